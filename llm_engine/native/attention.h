// Decode attention over the KV cache, split across threads by position (flash-decoding): each thread
// reduces its share of one row's positions, for every query head, to a partial softmax state (running
// max, sum of exponentials, and their weighted sum of values), and merge() combines the states.
//
// Splitting by head instead left one thread 5 of SmolLM2's 9 heads, re-read each key once per query
// head of its group, and reduced every dot product through memory: ~5 us per cached position per
// token (a 1000-token conversation decoded at half the speed of a fresh one).
//
// An int8 cache's scores, on AVX-512 VNNI, are integer dot products against the query rounded to int8 parts
// (attention_int8.h); elsewhere, and for its values, the codes are converted to floats here.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_int8.h"
#include "vec16.h"

namespace attention {

// A partial state is head_dim floats of sum(exp(s - max) * v), then max, then sum(exp(s - max)).
inline int state_size(int d) { return d + 2; }

// An int8 cache's per-row scales: keys[t] = codes * k[t] for t < cached, the row's own key codes * k_own; the
// same for values. A float cache passes none (k == nullptr) and its elements are the values.
struct Scales {
    const float* k = nullptr;
    const float* v = nullptr;
    float k_own = 1.f, v_own = 1.f;
};

// The G query heads q [G, d] of one kv head, over positions [t0, t1) of a row whose first `cached`
// positions are in keys/values [*, d] and whose own (position `cached`) key and value are given, all
// of the cache's element type T (float, half, or int8 codes with `sc`'s scales). Each key and value is
// loaded once for all G heads.
// scores: scratch of G * (t1 - t0) floats. out: G partial states.
template <int C, int G, typename T>  // head_dim = 16 * C
void part(const float* q, const T* keys, const T* values, int cached, const T* key, const T* value, const Scales& sc,
          int t0, int t1, float scale, float* scores, float* out) {
    using namespace vec16;
    constexpr int d = 16 * C;
    const int n = t1 - t0;
    auto k_at = [&](int t) { return t < cached ? keys + (size_t)t * d : key; };
    auto v_at = [&](int t) { return t < cached ? values + (size_t)t * d : value; };
    constexpr bool coded = std::is_same_v<T, int8_t>;
    auto k_scale = [&](int t) { return coded ? (t < cached ? sc.k[t] : sc.k_own) : 1.f; };
    auto v_scale = [&](int t) { return coded ? (t < cached ? sc.v[t] : sc.v_own) : 1.f; };
    V qv[G][C];
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) qv[g][c] = load(q + g * d + 16 * c);
    float top[G];
    for (int g = 0; g < G; ++g) top[g] = -INFINITY;
    // Four cached positions at a time: their G x 4 dot products stay in registers and each head's four
    // are reduced together (sum4), then scaled once per position, instead of one horizontal sum per
    // position and head (with the vectorized softmax sum below: ~8.5 -> ~5.9 ns per position for G = 3,
    // head_dim 64, measured alone; the whole step's int8 / float16 ratio at 2,000 positions did not move
    // beyond its noise, see docs/benchmarks.md's int8 KV section).
    constexpr int B = 4;
    int t = t0;
#ifdef PARLEY_ATTENTION_VNNI
    if constexpr (coded && attention_int8::takes(d)) {  // integer dots (attention_int8.h)
        attention_int8::Query qi[G];
        const attention_int8::Query* qp[G];
        for (int g = 0; g < G; ++g) {
            attention_int8::quantize(q + g * d, d, qi[g]);
            qp[g] = &qi[g];
        }
        const int full = std::min(t1, cached);
        if (t < full) attention_int8::scores<C / 4, G>(qp, keys, sc.k, t, full, scale, n, scores, top);
        for (t = std::max(t, full); t < t1; ++t)  // the row's own key
            for (int g = 0; g < G; ++g) {
                const float s = attention_int8::dot1(qi[g], k_at(t), d) * k_scale(t) * scale;
                scores[(size_t)g * n + (t - t0)] = s;
                top[g] = std::max(top[g], s);
            }
    }
#endif
    // (G = 8 would hold 32 accumulators: it keeps one position at a time.)
    for (const int full = G <= 4 ? std::min(t1, cached) : t0; t + B <= full; t += B) {
        V acc[G][B];
        for (int b = 0; b < B; ++b) {
            V k[C];
            for (int c = 0; c < C; ++c) k[c] = load(keys + (size_t)(t + b) * d + 16 * c);
            for (int g = 0; g < G; ++g) {
                acc[g][b] = mul(qv[g][0], k[0]);
                for (int c = 1; c < C; ++c) acc[g][b] = fma(qv[g][c], k[c], acc[g][b]);
            }
        }
        float ks[B];
        for (int b = 0; b < B; ++b) ks[b] = scale * k_scale(t + b);
        for (int g = 0; g < G; ++g) {
            float dots[B];
            sum4(acc[g], dots);
            float* dst = scores + (size_t)g * n + (t - t0);
            for (int b = 0; b < B; ++b) {
                dst[b] = dots[b] * ks[b];
                top[g] = std::max(top[g], dst[b]);
            }
        }
    }
    for (; t < t1; ++t) {  // the rest, and the row's own key
        V k[C];
        for (int c = 0; c < C; ++c) k[c] = load(k_at(t) + 16 * c);
        const float ks = scale * k_scale(t);
        for (int g = 0; g < G; ++g) {
            V acc = mul(qv[g][0], k[0]);
            for (int c = 1; c < C; ++c) acc = fma(qv[g][c], k[c], acc);
            const float s = sum(acc) * ks;
            scores[(size_t)g * n + (t - t0)] = s;
            top[g] = std::max(top[g], s);
        }
    }
    float total[G];
    for (int g = 0; g < G; ++g) {
        // e^(s - top) in place and its sum, sixteen at a time (a scalar running sum was a chain of n
        // dependent adds per head: ~30 % of the kernel's time, measured alone at 2,000 positions)
        float* s = scores + (size_t)g * n;
        const V m = set1(top[g]);
        V acc = zero();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            const V e = exp(sub(load(s + i), m));
            store(s + i, e);
            acc = add(acc, e);
        }
        total[g] = sum(acc);
        for (; i < n; ++i) total[g] += s[i] = std::exp(s[i] - top[g]);
        if constexpr (coded) {  // the value scales, once per position and head: weights of the codes
            const int own = std::max(0, std::min(n, cached - t0));
            for (i = 0; i < own; ++i) s[i] *= sc.v[t0 + i];
            for (; i < n; ++i) s[i] *= sc.v_own;
        }
    }
    V o[G][C];
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) o[g][c] = zero();
    for (int t = t0; t < t1; ++t) {
        V v[C];
#ifdef PARLEY_ATTENTION_VNNI
        if constexpr (coded && attention_int8::takes(d))  // the codes' lines ahead, as for the keys (attention_int8.h)
            for (int c = 0; c < C / 4; ++c) prefetch((const char*)(v_at(t) + 64 * c));
#endif
        for (int c = 0; c < C; ++c) v[c] = load(v_at(t) + 16 * c);
        for (int g = 0; g < G; ++g) {
            const V p = set1(scores[(size_t)g * n + (t - t0)]);
            for (int c = 0; c < C; ++c) o[g][c] = fma(p, v[c], o[g][c]);
        }
    }
    for (int g = 0; g < G; ++g) {
        float* dst = out + (size_t)g * state_size(d);
        for (int c = 0; c < C; ++c) store(dst + 16 * c, o[g][c]);
        dst[d] = top[g];
        dst[d + 1] = n > 0 ? total[g] : 0.f;
    }
}

