"""One C-style renderer, two dialects: CUDA and C++ with OpenMP.

Both dialects are ``cstyle.CStyle`` with a handful of hooks overridden (types, conversions,
kernel signature, how blocks are walked, synchronisation, combining a row's lanes), in the
spirit of tinygrad's CStyleLanguage: there is one code generator, not two.  ``render(plan)``
prints a plan in the dialect of its device; any plan prints in either dialect correctly,
because block work is written as loops strided by the thread index.
"""

from __future__ import annotations

from .cstyle import CStyle
from .plan import Kernel, KernelPlan, Loop

GROUP_SUM = """template <int L> __device__ __forceinline__ float group_sum(float v, float* red) {
  // sum over the L lanes of a thread group: shuffles inside a warp, shared memory across warps
#pragma unroll
  for (int o = (L < 32 ? L : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (L <= 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int first = (threadIdx.x / L) * (L / 32);
  float s = 0.0f;
  for (int q = 0; q < L / 32; ++q) s += red[first + q];
  return s;
}"""
GRID_BARRIER = """__device__ void grid_barrier(unsigned int* bar, unsigned int blocks) {
  // every block is resident (the plan keeps the grid within one wave): count arrivals in
  // bar[0], release by bumping the generation in bar[1]; reusable, counters start at zero
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* gen = bar + 1;
    const unsigned int seen = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == blocks - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == seen) { }
    }
    __threadfence();
  }
  __syncthreads();
}"""
EXP_F = """static inline float exp_f(float x) {
  // e^x = 2^n * e^r with |r| <= ln2/2 and e^r a degree-7 polynomial (about 1 ulp). No libm
  // call and no float-to-int conversion, so `omp simd` loops vectorise it without -ffast-math:
  // adding 1.5 * 2^23 rounds x*log2(e) to the integer n, which then sits in the low mantissa
  // bits. 2^n is applied in two halves, so overflow gives inf and underflow gives denormals.
  x = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  int k;
  memcpy(&k, &t, 4);
  k -= 0x4B400000;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int k1 = k >> 1, k2 = k - k1;
  const int e1 = (k1 + 127) << 23, e2 = (k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &e1, 4);
  memcpy(&s2, &e2, 4);
  return p * s1 * s2;
}"""
PARALLEL_MIN_WORK = 1 << 18  # below this, forking threads costs more than it saves
CUDA_TYPES = {"float16": ("half", "__half2float", "__float2half"),
              "bfloat16": ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16")}


class CudaDialect(CStyle):
    """CUDA: blocks are CUDA blocks, rows of a tile over thread groups, sums by shuffles."""

    name = "cuda"
    fn_prefix = "__device__ __forceinline__"

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        lines = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
                 f"{self.fn_prefix} float exp_f(float x) {{ return expf(x); }}",
                 *super().prelude(plans), GROUP_SUM]
        return lines + ([GRID_BARRIER] if any(p.barriers for p in plans) else [])

    def ctype(self, dtype: str) -> str:
        return CUDA_TYPES[dtype][0] if dtype in CUDA_TYPES else "float"

    def load(self, expr: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][1]}({expr})" if dtype in CUDA_TYPES else expr

    def convert(self, value: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][2]}({value})" if dtype in CUDA_TYPES else value

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [self._param(k, plan, p) for p in params]
        sig += ["float* __restrict__ ws", "unsigned int* __restrict__ bar"]
        lines = [f'extern "C" __global__ void __launch_bounds__({k.mapping.threads}) '
                 f"{k.name}({', '.join(sig)}) {{", "  const int tid = threadIdx.x;"]
        if k.smem_bytes:
            lines.append(f"  __shared__ __align__(16) float smem[{-(-k.smem_bytes // 4)}];")
        if "red" in k.buffers:
            lines.append(f"  float* const red = smem + {k.buffers['red'].offset // 4};")
        return lines

    def _param(self, k: Kernel, plan: KernelPlan, p: str) -> str:
        b = plan.globals[p]
        return f"{'const ' if b.role == 'input' else ''}{self.ctype(b.dtype)}* __restrict__ {p}"

    def work_loop(self, k: Kernel) -> list[str]:
        return [f"for (int w = blockIdx.x; w < {k.items}; w += gridDim.x) {{"]

    def block_sync(self) -> list[str]:
        return ["__syncthreads();"]

    def grid_sync(self, k: Kernel) -> list[str]:
        return [f"grid_barrier(bar + {2 * k.barrier_index}, gridDim.x);"]

    def group_sum(self, var: str, lanes: int) -> list[str]:
        if lanes == 1:
            return []
        red = "red" if "red" in self._k.buffers else "nullptr"
        return [f"{var} = group_sum<{lanes}>({var}, {red});"]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = [f"// launches, in order (workspace: {plan.workspace_floats} floats; bar: "
                 f"{2 * plan.barriers} zeroed unsigned ints):"]
        for k in plan.kernels:
            lines.append(f"//   {k.name}<<<{k.blocks}, {k.mapping.threads}>>>"
                         f"({', '.join(k.params)}, ws, bar)")
        return lines


