// Emulator stand-in for <cuda_runtime.h> in the matmul lab: the fiber runtime plus the few runtime
// names the host headers mention.
#pragma once

#include "emu_matmul.h"

typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0;
inline const char * cudaGetErrorString(cudaError_t) { return "emulated"; }
inline cudaError_t  cudaGetLastError() { return cudaSuccess; }
