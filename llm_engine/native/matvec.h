// Matrix-vector products for every weight kind the decode step reads, each written once against
// vec16 (float paths) or an int8-input kernel (int4_vnni and int8_vnni on AVX-512 VNNI, int8dot_avx2 on AVX2,
// int8dot_portable the same arithmetic in plain loops):
// y = W x + b for up to kMaxRows inputs at once, so a batched step reads each weight once.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <omp.h>

#include "abi.h"
#include "barrier.h"
#include "int4_vnni.h"
#include "int8_vnni.h"
#include "int8dot_avx2.h"
#include "int8dot_portable.h"
#include "vec16.h"

namespace matvec {

constexpr int kMaxRows = 16;

// ---- small vector helpers ----------------------------------------------------------------------

inline float dot(const float* a, const float* b, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// ---- matrix-vector products ---------------------------------------------------------------------
// Every kernel computes W[j] . x[b] for output rows j and inputs b; linear() gives each thread its share.

// The float int4 kernel's input, prepared by each thread: within each 32-wide block the 16 even-k values come first,
// then the 16 odd-k ones, matching the low and high nibbles of the block's 16 bytes; and per group the
// sum of x, which the group minimum multiplies.
inline bool int4_fast(const PLinear& L) { return L.group % 32 == 0; }

inline void prepare_int4_input(const PLinear& L, int rows, const float* x, float* xp, float* xsum) {
    const int k = L.k, groups = k / L.group;
    for (int b = 0; b < rows; ++b) {
        const float* xr = x + (size_t)b * k;
        float* pr = xp + (size_t)b * k;
        for (int blk = 0; blk < k; blk += 32)
            for (int i = 0; i < 16; ++i) {
                pr[blk + i] = xr[blk + 2 * i];
                pr[blk + 16 + i] = xr[blk + 2 * i + 1];
            }
        for (int g = 0; g < groups; ++g) {
            float s = 0.f;
            for (int i = 0; i < L.group; ++i) s += xr[g * L.group + i];
            xsum[(size_t)b * groups + g] = s;
        }
    }
}

// Accumulators per input row: a lone row gets several, so consecutive blocks' multiply-adds do not
// wait on each other (one accumulator made a step ~5x slower: latency-bound, not bandwidth-bound).
template <int R>
constexpr int lanes() { return R == 1 ? 4 : (R == 2 ? 2 : 1); }

// Output row j of an int4 layer against R prepared inputs: sum_g d_g * (q_g . x_g) + m_g * sum(x_g).
template <int R>
void int4_rows(const PLinear& L, int j, const float* xp, const float* xsum, float* out) {
    using namespace vec16;
    constexpr int A = lanes<R>();
    const int k = L.k, groups = k / L.group, per_group = L.group / 32;
    const uint8_t* wq = (const uint8_t*)L.w + (size_t)j * (k / 2);
    const float* d = L.scales + (size_t)j * groups;
    V acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = zero();
    auto group = [&](int g, int a) {
        const V dg = set1(d[g]);
        for (int s = 0; s < per_group; ++s) {
            const int blk = g * per_group + s;
            V even, odd;
            nibbles(wq + (size_t)blk * 16, even, odd);
#pragma GCC unroll 16
            for (int b = 0; b < R; ++b) {
                const float* xb = xp + (size_t)b * k + (size_t)blk * 32;
                acc[b][a] = fma(fma(odd, load(xb + 16), mul(even, load(xb))), dg, acc[b][a]);
            }
        }
    };
    int g = 0;
    for (; g + A <= groups; g += A) {
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) group(g + a, a);
    }
    for (; g < groups; ++g) group(g, 0);
    for (int b = 0; b < R; ++b) {
        V total = acc[b][0];
        for (int a = 1; a < A; ++a) total = add(total, acc[b][a]);
        out[b] = sum(total) + dot(L.mins + (size_t)j * groups, xsum + (size_t)b * groups, groups);
    }
}

// Int4 with a group size that is not a multiple of 32: plain loops over the unprepared input.
inline void int4_row_any_group(const PLinear& L, int j, int rows, const float* x, float* out) {
    const int k = L.k, groups = k / L.group;
    const uint8_t* wq = (const uint8_t*)L.w + (size_t)j * (k / 2);
    for (int b = 0; b < rows; ++b) {
        const float* xb = x + (size_t)b * k;
        float s = 0.f;
        for (int g = 0; g < groups; ++g) {
            const float d = L.scales[(size_t)j * groups + g], m = L.mins[(size_t)j * groups + g];
            for (int i = g * L.group; i < (g + 1) * L.group; ++i) {
                const uint8_t byte = wq[i / 2];
                s += ((float)((i & 1) ? (byte >> 4) : (byte & 0x0F)) * d + m) * xb[i];
            }
        }
        out[b] = s;
    }
}

// Output row j of an int8 (per-channel scale) or float32 layer against R inputs.
template <int R, typename W>
void dense_rows(const PLinear& L, int j, const float* x, float* out) {
    using namespace vec16;
    constexpr int A = lanes<R>();
    const int k = L.k;
    const W* w = (const W*)L.w + (size_t)j * k;
    auto weights = [&](int i) {
        if constexpr (sizeof(W) == 1) return from_i8((const int8_t*)w + i);
        else return load((const float*)w + i);
    };
    V acc[R][A];
    for (int b = 0; b < R; ++b)
        for (int a = 0; a < A; ++a) acc[b][a] = zero();
    int i = 0;
    for (; i + 16 * A <= k; i += 16 * A) {
        for (int off = 0; off < 16 * A * (int)sizeof(W); off += 64) vec16::prefetch((const char*)(w + i) + off);
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) {
            const V wv = weights(i + 16 * a);
#pragma GCC unroll 16
            for (int b = 0; b < R; ++b) acc[b][a] = fma(wv, load(x + (size_t)b * k + i + 16 * a), acc[b][a]);
        }
    }
    for (; i + 16 <= k; i += 16) {
        const V wv = weights(i);
        for (int b = 0; b < R; ++b) acc[b][0] = fma(wv, load(x + (size_t)b * k + i), acc[b][0]);
    }
    const float scale = sizeof(W) == 1 ? L.scales[j] : 1.f;
    for (int b = 0; b < R; ++b) {
        V total = acc[b][0];
        for (int a = 1; a < A; ++a) total = add(total, acc[b][a]);
        float s = sum(total);
        for (int t = i; t < k; ++t) s += (float)w[t] * x[(size_t)b * k + t];
        out[b] = s * scale;
    }
}

