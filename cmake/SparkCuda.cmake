# CUDA backend plumbing. Enabled when nvcc is found (SPARK_CUDA=AUTO) or forced (ON); off with OFF.
#
# Real cubins for every target GPU generation; sm_90a and sm_120a/sm_121a are the arch-specific
# targets (wgmma on Hopper; hardware E2M1 convert and block-scaled FP4 mma on Blackwell GeForce /
# DGX Spark), which are not forward compatible, hence no PTX fallback for them.
set(SPARK_CUDA_ENABLED OFF)
if(NOT SPARK_CUDA STREQUAL "OFF")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        enable_language(CUDA)
        find_package(CUDAToolkit REQUIRED)
        set(SPARK_CUDA_ENABLED ON)
    elseif(SPARK_CUDA STREQUAL "ON")
        message(FATAL_ERROR "SPARK_CUDA=ON but no CUDA compiler was found")
    endif()
endif()

if(SPARK_CUDA_ENABLED)
    if(CUDAToolkit_VERSION VERSION_LESS 13.0)
        message(FATAL_ERROR "spark needs CUDA >= 13.0 (for sm_121a); found ${CUDAToolkit_VERSION}")
    endif()
    # CMake 3.25 (Debian 12) does not know nvcc's C++20 flag yet: tell it.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # The generic kernels are built for every target; per-arch files only for their own (see
    # src/backends/cuda/CMakeLists.txt). Override with -DSPARK_CUDA_ARCHS="90a" for a fast local build.
    set(SPARK_CUDA_ARCHS "80;86;89;90a;120a;121a" CACHE STRING "CUDA targets (real cubins)")
    message(STATUS "spark: CUDA backend ON (${CUDAToolkit_VERSION}), targets: ${SPARK_CUDA_ARCHS}")
else()
    message(STATUS "spark: CUDA backend OFF")
endif()
