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
typedef uint16_t tuner_vh __attribute__((vector_size(TUNER_VL * 2)));
typedef uint32_t tuner_vu __attribute__((vector_size(TUNER_VL * 4)));
static inline tuner_vf load_vf(const float* p) {
  tuner_vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline tuner_vf load_vf(const tuner_f16* p) {
  // TUNER_VL halves to floats: vcvtph2ps where the ISA has it
#if TUNER_VL == 16
  return (tuner_vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif TUNER_VL == 8 && defined(__F16C__)
  return (tuner_vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  tuner_vf v;
  for (int l = 0; l < TUNER_VL; ++l) v[l] = to_f(p[l]);
  return v;
#endif
}
static inline tuner_vf load_vf(const tuner_bf16* p) {
  tuner_vh h;
  memcpy(&h, p, sizeof h);
  const tuner_vu u = __builtin_convertvector(h, tuner_vu) << 16;
  tuner_vf v;
  memcpy(&v, &u, sizeof v);
  return v;
}
template <int R, int CB, typename TA, typename TB>
static inline void mm_tile(const TA* const* a, const int sa, const TB* __restrict__ b,
                           const int sb, const int kn, float* __restrict__ m, const int ldm,
                           const int c0, const long pf) {
  // R rows x CB vectors of columns kept in registers over the whole k loop: every vector of
  // b loaded feeds R fused multiply-adds (GCC vector extensions: the ISA of -march=native).
  // pf != 0: b + pf is fetched into L2 now (rows further down B, or the same tile of the
  // next for-loop iteration); the hardware prefetchers do not follow a walk down rows
  // thousands of floats apart. One prefetch per vector, and one of the segment's last
  // element: on a numpy array (16 bytes past a cache line) the segment touches one line more
  // than its vectors start on, and that line was a demand miss every row (AVX-512 EPYC:
  // gated_mlp 6.1 -> 3.4 ms, rmsnorm_matmul 3.1 -> 1.9; aligned inputs unchanged).
  // TA, TB: float, or half storage (to_f / load_vf convert)
  tuner_vf acc[R][CB];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) acc[q][j] = tuner_vf{};
  for (int k = 0; k < kn; ++k) {
    const TB* bk = b + k * sb + c0;
    if (pf) {
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) __builtin_prefetch(bk + pf + j * TUNER_VL, 0, 1);
      __builtin_prefetch(bk + pf + CB * TUNER_VL - 1, 0, 1);
    }
    tuner_vf bv[CB];
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) bv[j] = load_vf(bk + j * TUNER_VL);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      const float s = to_f1(a[q][k * sa]);
#pragma GCC unroll 8
      for (int j = 0; j < CB; ++j) acc[q][j] += s * bv[j];
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CB; ++j) memcpy(m + q * ldm + c0 + j * TUNER_VL, &acc[q][j], sizeof(tuner_vf));
}
template <int R, typename TA, typename TB>
static inline void mm_rows(const TA* const* a, const int sa, const TB* __restrict__ b,
                           const int sb, const int kn, const int n, float* __restrict__ m,
                           const long pf) {
  // m[q * n + c] = sum_k a[q][k * sa] * b[k * sb + c] for q < R, c < n
  // half rows of A (a float16 X) are converted to float once here, not once per column tile
  // and k step: 8 scalar conversions a step beside B's 2 vectors kept an AVX2 8-row tile
  // issue-bound (AMD EPYC Zen 3: gated_mlp 9.4 -> 8.0 ms, lora 0.79 -> 0.63, gqa 7.4 ->
  // 6.1); with 2 rows it measured 5% slower (rmsnorm_matmul), so few rows read them as stored
  if constexpr (!__is_same(TA, float)) {
    if (R >= 4 && R * kn <= 4096) {  // at most 16 KB of stack
      alignas(64) float af[4096];
      const float* ar[R];
      for (int q = 0; q < R; ++q) {
        int k = 0;
        if (sa == 1)
          for (; k + TUNER_VL <= kn; k += TUNER_VL) {
            const tuner_vf v = load_vf(a[q] + k);
            memcpy(af + q * kn + k, &v, sizeof v);
          }
        for (; k < kn; ++k) af[q * kn + k] = to_f1(a[q][k * sa]);
        ar[q] = af + q * kn;
      }
      mm_rows<R>(ar, 1, b, sb, kn, n, m, pf);
      return;
    }
  }
  int c = 0;
  for (; c + TUNER_CB(R) * TUNER_VL <= n; c += TUNER_CB(R) * TUNER_VL)
    mm_tile<R, TUNER_CB(R)>(a, sa, b, sb, kn, m, n, c, pf);
  for (; c + TUNER_VL <= n; c += TUNER_VL) mm_tile<R, 1>(a, sa, b, sb, kn, m, n, c, pf);
  for (; c < n; ++c)
    for (int q = 0; q < R; ++q) {
      float s = 0.0f;
      for (int k = 0; k < kn; ++k) s += to_f(a[q][k * sa]) * to_f(b[k * sb + c]);
      m[q * n + c] = s;
    }
}
template <int R, typename TA, typename TB>
static inline void mm_rows_n(const int nr, const TA* const* a, const int sa,
                             const TB* __restrict__ b, const int sb, const int kn,
                             const int n, float* __restrict__ m, const long pf) {
  // the first nr <= R rows: the shorter last tile of a loop whose rows R does not divide
  if (nr >= R) mm_rows<R>(a, sa, b, sb, kn, n, m, pf);
  else if constexpr (R > 1) mm_rows_n<R - 1>(nr, a, sa, b, sb, kn, n, m, pf);
}
template <typename TS>
static inline void pack_rows(float* __restrict__ dst, const TS* __restrict__ src,
                             const int rows, const int n, const long stride) {
  // rows of n floats, stride apart, laid end to end (a B tile made contiguous)
  for (int k = 0; k < rows; ++k) {
#pragma omp simd
    for (int c = 0; c < n; ++c) dst[k * n + c] = to_f(src[k * stride + c]);
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
# the register tiles of a matmul whose B is stored transposed (a Linear's weight, [N, K] in
# memory): mm_rows_t<R>, printed after LANE_SUM, which it ends each dot product with
MATMUL_TRANSPOSED_TILES = """// TUNER_CT: columns per transposed tile (rows of the stored B), R x CT accumulators: 4 x 4 of
// the 32 AVX-512 registers with 4 + 4 loads, 4 x 2 of 16 otherwise
#if defined(__AVX512F__)
#define TUNER_CT 4
#elif defined(__AVX__)
#define TUNER_CT 2
#else
#define TUNER_CT 1
#endif
// a register's lanes added by vector halves, the value never leaving registers: lane_sum's
// memcpy from an accumulator's address made GCC 12 keep all of a tile's accumulators in
// memory (a load and a store around every FMA); GCC < 12 lacks __builtin_shufflevector
#if defined(__clang__) || __GNUC__ >= 12
static inline float lane_sum_v(const tuner_vf x) {
#if TUNER_VL == 16
  const tuner_v8 s8 = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
#elif TUNER_VL == 8
  const tuner_v8 s8 = x;
#endif
#if TUNER_VL >= 8
  const tuner_v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) +
                      __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
#else
  const tuner_v4 s4 = x;
#endif
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
#else
static inline float lane_sum_v(const tuner_vf x) {
  alignas(64) float lanes[TUNER_VL];
  memcpy(lanes, &x, sizeof lanes);
  return lane_sum(lanes);
}
#endif
// an empty asm that "changes" v: GCC 12 otherwise reloads each A and B vector of the tile at
// every FMA that uses it (16 loads a step more for 4 x 4, the loop load-bound); here each is
// loaded once into a register (AVX-512 EPYC, 16 x 512 x 1376: 350 -> 117 us with the above)
#define TUNER_IN_REGISTER(v) __asm__("" : "+v"(v))
template <int R, int CT, typename TA, typename TB>
static inline void mm_tile_t(const TA* const* a, const TB* __restrict__ b, const long ldb,
                             const int kn, float* __restrict__ m, const int ldm, const int c0) {
  // m[q * ldm + c0 + j] = sum_k a[q][k] * b[(c0 + j) * ldb + k] for q < R, j < CT: both
  // operands run along k in memory, so a dot product per (row, column) in vector lanes,
  // summed across the lanes once at the end; every element of B is loaded once per tile
  // of rows (a decode-shape X @ W.t() reads W once: a GEMV at memory speed)
  tuner_vf acc[R][CT];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CT; ++j) acc[q][j] = tuner_vf{};
  int k = 0;
  for (; k + TUNER_VL <= kn; k += TUNER_VL) {
    tuner_vf bv[CT];
#pragma GCC unroll 8
    for (int j = 0; j < CT; ++j) {
      bv[j] = load_vf(b + (c0 + j) * ldb + k);
      TUNER_IN_REGISTER(bv[j]);
    }
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      tuner_vf av = load_vf(a[q] + k);
      TUNER_IN_REGISTER(av);
#pragma GCC unroll 8
      for (int j = 0; j < CT; ++j) acc[q][j] += av * bv[j];
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < CT; ++j) {
      float s = lane_sum_v(acc[q][j]);
      for (int kk = k; kk < kn; ++kk) s += to_f(a[q][kk]) * to_f(b[(c0 + j) * ldb + kk]);
      m[q * ldm + c0 + j] = s;
    }
}
template <int R, typename TA, typename TB>
static inline void mm_rows_t(const TA* const* a, const TB* __restrict__ b, const long ldb,
                             const int kn, const int n, float* __restrict__ m) {
  // m[q * n + c] = sum_k a[q][k] * b[c * ldb + k] for q < R, c < n
  int c = 0;
  for (; c + TUNER_CT <= n; c += TUNER_CT) mm_tile_t<R, TUNER_CT>(a, b, ldb, kn, m, n, c);
  for (; c < n; ++c) mm_tile_t<R, 1>(a, b, ldb, kn, m, n, c);
}
template <int R, typename TA, typename TB>
static inline void mm_rows_t_n(const int nr, const TA* const* a, const TB* __restrict__ b,
                               const long ldb, const int kn, const int n, float* __restrict__ m) {
  // the first nr <= R rows (the shorter last tile)
  if (nr >= R) mm_rows_t<R>(a, b, ldb, kn, n, m);
  else if constexpr (R > 1) mm_rows_t_n<R - 1>(nr, a, b, ldb, kn, n, m);
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

# Half-precision storage, read and written by the kernels as it is: every value is converted
# on load and computed in float32.  Both dtypes are 16-bit integer types holding the bits
# (float16 uint16_t, bfloat16 char16_t: two distinct types, so to_f / load_vf overload on
# them).  Not _Float16: GCC 12 vectorises no loop that loads one beside float32 values ("no
# vectype"; ntrans in float16 ran 8-15x slower than in float32), whereas 16-bit integer loads
# widen in any vector loop.  So the scalar conversions are integer and float arithmetic that
# `omp simd` loops vectorise on any ISA (float16: the exponent rebiased by one multiply, which
# also renormalises subnormals; rounding back to nearest even as in ryg's
# float_to_half_fast3_rtne; bfloat16 a 16-bit shift, rounding to nearest even on the bits as
# kernels.devices.to_storage does), and a register-tiled matmul's B vector is converted by
# the ISA's own instruction (vcvtph2ps: AVX-512F, or F16C with AVX2).
HALF = """#include <stdint.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
typedef uint16_t tuner_f16;   // float16 storage: its bits
typedef char16_t tuner_bf16;  // bfloat16 storage: the upper half of a float32's bits
static inline float to_f(float x) { return x; }
static inline float to_f(tuner_f16 h) {
  // sign-extended, shifted and masked: the half's sign, exponent and mantissa where a float
  // keeps them; one multiply rebiases the exponent (15 -> 127) and normalises subnormals
  uint32_t u = ((uint32_t)(int32_t)(int16_t)h << 13) & 0x8fffe000u;
  // inf and NaN; a mask, not a ternary, which GCC made a branch (and no vector loop) on AVX2
  const uint32_t special = (0u - (uint32_t)((u & 0x0f800000u) == 0x0f800000u)) & 0x7f800000u;
  float f;
  memcpy(&f, &u, 4);
  f *= 0x1p112f;
  memcpy(&u, &f, 4);
  u |= special;
  memcpy(&f, &u, 4);
  return f;
}
static inline float to_f(tuner_bf16 h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float to_f1(float x) { return x; }
static inline float to_f1(tuner_bf16 x) { return to_f(x); }
static inline float to_f1(tuner_f16 h) {
  // one value outside a vectorised loop (a matmul's A element): F16C's scalar conversion
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return to_f(h);
#endif
}
static inline tuner_f16 to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  float t;
  memcpy(&t, &x, 4);
  t += 0.5f;  // below 2^-14: the float adder rounds the subnormal half's bits into place
  uint32_t sub;
  memcpy(&sub, &t, 4);
  sub -= 0x3f000000u;
  const uint32_t norm = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;  // rebias, round to even
  // the cases chosen by masks (ternaries became branches on AVX2: no vector loop)
  const uint32_t tiny = 0u - (uint32_t)(x < 0x38800000u);
  const uint32_t big = 0u - (uint32_t)(x >= 0x47800000u);  // overflow: inf; NaN: a quiet NaN
  const uint32_t special = 0x7c00u | ((0u - (uint32_t)(x > 0x7f800000u)) & 0x0200u);
  const uint32_t o = (((sub & tiny) | (norm & ~tiny)) & ~big) | (special & big);
  return (tuner_f16)(o | sign);
}
static inline tuner_bf16 to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (tuner_bf16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}"""

# the C type of each half storage dtype and its conversion from float32 on store
CPP_TYPES = {"float16": ("tuner_f16", "to_f16"), "bfloat16": ("tuner_bf16", "to_bf16")}
