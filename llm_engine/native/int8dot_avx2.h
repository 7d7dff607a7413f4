// The int8-input products of int4_vnni.h and int8_vnni.h for CPUs with AVX2 but no AVX-512 VNNI (most laptops
// and desktops: Intel client cores, AMD Zen 2/3), where the int4 layers otherwise take the float kernel (nibbles ->
// floats -> one FMA per eight weights and input row), measured at 0.8x llama.cpp on such a machine. Its Q4_K kernel
// serves VNNI machines too (matvec.h's int4_path): it beat the VNNI pairs there.
//
// Same arithmetic as the other two paths: each 32-wide input block becomes two int8 parts, hi = round(x/s) and
// lo = round((x - hi*s) * 256/s), and the block's dot is (codes.hi << 8) + codes.lo, exact in int32. Q4_K layers
// differ (int4_k_rows): one input scale per 256, so a super-block's products sum in int32 with its integer scales
// (the 1.5B Qwen on the AVX2 build: 14.4 tok/s with per-block floats, 21.4 so, the float kernels 16.0). AVX2 has no
// vpdpbusd: vpmaddubsw multiplies 32 unsigned weight bytes by 32 signed input bytes and adds neighbours into int16
// (no saturation here: |15 * 127 * 2| and |128 * 127 * 2| fit), and vpmaddwd then sums pairs into int32 lanes,
// times 256 for the hi part and times 1 for the lo part, so the shift comes for free.
//
// Int4 layout: a block's 16 code bytes hold k = 2i in the low nibble and 2i + 1 in the high one, so the input is
// laid out per block as its 16 even-k values, then its 16 odd-k values (the low nibbles, then the high ones, of one
// 256-bit register). Int8 layers: natural order. Both: per block its lo unit dx = max|x| / 127 / 256 and its sum / 8,
// each spread over the 8 lanes the block's products land in.
#pragma once
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PARLEY_INT8DOT_AVX2 1
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "int8dot_portable.h"
#include "kblock.h"
#include "vec16.h"

