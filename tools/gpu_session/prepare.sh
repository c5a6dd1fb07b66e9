#!/bin/bash
# Prepare, on a machine without a GPU, what one short session on a lent GPU machine needs:
#   tools/gpu_session/prepare.sh            (from the repository root; ~5 minutes)
# - .whl/: wheels of the packages the GPU image lacks (its python3 has torch, triton, cupy,
#   numpy, pytest, pyyaml, scipy; not SQLAlchemy, Optuna, Alembic, LightGBM), at the versions
#   of this checkout's .venv, for CPython 3.12 on x86-64 Linux;
# - .gpu/structures/: `tuner search` outputs of the suite at the paper shapes (the search needs
#   egglog, which the GPU image lacks, and costs nothing there this way).
# Both folders are ignored by git (.git/info/exclude) and travel with `carry`.  Then, on the
# GPU machine: bash tools/gpu_session/run.sh (see its header).
set -euo pipefail
PY=${PY:-.venv/bin/python}
for d in /.whl/ /.gpu/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
mkdir -p .whl .gpu/structures
for name in sqlalchemy greenlet alembic mako optuna colorlog lightgbm; do
  version=$($PY -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$version" ] || { echo "prepare: $name is not installed in $PY's environment (make .venv/.installed)" >&2; exit 2; }
  ls .whl | grep -qi "^${name}-${version}-" && continue
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$name==$version" 2>&1 | grep -v WARNING || true
done
echo "prepare: wheels $(du -sh .whl | cut -f1) in .whl"
for p in rmsnorm_matmul gated_mlp lora gqa qknorm_gqa mha mqa ntrans softmax_rows rmsnorm_residual; do
  [ -s .gpu/structures/$p.json ] && continue
  echo "prepare: searching $p (40 s)"
  $PY -m tuner.cli search "$p" --time-limit 40 --out ".gpu/structures/$p.json" > ".gpu/structures/$p.log" 2>&1 \
    || { echo "prepare: the search of $p failed: .gpu/structures/$p.log" >&2; exit 1; }
done
git rev-parse --short HEAD > .gpu/commit  # the files the run writes are named by it
git diff --quiet HEAD || echo "prepare: the working tree has uncommitted changes: they travel, the commit name does not say so" >&2
echo "prepare: done; on the GPU: carry [.whl, .gpu], command: bash tools/gpu_session/run.sh"
