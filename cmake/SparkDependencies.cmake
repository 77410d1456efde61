# All dependencies come from Debian packages (scripts/install-deps.sh); nothing is downloaded.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
if(SPARK_BUILD_TESTS)
    find_package(doctest REQUIRED)
endif()
if(SPARK_BUILD_EXAMPLES)
    find_package(CLI11 REQUIRED)
    pkg_check_modules(LIBEDIT IMPORTED_TARGET libedit)
endif()

# Warnings for our own code only.
add_library(spark_warnings INTERFACE)
target_compile_options(spark_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
