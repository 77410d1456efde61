# CUDA backend plumbing. SPARK_CUDA: AUTO (when nvcc is found and there is something to build for),
# ON, OFF. SPARK_CUDA_ARCHS chooses the targets, as llama.cpp does:
#   native  (default) the GPUs of this machine (nvidia-smi's compute capabilities). With none, AUTO
#           builds CPU-only (~2 minutes and a small libspark that does not need libcudart) and ON
#           builds every target;
#   all     every supported generation (packagers; CI compiles it so no kernel breaks unnoticed);
#   a list  such as "90a" or "90a;120a;121a".
# The resolved list is SPARK_CUDA_TARGETS. Real cubins for every target; sm_90a and sm_120a/sm_121a
# are the arch-specific targets (wgmma on Hopper; hardware E2M1 convert and block-scaled FP4 mma on
# Blackwell GeForce / DGX Spark), which are not forward compatible, hence no PTX fallback for them.
set(SPARK_CUDA_ARCHS "native" CACHE STRING "CUDA targets: native (this machine's GPUs), all, or a list such as 90a;120a")
set(spark_all_cuda_archs 80 86 89 90a 120a 121a)

# The real targets of this machine's GPUs (compute capability 8.0 and newer), or an empty list.
function(spark_native_cuda_archs out)
    set(archs "")
    find_program(SPARK_NVIDIA_SMI nvidia-smi)
    if(SPARK_NVIDIA_SMI)
        execute_process(COMMAND ${SPARK_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                        OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(rc EQUAL 0)
            string(REPLACE "\n" ";" caps "${caps}")
            foreach(cap IN LISTS caps)
                string(STRIP "${cap}" cap)
                if(NOT cap MATCHES "^([0-9]+)\\.([0-9])$")
                    continue()
                endif()
                set(a "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
                if(a LESS 80)
                    continue()
                endif()
                if(a MATCHES "^(90|100|101|103|120|121)$")  # the arch-specific feature sets
                    set(a "${a}a")
                endif()
                list(APPEND archs ${a})
            endforeach()
            list(REMOVE_DUPLICATES archs)
        endif()
    endif()
    set(${out} "${archs}" PARENT_SCOPE)
endfunction()

set(SPARK_CUDA_ENABLED OFF)
set(SPARK_CUDA_TARGETS "")
if(NOT SPARK_CUDA STREQUAL "OFF")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        if(SPARK_CUDA_ARCHS STREQUAL "native")
            spark_native_cuda_archs(SPARK_CUDA_TARGETS)
            if(NOT SPARK_CUDA_TARGETS AND SPARK_CUDA STREQUAL "ON")
                set(SPARK_CUDA_TARGETS ${spark_all_cuda_archs})
                message(STATUS "spark: no GPU found; SPARK_CUDA=ON builds every CUDA target")
            elseif(NOT SPARK_CUDA_TARGETS)
                message(STATUS "spark: nvcc found but no GPU: CPU-only build (-DSPARK_CUDA_ARCHS=all builds every CUDA target)")
            endif()
        elseif(SPARK_CUDA_ARCHS STREQUAL "all")
            set(SPARK_CUDA_TARGETS ${spark_all_cuda_archs})
        else()
            set(SPARK_CUDA_TARGETS ${SPARK_CUDA_ARCHS})
        endif()
        if(SPARK_CUDA_TARGETS)
            enable_language(CUDA)
            find_package(CUDAToolkit REQUIRED)
            set(SPARK_CUDA_ENABLED ON)
        endif()
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
    message(STATUS "spark: CUDA backend ON (${CUDAToolkit_VERSION}), targets: ${SPARK_CUDA_TARGETS}")
else()
    message(STATUS "spark: CUDA backend OFF")
endif()
