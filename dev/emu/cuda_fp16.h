// Emulator stand-in for <cuda_fp16.h>: the f16 types and the conversions matmul/formats.cuh uses,
// through the bit-exact host converters of quant/formats.h.
#pragma once

#include "emu_runtime.h"

struct __half {
    uint16_t bits;
};
struct __half2 {
    uint16_t x, y;
};
inline __half __ushort_as_half(unsigned short b) { return {uint16_t(b)}; }
inline float  __half2float(__half h) { return spark::f16_to_f32(h.bits); }
inline float2 __half22float2(__half2 h) { return {spark::f16_to_f32(h.x), spark::f16_to_f32(h.y)}; }
