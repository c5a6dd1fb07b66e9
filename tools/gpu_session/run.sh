#!/bin/bash
# One session on a lent GPU machine, every phase time-boxed, everything written to $OUT:
#   bash tools/gpu_session/run.sh      (after tools/gpu_session/prepare.sh here; carry .whl .gpu)
# Phases (seconds, override by environment): GPUTEST=110 `make gpu-test`'s tests with the
# image's python3; WEIGHTS=60 benchmarks/weight_streams.py on rmsnorm_matmul and gated_mlp
# (split-K x stages x steps x column tiles); SWEEP=200 benchmarks/sweep.py over the 8 paper
# programs (top structure by the estimate + the hand-written one, SECONDS_PER=20 each, the
# weight streams' 3 best configs of each program measured first); PEERS=150 benchmarks/peers.py
# with our column from the sweep; LAUNCH=30 benchmarks/launch_overhead.py.  At most ~9.5
# minutes (a device call may run 10): give run timeout_s 600.  Set a phase to 0 to skip it.
# Files: gputest.log, weights.json, weights.txt, sweep_*.jsonl.gz, sweep.log, peers.json,
# peers.log, launch.txt, env.txt (9: the tool brings back 8, so launch.txt is folded into
# env.txt).  On an H100 (2026-11-27) gpu-test took 90 s, the weights 45 s, peers 129 s.
# Files are named by .gpu/commit (the device's copy of .git may be older than the tree that
# travels): run `make gpu-prepare` again after committing; it reuses the searches.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
commit=$(cat .gpu/commit 2>/dev/null || echo unknown)
[ -n "${SKIP_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "run: the carried wheels did not install (tools/gpu_session/prepare.sh, carry .whl)"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton, cupy, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  echo "commit $commit"; } 2>&1 | tee "$OUT/env.txt"
phase() {  # phase LIMIT NAME COMMAND...: run COMMAND for at most LIMIT seconds (0: skip it)
  local limit=$1 name=$2; shift 2
  [ "$limit" -gt 0 ] 2>/dev/null || { echo "run: $name skipped"; return 0; }
  timeout "$limit" "$@"; [ $? -eq 124 ] && echo "run: $name stopped at its $limit s"; return 0; }
P="rmsnorm_matmul gated_mlp lora gqa qknorm_gqa mha mqa ntrans"
phase "${GPUTEST:-110}" gpu-test python3 -m pytest -p no:cacheprovider -m gpu -rs -s -q tests/kernels/test_gpu.py > "$OUT/gputest.log" 2>&1
tail -3 "$OUT/gputest.log"
phase "${WEIGHTS:-60}" weights python3 benchmarks/weight_streams.py --programs rmsnorm_matmul gated_mlp \
  --set F=32 g0=48,64,96 --splitk 1 2 4 --splitk-launches 1 2 --stages 4 --blocks 128 --json "$OUT/weights.json" > "$OUT/weights.txt" 2>&1
grep '^# ' "$OUT/weights.txt"
python3 -c "import json, sys; rows = json.load(open(sys.argv[1])); print(json.dumps([r for p in {r['program'] for r in rows} for r in sorted((r for r in rows if r['program'] == p), key=lambda r: r['call_ms'])[:3]]))" "$OUT/weights.json" > "$OUT/given.json" 2>/dev/null || echo "[]" > "$OUT/given.json"
SWEEPFILE="$OUT/sweep_${commit}.jsonl"
phase "${SWEEP:-200}" sweep python3 benchmarks/sweep.py --device cuda --structures .gpu/structures --only $P --top 1 \
  --with-handwritten --seconds "${SECONDS_PER:-20}" --configs "$OUT/given.json" --out "$SWEEPFILE" > "$OUT/sweep.log" 2>&1
rm -f "$OUT/given.json"
grep '^# ' "$OUT/sweep.log"; grep -A3 Traceback "$OUT/sweep.log" | tail -4
if [ -s "$SWEEPFILE" ]; then
  phase "${PEERS:-150}" peers python3 benchmarks/peers.py --device cuda --sweep "$SWEEPFILE" --rounds 3 --json > "$OUT/peers.json" 2> "$OUT/peers.log"
  grep '^# ' "$OUT/peers.log" | grep -v compiled
  gzip -f "$SWEEPFILE"
fi
phase "${LAUNCH:-30}" launch python3 benchmarks/launch_overhead.py 2>&1 | tee -a "$OUT/env.txt"
echo "run: done"
