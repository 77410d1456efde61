// Emulator stand-in for src/backends/cuda/common/arch.h (found first on the include path of every
// kernel lab: -Idev/emu comes before -Isrc). By default it is the real header, unchanged: the labs
// compile the kernels as a host pass sees them (every SPARK_ARCH_* is 0).
//
// A lab that defines SPARK_EMU_CUDA_ARCH (e.g. 1200: dev/kernels/fp4's emu-w4a4) gets the values
// the real header gives a device pass of that arch-specific target (sm_120a): __CUDA_ARCH__ and
// __CUDA_ARCH_SPECIFIC__ are defined to it while the real header is read, and undefined again
// afterwards, so nothing else (quant/formats.h picks CUDA intrinsics on __CUDA_ARCH__) sees a
// device pass. The real header's logic decides, nothing here redefines a SPARK_ARCH_* macro; the
// real build's guards (gemm_w4a4_sm120.cu's #error) are untouched. The PTX wrappers such a pass
// enables must then have a shadow here (ptx_sm120.cuh does).
#pragma once

#if defined(SPARK_EMU_CUDA_ARCH)
#if defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_SPECIFIC__)
#error "SPARK_EMU_CUDA_ARCH: the emulator is a host build, __CUDA_ARCH__ must not be defined"
#endif
#define __CUDA_ARCH__          SPARK_EMU_CUDA_ARCH
#define __CUDA_ARCH_SPECIFIC__ SPARK_EMU_CUDA_ARCH
#include_next "backends/cuda/common/arch.h"
#undef __CUDA_ARCH__
#undef __CUDA_ARCH_SPECIFIC__
#else
#include_next "backends/cuda/common/arch.h"
#endif
