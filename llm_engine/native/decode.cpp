// One decode step of a Llama-family model on CPU, compiled: one token per row, float32 activations,
// rows in slots of their own (a batched decode) or consecutive positions of one slot (a prompt's chunk),
// weights as the Python layers hold them (float32, int8 per channel, int4 group-wise with minimums), a
// KV cache of float32, float16 or int8 codes with a scale per head and position.
//
// Why it exists: in eager PyTorch a batch-1 step on a small model is ~40 tiny ops per layer, and their
// dispatch costs more than the arithmetic. Here the whole step is one call and one OpenMP parallel region
// (the same libgomp runtime as torch's, so one thread pool). Only the matrix-vector products (by output
// row) and attention (by cached position, attention.h) are split across threads; everything between them
// (norms, rope, SwiGLU or GeGLU, merging attention, preparing the next product's input) is a few hundred values
// that every thread computes for itself, so a layer costs five barriers (the team's own spinning barrier, barrier.h).
//
// The layout contract is abi.h; nothing here allocates model memory or keeps state between calls.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "abi.h"
#include "attention.h"
#include "barrier.h"
#include "matvec.h"
#include "vec16.h"

extern "C" {

// Bit 0: the int8-input kernels on AVX-512 VNNI are compiled in; bit 1: those on AVX2 (int8dot_avx2.h).
int32_t parley_features(void) {
    int32_t bits = 0;
#ifdef PARLEY_INT4_VNNI
    bits |= 1;
#endif
#ifdef PARLEY_INT8DOT_AVX2
    bits |= 2;
#endif
    return bits;
}

int32_t parley_abi(void) { return (int32_t)(sizeof(PLinear) * 1000 + sizeof(PLayer) * 10 + sizeof(PModel) % 10); }

}  // extern "C"

namespace {

using matvec::kMaxRows;
constexpr int kMaxHeadDim = 512;  // decoder.py refuses wider heads

void rms_norm(const float* x, const float* w, float eps, int n, float* out) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    const float r = 1.f / std::sqrt(ss / (float)n + eps);
    for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

// out[c] = silu(gate[c]) * up[c] for c < n; or (gelu) tanh-approximated gelu(gate[c]) * up[c], written as
// g * sigmoid(2u) with u = sqrt(2/pi) (g + 0.044715 g^3), which is 0.5 g (1 + tanh(u)).
void glu(const float* gate, const float* up, int n, bool gelu, float* out) {
    constexpr float k2 = 2.f * 0.7978845608028654f;  // 2 sqrt(2/pi)
    if (gelu)
        for (int c = 0; c < n; ++c) out[c] = -k2 * (gate[c] + 0.044715f * gate[c] * gate[c] * gate[c]);
    else
        for (int c = 0; c < n; ++c) out[c] = -gate[c];
    vec16::exp_inplace(out, n);
    for (int c = 0; c < n; ++c) out[c] = gate[c] / (1.f + out[c]) * up[c];
}

// x[b] += rms_norm(y[b]) * w for every row, each thread adding its share of the columns (every thread normalises
// the whole row into `scratch` for itself), then a barrier: the sandwich norms' residual add (Gemma 3).
void add_normed(const float* y, const float* w, float eps, int rows, int n, float* x, float* scratch, int me, int nt,
                team::Barrier& sync) {
    const int c0 = (int)((int64_t)n * me / nt), c1 = (int)((int64_t)n * (me + 1) / nt);
    for (int b = 0; b < rows; ++b) {
        rms_norm(y + (size_t)b * n, w, eps, n, scratch);
        for (int c = c0; c < c1; ++c) x[(size_t)b * n + c] += scratch[c];
    }
    sync.wait();
}

// x * cos + (x2, x1) * signed sin, the rotate-half rope of model.py.
void rope(const float* x, const float* cos, const float* sin, int d, float* out) {
    const int half = d / 2;
    for (int i = 0; i < d; ++i) out[i] = x[i] * cos[i] + x[i < half ? i + half : i - half] * sin[i];
}

// What every thread keeps for itself during a step.
struct Own {
    std::vector<float> h;       // [rows, widest]: normed x, or the SwiGLU output
    std::vector<float> q, kv;   // [rows, heads, d] rotated queries; [rows, 2, kv_heads, d] rotated keys, values
    std::vector<vec16::half> kv_half;  // kv rounded to a half-precision cache's element
    std::vector<int8_t> kv_i8;         // kv as an int8 cache's codes, with a scale per head (kv_scale)
    std::vector<float> kv_scale;       // [rows, 2, kv_heads]
    std::vector<float> att;     // [rows, heads, d]: the attention, merged from every thread's part
    std::vector<float> scores;  // [heads per kv head, max_seq]
    matvec::Input in;

