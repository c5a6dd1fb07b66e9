"""The CUDA dialect: blocks are CUDA blocks, rows of a tile over thread groups, sums by
shuffles (and shared memory across warps), phases joined by a grid barrier."""

from __future__ import annotations

from kernels.lowering import Kernel, KernelPlan

from ._cshift import GROUP_MAX
from ._cstyle import CStyle

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
CUDA_TYPES = {"float16": ("half", "__half2float", "__float2half"),
              "bfloat16": ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16")}


class CudaDialect(CStyle):
    """CUDA: blocks are CUDA blocks, rows of a tile over thread groups, sums by shuffles."""

    name = "cuda"
    fn_prefix = "__device__ __forceinline__"
    scratch_qualifier = ""  # threads of a block share tiles: no __restrict__ (see CStyle)

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        # NVRTC compiles without <math.h>: the max pass's -INFINITY needs its own definition
        lines = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
                 "#ifndef INFINITY", "#define INFINITY __int_as_float(0x7f800000)", "#endif",
                 f"{self.fn_prefix} float exp_f(float x) {{ return expf(x); }}",
                 *super().prelude(plans), GROUP_SUM, GROUP_MAX]
        return lines + ([GRID_BARRIER] if any(p.barriers for p in plans) else [])

    def ctype(self, dtype: str) -> str:
        return CUDA_TYPES[dtype][0] if dtype in CUDA_TYPES else "float"

    def load(self, expr: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][1]}({expr})" if dtype in CUDA_TYPES else expr

    def convert(self, value: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][2]}({value})" if dtype in CUDA_TYPES else value

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [self._param(k, plan, p) for p in params]
        sig += ["float* ws", "unsigned int* bar"]  # shared by the threads: not restrict
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

    def group_max(self, var: str, lanes: int) -> list[str]:
        if lanes == 1:
            return []
        red = "red" if "red" in self._k.buffers else "nullptr"
        return [f"{var} = group_max<{lanes}>({var}, {red});"]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = [f"// launches, in order (workspace: {plan.workspace_floats} floats; bar: "
                 f"{2 * plan.barriers} zeroed unsigned ints):"]
        for k in plan.kernels:
            lines.append(f"//   {k.name}<<<{k.blocks}, {k.mapping.threads}>>>"
                         f"({', '.join(k.params)}, ws, bar)")
        return lines
