"""The launches a Triton module makes, as data: the printer writes ``launch(inputs, outputs,
ws)`` from them and the cuda device's direct launches (``TUNER_TRITON_LAUNCH=direct``) replay
them, so the two cannot disagree (split-K's second program included)."""

from __future__ import annotations

from dataclasses import dataclass

from kernels.lowering import KernelPlan

from ._triton_tiles import TritonUnsupported, _param_arg


@dataclass(frozen=True)
class TritonLaunch:
    """One ``kernel[grid](...)`` call of the printed ``launch(inputs, outputs, ws)``: ``args``
    index the flat list ``inputs + outputs + [ws]``; ``line`` is the call as printed.  The
    cuda device's direct launches (``TUNER_TRITON_LAUNCH=direct``) replay these."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple[int, ...]
    options: tuple[tuple[str, int], ...]
    line: str


def triton_launches(plan: KernelPlan) -> list[TritonLaunch]:
    """The launches of ``plan``'s Triton module, in order: per kernel one program per virtual
    block, or with split-K (``Kernel.splitk``) its partial programs, then (unless the last
    partial program of each virtual block finishes it) its epilogue."""
    n_in = len(plan.inputs)
    stages = (("num_stages", int(plan.config["stages"])),) if plan.config.get("stages") else ()
    out = []
    for k in plan.kernels:
        args, names = [], []
        for p in k.params:  # a kernel between two others may take only the workspace
            b = plan.globals[p]
            if b.role not in ("input", "output"):
                raise TritonUnsupported(f"{k.name} takes {p} ({b.role}); only program inputs "
                                        "and outputs are Triton kernel parameters")
            args.append(b.io_index if b.role == "input" else n_in + b.io_index)
            names.append(_param_arg(b))
        args.append(n_in + len(plan.outputs))
        names.append("ws")
        opts = (("num_warps", max(1, k.mapping.threads // 32)), *stages)
        grids = [(k.vblocks,)] if k.splitk == 1 else [(k.vblocks, k.splitk), (k.vblocks,)]
        grids = grids[:len(k.programs)]  # split-K in one launch: no epilogue launch
        for program, grid in zip(k.programs, grids, strict=True):
            call = ", ".join([*names, *(f"{n}={v}" for n, v in opts)])
            out.append(TritonLaunch(program, grid, tuple(args), opts,
                                    f"{program}[{grid}]({call})"))
    return out
