// An int8 KV cache's attention scores as integer dot products (AVX-512 VNNI), the way llama.cpp reads a q8_0
// cache: the query heads are rounded to int8 once per step and every q.k is one exact int32 sum, scaled once per
// position (query scale x key scale), instead of converting 64 codes per position to floats first.
//
// Accuracy: each query head is three int8 parts, hi = round(q/s), then the rest in steps of s/256 and s/65536
// (int4_vnni.h's two parts, one more), so a score keeps ~23 bits of the query, as a float32 one does; the keys are
// the cache's codes exactly. Two parts (~15 bits) moved SmolLM2's logits 0.04-0.1 from the eager path's (float32
// ones ~3e-5, tests/llm_engine/test_kv_int8.py); the third costs ~10 % of the kernel measured alone.
//
// Layout: vpdpbusd sums products in fours within a 32-bit lane, so sixteen positions' 64-byte rows are
// half-transposed (two unpack stages) into vectors whose lanes hold one position and one group of four codes
// each; the query is laid out to match (lane = group), and a final 128-bit shuffle leaves sixteen positions'
// dots in one vector, in order. vpdpbusd multiplies unsigned by signed bytes: the key codes go in shifted by 128
// (xor 0x80) and 128 * sum(query codes) comes off each dot.
#pragma once
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PARLEY_ATTENTION_VNNI 1
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec16.h"

namespace attention_int8 {

constexpr int kMaxHeadDim = 128;
// The head dims that take it: 64 and 128. At 256 (Gemma 3, four query heads a kv head) its 48 accumulators spill,
// and measured alone, out of cache, it was slower than the float kernel (~44 against ~35 ns per position).
constexpr bool takes(int d) { return d == 64 || d == 128; }
constexpr int kParts = 3;

// One query head [d] as int8 parts: per part the codes in the lane order of dots16 (for each 64-code chunk
// w and each c < 4, a 64-byte vector whose 128-bit lane L repeats the four codes of group 4L + c four times),
// the sum of its codes, and its unit (s / 256^part).
struct Query {
    alignas(64) int8_t lanes[kParts][kMaxHeadDim * 4];
    int32_t sum[kParts];
    float unit[kParts];
    int8_t codes[kParts][kMaxHeadDim];  // natural order, for the positions outside full blocks of sixteen
};

// d a multiple of 64: int4_vnni::prepare's rounding (nearest, ties to even; later parts clamped to +-127), sixteen
// at a time.
inline void quantize(const float* q, int d, Query& out) {
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < d; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(q + i)));
    const float amax = _mm512_reduce_max_ps(m);
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f), lim = _mm512_set1_ps(127.f);
    __m512i sums[kParts];
    for (int p = 0; p < kParts; ++p) sums[p] = _mm512_setzero_si512();
    for (int i = 0; i < d; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(q + i), inv);  // in units of this part
        for (int p = 0; p < kParts; ++p) {
            __m512 code = _mm512_roundscale_ps(v, kNearest);
            if (p > 0) code = _mm512_max_ps(_mm512_min_ps(code, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
            v = _mm512_mul_ps(_mm512_sub_ps(v, code), _mm512_set1_ps(256.f));
            const __m512i c = _mm512_cvtps_epi32(code);
            sums[p] = _mm512_add_epi32(sums[p], c);
            _mm_storeu_si128((__m128i*)&out.codes[p][i], _mm512_cvtepi32_epi8(c));
        }
    }
    for (int p = 0; p < kParts; ++p) {
        out.sum[p] = _mm512_reduce_add_epi32(sums[p]);
        out.unit[p] = amax / 127.f / (float)(1 << (8 * p));
    }
    // lanes (w, c): dword 4L + r of the vector is group 4L + c of chunk w
    const __m512i base = _mm512_set_epi32(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
    for (int p = 0; p < kParts; ++p)
        for (int w = 0; w < d / 64; ++w) {
            const __m512i chunk = _mm512_loadu_si512(&out.codes[p][w * 64]);
            for (int c = 0; c < 4; ++c)
                _mm512_store_si512(&out.lanes[p][(w * 4 + c) * 64],
                                   _mm512_permutexvar_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(c)), chunk));
        }
}

// q.k for one position from the natural-order codes: the same integers dots16 sums, in plain loops.
inline float dot1(const Query& q, const int8_t* key, int d) {
    float s = 0.f;
    for (int p = 0; p < kParts; ++p) {
        int32_t acc = 0;
        for (int i = 0; i < d; ++i) acc += (int32_t)q.codes[p][i] * key[i];
        s += (float)acc * q.unit[p];
    }
    return s;
}