namespace int8dot_avx2 {

inline float hsum(__m256 v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// x [rows, k] -> hi, lo [rows, k] int8 (per block even k then odd k where `nibble_order`, else natural order),
// dx, xs [rows, k / 32, 8]: each block's lo unit and its sum / 8, in every lane.
inline void prepare(int rows, int k, const float* x, int8_t* hi, int8_t* lo, float* dx, float* xs, bool nibble_order) {
    const int blocks = k / 32;
    for (int b = 0; b < rows; ++b)
        for (int blk = 0; blk < blocks; ++blk) {
            const size_t at = (size_t)b * k + (size_t)blk * 32, lanes = ((size_t)b * blocks + blk) * 8;
            const float* xb = x + at;
            float amax = 0.f, total = 0.f;
            for (int i = 0; i < 32; ++i) {
                amax = std::fmax(amax, std::fabs(xb[i]));
                total += xb[i];
            }
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            for (int i = 0; i < 32; ++i) {
                const int to = nibble_order ? (i % 2) * 16 + i / 2 : i;
                int8dot::split(xb[i] * inv, hi[at + to], lo[at + to]);
            }
            for (int i = 0; i < 8; ++i) {
                dx[lanes + i] = amax / 127.f / 256.f;
                xs[lanes + i] = total / 8.f;
            }
        }
}

// The Q4_K layers' input: as prepare(nibble order), but one scale per 256 inputs (a Q4_K super-block), so the
// super-block's products sum in int32 with its integer 6-bit scales and become floats once per super-block, as
// llama.cpp's Q8_K input does (its one int8 part per value; here two, ~16 bits of each super-block's largest value).
// dx [rows, k / 256]: each super-block's lo unit; xs [rows, k / 32]: each block's sum.
inline void prepare_k(int rows, int k, const float* x, int8_t* hi, int8_t* lo, float* dx, float* xs) {
    const int supers = k / 256;
    for (int b = 0; b < rows; ++b)
        for (int sb = 0; sb < supers; ++sb) {
            const size_t at = (size_t)b * k + (size_t)sb * 256;
            const float* xb = x + at;
            float amax = 0.f;
            for (int i = 0; i < 256; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            for (int blk = 0; blk < 8; ++blk) {
                float total = 0.f;
                for (int i = blk * 32; i < blk * 32 + 32; ++i) {
                    total += xb[i];
                    const int to = blk * 32 + (i % 2) * 16 + (i % 32) / 2;
                    int8dot::split(xb[i] * inv, hi[at + to], lo[at + to]);
                }
                xs[(size_t)b * (k / 32) + sb * 8 + blk] = total;
            }
            dx[(size_t)b * supers + sb] = amax / 127.f / 256.f;
        }
}

// Output row j of a Q4_K layer (codes wq [k / 2], one KBlock per 256) for R inputs from prepare_k: per super-block
// sum_g sc_g (256 codes.hi + codes.lo) in int32 (hi and lo apart: 256 * hi's sum could pass 2^31), times d dx once;
// the minimums' term sum_g m_g * sum(x_g) as eight lanes, times nmin.
template <int R>
void int4_k_rows(const uint8_t* wq, const kblock::KBlock* kb, int k, const int8_t* hi, const int8_t* lo, const float* dx,
                 const float* xs, float* out) {
    const int supers = k / 256;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc[R], macc[R];
    for (int b = 0; b < R; ++b) acc[b] = macc[b] = _mm256_setzero_ps();
    for (int sb = 0; sb < supers; ++sb) {
        const kblock::KBlock& f = kb[sb];
        const uint8_t* codes = wq + (size_t)sb * 128;
        vec16::prefetch((const char*)codes), vec16::prefetch((const char*)codes + 64);
        __m256i sum_hi[R], sum_lo[R];
        for (int b = 0; b < R; ++b) sum_hi[b] = sum_lo[b] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m128i bytes = _mm_loadu_si128((const __m128i*)(codes + g * 16));
            const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), mask);
            const __m256i sc = _mm256_set1_epi16(f.sm[2 * g]);
#pragma GCC unroll 16
            for (int b = 0; b < R; ++b) {
                const size_t at = (size_t)b * k + (size_t)sb * 256 + g * 32;
                const __m256i ph = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i*)(hi + at)));
                const __m256i pl = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i*)(lo + at)));
                sum_hi[b] = _mm256_add_epi32(sum_hi[b], _mm256_madd_epi16(ph, sc));
                sum_lo[b] = _mm256_add_epi32(sum_lo[b], _mm256_madd_epi16(pl, sc));
            }
        }
        int64_t mins8;  // the eight groups' minimum multipliers: sm[1], sm[3], ...
        uint8_t m[8];
        for (int g = 0; g < 8; ++g) m[g] = f.sm[2 * g + 1];
        std::memcpy(&mins8, m, 8);
        const __m256 mw = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mins8))), _mm256_set1_ps(f.nmin));
        for (int b = 0; b < R; ++b) {
            const float unit = f.d * dx[(size_t)b * supers + sb];
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_hi[b]), _mm256_set1_ps(256.f * unit), acc[b]);
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lo[b]), _mm256_set1_ps(unit), acc[b]);
            macc[b] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + (size_t)b * (k / 32) + sb * 8), macc[b]);
        }
    }
    for (int b = 0; b < R; ++b) {
        const __m256 total = _mm256_add_ps(acc[b], macc[b]);
        out[b] = hsum(total);
    }
}

// 256 * (w . xh) + (w . xl) in 8 int32 lanes, w unsigned bytes, xh and xl signed.
inline __m256i dot32(__m256i w, __m256i xh, __m256i xl) {
    const __m256i by256 = _mm256_set1_epi16(256), ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, xh), by256),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, xl), ones));
}