    Own(const PModel& m, int rows, int widest, int dot)
        : h((size_t)rows * widest), q((size_t)rows * m.n_heads * m.head_dim), kv((size_t)rows * 2 * m.n_kv * m.head_dim),
          kv_half(m.kv_kind == KV_HALF ? kv.size() : 0), kv_i8(m.kv_kind == KV_INT8 ? kv.size() : 0),
          kv_scale(m.kv_kind == KV_INT8 ? (size_t)rows * 2 * m.n_kv : 0), att((size_t)rows * m.n_heads * m.head_dim),
          scores((size_t)(m.n_heads / m.n_kv) * m.max_seq), in(rows, widest, dot) {}
};

// x [d] (rotated) -> int8 codes and their scale, as kv_cache.quantize_rows does it (max |x| / 127, x / scale rounded
// half to even), so a key computed here is stored exactly as the torch path would store it.
float quantize_row(const float* x, int d, int8_t* codes) {
    float top = 0.f;
    for (int i = 0; i < d; ++i) top = std::max(top, std::fabs(x[i]));
    const float scale = top / 127.f;
#if defined(__AVX512F__)
    if (d % 16 == 0 && scale > 0.f) {  // the same division and rounding, sixteen at a time
        const __m512 s = _mm512_set1_ps(scale), lim = _mm512_set1_ps(127.f), low = _mm512_set1_ps(-127.f);
        for (int i = 0; i < d; i += 16) {
            const __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i*)(codes + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(v, lim), low))));
        }
        return scale;
    }
#endif
    for (int i = 0; i < d; ++i)
        codes[i] = scale > 0.f ? (int8_t)std::max(-127.f, std::min(127.f, std::nearbyint(x[i] / scale))) : 0;
    return scale;
}

// x [d] <- x times kv_cache.hadamard(d): a Walsh-Hadamard butterfly over each block of the largest power of
// two dividing d, scaled to be orthogonal. Its own inverse: queries enter an int8 cache's rotated space by
// it, and the attention leaves it by it.
void rotate(float* x, int d) {
    const int block = d & -d;
    const float norm = 1.f / std::sqrt((float)block);
#if defined(__AVX512F__)
    // Sixteen lanes at a time, the same adds in the same order (~0.1 of the loops' time; 24 rows a layer at
    // head_dim 64 took ~3 us, ~3 % of a SmolLM2 step): strides 1-8 by swapping lanes within a vector, then across.
    if (block >= 16) {
        const __m512 scale = _mm512_set1_ps(norm);
        for (int b0 = 0; b0 < d; b0 += block) {
            float* y = x + b0;
            for (int v = 0; v < block; v += 16) {
                __m512 a = _mm512_loadu_ps(y + v), p;
                p = _mm512_permute_ps(a, 0xB1);  // lanes j ^ 1
                a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xAAAA, p, a);
                p = _mm512_permute_ps(a, 0x4E);  // j ^ 2
                a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xCCCC, p, a);
                p = _mm512_shuffle_f32x4(a, a, 0xB1);  // j ^ 4
                a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xF0F0, p, a);
                p = _mm512_shuffle_f32x4(a, a, 0x4E);  // j ^ 8
                a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xFF00, p, a);
                _mm512_storeu_ps(y + v, a);
            }
            for (int h = 16; h < block; h *= 2)
                for (int i = 0; i < block; i += 2 * h)
                    for (int j = i; j < i + h; j += 16) {
                        const __m512 a = _mm512_loadu_ps(y + j), c = _mm512_loadu_ps(y + j + h);
                        _mm512_storeu_ps(y + j, _mm512_add_ps(a, c));
                        _mm512_storeu_ps(y + j + h, _mm512_sub_ps(a, c));
                    }
            for (int i = 0; i < block; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), scale));
        }
        return;
    }
