"""Split-K: several programs share one virtual block's for-loop (the Triton dialect).

A decode-sized weight stream has a few output rows and a long K: one program per 64-column
output tile walks its K x 64 slice alone, and 64-128 programs cannot keep an H100's 132 SMs
loading (16-38% of the copy bandwidth, docs/devices.md).  ``split_k`` decides whether a
kernel's loop can be split (only sums can) and records it in the plan for the printer.

The part after the loop runs once per virtual block, after all its partial sums are in: in a
second launch (``splitk_launches=2``: an epilogue program per virtual block; the form measured
on an H100 first), or in the same launch (``splitk_launches=1``) by the program that adds its
sums last.  That one is told by a counter per virtual block: each program, once all its
threads have added their sums (a block barrier), takes a ticket with one acquire-release
atomic add; the program holding the last ticket sees every other program's sums (release
by them, acquire by it), resets the counter for the next call and finishes the block.  This
is the pattern of CUTLASS's split-K semaphore.  It saves a launch: an empty one costs 4.8 us a
call on an H100, and split-K's two launches held rmsnorm_matmul at 65% of the copy bandwidth
a call against 72% replayed as a CUDA graph (docs/devices.md).
"""

from __future__ import annotations

import math

from ._plan import Buffer, Kernel, Let, Level, Store


def split_k(k: Kernel, s: int, what: str, triton: bool, launches: int = 2) -> None:
    """``splitk=s``: ``s`` programs per virtual block share the for-loop, each adding its
    accumulators into a zeroed float32 workspace slot (``splitk`` buffers, one slot per virtual
    block); an epilogue program per virtual block reads them, zeroes them for the next call and
    runs the part after the loop (the Triton dialect prints both).  Legal only where every
    state the loop carries is a sum: tiles accumulated (never overwritten, never read inside
    the loop, never written outside it) and accumulated outputs.  FlashAttention's running
    max, tiles overwritten by each iteration, stores inside the loop, grid barriers are
    refused with the reason, as any illegal config is.  ``launches`` 1 finishes each
    virtual block in its last program instead of an epilogue launch (module docstring)."""
    why = f"config: splitk={s} cannot split {what} ({k.name})"
    if not triton:
        raise ValueError(f"config: splitk={s} needs the Triton dialect (triton=1): only its "
                         "printer has the partial and epilogue programs")
    if k.forloop % s:
        raise ValueError(f"config: splitk={s} must divide the for-loop range {k.forloop} of "
                         f"{what} ({k.name})")
    if k.barrier != "none" or len(k.phases) != 1:
        raise ValueError(f"{why}: its phases are joined by a grid barrier")
    loops = k.phases[0].loops
    body = [lp for lp in loops if lp.stage == "body"]
    if not body:
        raise ValueError(f"{why}: nothing runs inside its for-loop")
    tiles = {n for n, b in k.buffers.items() if b.level is Level.REGIONAL}
    view_buf = {v.name: v.buffer for v in k.views}
    carried: dict[str, tuple[int, int]] = {}  # tile or output view -> (rows, cols)
    overwritten: set[str] = set()
    for lp in body:
        for st in (*lp.hoisted, *lp.col, *lp.row):
            if isinstance(st, Let) and st.attrs.get("shift") or \
                    isinstance(st, Store) and st.scale:
                raise ValueError(f"{why}: it carries a running row max (a rescaled, "
                                 "FlashAttention-style accumulator), which is not a sum")
            if not isinstance(st, Store):
                continue
            buf = view_buf[st.access.view]
            if buf in tiles:
                if st.accumulate:
                    b = k.buffers[buf]
                    rows = math.prod(b.shape[:-1]) if len(b.shape) > 1 else 1
                    carried[buf] = (rows, b.shape[-1] if b.shape else 1)
                else:
                    overwritten.add(buf)
            elif st.accumulate:
                carried.setdefault(st.access.view, (lp.rows, 1 if st in lp.row else lp.cols))
            else:
                raise ValueError(f"{why}: it stores {buf} inside the for-loop (each iteration "
                                 "overwrites it: not a sum)")
    both = sorted(overwritten & set(carried))
    if both:
        raise ValueError(f"{why}: {both[0]} is both overwritten and accumulated in the loop")
    for lp in loops:
        for st in (*lp.hoisted, *lp.col, *lp.row):
            accs = st.access if isinstance(st, Let) else (st.access,)
            bufs = {view_buf[a.view] for a in accs}
            if lp.stage == "body" and isinstance(st, Let) and bufs & set(carried):
                raise ValueError(f"{why}: the loop reads its accumulator "
                                 f"{sorted(bufs & set(carried))[0]} (a partial sum)")
            if lp.stage != "body" and isinstance(st, Store) and bufs & set(carried):
                raise ValueError(f"{why}: accumulator {sorted(bufs & set(carried))[0]} is "
                                 "also written outside the for-loop")
            if lp.stage == "post" and bufs & overwritten:
                raise ValueError(f"{why}: {sorted(bufs & overwritten)[0]} is overwritten "
                                 "by every iteration and read after the loop (not a sum)")
    if not carried:
        raise ValueError(f"{why}: its for-loop carries no accumulator")
    k.splitk, k.splitk_launches = s, launches
    for key, shape in carried.items():
        k.buffers[f"sk_{key}"] = Buffer(
            f"sk_{key}", shape, Level.GLOBAL, "splitk", per_vblock=True, carries=key,
            doc=f"split-K: the {s} partial sums of {key} per virtual block, added atomically; "
                "zeroed again by the epilogue")
    if launches == 1:
        k.buffers["sk_count"] = Buffer(
            "sk_count", (1,), Level.GLOBAL, "splitk_count", per_vblock=True,
            doc=f"split-K: how many of the {s} programs of a virtual block have added their "
                "sums (int32 bits); the last one finishes the block and resets it")
    k.notes.append(f"split-K {s}: {s} programs per virtual block walk {k.forloop // s} "
                   f"for-loop steps each, {len(carried)} accumulator(s) summed in the "
                   "workspace, " + ("the last to finish runs the part after the loop"
                                    if launches == 1 else "then an epilogue launch"))
