"""C++ text the cpp dialect puts before its kernels: the vectorisable exp, the register-tiled
matmul rows and the non-temporal row copy (``render.CppDialect.prelude``).

Kept apart from the printer because it is C++, not Python logic; every function is
``static inline`` so a kernel that does not call one pays nothing for it.
"""

EXP_F = """static inline float exp_f(float x) {
  // e^x = 2^n * e^r with n = round(x / ln2), |r| <= ln2/2 and e^r a degree-5 polynomial
  // (within 3 ulp). No libm call and no float-to-int conversion, so `omp simd` loops
  // vectorise it without -ffast-math: adding 1.5 * 2^23 rounds x*log2(e) to n, which then
  // sits in the low mantissa bits. x is clamped to [-87.5, 89] on its bit pattern (integer
  // min/max: a float ternary made GCC duplicate the tail per case with masks), so results
  // below ~1.7e-38 are 0, above FLT_MAX inf, and NaN is passed through by a select on bits
  // (`x != x ? x : v` became a branch that kept GCC from vectorising the loop at all without
  // AVX-512 masks: 2.1 ns an exp with AVX2, 3.8 with SSE4.2; 0.30 and 0.90 branch-free).
  unsigned u;
  memcpy(&u, &x, 4);
  u = (int)u > 0x42B20000 ? 0x42B20000u : u;  // x > 89 -> 89
  u = u > 0xC2AF0000u ? 0xC2AF0000u : u;      // x < -87.5 -> -87.5
  float y;
  memcpy(&y, &u, 4);
  const float t = y * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  int k;
  memcpy(&k, &t, 4);
  float r = y - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  // 2 e^r (minimax for relative error), times 2^(n-1): n = 128 still has an exponent field
  float p = 1.6625050455331802e-2f;
  p = p * r + 8.3780229091644287e-2f;
  p = p * r + 3.3334228396415710e-1f;
  p = p * r + 9.9998462200164795e-1f;
  p = p * r + 2.0f;
  p = p * r + 2.0f;
  const int e = (k - 0x4B400000 + 126) << 23;
  float s;
  memcpy(&s, &e, 4);
  const float v = p * s;
  unsigned vb;
  memcpy(&vb, &v, 4);
  memcpy(&u, &x, 4);
  const unsigned nan = 0u - (unsigned)((u & 0x7fffffffu) > 0x7f800000u);  // ~0 when x is NaN
  vb ^= (vb ^ u) & nan;
  float out;
  memcpy(&out, &vb, 4);
  return out;
}"""
# the register-tiled matmul routines a loop with Loop.tile_rows calls (mm_rows<R>, R printed
# from the lowering's choice): C text only, no number here is one the lowering decides
MATMUL_REGISTER_TILES = """// TUNER_CB(R): vectors of columns per register tile of R rows, R x CB accumulators within the
// vector registers (32 with AVX-512, 16 otherwise); 8 x 4 on AVX-512 spills a few
// accumulators to L1 and still beat 8 x 2 and 8 x 3 (gated_mlp 8.9 vs 9.9 and 10.4 ms); with
// AVX2 an 8-row tile (only where B streams from memory: else 6 rows) takes 2 vectors, a whole
// cache line of B per row, spilling 2 accumulators (gated_mlp, Zen 3, 2 threads: 15-21 ms
// against 21-25 for 8 x 1)
#if defined(__AVX512F__)
#define TUNER_VL 16
#define TUNER_CB(R) 4
#elif defined(__AVX__)
#define TUNER_VL 8
#define TUNER_CB(R) 2
#else
#define TUNER_VL 4
#define TUNER_CB(R) ((R) <= 6 ? 2 : 1)
#endif
typedef float tuner_vf __attribute__((vector_size(TUNER_VL * 4)));
template <int R, int CB>
static inline void mm_tile(const float* const* a, const int sa, const float* __restrict__ b,
                           const int sb, const int kn, float* __restrict__ m, const int ldm,
                           const int c0, const long pf) {
  // R rows x CB vectors of columns kept in registers over the whole k loop: every vector of
  // b loaded feeds R fused multiply-adds (GCC vector extensions: the ISA of -march=native).
  // pf != 0: b + pf is fetched into L2 now (rows further down B, or the same tile of the
  // next for-loop iteration); the hardware prefetchers do not follow a walk down rows
  // thousands of floats apart
  tuner_vf acc[R][CB];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) acc[q][j] = tuner_vf{};
  for (int k = 0; k < kn; ++k) {
    const float* bk = b + k * sb + c0;
    if (pf)
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) __builtin_prefetch(bk + pf + j * TUNER_VL, 0, 1);
    tuner_vf bv[CB];
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) memcpy(&bv[j], bk + j * TUNER_VL, sizeof(tuner_vf));
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      const float s = a[q][k * sa];
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) acc[q][j] += s * bv[j];
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) memcpy(m + q * ldm + c0 + j * TUNER_VL, &acc[q][j], sizeof(tuner_vf));
}
template <int R>
static inline void mm_rows(const float* const* a, const int sa, const float* __restrict__ b,
                           const int sb, const int kn, const int n, float* __restrict__ m,
                           const long pf) {
  // m[q * n + c] = sum_k a[q][k * sa] * b[k * sb + c] for q < R, c < n
  int c = 0;
  for (; c + TUNER_CB(R) * TUNER_VL <= n; c += TUNER_CB(R) * TUNER_VL)
    mm_tile<R, TUNER_CB(R)>(a, sa, b, sb, kn, m, n, c, pf);
  for (; c + TUNER_VL <= n; c += TUNER_VL) mm_tile<R, 1>(a, sa, b, sb, kn, m, n, c, pf);
  for (; c < n; ++c)
    for (int q = 0; q < R; ++q) {
      float s = 0.0f;
      for (int k = 0; k < kn; ++k) s += a[q][k * sa] * b[k * sb + c];
      m[q * n + c] = s;
    }
}
template <int R>
static inline void mm_rows_n(const int nr, const float* const* a, const int sa,
                             const float* __restrict__ b, const int sb, const int kn,
                             const int n, float* __restrict__ m, const long pf) {
  // the first nr <= R rows: the shorter last tile of a loop whose rows R does not divide
  if (nr >= R) mm_rows<R>(a, sa, b, sb, kn, n, m, pf);
  else if constexpr (R > 1) mm_rows_n<R - 1>(nr, a, sa, b, sb, kn, n, m, pf);
}
static inline void pack_rows(float* __restrict__ dst, const float* __restrict__ src,
                             const int rows, const int n, const long stride) {
  // rows of n floats, stride apart, laid end to end (a B tile made contiguous)
  for (int k = 0; k < rows; ++k) {
#pragma omp simd
    for (int c = 0; c < n; ++c) dst[k * n + c] = src[k * stride + c];
  }
}"""
LANE_SUM = """typedef float tuner_v8 __attribute__((vector_size(32)));
typedef float tuner_v4 __attribute__((vector_size(16)));
static inline float lane_sum(const float* p) {
  // the TUNER_VL lane partials of a row sum, added by vector halves: a loop over the halves
  // or an unrolled scalar tree both came out as ~30 shuffles and adds per row in GCC 12
#if TUNER_VL >= 16
  tuner_v8 a, b;
  memcpy(&a, p, 32);
  memcpy(&b, p + 8, 32);
  a += b;
#elif TUNER_VL >= 8
  tuner_v8 a;
  memcpy(&a, p, 32);
#endif
#if TUNER_VL >= 8
  tuner_v4 c, d;
  memcpy(&c, &a, 16);
  memcpy(&d, reinterpret_cast<const float*>(&a) + 4, 16);
  c += d;
#else
  tuner_v4 c;
  memcpy(&c, p, 16);
#endif
  return (c[0] + c[2]) + (c[1] + c[3]);
}"""
STREAM_ROW = """#include <stdint.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
static inline void stream_row(float* __restrict__ dst, const float* __restrict__ src, const int n) {
  // copy a row written once into its output with non-temporal stores: no read for ownership
  // of the output lines and no eviction of the inputs; the unaligned head and the tail are
  // ordinary stores
  int i = 0;
#if defined(__SSE2__)
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 63); ++i) dst[i] = src[i];
#endif
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#elif defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}
static inline void stream_fence() {
  // non-temporal stores are weakly ordered: fence them before other threads may read
#if defined(__SSE2__)
  _mm_sfence();
#endif
}"""