#endif
    for (int b0 = 0; b0 < d; b0 += block) {
        float* y = x + b0;
        for (int h = 1; h < block; h *= 2)
            for (int i = 0; i < block; i += 2 * h)
                for (int j = i; j < i + h; ++j) {
                    const float a = y[j], c = y[j + h];
                    y[j] = a + c;
                    y[j + h] = a - c;
                }
        for (int i = 0; i < block; ++i) y[i] *= norm;
    }
}

// Layer l's attention with a cache of element type T: one thread stores this step's keys and values;
// then each thread takes its share of every row's positions for every head. The positions before a
// row's own come from the cache (written in earlier steps), its own from `own`, in the cache's
// precision, so a step sees the same key whether it was just computed or read back later.
template <typename T>
void attend(const PModel& m, int l, int rows, const int64_t* pos, const int64_t* slots, bool chained, Own& own,
            float* parts, int me, int nt, team::Barrier& sync) {
    const int d = m.head_dim, hq = m.n_heads, hkv = m.n_kv, per_kv = hq / hkv, state = attention::state_size(d);
    const size_t slot_stride = (size_t)hkv * m.max_seq * d, layer_stride = (size_t)m.n_slots * slot_stride;
    const T* mine;
    constexpr bool coded = std::is_same_v<T, int8_t>;
    if constexpr (std::is_same_v<T, float>) {
        mine = own.kv.data();
    } else if constexpr (coded) {
        for (size_t r = 0; r < own.kv_scale.size(); ++r) {
            rotate(&own.kv[r * d], d);
            own.kv_scale[r] = quantize_row(&own.kv[r * d], d, &own.kv_i8[r * d]);
        }
        for (int r = 0; r < rows * hq; ++r) rotate(&own.q[(size_t)r * d], d);
        mine = own.kv_i8.data();
    } else {
        for (size_t i = 0; i < own.kv.size(); ++i) own.kv_half[i] = (T)own.kv[i];
        mine = own.kv_half.data();
    }
    T *k_cache = static_cast<T*>(m.k_cache), *v_cache = static_cast<T*>(m.v_cache);
    // Scales [n_layers, n_slots, n_kv, max_seq]: the same index as the rows, without head_dim.
    const size_t s_slot = (size_t)hkv * m.max_seq, s_layer = (size_t)m.n_slots * s_slot;
#pragma omp master
    for (int b = 0; b < rows; ++b)
        for (int head = 0; head < hkv; ++head) {
            const size_t row = l * s_layer + slots[b] * s_slot + (size_t)head * m.max_seq + pos[b];
            std::memcpy(k_cache + row * d, mine + ((size_t)b * 2 * hkv + head) * d, sizeof(T) * d);
            std::memcpy(v_cache + row * d, mine + ((size_t)b * 2 * hkv + hkv + head) * d, sizeof(T) * d);
            if constexpr (coded) {
                m.k_scale[row] = own.kv_scale[(size_t)b * 2 * hkv + head];
                m.v_scale[row] = own.kv_scale[(size_t)b * 2 * hkv + hkv + head];
            }
        }
    // Rows of one slot (a chunk of a prompt) read the positions the rows before them store in this step.
    if (chained) sync.wait();
    const int window = m.layers[l].window;
    for (int b = 0; b < rows; ++b) {
        // This row's positions [first, len): all of them, or under a sliding window the last `window`.
        const int len = (int)pos[b] + 1, first = window > 0 ? std::max(0, len - window) : 0, n = len - first;
        const int t0 = first + (int)((int64_t)n * me / nt), t1 = first + (int)((int64_t)n * (me + 1) / nt);
        const T* kv = mine + (size_t)b * 2 * hkv * d;
        for (int kvh = 0; kvh < hkv; ++kvh) {
            const size_t base = l * layer_stride + slots[b] * slot_stride + (size_t)kvh * m.max_seq * d;
            attention::Scales sc;
            if constexpr (coded) {
                const size_t row0 = l * s_layer + slots[b] * s_slot + (size_t)kvh * m.max_seq;
                const float* mine_scale = &own.kv_scale[(size_t)b * 2 * hkv];
                sc = {m.k_scale + row0, m.v_scale + row0, mine_scale[kvh], mine_scale[hkv + kvh]};
            }
            attention::partial(&own.q[((size_t)b * hq + kvh * per_kv) * d], per_kv, d, k_cache + base, v_cache + base,
                               (int)pos[b], kv + kvh * d, kv + (hkv + kvh) * d, sc, t0, t1, own.scores.data(),
                               &parts[(((size_t)me * rows + b) * hq + kvh * per_kv) * state]);
        }
    }
}

