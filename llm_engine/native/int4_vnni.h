// Int4 x int8 dot products with AVX-512 VNNI, llama.cpp's way of making a 4-bit matrix-vector product
// bandwidth-bound instead of instruction-bound: one vpdpbusd multiplies 64 weight codes by 64 input
// bytes and sums them in fours. On the 2-core Xeon the float kernel (nibbles -> floats -> FMA) topped
// out near 5 GB/s per core.
//
// llama.cpp rounds the input to int8 per 32-wide block; measured on SmolLM2 that alone moved greedy
// replies off the float path's within a few tokens. Here each input is two int8 parts: hi = round(x/s)
// and lo = round((x - hi*s) * 256/s), and dot = (codes.hi << 8) + codes.lo exactly in int32, so the
// input keeps ~16 bits for one more vpdpbusd and a shift per 64 weights.
//
// Only two weight blocks at a time fit one instruction, so the input is laid out per pair of blocks as
// [block0 even k, block1 even k, block0 odd k, block1 odd k] (16 bytes each), which is where the
// weights' low and high nibbles land when a pair's 32 bytes are split into two 32-byte halves.
#pragma once
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PARLEY_INT4_VNNI 1
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vec16.h"

namespace int4_vnni {


// Layers this path takes: whole pairs of blocks, and a group that is one block or whole pairs.
inline bool fits(int k, int group) { return k % 64 == 0 && (group == 32 || group % 64 == 0); }

// x [rows, k] -> hi, lo [rows, k] int8 in pair order; per pair 16 lanes of each block's scale (of the
// lo unit), dx, and 16 lanes of each block's input sum / 8, xs (the minimum's term, spread over the
// 8 lanes a block's products land in).
inline void prepare(int rows, int k, const float* x, int8_t* hi, int8_t* lo, float* dx, float* xs) {
    const int pairs = k / 64;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512 lim = _mm512_set1_ps(127.f);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int b = 0; b < rows; ++b)
        for (int p = 0; p < pairs; ++p) {
            const size_t at = (size_t)b * k + (size_t)p * 64, lanes = ((size_t)b * pairs + p) * 16;
            for (int h = 0; h < 2; ++h) {
                const __m512 x0 = _mm512_loadu_ps(x + at + h * 32), x1 = _mm512_loadu_ps(x + at + h * 32 + 16);
                const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
                const float total = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
                const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
                for (int parity = 0; parity < 2; ++parity) {  // even k, then odd k
                    const __m512 v = _mm512_mul_ps(_mm512_permutex2var_ps(x0, parity ? odd : even, x1), inv);
                    const __m512 top = _mm512_roundscale_ps(v, kNearest);
                    __m512 rest = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, top), _mm512_set1_ps(256.f)), kNearest);
                    rest = _mm512_max_ps(_mm512_min_ps(rest, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
                    const size_t to = at + parity * 32 + h * 16;
                    _mm_storeu_si128((__m128i*)(hi + to), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(top)));
                    _mm_storeu_si128((__m128i*)(lo + to), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rest)));
                }
                for (int i = 0; i < 4; ++i) {
                    dx[lanes + h * 4 + i] = dx[lanes + 8 + h * 4 + i] = amax / 127.f / 256.f;
                    xs[lanes + h * 4 + i] = xs[lanes + 8 + h * 4 + i] = total / 8.f;
                }
            }
        }
}

// Output row j for R prepared inputs: sum over blocks of d * dx * (codes . x) + m * sum(x).
// dm: the row's (scale, minimum) per group as pairs of DM: uint16_t (float16 bits) or float (for scales float16
// cannot hold, as Q4_K's d * sc, at 4 more bytes per 32 weights). A independent accumulators per input.
template <typename DM>
inline float dm_value(DM v) {
    if constexpr (std::is_same_v<DM, float>)
        return v;
    else
        return _cvtsh_ss(v);
}

template <int R, int A, typename DM>
void rows(const uint8_t* wq, const DM* dm, int k, int group, const int8_t* hi, const int8_t* lo, const float* dx,
          const float* xs, float* out) {
    const int pairs = k / 64;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m512i spread_d = _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
    const __m512i spread_m = _mm512_add_epi32(spread_d, _mm512_set1_epi32(1));
    __m512 acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = _mm512_setzero_ps();
    auto pair = [&](int p, int a, __m512 dw, __m512 mw) {
        if (p % 2 == 0) {  // one cache line of codes per two pairs, of scales per eight
            vec16::prefetch((const char*)(wq + (size_t)p * 32));
            if (p % (sizeof(DM) == 2 ? 8 : 4) == 0) vec16::prefetch((const char*)(dm + (size_t)p * 4));
        }
        const __m256i bytes = _mm256_loadu_si256((const __m256i*)(wq + (size_t)p * 32));
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, mask)),
                                             _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), 1);
#pragma GCC unroll 16
        for (int b = 0; b < R; ++b) {
            const size_t at = (size_t)b * k + (size_t)p * 64, lanes = ((size_t)b * pairs + p) * 16;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(hi + at));
            dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), w, _mm512_loadu_si512(lo + at));
            __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_loadu_ps(dx + lanes)), acc[b][a]);
            acc[b][a] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(xs + lanes), sum);
        }
    };
    if (group == 32) {  // each block of the pair has its own scale and minimum
        auto both = [&](int p, int a) {
            __m512 dm4;
            if constexpr (std::is_same_v<DM, float>)
                dm4 = _mm512_castps128_ps512(_mm_loadu_ps(dm + (size_t)p * 4));
            else
                dm4 = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)(dm + (size_t)p * 4))));
            pair(p, a, _mm512_permutexvar_ps(spread_d, dm4), _mm512_permutexvar_ps(spread_m, dm4));
        };
        int p = 0;
        for (; p + A <= pairs; p += A) {
#pragma GCC unroll 4
            for (int a = 0; a < A; ++a) both(p + a, a);
        }
        for (; p < pairs; ++p) both(p, 0);
    } else {  // whole pairs per group: one scale and minimum for both blocks
        const int per_group = group / 64, groups = k / group;
        for (int g = 0; g < groups; ++g) {
            const __m512 dw = _mm512_set1_ps(dm_value(dm[2 * g])), mw = _mm512_set1_ps(dm_value(dm[2 * g + 1]));
            for (int s = 0; s < per_group; ++s) pair(g * per_group + s, 0, dw, mw);
        }
    }
    for (int b = 0; b < R; ++b) {
        __m512 total = acc[b][0];
        for (int a = 1; a < A; ++a) total = _mm512_add_ps(total, acc[b][a]);
        out[b] = _mm512_reduce_add_ps(total);
    }
}

}  // namespace int4_vnni
#endif
