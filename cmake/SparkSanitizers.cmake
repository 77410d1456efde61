# Sanitizer and fuzzer instrumentation for every target of the build (see docs/RELIABILITY.md).
if(SPARK_SANITIZE)
    # Frame pointers keep the reports' stacks readable; UBSan findings abort like ASan's.
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${SPARK_SANITIZE}>
                        $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
    if(SPARK_SANITIZE MATCHES "undefined")
        add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
    endif()
    add_link_options(-fsanitize=${SPARK_SANITIZE})
    if(SPARK_SANITIZE MATCHES "undefined" AND CMAKE_C_COMPILER_ID MATCHES "Clang")
        # C programs linking libspark need UBSan's C++ part (vptr checks inside the library).
        add_link_options($<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime>)
        string(APPEND CMAKE_C_STANDARD_LIBRARIES " -lstdc++")
    endif()
    message(STATUS "spark: sanitizers ${SPARK_SANITIZE}")
endif()
if(SPARK_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
        message(FATAL_ERROR "SPARK_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
    endif()
    # Coverage feedback for everything; the harnesses link libFuzzer's main themselves.
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()