// The same for any even head_dim, in plain loops.
template <typename T>
void part_any(const float* q, int G, int d, const T* keys, const T* values, int cached, const T* key, const T* value,
              const Scales& sc, int t0, int t1, float scale, float* scores, float* out) {
    const int n = t1 - t0;
    constexpr bool coded = std::is_same_v<T, int8_t>;
    for (int g = 0; g < G; ++g) {
        float* s = scores + (size_t)g * n;
        float top = -INFINITY;
        for (int t = t0; t < t1; ++t) {
            const T* kt = t < cached ? keys + (size_t)t * d : key;
            float dotp = 0.f;
            for (int i = 0; i < d; ++i) dotp += q[g * d + i] * (float)kt[i];
            s[t - t0] = dotp * scale * (coded ? (t < cached ? sc.k[t] : sc.k_own) : 1.f);
            top = std::max(top, s[t - t0]);
        }
        float* dst = out + (size_t)g * state_size(d);
        float total = 0.f;
        for (int i = 0; i < d; ++i) dst[i] = 0.f;
        for (int t = t0; t < t1; ++t) {
            const float p = std::exp(s[t - t0] - top);
            const T* vt = t < cached ? values + (size_t)t * d : value;
            const float pv = p * (coded ? (t < cached ? sc.v[t] : sc.v_own) : 1.f);
            total += p;
            for (int i = 0; i < d; ++i) dst[i] += pv * (float)vt[i];
        }
        dst[d] = top;
        dst[d + 1] = total;
    }
}