// One thread's copy of a product's input, in the form its kernel reads (each thread prepares its own:
// a few hundred values, cheaper than making the other thread wait for one copy).
struct Input {
    const float* x = nullptr;       // the float input as given [rows, k]
    std::vector<float> xp, xsum;    // float int4 path: nibble order, per group sums
    std::vector<int8_t> xq;         // int8 int4 path: two int8 parts per block (hi, then lo), pair order
    std::vector<float> dx, xs;      // int8 int4 path: block scales, block sums / 8, per lane (portable: per block)
    int int8_dot = 0;               // layers that fit take the int8-input path: INT8DOT_* (abi.h)

    Input(int rows, int widest, int dot)
        : xp((size_t)rows * widest), xsum((size_t)rows * widest), xq((size_t)2 * rows * widest),
          dx((size_t)rows * widest / 4 + 16), xs((size_t)rows * widest / 4 + 16), int8_dot(dot) {}
};

enum class Int4Path { kFloat, kInt8Dot, kInt8DotAvx2, kInt8DotPortable, kAnyGroup };

inline Int4Path int4_path(const PLinear& L, const Input& p) {
    if (p.int8_dot && int8dot::takes(L)) {
#if defined(PARLEY_INT4_VNNI) && defined(PARLEY_INT8DOT_AVX2)
        // Q4_K layers take the super-block kernel (integer sums per 256, int8dot_avx2.h) on VNNI machines too: it beat
        // the VNNI pairs' float step per 64 weights on the 1.5B Qwen here, 22.5-23.2 against 20.5-21.7 tok/s
        if (p.int8_dot == INT8DOT_VNNI && L.kblocks) return Int4Path::kInt8DotAvx2;
#elif defined(PARLEY_INT4_VNNI)
        if (p.int8_dot == INT8DOT_VNNI && L.kblocks) return Int4Path::kInt8DotPortable;  // (no target has one without the other)
#endif
#ifdef PARLEY_INT4_VNNI
        if (p.int8_dot == INT8DOT_VNNI) return Int4Path::kInt8Dot;
#endif
#ifdef PARLEY_INT8DOT_AVX2
        if (p.int8_dot == INT8DOT_AVX2) return Int4Path::kInt8DotAvx2;
#endif
        return Int4Path::kInt8DotPortable;
    }
    return int4_fast(L) ? Int4Path::kFloat : Int4Path::kAnyGroup;
}

