# The installed package, for programs that use libspark:
#   find_package(spark)  lib/cmake/spark: spark::spark (libspark.so), spark::spark_static (libspark.a)
#   pkg-config spark     lib/pkgconfig/spark.pc (--static: what libspark.a needs besides)
# and the demo models (examples/models/CMakeLists.txt, component "models").
include(CMakePackageConfigHelpers)
set(SPARK_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/spark)

# What a program linking libspark.a with the C compiler needs besides libspark.a: the C++ runtime
# (the libraries the C++ driver links and the C driver does not: -lstdc++ -lm with GCC), threads,
# PCRE2 and utf8proc, CUDA's runtime.
set(SPARK_CXX_RUNTIME_LIBS ${CMAKE_CXX_IMPLICIT_LINK_LIBRARIES})
if(CMAKE_C_IMPLICIT_LINK_LIBRARIES)
    list(REMOVE_ITEM SPARK_CXX_RUNTIME_LIBS ${CMAKE_C_IMPLICIT_LINK_LIBRARIES})
endif()
list(REMOVE_DUPLICATES SPARK_CXX_RUNTIME_LIBS)

if(SPARK_CUDA_ENABLED)
    set(SPARK_CONFIG_CUDA_NOTE ", CUDA's runtime")
endif()
list(JOIN SPARK_CXX_RUNTIME_LIBS " " SPARK_CONFIG_CXX_RUNTIME)
install(EXPORT spark-targets NAMESPACE spark:: DESTINATION ${SPARK_CMAKE_INSTALL_DIR})
install(EXPORT spark-static-targets NAMESPACE spark:: DESTINATION ${SPARK_CMAKE_INSTALL_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/spark-config.cmake.in
    ${PROJECT_BINARY_DIR}/package/spark-config.cmake INSTALL_DESTINATION ${SPARK_CMAKE_INSTALL_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/spark-config-version.cmake
    COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/spark-config.cmake ${PROJECT_BINARY_DIR}/package/spark-config-version.cmake
        DESTINATION ${SPARK_CMAKE_INSTALL_DIR})

# spark.pc. The prefix is the one given at install time (cmake --install BUILD --prefix P), so the
# file is written then, from package/spark.pc.in.
set(pc_requires "")
set(pc_libs "")
foreach(dep PCRE2:libpcre2-8:pcre2-8 UTF8PROC:libutf8proc:utf8proc)
    string(REPLACE ":" ";" dep ${dep})
    list(GET dep 0 var)
    list(GET dep 1 module)
    list(GET dep 2 lib)
    if(${var}_FOUND)  # found through pkg-config (cmake/SparkDependencies.cmake): its .pc is there
        list(APPEND pc_requires ${module})
    else()
        get_filename_component(dir "${${var}_LIBRARY}" DIRECTORY)
        list(APPEND pc_libs "-L${dir}" "-l${lib}")
    endif()
endforeach()
if(SPARK_CUDA_ENABLED)
    list(APPEND pc_libs "-L${CUDAToolkit_LIBRARY_DIR}" -lcudart)
    foreach(lib ${CMAKE_DL_LIBS})  # NCCL is opened at run time (dlopen)
        list(APPEND pc_libs -l${lib})
    endforeach()
endif()
if(CMAKE_THREAD_LIBS_INIT)
    list(APPEND pc_libs ${CMAKE_THREAD_LIBS_INIT})
endif()
foreach(lib ${SPARK_CXX_RUNTIME_LIBS})
    if(lib MATCHES "^-" OR IS_ABSOLUTE "${lib}")
        list(APPEND pc_libs ${lib})
    else()
        list(APPEND pc_libs -l${lib})
    endif()
endforeach()
list(JOIN pc_requires " " SPARK_PC_REQUIRES_PRIVATE)
list(JOIN pc_libs " " SPARK_PC_LIBS_PRIVATE)
foreach(d LIBDIR INCLUDEDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${d}}")
        set(SPARK_PC_${d} "${CMAKE_INSTALL_${d}}")
    else()
        set(SPARK_PC_${d} "\${prefix}/${CMAKE_INSTALL_${d}}")
    endif()
endforeach()
set(SPARK_PC_PREFIX "@SPARK_PC_PREFIX@")  # filled in at install time
configure_file(${PROJECT_SOURCE_DIR}/cmake/spark.pc.in ${PROJECT_BINARY_DIR}/package/spark.pc.in @ONLY)
install(CODE "set(SPARK_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
configure_file(\"${PROJECT_BINARY_DIR}/package/spark.pc.in\" \"${PROJECT_BINARY_DIR}/package/spark.pc\" @ONLY)")
install(FILES ${PROJECT_BINARY_DIR}/package/spark.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
