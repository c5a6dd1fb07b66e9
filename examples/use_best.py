"""Use the best kernel the quickstart found, from a new process: `tuner.load` compiles the
stored source (cached on disk) and returns a function on numpy arrays."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import tuner


def main() -> int:
    shapes = {"X": "16x256", "W": "256x256"}
    record = tuner.best("rmsnorm_matmul", shapes, device="cpu")
    if record is None:
        print("nothing tuned yet: run `tuner launch examples/quickstart.yaml` first")
        return 1
    kernel = tuner.load("rmsnorm_matmul", shapes, device="cpu")
    rng = np.random.default_rng(0)
    # inputs in the program's dtype (the built-in is float16): a float32 array would be
    # converted on every call, and numpy's float16 conversion of W alone takes ~160 us here
    x = rng.standard_normal((16, 256), dtype=np.float32).astype(record.dtype)
    w = rng.standard_normal((256, 256), dtype=np.float32).astype(record.dtype)
    (out,) = kernel(x, w)
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    expected = (xf / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True))) @ wf
    result = [np.empty_like(out)]  # out=: no allocation per call (what a hot loop should do)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        kernel(x, w, out=result)
        times.append(time.perf_counter() - t0)
    per_call = statistics.median(times)
    err = float(np.max(np.abs(out - expected)))
    print(f"tuner.load('rmsnorm_matmul'): structure {record.structure_hash[:12]}, config "
          f"{record.config}; max |error| vs numpy {err:.2e}; {per_call * 1e6:.1f} us per call "
          f"from Python with out= (median of 200) (stored kernel time {record.time_s * 1e6:.1f} us)")
    return 0 if err < 1e-3 * float(np.max(np.abs(expected))) else 1


if __name__ == "__main__":
    sys.exit(main())
