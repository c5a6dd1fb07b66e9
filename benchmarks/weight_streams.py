"""How fast the decode-sized weight streams read their weights on a CUDA GPU, config by config.

    python3 benchmarks/weight_streams.py [--programs rmsnorm_matmul gated_mlp lora]
        [--splitk 1 2 4 8 16] [--splitk-launches 1 2] [--stages 3 4] [--blocks 128 256]
        [--set F=64,128 ...]
        [--budget 0.15] [--json FILE]

Why: issue 18's target is the weights streamed at >= 70% of the device-to-device copy
bandwidth, and a call of these kernels costs about as much as its launches.  For each program
(hand-written structure at its paper shape) and each legal config around the Triton default
(``kernels.triton_default_config``: split-K S and whether its last program or a second launch
finishes each tile (``splitk_launches``), Triton ``num_stages``, threads per block, and
any symbol ``--set`` names, e.g. the for-loop step F), the
kernel is built as the cuda device builds it (``build_kernel``: the launch mode of
``$TUNER_TRITON_LAUNCH``), checked as every device checks (``kernels.devices.expected`` and
``judge_outputs``: the float64 reference, the dtype's tolerance, each element's slack), and
timed two ways with CUDA events, medians of ``kernels.measure``: per call (calls back to
back, as the stream sees them: host dispatch included where it is slower than the GPU) and
as one CUDA-graph replay (the GPU's time for the call's launches, no Python).  Columns: the
weights' GB/s for each and their share of the copy bandwidth measured in the same run.
Without a GPU: one line, exit 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def weight_bytes(program) -> int:
    """Bytes of every input but the activations X (what a decode step streams)."""
    import numpy as np

    return sum(int(np.prod(s)) * 2 for n, s in program.inputs.items() if n != "X")


def graph_of(cp, fn):
    """``fn``'s launches captured once on a side stream (Triton launches on CuPy's current
    stream with the direct launcher, on torch's with jit: both pointed at it)."""
    import torch

    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        stream.begin_capture()
        try:
            fn()
        finally:
            g = stream.end_capture()
    return g.launch


