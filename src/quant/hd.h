// SPARK_HD marks small functions that are compiled both for the host (.cpp, any C++ compiler) and
// for the device (.cu, nvcc), so number-format code is written once and shared by the CPU backend,
// the converter and the CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define SPARK_HD __host__ __device__ __forceinline__
#else
#define SPARK_HD inline
#endif