// Which int8-input kernel an int8 layer takes: INT8DOT_VNNI or INT8DOT_AVX2 where compiled in and asked for, else
// 0 (the float kernel: the portable loops are only the int4 layers' reference).
inline int int8_takes_dot(const PLinear& L, const Input& p) {
#ifdef PARLEY_INT4_VNNI
    if (p.int8_dot == INT8DOT_VNNI && int8_vnni::fits(L.k)) return INT8DOT_VNNI;
#endif
#ifdef PARLEY_INT8DOT_AVX2
    if (p.int8_dot == INT8DOT_AVX2 && L.k % 32 == 0) return INT8DOT_AVX2;
#endif
    (void)L, (void)p;
    return 0;
}

// Output rows [j0, j1) against R inputs, written (or added) to y with the bias: the loop over rows sits
// inside each kernel's instantiation so the per-row kernel inlines (a call per row cost ~5 % of a step).
template <int R, typename Row>
inline void each_row(const PLinear& L, int j0, int j1, float* y, int ystride, bool accumulate, Row row) {
    for (int j = j0; j < j1; ++j) {
        float out[R];
        row(j, out);
        const float bias = L.bias ? L.bias[j] : 0.f;
        for (int b = 0; b < R; ++b) {
            float& dst = y[(size_t)b * ystride + j];
            dst = (accumulate ? dst : 0.f) + out[b] + bias;
        }
    }
}

template <int R>
void rows_of(const PLinear& L, int j0, int j1, const Input& p, float* y, int ystride, bool accumulate) {
    const float* x = p.x;
    auto run = [&](auto row) { each_row<R>(L, j0, j1, y, ystride, accumulate, row); };
    if (L.kind == KIND_INT4) {
        switch (int4_path(L, p)) {
#ifdef PARLEY_INT4_VNNI
            case Int4Path::kInt8Dot: {
                const size_t dm_row = (size_t)(L.k / L.group) * 2;
                const int8_t *hi = p.xq.data(), *lo = hi + (size_t)R * L.k;
                const uint8_t* w = (const uint8_t*)L.w;
                if (L.dm)
                    run([&](int j, float* out) {
                        int4_vnni::rows<R, lanes<R>()>(w + (size_t)j * (L.k / 2), L.dm + j * dm_row, L.k, L.group, hi, lo,
                                                       p.dx.data(), p.xs.data(), out);
                    });
                else
                    run([&](int j, float* out) {
                        int4_vnni::rows<R, lanes<R>()>(w + (size_t)j * (L.k / 2), L.dm32 + j * dm_row, L.k, L.group, hi, lo,
                                                       p.dx.data(), p.xs.data(), out);
                    });
                break;
            }
#endif
#ifdef PARLEY_INT8DOT_AVX2
            case Int4Path::kInt8DotAvx2: {
                const size_t dm_row = (size_t)(L.k / L.group) * 2;
                const int8_t *hi = p.xq.data(), *lo = hi + (size_t)R * L.k;
                const uint8_t* w = (const uint8_t*)L.w;
                auto with = [&](const auto* dm, size_t per_row) {
                    run([&](int j, float* out) {
                        int8dot_avx2::int4_rows<R, lanes<R>()>(w + (size_t)j * (L.k / 2), dm + j * per_row, L.k, L.group,
                                                                hi, lo, p.dx.data(), p.xs.data(), out);
                    });
                };
                if (L.kblocks) {
                    const auto* kb = (const kblock::KBlock*)L.kblocks;
                    run([&](int j, float* out) {
                        int8dot_avx2::int4_k_rows<R>(w + (size_t)j * (L.k / 2), kb + (size_t)j * (L.k / 256), L.k, hi, lo,
                                                     p.dx.data(), p.xs.data(), out);
                    });
                } else if (L.dm) with(L.dm, dm_row);
                else with(L.dm32, dm_row);
                break;
            }
#endif
            case Int4Path::kInt8DotPortable: {
                const int8_t *hi = p.xq.data(), *lo = hi + (size_t)R * L.k;
                run([&](int j, float* out) { int8dot::rows<R>(L, j, hi, lo, p.dx.data(), p.xs.data(), out); });
                break;
            }
            case Int4Path::kFloat: run([&](int j, float* out) { int4_rows<R>(L, j, p.xp.data(), p.xsum.data(), out); }); break;
            default: run([&](int j, float* out) { int4_row_any_group(L, j, R, x, out); });
        }
    } else if (L.kind == KIND_INT8) {
        const int8_t *hi = p.xq.data(), *lo = hi + (size_t)R * L.k, *w = (const int8_t*)L.w;
#ifdef PARLEY_INT4_VNNI
        if (int8_takes_dot(L, p) == INT8DOT_VNNI) {
            run([&](int j, float* out) {
                int8_vnni::rows<R, lanes<R>()>(w + (size_t)j * L.k, L.scales[j], L.k, hi, lo, p.dx.data(), out);
            });
            return;
        }
#endif
#ifdef PARLEY_INT8DOT_AVX2
        if (int8_takes_dot(L, p) == INT8DOT_AVX2) {
            run([&](int j, float* out) {
                int8dot_avx2::int8_rows<R, lanes<R>()>(w + (size_t)j * L.k, L.scales[j], L.k, hi, lo, p.dx.data(), out);
            });
            return;
        }
#endif
        (void)hi, (void)lo, (void)w;
        run([&](int j, float* out) { dense_rows<R, int8_t>(L, j, x, out); });
    } else {
        run([&](int j, float* out) { dense_rows<R, float>(L, j, x, out); });
    }
}

