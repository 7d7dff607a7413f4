// Int8 x int8 dot products with AVX-512 VNNI for the int8 layers (per-channel scales: GGUF's Q8_0, Q5_0 and Q6_K
// tensors as the engine keeps them): one vpdpbusd multiplies 64 weight codes by 64 input bytes, where the float
// kernel converts sixteen codes to floats and spends one FMA per input row on them. At one row both read the same
// bytes (Qwen2.5-0.5B's step 24 ms either way); with more rows the float kernel is compute-bound: a 16-row batched
// step of the 0.5B took 223 ms, 140 with this one (bench/native_chunks.py).
//
// The input keeps ~16 bits as in int4_vnni.h: per 32-wide block hi = round(x/s), lo = round((x - hi*s) * 256/s),
// dot = (codes.hi << 8) + codes.lo exactly in int32. vpdpbusd takes unsigned x signed bytes, so the weight's sign
// moves onto the input (|w| . (x signed as w)), as llama.cpp's AVX2 path does with maddubs: codes are in
// [-127, 127] and so are the input's parts, so neither side overflows a byte.
//
// Layout: natural order. Per 64 inputs, 16 lanes of the block scale (lanes 0-7: the first block, 8-15: the second,
// where a 64-byte load's products land) in dx.
#pragma once
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>

#include "vec16.h"

namespace int8_vnni {

inline bool fits(int k) { return k % 64 == 0; }

// x [rows, k] -> hi, lo [rows, k] int8 (natural order) and dx [rows, k / 64, 16]: each lane's block scale of the lo unit.
inline void prepare(int rows, int k, const float* x, int8_t* hi, int8_t* lo, float* dx) {
    const __m512 lim = _mm512_set1_ps(127.f);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const int chunks = k / 64;
    for (int b = 0; b < rows; ++b)
        for (int c = 0; c < chunks; ++c) {
            const size_t at = (size_t)b * k + (size_t)c * 64, lanes = ((size_t)b * chunks + c) * 16;
            for (int h = 0; h < 2; ++h) {  // the chunk's two blocks of 32
                const __m512 x0 = _mm512_loadu_ps(x + at + h * 32), x1 = _mm512_loadu_ps(x + at + h * 32 + 16);
                const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
                const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
                for (int half = 0; half < 2; ++half) {
                    const __m512 v = _mm512_mul_ps(half ? x1 : x0, inv);
                    const __m512 top = _mm512_roundscale_ps(v, kNearest);
                    __m512 rest = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, top), _mm512_set1_ps(256.f)), kNearest);
                    rest = _mm512_max_ps(_mm512_min_ps(rest, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
                    const size_t to = at + h * 32 + half * 16;
                    _mm_storeu_si128((__m128i*)(hi + to), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(top)));
                    _mm_storeu_si128((__m128i*)(lo + to), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rest)));
                }
                for (int i = 0; i < 8; ++i) dx[lanes + h * 8 + i] = amax / 127.f / 256.f;
            }
        }
}

// Output row j (codes w [k], its scale) for R prepared inputs, A independent accumulators per input.
template <int R, int A>
void rows(const int8_t* w, float scale, int k, const int8_t* hi, const int8_t* lo, const float* dx, float* out) {
    const int chunks = k / 64;
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = _mm512_setzero_ps();
    auto chunk = [&](int c, int a) {
        vec16::prefetch((const char*)(w + (size_t)(c + 2) * 64));
        const __m512i wv = _mm512_loadu_si512(w + (size_t)c * 64);
        const __m512i mag = _mm512_abs_epi8(wv);
        const __mmask64 neg = _mm512_movepi8_mask(wv);
#pragma GCC unroll 16
        for (int b = 0; b < R; ++b) {
            const size_t at = (size_t)b * k + (size_t)c * 64;
            const __m512i h = _mm512_loadu_si512(hi + at), l = _mm512_loadu_si512(lo + at);
            __m512i dot = _mm512_dpbusd_epi32(zero, mag, _mm512_mask_sub_epi8(h, neg, zero, h));
            dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), mag, _mm512_mask_sub_epi8(l, neg, zero, l));
            acc[b][a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_loadu_ps(dx + ((size_t)b * chunks + c) * 16), acc[b][a]);
        }
    };
    int c = 0;
    for (; c + A <= chunks; c += A) {
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) chunk(c + a, a);
    }
    for (; c < chunks; ++c) chunk(c, 0);
    for (int b = 0; b < R; ++b) {
        __m512 total = acc[b][0];
        for (int a = 1; a < A; ++a) total = _mm512_add_ps(total, acc[b][a]);
        out[b] = _mm512_reduce_add_ps(total) * scale;
    }
}

}  // namespace int8_vnni
#endif
