#!/bin/bash
# A launch on a GPU no model trained on, as a user runs it: for each of the 12 Kernel Tuner
# caches (convolution, dedispersion x 6 GPUs), import the other five GPUs' caches, `tuner model
# train` (defaults), then replay-launch the held-out GPU with the default sampler (`auto`, seed
# 1) and with TPE (seeds 1-3), 20 trials each; prints the best found against the GPU's optimum.
# Usage: benchmarks/new_gpu_launch.sh [OUTDIR] [CACHES]   (about 40 min on 2 cores; SPACES=...
# and HELDOUT=... run some rows only)
set -euo pipefail
OUT=${1:-/tmp/new_gpu_launch}
CACHES=${2:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data/kernel_tuner_caches}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
GPUS="A100 A4000 A6000 MI250X W6600 W7800"
cd "$ROOT"
for S in ${SPACES:-convolution dedispersion}; do
  for H in ${HELDOUT:-$GPUS}; do
    W=$OUT/${S}_$H; rm -rf "$W"; mkdir -p "$W"
    for g in $GPUS; do
      [ "$g" = "$H" ] || $PY -m tuner.cli import kernel-tuner --db "sqlite:///$W/t.db" \
        "$CACHES/$S/$g.json.gz" > /dev/null
    done
    $PY -m tuner.cli model train --db "sqlite:///$W/t.db" > "$W/train.log" 2>&1
    for run in auto:1 tpe:1 tpe:2 tpe:3; do
      sampler=${run%:*}; seed=${run#*:}
      cp "$W/t.db" "$W/${sampler}_$seed.db"
      printf 'programs:\n  - kernel_tuner: %s\ndevices: [replay]\ntuning:\n  sampler: %s\n  trials_per_structure: 20\n  seed: %s\n' \
        "$CACHES/$S/$H.json.gz" "$sampler" "$seed" > "$W/job_${sampler}_$seed.yaml"
      $PY -m tuner.cli launch --db "sqlite:///$W/${sampler}_$seed.db" --no-train --json \
        "$W/job_${sampler}_$seed.yaml" > "$W/out_${sampler}_$seed.json" 2> "$W/err_${sampler}_$seed.log"
    done
  done
done
$PY - "$OUT" "$CACHES" <<'EOPY'
import gzip, json, statistics, sys
from pathlib import Path
out, caches = Path(sys.argv[1]), Path(sys.argv[2])
print(f"{'space':13} {'GPU':7} {'auto (sampler chosen)':>58}  tpe seeds 1-3 (median)")
for space in ("convolution", "dedispersion"):
    for gpu in ("A100", "A4000", "A6000", "MI250X", "W6600", "W7800"):
        doc = json.loads(gzip.decompress((caches / space / f"{gpu}.json.gz").read_bytes()))
        best = min(v["time"] for v in doc["cache"].values()
                   if isinstance(v.get("time"), (int, float))) / 1e3
        if not (out / f"{space}_{gpu}").is_dir():
            continue
        got = {}
        for run in ("auto_1", "tpe_1", "tpe_2", "tpe_3"):
            p = json.loads((out / f"{space}_{gpu}" / f"out_{run}.json").read_text())["programs"][0]
            got[run] = (p["best_s"] / best - 1, p["sampler"])
        tpe = [got[r][0] for r in ("tpe_1", "tpe_2", "tpe_3")]
        print(f"{space:13} {gpu:7} {100 * got['auto_1'][0]:6.1f}% ({got['auto_1'][1][:48]:48})  "
              + " ".join(f"{100 * t:6.1f}%" for t in tpe)
              + f" ({100 * statistics.median(tpe):.1f}%)")
EOPY
