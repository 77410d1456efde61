// Emulator stand-in for <cuda_bf16.h> (nothing of it is used by the GEMV emulation).
#pragma once
#include "emu_matmul.h"