def one_program(name: str, args, cp, copy_gbs: float, say) -> list[dict]:
    import numpy as np

    from kernels import devices as kd
    from kernels import get_device, legal, measure, triton_default_config
    from search import handwritten, load_program

    program = load_program(name)
    ref, structure, device = program.build(), handwritten(program), get_device("cuda")
    stored = kd.as_stored(kd.random_inputs(ref), kd.input_layouts(ref))
    weights = weight_bytes(program)
    base = triton_default_config(structure, device.spec)
    clock = kd.EventClock(cp)
    rows = []
    axes = {"splitk": args.splitk, "splitk_launches": args.splitk_launches,
            "stages": args.stages, "block": args.blocks}
    for key, values in args.set.items():
        axes[key] = values if key in base else []
    grid = [dict(zip(axes, values, strict=True))
            for values in itertools.product(*[v or [None] for v in axes.values()])]
    for knobs in grid:
        if knobs["splitk"] == 1 and knobs["splitk_launches"] != args.splitk_launches[0]:
            continue  # without split-K the knob changes nothing: measured once
        config = {**base, **{k: v for k, v in knobs.items() if v is not None}}
        if legal(structure, config, device.spec) is not None:
            continue
        label = " ".join(f"{k}={config.get(k)}" for k in axes)
        try:
            plan = device.lower(structure, config, name)
            kernel = kd.build_kernel(cp, plan, device.render(plan))
            xs = [cp.asarray(kd.to_storage(x, b.dtype))
                  for x, b in zip(stored, plan.inputs, strict=True)]
            outs = [cp.asarray(kd.to_storage(np.full(b.shape, np.nan, np.float32),
                                             b.dtype)) for b in plan.outputs]
            for _ in range(2):  # twice: the split-K workspace must be clean again
                kernel(xs, outs)
            cp.cuda.Device().synchronize()
            got = [kd.from_storage(cp.asnumpy(o), b.dtype)
                   for o, b in zip(outs, plan.outputs, strict=True)]
            rounded = [kd.from_storage(kd.to_storage(x, b.dtype), b.dtype)
                       for x, b in zip(stored, plan.inputs, strict=True)]
            # the devices' own judgement: the dtype's tolerance plus each element's slack
            want = kd.expected(ref, kd.as_logical(rounded, kd.input_layouts(ref)),
                               plan.outputs[0].dtype)
            _, bad, _ = kd.judge_outputs(got, want.outputs, want.rtol, want.atol, want.slack)
            if bad:
                say(f"# {name} {label}: WRONG: {bad}")
                continue
            call = measure(lambda k=kernel, a=xs, o=outs: k(a, o),
                           budget_s=args.budget, clock=clock).median_s
            replay = graph_of(cp, lambda k=kernel, a=xs, o=outs: k(a, o))
            gpu = measure(replay, budget_s=args.budget, clock=clock).median_s
        except Exception as e:  # noqa: BLE001 - one config failing must not stop the rest
            say(f"# {name} {label}: failed: {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0][:200]}")
            continue
        row = {"program": name, "config": config, "call_ms": call * 1e3,
               "graph_ms": gpu * 1e3, "call_gbs": weights / call / 1e9,
               "graph_gbs": weights / gpu / 1e9, "weights_mb": weights / 1e6,
               "copy_gbs": copy_gbs}
        rows.append(row)
        say(f"{name} {label}: call {row['call_ms']:.4f} ms "
            f"({row['call_gbs']:.0f} GB/s, {row['call_gbs'] / copy_gbs:.0%}), graph "
            f"{row['graph_ms']:.4f} ms ({row['graph_gbs']:.0f} GB/s, "
            f"{row['graph_gbs'] / copy_gbs:.0%})")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=["rmsnorm_matmul", "gated_mlp", "lora"])
    parser.add_argument("--splitk", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--splitk-launches", nargs="+", type=int, default=[1, 2],
                        choices=[1, 2], help="1: the last program of a tile finishes it; 2: "
                        "an epilogue launch does")
    parser.add_argument("--stages", nargs="+", type=int, default=[3, 4])
    parser.add_argument("--blocks", nargs="+", type=int, default=[128, 256])
    parser.add_argument("--set", nargs="*", default=[], metavar="SYMBOL=V1,V2",
                        help="more values of a config symbol (ignored where a program lacks it)")
    parser.add_argument("--budget", type=float, default=0.15, help="seconds per measure()")
    parser.add_argument("--json", metavar="FILE", help="write every row to FILE")
    args = parser.parse_args(argv)
    try:
        args.set = {k: [int(v) for v in vs.split(",")]
                    for k, _, vs in (item.partition("=") for item in args.set)}
    except ValueError:
        parser.error(f"--set {' '.join(args.set)}: each is SYMBOL=V1,V2 with integer values")
    sys.path.insert(0, str(ROOT))
    from kernels import cuda_available

    ok, why = cuda_available()
    if not ok:
        print(f"weight_streams: no CUDA GPU here, nothing measured: {why}")
        return 0
    import cupy as cp
    import torch  # noqa: F401 - before Triton's driver: launches then follow torch's stream

    def say(line: str) -> None:
        print(line, flush=True)

    copy_gbs = runpy.run_path(str(ROOT / "benchmarks" / "kernels.py"))["gpu_copy_gbs"]()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    say(f"# {name.decode() if isinstance(name, bytes) else name}: copy {copy_gbs:.0f} GB/s")
    rows = []
    for program in args.programs:
        found = one_program(program, args, cp, copy_gbs, say)
        rows += found
        for key in ("call_gbs", "graph_gbs"):
            if found:
                best = max(found, key=lambda r, k=key: r[k])
                say(f"# {program}: best by {key.split('_')[0]}: {best['config']}: "
                    f"{best[key]:.0f} GB/s = {best[key] / copy_gbs:.0%} of copy "
                    f"({best['call_ms']:.4f} ms a call, {best['graph_ms']:.4f} ms replayed)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