// Group g's (scale, minimum): DM is uint16_t (float16 pairs) or float (pairs). (Q4_K layers: int4_k_rows.)
template <typename DM>
inline void group_factors(const DM* dm, int g, float& d, float& m) {
    if constexpr (std::is_same_v<DM, float>) {
        d = dm[2 * g], m = dm[2 * g + 1];
    } else {
        d = _cvtsh_ss(dm[2 * g]), m = _cvtsh_ss(dm[2 * g + 1]);
    }
}

// Output row j of an int4 layer (codes wq [k / 2], (scale, minimum) pairs dm) for R prepared inputs, A accumulators
// per input.
template <int R, int A, typename DM>
void int4_rows(const uint8_t* wq, const DM* dm, int k, int group, const int8_t* hi, const int8_t* lo, const float* dx,
               const float* xs, float* out) {
    const int blocks = k / 32, per_group = group / 32;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = _mm256_setzero_ps();
    auto block = [&](int blk, int a, __m256 dw, __m256 mw) {
        if (blk % 4 == 0) vec16::prefetch((const char*)(wq + (size_t)blk * 16));
        const __m128i bytes = _mm_loadu_si128((const __m128i*)(wq + (size_t)blk * 16));
        const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), mask);
#pragma GCC unroll 16
        for (int b = 0; b < R; ++b) {
            const size_t at = (size_t)b * k + (size_t)blk * 32, lanes = ((size_t)b * blocks + blk) * 8;
            const __m256i dot = dot32(w, _mm256_loadu_si256((const __m256i*)(hi + at)), _mm256_loadu_si256((const __m256i*)(lo + at)));
            const __m256 sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, _mm256_loadu_ps(dx + lanes)), acc[b][a]);
            acc[b][a] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + lanes), sum);
        }
    };
    const int groups = k / group;
    int g = 0;
    auto run_group = [&](int gi, int a) {
        float d, m;
        group_factors(dm, gi, d, m);
        const __m256 dw = _mm256_set1_ps(d), mw = _mm256_set1_ps(m);
        for (int s = 0; s < per_group; ++s) block(gi * per_group + s, a, dw, mw);
    };
    for (; g + A <= groups; g += A) {
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) run_group(g + a, a);
    }
    for (; g < groups; ++g) run_group(g, 0);
    for (int b = 0; b < R; ++b) {
        __m256 total = acc[b][0];
        for (int a = 1; a < A; ++a) total = _mm256_add_ps(total, acc[b][a]);
        out[b] = hsum(total);
    }
}

// Output row j of an int8 layer (codes w [k] in [-127, 127] or -128, its scale) for R prepared inputs (natural
// order): vpmaddubsw wants one unsigned side, so the weight's sign moves onto the input (|w| . (x signed as w)).
template <int R, int A>
void int8_rows(const int8_t* w, float scale, int k, const int8_t* hi, const int8_t* lo, const float* dx, float* out) {
    const int blocks = k / 32;
    __m256 acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = _mm256_setzero_ps();
    auto block = [&](int blk, int a) {
        if (blk % 2 == 0) vec16::prefetch((const char*)(w + (size_t)blk * 32));
        const __m256i wv = _mm256_loadu_si256((const __m256i*)(w + (size_t)blk * 32));
        const __m256i mag = _mm256_abs_epi8(wv);
#pragma GCC unroll 16
        for (int b = 0; b < R; ++b) {
            const size_t at = (size_t)b * k + (size_t)blk * 32, lanes = ((size_t)b * blocks + blk) * 8;
            const __m256i h = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(hi + at)), wv);
            const __m256i l = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(lo + at)), wv);
            acc[b][a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(mag, h, l)), _mm256_loadu_ps(dx + lanes), acc[b][a]);
        }
    };
    int blk = 0;
    for (; blk + A <= blocks; blk += A) {
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) block(blk + a, a);
    }
    for (; blk < blocks; ++blk) block(blk, 0);
    for (int b = 0; b < R; ++b) {
        __m256 total = acc[b][0];
        for (int a = 1; a < A; ++a) total = _mm256_add_ps(total, acc[b][a]);
        out[b] = hsum(total) * scale;
    }
}

}  // namespace int8dot_avx2
#endif
