"""``tuner codegen`` and ``tuner measure``: a fused structure's source, and its speed.

The structure and config are picked by ``tuner.api.resolve_structure`` / ``resolve_config``
(``--structure``, ``--structures``, ``--config``); the config actually used is reported on
stderr.  Bad input raises ``tuner.api.InputError``: the CLI prints it as one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING

from kernels import DEVICE_KINDS, OK
from search import KernelGraph, Program, load_program

from ..api import (
    InputError,
    lower_plan,
    parse_config,
    parse_pairs,
    resolve_config,
    resolve_structure,
)
from ..formatting import ms

if TYPE_CHECKING:
    from kernels import DeviceSpec, KernelPlan

GPUS = ("H100", "A100", "H200")


def _prepare(args: argparse.Namespace, device: str | DeviceSpec
             ) -> tuple[Program, KernelGraph, dict[str, int], KernelPlan]:
    """(program, structure, config, plan); says on stderr which structure and config."""
    program = load_program(args.program, parse_pairs(args.set, "--set"))
    structure, what = resolve_structure(program, args.structure, args.structures, device)
    given = parse_config(args.config)
    if getattr(args, "target", None) == "triton":
        given = {**(given or {}), "triton": 1}
    config = resolve_config(structure, given, device)
    plan = lower_plan(structure, config, device, program.name)  # config errors: exit 2
    print(f"# {what}; config {' '.join(f'{k}={v}' for k, v in config.items()) or '(none)'}",
          file=sys.stderr)
    return program, structure, config, plan


# ---------------------------------------------------------------- commands


def cmd_codegen(args: argparse.Namespace) -> int:
    from kernels import render

    device = "cpu" if args.target == "cpp" else args.gpu
    _, _, _, plan = _prepare(args, device)
    print(render(plan, args.target), end="")
    if args.plan:
        print(plan.summary(), file=sys.stderr)
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from kernels import cuda_available, cuda_device_spec, measure_program

    timing = {"budget_s": args.budget}
    if args.device == "cuda":
        ok, reason = cuda_available()
        if not ok:
            raise InputError(f"--device cuda: no usable GPU ({reason}); use --device cpu")
    program, structure, config, _ = _prepare(
        args, cuda_device_spec() if args.device == "cuda" else "cpu")
    m = measure_program(program, structure, config, device=args.device, timing=timing)
    if args.json:
        print(json.dumps(m.as_dict(), indent=2))
    else:
        rows = [("program", m.program), ("device", m.device), ("status", m.status),
                ("kernel", ms(m.kernel_s, spec=".4g")), ("baseline", ms(m.baseline_s, spec=".4g")
                                                   + " (reference op by op)"),
                ("speedup", "-" if math.isnan(m.speedup) else f"{m.speedup:.2f}x"),
                ("max error", "-" if math.isnan(m.max_error) else f"{m.max_error:.3g}"),
                ("bandwidth", "-" if math.isnan(m.achieved_gbs) else
                 f"{m.achieved_gbs:.1f} GB/s ({m.fraction_of_copy:.0%} of "
                 f"{m.copy_gbs:.1f} GB/s)"),
                ("kernels", str(m.kernels))]
        for key, value in rows:
            print(f"{key:<10} {value}")
        if m.message:
            print(f"message    {m.message}")
    return 0 if m.status == OK else 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM", help="built-in name or program file")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a parameter (batch=8) or an input shape (X=16x1024)")
    p.add_argument("--structure", default="best", metavar="best|handwritten|HASH|FILE",
                   help="which fused structure (default best: the structure of --structures, "
                        "or the program as written, with the fastest roofline estimate on the "
                        "device; without --structures the hand-written one)")
    p.add_argument("--structures", metavar="FILE",
                   help="a search output (JSON with a 'structures' list) for best / HASH")
    p.add_argument("--config", action="append", metavar="K=V",
                   help="bind a symbol (g0=64) or a mapping knob (block, lanes, split, vpack); "
                        "the rest comes from the AStitch default")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``codegen`` and ``measure`` to the ``tuner`` subcommands."""
    p = sub.add_parser("codegen", help="print the CUDA, Triton or C++ source of a fused "
                                       "structure")
    _common(p)
    p.add_argument("--target", choices=("cuda", "triton", "cpp"), default="cuda",
                   help="CUDA C (default), Triton (the GPU's tile-program dialect: config "
                        "triton=1) or C++/OpenMP for the local CPU")
    p.add_argument("--gpu", choices=GPUS, default="H100",
                   help="GPU whose limits shape the CUDA / Triton plan (default %(default)s)")
    p.add_argument("--plan", action="store_true", help="also print the plan summary on stderr")
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("measure", help="time a fused kernel against the op-by-op baseline")
    _common(p)
    p.add_argument("--device", choices=DEVICE_KINDS, default="cpu")
    p.add_argument("--budget", type=float, default=1.0, metavar="SECONDS",
                   help="timing budget per side (default %(default)s s)")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    p.set_defaults(func=cmd_measure)
