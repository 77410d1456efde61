// Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp, docs/RELIABILITY.md): a private scratch
// directory for the inputs that spark reads from files, and the one rule of every harness: a
// spark::Error is a correct answer to a hostile input; anything else (a crash, another exception,
// a leak, a timeout, running out of memory) is a finding.
#pragma once

#include "common/error.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace fuzz {

// A directory of this process, on tmpfs when there is one (the harnesses write a file per input).
inline const std::filesystem::path & scratch_dir() {
    static const std::filesystem::path dir = [] {
        const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
        std::filesystem::path       d    = base / ("spark-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
        return d;
    }();
    return dir;
}

inline void write_file(const std::filesystem::path & path, std::string_view bytes) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();  // the harness's own environment, not a finding about spark
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
}

// Runs `fn`; a spark::Error is an accepted outcome.
template <typename Fn> void expect_spark_errors_only(Fn && fn) {
    try {
        fn();
    } catch (const spark::Error &) {
    }
}

// The input split at its first NUL byte: the JSON documents of the harnesses never contain one.
inline std::pair<std::string_view, std::string_view> split_at_nul(std::string_view in) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) return {in, {}};
    return {in.substr(0, nul), in.substr(nul + 1)};
}

}  // namespace fuzz
