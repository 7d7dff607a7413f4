// A GGUF Q4_K super-block's factors as the int8-input Q4_K kernel reads them (int8dot_avx2.h; VNNI machines take it too).
#pragma once
#include <cstdint>

namespace kblock {

// 24 bytes per 256 weights (llama.cpp reads 16 for them): the (scale, minimum) of group g is (d * sm[2g],
// nmin * sm[2g + 1]) in float32, exactly what the layer's float32 pairs hold.
struct KBlock {
    uint8_t sm[16];  // 6-bit scale and minimum multipliers per group of 32, interleaved
    float d, nmin;   // the super-block's scale and its negated minimum scale (-dmin)
};
static_assert(sizeof(KBlock) == 24, "KBlock is 24 bytes");

}  // namespace kblock
