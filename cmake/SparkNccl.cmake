# NCCL for the CUDA backend's communicator (src/backends/cuda/comm_nccl.cpp, docs/DISTRIBUTED.md).
# SPARK_NCCL: AUTO (when nccl.h is found), ON, OFF; meaningful only when the CUDA backend is built.
# Only the header is needed to build: libnccl.so.2 is loaded at run time (dlopen), so that libspark
# does not depend on NCCL and a host without it fails only when it asks for several GPUs.
#
# nccl.h is looked for in NCCL_ROOT (CMake or environment), the CUDA toolkit's include directories,
# and the PyPI wheel nvidia-nccl-cu13 of python3 (site-packages/nvidia/nccl/{include,lib}). The
# directory of the libnccl.so.2 found beside it is baked in as the run-time loader's fallback
# (SPARK_NCCL_LIBRARY_DIR). Result: SPARK_NCCL_ENABLED, SPARK_NCCL_INCLUDE_DIR, SPARK_NCCL_LIBRARY_DIR.
set(SPARK_NCCL "AUTO" CACHE STRING "NCCL communicator for several GPUs: AUTO (when nccl.h is found), ON, OFF")
set_property(CACHE SPARK_NCCL PROPERTY STRINGS AUTO ON OFF)
set(NCCL_ROOT "" CACHE PATH "Where NCCL is installed (include/nccl.h, lib/libnccl.so.2); also read from the environment")

set(SPARK_NCCL_ENABLED OFF)
set(SPARK_NCCL_LIBRARY_DIR "")

# The wheel's directories (site-packages/nvidia/nccl) that python3 knows of.
function(spark_nccl_wheel_dirs out)
    set(dirs "")
    find_program(SPARK_PYTHON3 python3)
    if(SPARK_PYTHON3)
        # nvidia is a namespace package: its __file__ is None, its __path__ is the directory.
        execute_process(COMMAND ${SPARK_PYTHON3} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                        OUTPUT_VARIABLE d RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(rc EQUAL 0 AND d)
            list(APPEND dirs "${d}")
        endif()
        execute_process(COMMAND ${SPARK_PYTHON3} -c "import site; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
                        OUTPUT_VARIABLE sites RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(rc EQUAL 0)
            foreach(s IN LISTS sites)
                list(APPEND dirs "${s}/nvidia/nccl")
            endforeach()
        endif()
    endif()
    set(${out} "${dirs}" PARENT_SCOPE)
endfunction()

if(SPARK_CUDA_ENABLED AND NOT SPARK_NCCL STREQUAL "OFF")
    set(roots "")
    foreach(r "${NCCL_ROOT}" "$ENV{NCCL_ROOT}")
        if(r)
            list(APPEND roots "${r}")
        endif()
    endforeach()
    spark_nccl_wheel_dirs(wheel_dirs)
    set(include_hints "")
    foreach(r IN LISTS roots)
        list(APPEND include_hints "${r}/include")
    endforeach()
    list(APPEND include_hints ${CUDAToolkit_INCLUDE_DIRS})
    foreach(w IN LISTS wheel_dirs)
        list(APPEND include_hints "${w}/include")
    endforeach()
    # NCCL_ROOT first; the default paths (/usr/include, /usr/local/include) after the hints.
    find_path(SPARK_NCCL_INCLUDE_DIR nccl.h HINTS ${include_hints} DOC "Directory of nccl.h")

    if(SPARK_NCCL_INCLUDE_DIR)
        # libnccl.so.2 beside the header (the wheel's lib/, a tarball's lib/, the toolkit's lib64/).
        get_filename_component(prefix "${SPARK_NCCL_INCLUDE_DIR}" DIRECTORY)
        find_file(SPARK_NCCL_LIBRARY_FILE libnccl.so.2
                  HINTS "${prefix}/lib" "${prefix}/lib64" ${CUDAToolkit_LIBRARY_DIR}
                        "${CUDAToolkit_LIBRARY_ROOT}/lib" "${CUDAToolkit_LIBRARY_ROOT}/lib64"
                  NO_CACHE NO_DEFAULT_PATH)
        if(SPARK_NCCL_LIBRARY_FILE)
            get_filename_component(SPARK_NCCL_LIBRARY_DIR "${SPARK_NCCL_LIBRARY_FILE}" DIRECTORY)
        endif()
        file(STRINGS "${SPARK_NCCL_INCLUDE_DIR}/nccl.h" nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
        string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
               nccl_version "${nccl_version_lines}")
        set(SPARK_NCCL_ENABLED ON)
        if(SPARK_NCCL_LIBRARY_DIR)
            set(where "libnccl.so.2 from SPARK_NCCL_LIBRARY, else ${SPARK_NCCL_LIBRARY_DIR}, else the loader's path")
        else()
            set(where "libnccl.so.2 from SPARK_NCCL_LIBRARY, else the loader's path (none found beside the header)")
        endif()
        message(STATUS "spark: NCCL ON (header ${nccl_version} in ${SPARK_NCCL_INCLUDE_DIR}; loaded at run time: ${where})")
    elseif(SPARK_NCCL STREQUAL "ON")
        message(FATAL_ERROR "SPARK_NCCL=ON but nccl.h was not found (set NCCL_ROOT, or pip install nvidia-nccl-cu13)")
    else()
        message(STATUS "spark: NCCL OFF (nccl.h not found; NCCL_ROOT or pip install nvidia-nccl-cu13 enable it)")
    endif()
elseif(SPARK_NCCL STREQUAL "ON" AND NOT SPARK_CUDA_ENABLED)
    message(STATUS "spark: NCCL OFF (SPARK_NCCL=ON needs the CUDA backend, which is not built)")
endif()
