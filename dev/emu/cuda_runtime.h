// Stand-in for <cuda_runtime.h> in the kernel labs: the emulator runtime plus the runtime API names
// the host headers mention.
#pragma once

#include "emu_runtime.h"

constexpr cudaError_t cudaSuccess = 0;
inline const char *   cudaGetErrorString(cudaError_t) { return "emulated"; }
inline cudaError_t    cudaGetLastError() { return cudaSuccess; }