// Heads per kv head with a compiled kernel (G x head_dim accumulators stay in registers). Any other count is
// taken four heads at a time, the rest by its own kernel: Qwen2.5's 7 (0.5B) and 6 (1.5B) went to the plain loops,
// whose cost per cached position made a 600-token conversation decode ~20 % slower than a fresh one.
template <int C, typename T>
bool part_g(int G, const float* q, const T* keys, const T* values, int cached, const T* key, const T* value,
            const Scales& sc, int t0, int t1, float scale, float* scores, float* out) {
    switch (G) {
        case 1: part<C, 1>(q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out); return true;
        case 2: part<C, 2>(q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out); return true;
        case 3: part<C, 3>(q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out); return true;
        case 4: part<C, 4>(q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out); return true;
        case 8: part<C, 8>(q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out); return true;
        default:
            if (G < 1) return false;
            for (int g0 = 0; g0 < G; g0 += 4)  // heads [g0, g0 + 4): their queries, states; the scores' scratch reused
                part_g<C>(std::min(4, G - g0), q + (size_t)g0 * 16 * C, keys, values, cached, key, value, sc, t0, t1,
                          scale, scores, out + (size_t)g0 * state_size(16 * C));
            return true;
    }
}

template <typename T>
void partial(const float* q, int G, int d, const T* keys, const T* values, int cached, const T* key, const T* value,
             const Scales& sc, int t0, int t1, float* scores, float* out) {
    const float scale = 1.f / std::sqrt((float)d);
    bool done = false;
    if (d == 64) done = part_g<4>(G, q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out);
    if (d == 128) done = part_g<8>(G, q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out);
    // Gemma 3's heads: the plain loops took ~17 % of a 270M step (4 query heads re-read each key, one value at a time)
    if (d == 256) done = part_g<16>(G, q, keys, values, cached, key, value, sc, t0, t1, scale, scores, out);
    if (!done) part_any(q, G, d, keys, values, cached, key, value, sc, t0, t1, scale, scores, out);
}

// parts[i] (i < n): partial states of one head over disjoint position ranges -> out [d], the attention.
inline void merge(const float* const* parts, int n, int d, float* out) {
    float top = -INFINITY;
    for (int i = 0; i < n; ++i)
        if (parts[i][d + 1] > 0.f) top = std::max(top, parts[i][d]);
    float total = 0.f;
    for (int j = 0; j < d; ++j) out[j] = 0.f;
    for (int i = 0; i < n; ++i) {
        if (parts[i][d + 1] <= 0.f) continue;  // an empty range
        const float w = std::exp(parts[i][d] - top);
        total += w * parts[i][d + 1];
        for (int j = 0; j < d; ++j) out[j] += w * parts[i][j];
    }
    const float inv = 1.f / total;
    for (int j = 0; j < d; ++j) out[j] *= inv;
}

}  // namespace attention
