"""Softmax's max subtraction in the C-style dialects (C++ and CUDA).

Lowering marks where an exp may be shifted by its row max (``kernels/lowering/_softmax``):
``Let.attrs["shift"]`` names the max, ``attrs["local"]`` says the row is complete in one pass,
``attrs["rows"]`` (the running-max case, across for-loop iterations) names two per-row
shared-memory buffers, and ``Store.scale`` marks accumulators to rescale.  The C-style loops
walk a row's columns once, so the max comes from a pass of its own before them: it recomputes
the exp's argument per column (its chain of loads and ops in the loop, a matmul read from its
register tile where the schedule keeps one) and takes the maximum, combined across the lanes
of a row.  The exp then reads ``exp_f(s - m)``; with a running max each iteration also stores
m and α = exp(m_old − m_new), and every scaled accumulator becomes ``old·α + new``.
"""

from __future__ import annotations

from kernels.lowering import Kernel, Let, Loop, Store

# the maximum over the L lanes of a thread group (CUDA): as group_sum, with fmaxf
GROUP_MAX = """template <int L> __device__ __forceinline__ float group_max(float v, float* red) {
  // max over the L lanes of a thread group: shuffles inside a warp, shared memory across warps
#pragma unroll
  for (int o = (L < 32 ? L : 32) / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (L <= 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int first = (threadIdx.x / L) * (L / 32);
  float m = red[first];
  for (int q = 1; q < L / 32; ++q) m = fmaxf(m, red[first + q]);
  return m;
}"""


def honoured(k: Kernel, split: int) -> dict[str, tuple[str, str] | None]:
    """Shift name -> None (one pass) or its (max, alpha) row buffers, for each mark of ``k``
    the C-style dialects print; an unmarked exp, or one without its buffers, is printed plain
    (its scaled stores then accumulate plainly too)."""
    out: dict[str, tuple[str, str] | None] = {}
    if split > 1:
        return out
    for ph in k.phases:
        for lp in ph.loops:
            for st in lp.col:
                if isinstance(st, Let) and st.op == "exp" and st.attrs.get("shift"):
                    if st.attrs.get("local"):
                        out[st.attrs["shift"]] = None
                    elif st.attrs.get("rows"):
                        out[st.attrs["shift"]] = tuple(st.attrs["rows"])  # type: ignore[assignment]
    return out


def argument_chain(lp: Loop, exp: Let) -> list[Let]:
    """The column statements the exp's argument is computed from, in order."""
    lets = [st for st in lp.col if isinstance(st, Let)]
    need = set(exp.args)
    chain = []
    for st in reversed(lets[:lets.index(exp)]):
        if st.var in need:
            chain.append(st)
            need |= set(st.args)
    return chain[::-1]


def max_pass(lets: list[str], exp: Let, cols: tuple[str, str, str], pragma: list[str],
             group_max: list[str], guards: list[str],
             buffers: tuple[str, str] | None) -> list[str]:
    """Row lines before the column loop: the row max of the exp's argument (``lets``: the
    printed chain computing it at column c), then the shift m (and, for a running max, α and
    the row buffers' update)."""
    m, s = exp.attrs["shift"], exp.args[0]
    start, end, step = cols
    out = [f"// row max of {s}: {exp.var} = exp({s} - {m}) (softmax's max subtraction)"]
    if buffers is not None:  # read before the lanes combine (which orders it before the write)
        out.append(f"const float {m}_old = it == 0 ? -INFINITY : {buffers[0]}[r];")
    out += [f"float mx_{m} = -INFINITY;", *pragma,
            f"for (int c = {start}; c < {end}; {step}) {{",  # (a select vectorises)
            *("  " + ln for ln in lets), f"  mx_{m} = {s} > mx_{m} ? {s} : mx_{m};", "}",
            *group_max]
    if buffers is None:  # a whole row in this pass; an all -inf row keeps 0 (no inf - inf)
        return out + [f"const float {m} = mx_{m} == -INFINITY ? 0.0f : mx_{m};"]
    mbuf, abuf = buffers
    write = f"{{ {mbuf}[r] = {m}; {abuf}[r] = {m}_alpha; }}"
    conds = [*guards]
    return out + [f"const float {m}_hi = fmaxf({m}_old, mx_{m});",
                  f"const float {m} = {m}_hi == -INFINITY ? 0.0f : {m}_hi;",
                  f"const float {m}_alpha = it == 0 ? 0.0f : exp_f({m}_old - {m});",
                  f"if ({' && '.join(conds)}) {write}" if conds else write]


def scaled(st: Store, ref: str, shifts: dict[str, tuple[str, str] | None],
           local_alpha: set[str]) -> str | None:
    """``old·α + new`` for an accumulating store the shift rescales (None: a plain one)."""
    if not (st.accumulate and st.scale and shifts.get(st.scale)):
        return None
    buffers = shifts[st.scale]
    assert buffers is not None
    alpha = f"{st.scale}_alpha" if st.scale in local_alpha else f"{buffers[1]}[r]"
    return f"(it == 0 ? {st.var} : {ref} * {alpha} + {st.var})"
