// The int8-input int4 product of int4_vnni.h in plain loops, for CPUs without AVX-512 VNNI (and for tests on
// every machine): the same rounding of each 32-wide input block into two int8 parts, hi = round(x/s) and
// lo = round((x - hi*s) * 256/s), the same exact int32 dot (codes.hi << 8) + codes.lo, and the same float terms,
// in natural k order. Slower than the float kernel; a decoder takes it only when asked for the int8 path where
// the VNNI one is not compiled in, or when told to take it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "abi.h"

namespace int8dot {

// The layers the VNNI path takes (int4_vnni::fits and a scale format it reads), so both paths cover the same ones.
inline bool takes(const PLinear& L) {
    const bool format = L.dm || L.dm32 || (L.kblocks && L.group == 32 && L.k % 256 == 0);
    return format && L.k % 64 == 0 && (L.group == 32 || L.group % 64 == 0);
}

// One input value in units of its block's scale (|v| <= 127) -> its two int8 parts: hi = v rounded to nearest, ties to
// even (as the VNNI path's roundscale), lo = the rest in 256ths, clamped to +-127. Every int8-input path rounds so.
inline void split(float v, int8_t& hi, int8_t& lo) {
    const float top = std::nearbyint(v);
    hi = (int8_t)top;
    lo = (int8_t)std::clamp(std::nearbyint((v - top) * 256.f), -127.f, 127.f);
}

// x [rows, k] -> hi, lo [rows, k] int8; per 32-wide block its lo unit dx = max|x| / 127 / 256 and its sum xs.
inline void prepare(int rows, int k, const float* x, int8_t* hi, int8_t* lo, float* dx, float* xs) {
    const int blocks = k / 32;
    for (int b = 0; b < rows; ++b)
        for (int blk = 0; blk < blocks; ++blk) {
            const size_t at = (size_t)b * k + (size_t)blk * 32;
            float amax = 0.f, total = 0.f;
            for (int i = 0; i < 32; ++i) {
                amax = std::max(amax, std::fabs(x[at + i]));
                total += x[at + i];
            }
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            for (int i = 0; i < 32; ++i) split(x[at + i] * inv, hi[at + i], lo[at + i]);
            dx[(size_t)b * blocks + blk] = amax / 127.f / 256.f;
            xs[(size_t)b * blocks + blk] = total;
        }
}

// Output row j for R prepared inputs: sum over blocks of d_g * dx * (codes . x) + m_g * sum(x), with the layer's
// float32 (scale, minimum) per group (the values its float16 pairs or Q4_K factors hold).
template <int R>
void rows(const PLinear& L, int j, const int8_t* hi, const int8_t* lo, const float* dx, const float* xs, float* out) {
    const int k = L.k, groups = k / L.group, blocks = k / 32;
    const uint8_t* wq = (const uint8_t*)L.w + (size_t)j * (k / 2);
    const float *d = L.scales + (size_t)j * groups, *m = L.mins + (size_t)j * groups;
    for (int b = 0; b < R; ++b) {
        const int8_t *h = hi + (size_t)b * k, *l = lo + (size_t)b * k;
        float s = 0.f;
        for (int blk = 0; blk < blocks; ++blk) {
            int32_t dot_hi = 0, dot_lo = 0;
            for (int i = blk * 32; i < blk * 32 + 32; i += 2) {  // one byte: codes of k = i (low nibble) and i + 1
                const int32_t even = wq[i / 2] & 0x0F, odd = wq[i / 2] >> 4;
                dot_hi += even * h[i] + odd * h[i + 1];
                dot_lo += even * l[i] + odd * l[i + 1];
            }
            const int g = blk * 32 / L.group;
            s += (float)(dot_hi * 256 + dot_lo) * (d[g] * dx[(size_t)b * blocks + blk]) + m[g] * xs[(size_t)b * blocks + blk];
        }
        out[b] = s;
    }
}

}  // namespace int8dot
