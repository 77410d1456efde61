// Emulator stand-in for <cuda_bf16.h>: the bf16 type, for mma_m16n8k16<__nv_bfloat16> (the values
// go through the bit-exact host converters of quant/formats.h, see backends/cuda/common/ptx_sm80.cuh).
#pragma once

#include "emu_runtime.h"

struct __nv_bfloat16 {
    uint16_t bits;
};