// Sixteen positions' rows keys[16][64 * W] against G query heads: out[g] = q_g . key_i in lane i, as floats
// (the query's units applied, not the key scales).
template <int W, int G>
inline void dots16(const Query* const* q, const int8_t* keys, __m512 out[G]) {
    constexpr int d = 64 * W;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i acc[G][kParts][4];
    for (int g = 0; g < G; ++g)
        for (int p = 0; p < kParts; ++p)
            for (int i = 0; i < 4; ++i) acc[g][p][i] = _mm512_setzero_si512();
    for (int w = 0; w < W; ++w) {
        __m512i t[16], u[16];
        for (int i = 0; i < 8; ++i) {
            const __m512i a = _mm512_xor_si512(_mm512_loadu_si512(keys + (size_t)(2 * i) * d + 64 * w), flip);
            const __m512i b = _mm512_xor_si512(_mm512_loadu_si512(keys + (size_t)(2 * i + 1) * d + 64 * w), flip);
            t[2 * i] = _mm512_unpacklo_epi32(a, b);      // lane L: r2i[4L], r2i+1[4L], r2i[4L+1], r2i+1[4L+1]
            t[2 * i + 1] = _mm512_unpackhi_epi32(a, b);  // the same for groups 4L+2, 4L+3
        }
        for (int i = 0; i < 4; ++i) {  // u[4i + c], lane (L, r): row 4i + r, group 4L + c
            u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        for (int g = 0; g < G; ++g)
            for (int p = 0; p < kParts; ++p)
                for (int c = 0; c < 4; ++c) {
                    const __m512i qv = _mm512_load_si512(&q[g]->lanes[p][(w * 4 + c) * 64]);
                    for (int i = 0; i < 4; ++i) acc[g][p][i] = _mm512_dpbusd_epi32(acc[g][p][i], u[4 * i + c], qv);
                }
    }
    for (int g = 0; g < G; ++g) {
        __m512 s = _mm512_setzero_ps();
        for (int p = 0; p < kParts; ++p) {
            // acc[i] lane (L, r): row 4i + r over groups 4L..; row 4M + r's total is the sum over L of acc[M] lane (L, r)
            const __m512i* a = acc[g][p];
            const __m512i ab = _mm512_add_epi32(_mm512_shuffle_i32x4(a[0], a[1], 0x44), _mm512_shuffle_i32x4(a[0], a[1], 0xEE));
            const __m512i cd = _mm512_add_epi32(_mm512_shuffle_i32x4(a[2], a[3], 0x44), _mm512_shuffle_i32x4(a[2], a[3], 0xEE));
            __m512i dot = _mm512_add_epi32(_mm512_shuffle_i32x4(ab, cd, 0x88), _mm512_shuffle_i32x4(ab, cd, 0xDD));
            dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * q[g]->sum[p]));
            s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(q[g]->unit[p]), s);
        }
        out[g] = s;
    }
}

// Scores of positions [t0, t1) against G query heads, all of them cached codes (t1 <= the cached count):
// scores[g * n + t - t0] = q_g . k_t * k_scale[t] * scale, top[g] raised to their maximum. d = 64 W.
template <int W, int G>
void scores(const Query* const* q, const int8_t* keys, const float* k_scale, int t0, int t1, float scale, int n,
            float* scores, float* top) {
    constexpr int d = 64 * W;
    __m512 best[G];
    for (int g = 0; g < G; ++g) best[g] = _mm512_set1_ps(-INFINITY);
    int t = t0;
    for (; t + 16 <= t1; t += 16) {
        __m512 dots[G];
        // The lines 4 KB ahead: measured alone, one thread, 2,000 positions out of cache, ~6.9 -> ~4.2 ns per position.
        for (int i = 0; i < 16 * W; ++i) vec16::prefetch((const char*)(keys + (size_t)t * d) + 64 * i);
        vec16::prefetch((const char*)(k_scale + t));
        dots16<W, G>(q, keys + (size_t)t * d, dots);
        const __m512 ks = _mm512_mul_ps(_mm512_loadu_ps(k_scale + t), _mm512_set1_ps(scale));
        for (int g = 0; g < G; ++g) {
            const __m512 s = _mm512_mul_ps(dots[g], ks);
            _mm512_storeu_ps(scores + (size_t)g * n + (t - t0), s);
            best[g] = _mm512_max_ps(best[g], s);
        }
    }
    for (int g = 0; g < G; ++g) top[g] = std::max(top[g], _mm512_reduce_max_ps(best[g]));
    for (; t < t1; ++t)
        for (int g = 0; g < G; ++g) {
            const float s = dot1(*q[g], keys + (size_t)t * d, d) * k_scale[t] * scale;
            scores[(size_t)g * n + (t - t0)] = s;
            top[g] = std::max(top[g], s);
        }
}

}  // namespace attention_int8
#endif
