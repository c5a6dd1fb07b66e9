"""Max-subtraction: where an ``exp`` is normalised by its own row sum, shift it by the row max.

Softmax is unchanged by subtracting any per-row constant c:
exp(s - c) / Σ exp(s - c) = exp(s)·e^-c / (Σ exp(s)·e^-c) = exp(s) / Σ exp(s).  The verifier
proves µGraphs without the shift (a max has no finite-field meaning), so the shift is a
lowering rule, applied only where the identity holds: every use of e = exp(s) is linear in e
(its row sum, or the left operand of a matmul), each of those sums is accumulated, and what is
accumulated is only ever read as the numerator or the denominator of a division whose other
operand is shifted too.  With c the row max no exp exceeds 1, so float16 / bfloat16 tiles and
float32 sums cannot overflow on real-scale logits.

Across a for-loop the max is a running one (FlashAttention's online softmax): each iteration
takes m' = max(m, rowmax(s)), uses exp(s - m') and multiplies every accumulator fed by e by
exp(m - m') before adding.  The rule only marks the plan: ``Let.attrs["shift"]`` on the exp
(the name of its running max) and ``Store.scale`` on the accumulating stores; every dialect
prints them.  Triton keeps the running max of each row in a register tile; the C-style
dialects (C++, CUDA), whose loops walk rows one thread group at a time, get two per-row
buffers in the block's shared memory (``attrs["rows"]``: the running max and its rescaling
factor, which later loops of the same rows read), and print the plain form where those do not
fit the shared-memory budget or where a scaled store's loop walks other rows.

A multiplicative 0/1 mask applied after the exp (``exp(s) * M``, a causal or padding mask)
keeps the identity exact: M·e^(s−c) / Σ M·e^(s−c) = M·e^s / Σ M·e^s; a fully masked row is 0/0
with or without the shift.
"""

from __future__ import annotations

from ._plan import Buffer, Kernel, Let, Level, Loop, Store, View

ALIGN = 16  # bytes, as shared-memory planning aligns buffers


def _stmts(lp: Loop) -> list:
    return [*lp.hoisted, *lp.col, *lp.row]


def shift_exponentials(k: Kernel, smem_limit: int | None = None) -> None:
    """Mark each exp of ``k`` that may be shifted by its row max (see the module docstring);
    ``smem_limit``: the shared-memory budget the per-row buffers must fit (None: any)."""
    if len(k.phases) != 1:
        return
    loops = k.phases[0].loops
    view_buf = {v.name: v.buffer for v in k.views}
    for li, lp in enumerate(loops):
        for st in lp.col:
            if isinstance(st, Let) and st.op == "exp":
                _try_shift(k, loops, li, st, view_buf)
                if st.attrs.get("shift") and not st.attrs.get("local"):
                    _row_buffers(k, loops, lp, st, smem_limit)


