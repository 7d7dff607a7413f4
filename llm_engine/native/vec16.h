// Sixteen floats as one value, over AVX-512, AVX2+FMA or plain loops, whichever the compiler targets:
// the kernels in decode.cpp are written once against these few operations.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace vec16 {

// The KV cache's half-precision element (torch.float16): GCC converts it with round-to-nearest-even,
// as torch does, in hardware where the target has F16C and in libgcc where it does not.
using half = _Float16;

// Weights stream through once per step; the hardware prefetcher alone kept a 133 MB int4 stream at ~12
// GB/s on the 2-core Xeon (25 GB/s is what plain reads get). Asking for the line this many bytes ahead
// of the one in use got ~21 GB/s (measured 512..8192: 4096 was best).
constexpr int kPrefetchBytes = 4096;
inline void prefetch(const char* p) { __builtin_prefetch(p + kPrefetchBytes, 0, 3); }

#if defined(__AVX512F__)
struct V {
    __m512 v;
};
inline V zero() { return {_mm512_setzero_ps()}; }
inline V set1(float s) { return {_mm512_set1_ps(s)}; }
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V load(const half* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline float sum(V a) { return _mm512_reduce_add_ps(a.v); }
// The sums of four vectors, once: out[i] = sum(a[i]) (a transposed add, not four horizontal ones).
inline __m256 fold(V a) { return _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1))); }
// 16 signed bytes -> 16 floats.
inline V from_i8(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
// e^x to ~1e-7 relative: x = n ln2 + r (|r| <= ln2 / 2), e^r by its Taylor series to degree 7, times 2^n.
inline V exp(V a) {
    const __m512 x = _mm512_max_ps(_mm512_min_ps(a.v, _mm512_set1_ps(88.f)), _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040);
    for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    return {_mm512_scalef_ps(p, n)};
}
// 16 bytes of two 4-bit codes each -> the 16 low nibbles and the 16 high nibbles as floats.
inline void nibbles(const uint8_t* p, V& low, V& high) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi8(0x0F);
    low.v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask)));
    high.v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask)));
}

#elif defined(__AVX2__) && defined(__FMA__)
struct V {
    __m256 a, b;
};
inline V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V set1(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
#if defined(__F16C__)
inline V load(const half* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
#else
inline V load(const half* p) {
    float f[16];
    for (int i = 0; i < 16; ++i) f[i] = (float)p[i];
    return load(f);
}
#endif
inline V mul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline V fma(V x, V y, V z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
inline V add(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline V sub(V x, V y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
inline float sum(V x) {
    const __m256 v = _mm256_add_ps(x.a, x.b);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline __m256 fold(V x) { return _mm256_add_ps(x.a, x.b); }
inline __m256 u8x8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline void store(float* p, V x) {
    _mm256_storeu_ps(p, x.a);
    _mm256_storeu_ps(p + 8, x.b);
}
// e^x to ~1e-7 relative, as the AVX-512 version, with 2^n built in the exponent bits.
inline __m256 exp8(__m256 a) {
    const __m256 x = _mm256_max_ps(_mm256_min_ps(a, _mm256_set1_ps(88.f)), _mm256_set1_ps(-87.f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.f / 5040);
    for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    // n in [-126, 127] after the clamp: (n + 127) << 23 is 2^n as float bits; the high half goes in two steps.
    const __m256i e = _mm256_cvtps_epi32(n);
    const __m256i e1 = _mm256_srai_epi32(e, 1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, e1), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
inline V exp(V x) { return {exp8(x.a), exp8(x.b)}; }
inline V from_i8(const int8_t* p) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)p);
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)))};
}
inline void nibbles(const uint8_t* p, V& low, V& high) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    low = {u8x8(lo), u8x8(_mm_srli_si128(lo, 8))};
    high = {u8x8(hi), u8x8(_mm_srli_si128(hi, 8))};
}

#else
struct V {
    float v[16];
};
inline V zero() { return V{}; }
inline V set1(float s) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = s;
    return r;
}
inline V load(const float* p) {
    V r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
}
inline V load(const half* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = (float)p[i];
    return r;
}
inline V mul(V a, V b) {
    for (int i = 0; i < 16; ++i) a.v[i] *= b.v[i];
    return a;
}
inline V fma(V a, V b, V c) {
    for (int i = 0; i < 16; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
}
inline V add(V a, V b) {
    for (int i = 0; i < 16; ++i) a.v[i] += b.v[i];
    return a;
}
inline V sub(V a, V b) {
    for (int i = 0; i < 16; ++i) a.v[i] -= b.v[i];
    return a;
}
inline float sum(V a) {
    float s = 0.f;
    for (int i = 0; i < 16; ++i) s += a.v[i];
    return s;
}
inline V from_i8(const int8_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = (float)p[i];
    return r;
}
inline void store(float* p, V a) { std::memcpy(p, a.v, sizeof a.v); }
inline void sum4(const V* a, float* out) {
    for (int i = 0; i < 4; ++i) out[i] = sum(a[i]);
}
inline V exp(V a) {
    for (int i = 0; i < 16; ++i) a.v[i] = std::exp(a.v[i]);
    return a;
}
inline void nibbles(const uint8_t* p, V& low, V& high) {
    for (int i = 0; i < 16; ++i) {
        low.v[i] = (float)(p[i] & 0x0F);
        high.v[i] = (float)(p[i] >> 4);
    }
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// out[i] = sum(a[i]) for four vectors at once: each folded to eight floats, then transposed and added, so
// the shuffles are shared (a quarter of four horizontal sums' work).
inline void sum4(const V* a, float* out) {
    const __m256 b0 = fold(a[0]), b1 = fold(a[1]), b2 = fold(a[2]), b3 = fold(a[3]);
    const __m256 u01 = _mm256_add_ps(_mm256_unpacklo_ps(b0, b1), _mm256_unpackhi_ps(b0, b1));
    const __m256 u23 = _mm256_add_ps(_mm256_unpacklo_ps(b2, b3), _mm256_unpackhi_ps(b2, b3));
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x44), _mm256_shuffle_ps(u01, u23, 0xEE));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1)));
}
#endif

// The int8 KV cache's codes, read like the other element types.
inline V load(const int8_t* p) { return from_i8(p); }

// v[i] = e^v[i], sixteen at a time.
inline void exp_inplace(float* v, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) store(v + i, exp(load(v + i)));
    for (; i < n; ++i) v[i] = std::exp(v[i]);
}

}  // namespace vec16