// Error codes: 0 ok, 1 rows out of range, 2 token out of range, 3 position out of range, 4 slot out of
// range, 5 rows of one slot not at consecutive positions.
int32_t forward(const PModel& m, int32_t rows, const int64_t* tokens, const int64_t* pos, const int64_t* slots,
                float* logits, int32_t threads, int32_t head_from) {
    if (rows < 1 || rows > kMaxRows || rows > m.max_rows || head_from < 0 || head_from > rows) return 1;
    bool chained = false;
    for (int b = 0; b < rows; ++b) {
        if (tokens[b] < 0 || tokens[b] >= m.vocab) return 2;
        if (pos[b] < 0 || pos[b] >= m.max_seq) return 3;
        if (slots[b] < 0 || slots[b] >= m.n_slots) return 4;
        for (int a = 0; a < b; ++a)
            if (slots[a] == slots[b]) {
                if (pos[b] != pos[b - 1] + 1 || slots[b - 1] != slots[b]) return 5;  // one run of positions a slot
                chained = true;
            }
    }
    const int hidden = m.hidden, d = m.head_dim, hq = m.n_heads, hkv = m.n_kv, inter = m.inter;
    const int qkv_width = (hq + 2 * hkv) * d, widest = std::max(std::max(hidden, hq * d), inter);
    // Shared: the residual stream and the outputs the team writes together.
    std::vector<float> x((size_t)rows * hidden), qkv((size_t)rows * qkv_width), gu((size_t)rows * 2 * inter);
    std::vector<float> sub((size_t)rows * hidden);  // a sublayer's output before its norm (Gemma 3's sandwich norms)
    const int team = std::min(std::max((int)threads, 1), 64), state = attention::state_size(d);  // merge() takes <= 64 parts
    std::vector<float> parts((size_t)team * rows * hq * state);  // [thread, row, head, state]
    team::Barrier sync;
    for (int b = 0; b < rows; ++b) {
        std::memcpy(&x[(size_t)b * hidden], m.embed + (size_t)tokens[b] * hidden, sizeof(float) * hidden);
        if (m.embed_scale != 1.f)
            for (int c = 0; c < hidden; ++c) x[(size_t)b * hidden + c] *= m.embed_scale;
    }

#pragma omp parallel num_threads(team)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        sync.join(nt);
        Own own(m, rows, widest, m.int4_dot);
        float* h = own.h.data();
        auto norm_all = [&](const float* weight) {
            for (int b = 0; b < rows; ++b) rms_norm(&x[(size_t)b * hidden], weight, m.eps, hidden, h + (size_t)b * hidden);
        };
        for (int l = 0; l < m.n_layers; ++l) {
            const PLayer& L = m.layers[l];
            norm_all(L.attn_norm);
            matvec::prepare(L.qkv, rows, h, own.in);
            matvec::linear(L.qkv, rows, own.in, qkv.data(), qkv_width, false, sync);

            // Every thread rotates this step's queries and keys for itself; one stores keys and values.
            for (int b = 0; b < rows; ++b) {
                const float* src = &qkv[(size_t)b * qkv_width];
                const float* cos = (L.local_rope ? m.rope_cos_local : m.rope_cos) + pos[b] * d;
                const float* sin = (L.local_rope ? m.rope_sin_local : m.rope_sin) + pos[b] * d;
                float* kv = &own.kv[(size_t)b * 2 * hkv * d];
                float normed[kMaxHeadDim];
                for (int head = 0; head < hq + hkv; ++head) {
                    const float* x = src + head * d;
                    const float* norm = head < hq ? L.q_norm : L.k_norm;
                    if (norm != nullptr) {
                        rms_norm(x, norm, m.eps, d, normed);
                        x = normed;
                    }
                    rope(x, cos, sin, d, head < hq ? &own.q[((size_t)b * hq + head) * d] : kv + (head - hq) * d);
                }
                std::memcpy(kv + hkv * d, src + (hq + hkv) * d, sizeof(float) * hkv * d);
            }
            if (m.kv_kind == KV_HALF)
                attend<vec16::half>(m, l, rows, pos, slots, chained, own, parts.data(), me, nt, sync);
            else if (m.kv_kind == KV_INT8)
                attend<int8_t>(m, l, rows, pos, slots, chained, own, parts.data(), me, nt, sync);
            else
                attend<float>(m, l, rows, pos, slots, chained, own, parts.data(), me, nt, sync);
            sync.wait();
            for (int i = 0; i < rows * hq; ++i) {
                const float* mine[64];
                for (int t = 0; t < nt; ++t) mine[t] = &parts[((size_t)t * rows * hq + i) * state];
                attention::merge(mine, nt, d, &own.att[(size_t)i * d]);
                if (m.kv_kind == KV_INT8) rotate(&own.att[(size_t)i * d], d);  // back from the cache's rotated space
            }
            matvec::prepare(L.o, rows, own.att.data(), own.in);
            if (L.attn_out_norm == nullptr) {
                matvec::linear(L.o, rows, own.in, x.data(), hidden, true, sync);  // residual: x += o(att)
            } else {
                matvec::linear(L.o, rows, own.in, sub.data(), hidden, false, sync);
                add_normed(sub.data(), L.attn_out_norm, m.eps, rows, hidden, x.data(), h, me, nt, sync);  // x += norm(o(att))
            }

            norm_all(L.mlp_norm);
            matvec::prepare(L.gate_up, rows, h, own.in);
            matvec::linear(L.gate_up, rows, own.in, gu.data(), 2 * inter, false, sync);
            for (int b = 0; b < rows; ++b) {
                const float* g = &gu[(size_t)b * 2 * inter];
                glu(g, g + inter, inter, m.gelu != 0, h + (size_t)b * inter);
            }
            matvec::prepare(L.down, rows, h, own.in);
            if (L.mlp_out_norm == nullptr) {
                matvec::linear(L.down, rows, own.in, x.data(), hidden, true, sync);  // residual: x += down(act)
            } else {
                matvec::linear(L.down, rows, own.in, sub.data(), hidden, false, sync);
                add_normed(sub.data(), L.mlp_out_norm, m.eps, rows, hidden, x.data(), h, me, nt, sync);
            }
        }
        const int out = rows - head_from;  // the rows whose logits are asked for: the last ones
        if (out > 0) {
            float* hh = h + (size_t)head_from * hidden;
            for (int b = head_from; b < rows; ++b) rms_norm(&x[(size_t)b * hidden], m.final_norm, m.eps, hidden, h + (size_t)b * hidden);
            matvec::prepare(m.head, out, hh, own.in);
            matvec::linear(m.head, out, own.in, logits, m.vocab, false, sync);
        }
    }
    return 0;
}

}  // namespace

extern "C" {

// One token per row, each row in its own slot: logits [rows, vocab].
int32_t parley_decode(const PModel* mp, int32_t rows, const int64_t* tokens, const int64_t* pos, const int64_t* slots,
                      float* logits, int32_t threads) {
    for (int b = 0; b < rows && b < kMaxRows; ++b)
        for (int a = 0; a < b; ++a)
            if (slots[a] == slots[b]) return 4;
    return forward(*mp, rows, tokens, pos, slots, logits, threads, 0);
}

// Rows in slots of their own or runs of consecutive positions of one slot (a prompt's chunk, a draft to check);
// logits [rows - head_from, vocab] for the last rows only (a chunk wants its last row's, or none: head_from = rows).
int32_t parley_forward(const PModel* mp, int32_t rows, const int64_t* tokens, const int64_t* pos, const int64_t* slots,
                       float* logits, int32_t threads, int32_t head_from) {
    return forward(*mp, rows, tokens, pos, slots, logits, threads, head_from);
}

}  // extern "C"
