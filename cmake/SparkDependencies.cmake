# All dependencies come from Debian packages (scripts/install-deps.sh); nothing is downloaded.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3.10 REQUIRED)
# PCRE2 and utf8proc through pkg-config, or found directly where pkg-config is absent (e.g. a
# machine where the Debian packages were unpacked into a prefix listed in CMAKE_PREFIX_PATH).
find_package(PkgConfig QUIET)
function(spark_find_c_library var pc header lib)
    if(PKG_CONFIG_FOUND)
        pkg_check_modules(${var} QUIET IMPORTED_TARGET ${pc})
    endif()
    if(NOT TARGET PkgConfig::${var})
        find_path(${var}_INCLUDE ${header} REQUIRED)
        find_library(${var}_LIBRARY ${lib} REQUIRED)
        add_library(PkgConfig::${var} UNKNOWN IMPORTED GLOBAL)
        set_target_properties(PkgConfig::${var} PROPERTIES IMPORTED_LOCATION ${${var}_LIBRARY}
                                                           INTERFACE_INCLUDE_DIRECTORIES ${${var}_INCLUDE})
    endif()
endfunction()
spark_find_c_library(PCRE2 libpcre2-8 pcre2.h pcre2-8)
spark_find_c_library(UTF8PROC libutf8proc utf8proc.h utf8proc)
if(SPARK_BUILD_TESTS)
    find_package(doctest REQUIRED)
endif()
if(SPARK_BUILD_EXAMPLES)
    find_package(CLI11 REQUIRED)
    if(PKG_CONFIG_FOUND)
        pkg_check_modules(LIBEDIT QUIET IMPORTED_TARGET libedit)
    endif()
endif()

# Warnings for our own code only.
add_library(spark_warnings INTERFACE)
target_compile_options(spark_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