class CppDialect(CStyle):
    """C++/OpenMP: a block runs on one thread (every stride is 1); blocks are an omp for."""

    name = "cpp"
    matmul_by_rows = True

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        return ["#include <math.h>", "#include <stdlib.h>", "#include <string.h>", EXP_F,
                *super().prelude(plans)]

    def threads(self, k: Kernel) -> int:
        return 1

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [f"{'const ' if plan.globals[p].role == 'input' else ''}float* __restrict__ {p}"
               for p in params] + ["float* __restrict__ ws"]
        work = k.vblocks * sum(lp.rows * lp.cols for ph in k.phases for lp in ph.loops)
        lines = [f"static void {k.name}({', '.join(sig)}) {{",
                 f"#pragma omp parallel if({work} >= {PARALLEL_MIN_WORK})  // ~elements touched",
                 "{"]
        if k.smem_bytes:
            size = -(-k.smem_bytes // 64) * 64
            lines.append(f"  float* const smem = static_cast<float*>(aligned_alloc(64, {size}));"
                         "  // this thread's \"shared memory\"")
        return lines

    def kernel_close(self, k: Kernel) -> list[str]:
        return (["  free(smem);"] if k.smem_bytes else []) + ["}", "}"]

    def work_loop(self, k: Kernel) -> list[str]:
        return ["#pragma omp for schedule(static)", f"for (int w = 0; w < {k.items}; ++w) {{"]

    def grid_sync(self, k: Kernel) -> list[str]:
        return ["// grid barrier: the implicit barrier at the end of the omp for above"]

    def col_pragma(self, lp: Loop | None, accs: list[str]) -> list[str]:
        return ["#pragma omp simd" + (f" reduction(+:{', '.join(accs)})" if accs else "")]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = ['extern "C" void kernel(float** inputs, float** outputs) {']
        if plan.workspace_floats:
            size = -(-plan.workspace_floats * 4 // 64) * 64
            lines.append(f"  static float* const ws = static_cast<float*>(aligned_alloc(64, "
                         f"{size}));  // workspace, allocated once")
        else:
            lines.append("  float* const ws = nullptr;")
        for k in plan.kernels:
            args = [f"{'inputs' if plan.globals[p].role == 'input' else 'outputs'}"
                    f"[{plan.globals[p].io_index}]" for p in k.params] + ["ws"]
            lines.append(f"  {k.name}({', '.join(args)});")
        return lines + ["}"]


DIALECTS: dict[str, type[CStyle]] = {"cuda": CudaDialect, "cpp": CppDialect}


def render(plan: KernelPlan | list[KernelPlan], dialect: str | None = None) -> str:
    """Source for ``plan`` in ``dialect`` ('cuda' or 'cpp'; default: the plan's device kind)."""
    first = plan[0] if isinstance(plan, list) else plan
    dialect = dialect or ("cpp" if first.device_kind == "cpu" else "cuda")
    if dialect not in DIALECTS:
        raise ValueError(f"render: unknown dialect {dialect!r}; use one of {sorted(DIALECTS)}")
    return DIALECTS[dialect]().render(plan)
