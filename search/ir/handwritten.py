"""Hand-written fused µGraph structures for the suite: the kernels an expert would write.

They serve three purposes: the verifier's acceptance tests, a target the search must
rediscover, and the kernels issue's inputs until the search lands.  Each is a *structure*
(grid and for-loop sizes are the symbols ``g0``, ``g1``, ``F``) built over the program's
own inputs, so it instantiates at any shapes the program allows.
"""

from __future__ import annotations

from collections.abc import Callable

from .graph import BlockGraph, KernelGraph, Tensor
from .lang import Program


def _start(program: Program) -> tuple[KernelGraph, dict[str, Tensor]]:
    g = KernelGraph()
    return g, {n: g.new_input(s, program.dtype, n, layout=program.layouts.get(n, "row"))
               for n, s in program.inputs.items()}


def _finish(g: KernelGraph, bg: BlockGraph) -> KernelGraph:
    for out in g.graph_kernel(bg):
        g.mark_output(out)
    return g


def rmsnorm_matmul(program: Program) -> KernelGraph:
    """Grid over W's columns, loop over the shared dim, normalise once at the end."""
    g, t = _start(program)
    bg = BlockGraph(("g0",), "F")
    x = bg.new_input(t["X"], imap=(-1,), fmap=1)
    w = bg.new_input(t["W"], imap=(1,), fmap=0)
    acc = bg.forloop_accum(bg.matmul(x, w))
    rms = bg.forloop_accum(x, "rms")
    bg.new_output(bg.div(acc, rms), omap=(1,))
    return _finish(g, bg)


def gated_mlp(program: Program) -> KernelGraph:
    """Both matmuls share X's tile; silu and the product run once after the loop."""
    g, t = _start(program)
    bg = BlockGraph(("g0",), "F")
    x = bg.new_input(t["X"], imap=(-1,), fmap=1)
    w1 = bg.new_input(t["W1"], imap=(1,), fmap=0)
    w2 = bg.new_input(t["W2"], imap=(1,), fmap=0)
    a = bg.forloop_accum(bg.matmul(x, w1))
    b = bg.forloop_accum(bg.matmul(x, w2))
    bg.new_output(bg.mul(bg.silu(a), b), omap=(1,))
    return _finish(g, bg)


def lora(program: Program) -> KernelGraph:
    """Loop over X's columns for X·W and X·A; the low-rank B product runs in the epilogue."""
    g, t = _start(program)
    bg = BlockGraph(("g0",), "F")
    x = bg.new_input(t["X"], imap=(-1,), fmap=1)
    w = bg.new_input(t["W"], imap=(1,), fmap=0)
    a = bg.new_input(t["A"], imap=(-1,), fmap=0)
    b = bg.new_input(t["B"], imap=(1,), fmap=-1)
    xw = bg.forloop_accum(bg.matmul(x, w))
    xa = bg.forloop_accum(bg.matmul(x, a))
    bg.new_output(bg.add(xw, bg.matmul(xa, b)), omap=(1,))
    return _finish(g, bg)


def _attention(program: Program, norm: bool, split_batch: bool = True) -> KernelGraph:
    """Grid over (batch, query rows); the loop walks the key/value sequence.

    With ``split_batch=False`` (MQA: one shared K/V, batch 1) only query rows are split."""
    g, t = _start(program)
    if split_batch:
        bg = BlockGraph(("g0", "g1"), "F")
        q = bg.new_input(t["Q"], imap=(0, 1), fmap=-1)
        k = bg.new_input(t["K"], imap=(0, -1), fmap=2)
        v = bg.new_input(t["V"], imap=(0, -1), fmap=1)
        omap: tuple[int, ...] = (0, 1)
    else:
        bg = BlockGraph(("g0",), "F")
        q = bg.new_input(t["Q"], imap=(1,), fmap=-1)
        k = bg.new_input(t["K"], imap=(-1,), fmap=2)
        v = bg.new_input(t["V"], imap=(-1,), fmap=1)
        omap = (1,)
    if norm:
        q, v = bg.rms_norm(q), bg.rms_norm(v)
    e = bg.exp(bg.matmul(q, k))
    num = bg.forloop_accum(bg.matmul(e, v))
    den = bg.forloop_accum(e, "sum")
    bg.new_output(bg.div(num, den), omap=omap)
    return _finish(g, bg)


def ntrans(program: Program) -> KernelGraph:
    """Whole rows per block (both norms need the full row), no loop."""
    g, t = _start(program)
    bg = BlockGraph(("g0",), 1)
    h, x, alpha = (bg.new_input(t[n], imap=(0,), fmap=-1) for n in ("H", "X", "alpha"))
    y = bg.add(x, bg.mul(alpha, bg.add(bg.rms_norm(h), x)))
    bg.new_output(bg.forloop_accum(bg.rms_norm(y)), omap=(0,))
    return _finish(g, bg)


def softmax_rows(program: Program) -> KernelGraph:
    """Rows over the grid, whole rows per block: the row sum stays on chip (no loop)."""
    g, t = _start(program)
    bg = BlockGraph(("g0",), 1)
    x = bg.new_input(t["X"], imap=(0,), fmap=-1)
    e = bg.exp(x)
    bg.new_output(bg.forloop_accum(bg.div(e, bg.sum(e, 1))), omap=(0,))
    return _finish(g, bg)


def rmsnorm_residual(program: Program) -> KernelGraph:
    g, t = _start(program)
    bg = BlockGraph(("g0",), 1)
    x = bg.new_input(t["X"], imap=(0,), fmap=-1)
    r = bg.new_input(t["R"], imap=(0,), fmap=-1)
    y = bg.add(x, r)
    bg.new_output(bg.forloop_accum(y), omap=(0,))
    bg.new_output(bg.forloop_accum(bg.rms_norm(y)), omap=(0,))
    return _finish(g, bg)


HANDWRITTEN: dict[str, Callable[[Program], KernelGraph]] = {
    "rmsnorm_matmul": rmsnorm_matmul,
    "gated_mlp": gated_mlp,
    "lora": lora,
    "gqa": lambda p: _attention(p, norm=False),
    "qknorm_gqa": lambda p: _attention(p, norm=True),
    "mha": lambda p: _attention(p, norm=False),
    "mqa": lambda p: _attention(p, norm=False, split_batch=False),
    "ntrans": ntrans,
    "softmax_rows": softmax_rows,
    "rmsnorm_residual": rmsnorm_residual,
}


def handwritten(program: Program) -> KernelGraph:
    """The hand-written fused structure for a built-in program of this name."""
    try:
        return HANDWRITTEN[program.name](program)
    except KeyError:
        raise KeyError(f"no hand-written structure for {program.name!r}; have: "
                       + ", ".join(HANDWRITTEN)) from None