def _row_buffers(k: Kernel, loops: list[Loop], lp: Loop, exp: Let,
                 smem_limit: int | None) -> None:
    """Shared-memory rows for a running max the C-style dialects keep across loops: the max
    and exp(m_old − m_new) of each of the exp loop's rows; only when every scaled store walks
    the same rows and the two fit the budget."""
    name = exp.attrs["shift"]
    for other in loops:
        for st in _stmts(other):
            if isinstance(st, Store) and st.scale == name and \
                    other.shape[:-1] != lp.shape[:-1]:
                return
    nbytes = -(-4 * lp.rows // ALIGN) * ALIGN
    first = -(-k.smem_bytes // ALIGN) * ALIGN
    if smem_limit is not None and first + 2 * nbytes > smem_limit:
        return
    names = (f"{name}_rowmax", f"{name}_rowalpha")
    for i, n in enumerate(names):
        k.buffers[n] = Buffer(n, (lp.rows,), Level.REGIONAL, "scratch", offset=first + i * nbytes,
                              live=(0, len(loops)), doc=f"per-row running max of {exp.var} "
                              "and its rescaling factor (_softmax)")
        k.views.append(View(n, n))
    k.smem_bytes = first + 2 * nbytes
    exp.attrs["rows"] = names


def _try_shift(k: Kernel, loops: list[Loop], li: int, exp: Let, view_buf: dict) -> None:
    e = exp.var
    lp = loops[li]
    if lp.stage != "body":
        _try_local(loops, li, exp, view_buf)
        return
    scaled: list[Store] = []
    linear = {e}  # e, and e times factors independent of it (a 0/1 mask)
    factors: list[Let] = []
    for st in lp.col:
        if _factor(st, linear, set()):
            linear.add(st.var)
            factors.append(st)
    sums = {red.dst for red in lp.reductions if red.src in linear}
    if not sums:
        return  # not normalised by its own row sum
    kept: set[str] = set()  # tile buffers e is kept in for a later loop
    for st in _stmts(lp):
        if isinstance(st, Store) and st.var in linear:
            if st.accumulate:
                return
            kept.add(view_buf[st.access.view])
        elif isinstance(st, Store) and st.var in sums:
            if not st.accumulate:
                return
            scaled.append(st)
        elif isinstance(st, Let) and any(a in linear for a in st.args) and st is not exp \
                and not any(st is f for f in factors):
            return  # another use of e (not linear through a sum)
        elif isinstance(st, Let) and st.op == "matmul" and view_buf[st.access[0].view] in kept:
            return
    if any(red.src in linear for red in lp.reductions) and len(sums) != len(scaled):
        return  # a row sum of e used within the iteration, unaccumulated
    # matmuls reading a kept tile of e as their left operand, each accumulated
    for later in loops[li + 1:]:
        if later.stage != lp.stage:
            continue
        for st in _stmts(later):
            if isinstance(st, Let) and any(view_buf[a.view] in kept for a in st.access):
                if st.op != "matmul" or view_buf[st.access[0].view] not in kept or \
                        view_buf[st.access[1].view] in kept:
                    return
                stores = [x for x in _stmts(later) if isinstance(x, Store) and x.var == st.var]
                if not stores or not all(x.accumulate for x in stores):
                    return
                uses = [x for x in _stmts(later) if isinstance(x, Let) and st.var in x.args]
                if uses:
                    return
                scaled += stores
    if not _only_ratios(k, loops, scaled, view_buf):
        return
    name = f"m_{e}"
    exp.attrs["shift"] = name
    for st in scaled:
        st.scale = name


def _factor(st, e_names: set[str], d_names: set[str]) -> bool:
    """``st`` multiplies an e-linear value by a factor not computed from e or its sums (a 0/1
    mask): the product is still linear in e and carries the same shift."""
    if not isinstance(st, Let) or st.op != "mul" or st.access:
        return False
    inside = [a in e_names for a in st.args]
    return sum(inside) == 1 and not any(a in d_names for a in st.args)


def _try_local(loops: list[Loop], li: int, exp: Let, view_buf: dict) -> None:
    """Within one pass (no for-loop carrying the sums): e = exp(s) whose only uses are its
    row sum d and the quotient e / d (directly, through tiles kept for a later loop, multiplied
    by a factor independent of e such as a 0/1 mask, for the numerator and the sum alike, or
    as the left operand of a matmul: attention's Σ_j e_j·V_j / d) may be shifted by the row
    max of this pass; each quotient of an unmultiplied e is
    marked as lying in [0, 1] (``attrs["unit"]``): a tensor-core operand in half precision
    cannot overflow."""
    lp = loops[li]
    linear = {exp.var}
    for st in lp.col:
        if _factor(st, linear, set()):
            linear.add(st.var)
    sums = [red.dst for red in lp.reductions if red.src in linear]
    if len(sums) != 1:
        return
    e_names, d_names = {exp.var}, {sums[0]}
    factored: set[str] = set()  # e-linear values that went through a factor: not in [0, 1]
    e_bufs: set[str] = set()
    d_bufs: set[str] = set()
    quotients: list[Let] = []
    for later in loops[li:]:
        if later.stage != lp.stage:
            continue
        for st in _stmts(later):
            if isinstance(st, Store):
                if st.var in e_names:
                    if st.accumulate:
                        return
                    e_bufs.add(view_buf[st.access.view])
                    if st.var in factored:
                        factored.add(view_buf[st.access.view])
                elif st.var in d_names:
                    if st.accumulate:
                        return
                    d_bufs.add(view_buf[st.access.view])
                continue
            if st is exp:
                continue
            if st.op == "load" and view_buf[st.access[0].view] in e_bufs:
                e_names.add(st.var)
                if view_buf[st.access[0].view] in factored:
                    factored.add(st.var)
            elif st.op == "load" and view_buf[st.access[0].view] in d_bufs:
                d_names.add(st.var)
            elif _factor(st, e_names, d_names) or (
                    st.op == "matmul" and view_buf[st.access[0].view] in e_bufs and
                    not any(view_buf[a.view] in e_bufs | d_bufs for a in st.access[1:])):
                e_names.add(st.var)  # e·M, or Σ_j e_j·V_j (attention): linear in e
                factored.add(st.var)
            elif st.op == "div" and st.args[0] in e_names and st.args[1] in d_names:
                quotients.append(st)
            elif any(a in e_names | d_names for a in st.args) or any(
                    view_buf[a.view] in e_bufs | d_bufs for a in st.access):
                return  # another use: the shift might show
        for red in later.reductions:
            if red.src in e_names and red.dst not in d_names or red.src in d_names:
                return
    if not quotients:
        return
    exp.attrs["shift"] = f"m_{exp.var}"
    exp.attrs["local"] = True
    for st in quotients:
        if st.args[0] not in factored:
            st.attrs["unit"] = True


def _only_ratios(k: Kernel, loops: list[Loop], scaled: list[Store], view_buf: dict) -> bool:
    """Every read of a scaled accumulator is a load that feeds a division whose operands are
    both scaled.  An op reading the accumulator itself (``sum(d, dim=0)``: every row's sum,
    each shifted by its own row's max) would add differently shifted terms."""
    bufs = {view_buf[st.access.view] for st in scaled}
    for lp in loops:
        loaded = {}
        for st in _stmts(lp):
            if isinstance(st, Let) and any(view_buf[a.view] in bufs for a in st.access):
                if st.op != "load" or lp.stage != "post":
                    return False  # read by another op (a sum over rows of row sums): not a ratio
                loaded[st.var] = True
        for st in _stmts(lp):
            if isinstance(st, Let) and any(a in loaded for a in st.args):
                if st.op != "div" or not all(a in loaded for a in st.args):
                    return False
            if isinstance(st, Store) and st.var in loaded:
                return False
    return True
