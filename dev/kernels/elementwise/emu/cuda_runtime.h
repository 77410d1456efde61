// Emulator stand-in for <cuda_runtime.h> (see emu_runtime.h).
#pragma once
#include "emu_runtime.h"
