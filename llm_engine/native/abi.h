// The structs the Python side (decoder.py) fills with pointers into the model: the library's whole
// view of a model. Any change here changes parley_abi(), which decoder.py checks before the first call.
#pragma once
#include <cstdint>

extern "C" {

enum { KIND_F32 = 0, KIND_INT8 = 1, KIND_INT4 = 2 };
enum { KV_F32 = 0, KV_HALF = 1, KV_INT8 = 2 };
// PModel.int4_dot: which int8-input kernel the layers that fit take (0: none, the float kernels).
enum { INT8DOT_VNNI = 1, INT8DOT_PORTABLE = 2, INT8DOT_AVX2 = 3 };

struct PLinear {
    int32_t kind;        // KIND_*
    int32_t n, k, group;  // out features, in features, int4 group size
    const void* w;        // f32 [n, k] | int8 [n, k] | uint8 [n, k / 2], low nibble = even k
    const float* scales;  // int8: [n]; int4: [n, k / group]
    const float* mins;    // int4: [n, k / group]
    const float* bias;    // [n] or null
    const uint16_t* dm;   // int4: (scale, minimum) per group as float16 pairs [n, k / group, 2], or null
    const float* dm32;    // int4 whose pairs float16 cannot hold: the same as float32 pairs, or null
    const void* kblocks;  // int4 from GGUF Q4_K, group 32: KBlock [n, k / 256] (kblock.h) instead of pairs, or null
};

struct PLayer {
    const float* attn_norm;  // [hidden]
    const float* mlp_norm;   // [hidden] before the MLP
    const float* attn_out_norm;  // [hidden] on the attention's output before the residual add (Gemma 3), or null
    const float* mlp_out_norm;   // [hidden] on the MLP's output before the residual add (Gemma 3), or null
    PLinear qkv;             // hidden -> (heads + 2 kv_heads) * head_dim, q then k then v
    PLinear o;               // heads * head_dim -> hidden
    PLinear gate_up;         // hidden -> 2 * inter, gate then up
    PLinear down;            // inter -> hidden
    const float* q_norm;     // [head_dim] RMS norm of each query head before rope (Qwen3), or null
    const float* k_norm;     // [head_dim] the same for each key head, or null
    int32_t window;          // sliding-window attention: the last `window` positions (the row's own included); 0 = all
    int32_t local_rope;      // 1: rotate by the model's local tables (rope_cos_local), 0: the global ones
};

struct PModel {
    int32_t n_layers, hidden, n_heads, n_kv, head_dim, inter, vocab, max_seq, n_slots, max_rows;
    int32_t int4_dot;         // INT8DOT_*: int4 (and int8) layers take the int8-input dot product on AVX-512 VNNI or
                              // AVX2 where compiled in (else the portable loops), or the portable loops; 0: not
    int32_t kv_kind;          // KV_* : the KV cache's element
    int32_t gelu;             // the MLP's gate: 1 tanh-approximated gelu (GeGLU, Gemma), 0 silu (SwiGLU)
    float eps;
    float embed_scale;        // the embedding rows are multiplied by it on the way in (Gemma: sqrt(hidden)), else 1
    const float* embed;       // [vocab, hidden]
    const float* final_norm;  // [hidden]
    PLinear head;             // hidden -> vocab
    const float* rope_cos;    // [max_seq, head_dim]
    const float* rope_sin;    // [max_seq, head_dim], sign of the rotation folded into the first half
    const float* rope_cos_local;  // the same for layers with local_rope (Gemma 3's windowed layers)
    const float* rope_sin_local;
    void* k_cache;            // [n_layers, n_slots, n_kv, max_seq, head_dim] of float, half or int8 (kv_kind)
    void* v_cache;
    float* k_scale;           // KV_INT8: [n_layers, n_slots, n_kv, max_seq], row = codes * scale; else null
    float* v_scale;
    const PLayer* layers;     // [n_layers]
};

}  // extern "C"