using RowsFn = void (*)(const PLinear&, int, int, const Input&, float*, int, bool);

template <int... R>
constexpr RowsFn pick(int rows, std::integer_sequence<int, R...>) {
    RowsFn fns[] = {rows_of<R + 1>...};
    return fns[rows - 1];
}

// Every thread, before linear(): its own copy of the input x [rows, L.k] in the form L's kernel reads.
inline void prepare(const PLinear& L, int rows, const float* x, Input& in) {
    in.x = x;
#ifdef PARLEY_INT4_VNNI
    if (L.kind == KIND_INT8 && int8_takes_dot(L, in) == INT8DOT_VNNI)
        int8_vnni::prepare(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data());
#endif
#ifdef PARLEY_INT8DOT_AVX2
    if (L.kind == KIND_INT8 && int8_takes_dot(L, in) == INT8DOT_AVX2)
        int8dot_avx2::prepare(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data(), in.xs.data(), false);
#endif
    if (L.kind != KIND_INT4) return;
    const Int4Path path = int4_path(L, in);
    if (path == Int4Path::kFloat) prepare_int4_input(L, rows, x, in.xp.data(), in.xsum.data());
    if (path == Int4Path::kInt8DotPortable)
        int8dot::prepare(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data(), in.xs.data());
#ifdef PARLEY_INT8DOT_AVX2
    if (path == Int4Path::kInt8DotAvx2 && L.kblocks)
        int8dot_avx2::prepare_k(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data(), in.xs.data());
    else if (path == Int4Path::kInt8DotAvx2)
        int8dot_avx2::prepare(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data(), in.xs.data(), true);
#endif
#ifdef PARLEY_INT4_VNNI
    if (path == Int4Path::kInt8Dot)
        int4_vnni::prepare(rows, L.k, x, in.xq.data(), in.xq.data() + (size_t)rows * L.k, in.dx.data(), in.xs.data());
#endif
}

// y[b * ystride + j] (+)= (W x_b)[j] + bias[j]: each thread takes one contiguous share of the output rows
// (one weight stream each), then waits for the others.
inline void linear(const PLinear& L, int rows, const Input& in, float* y, int ystride, bool accumulate, team::Barrier& sync) {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int j0 = (int)((int64_t)L.n * t / nt), j1 = (int)((int64_t)L.n * (t + 1) / nt);
    pick(rows, std::make_integer_sequence<int, kMaxRows>{})(L, j0, j1, in, y, ystride, accumulate);
    sync.wait();
}

}  // namespace matvec
