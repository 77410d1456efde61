// Helpers for the io tests: a private temporary directory, byte builders for hand-made (and
// hostile) files, and error capture.
#pragma once

#include "common/error.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace spark::test {

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "spark-io-test-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir & operator=(const TempDir &) = delete;

    std::string operator/(const std::string & name) const { return path_ + "/" + name; }
    const std::string & path() const { return path_; }

private:
    std::string path_;
};

inline void write_file(const std::string & path, const void * data, size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char *>(data), std::streamsize(n));
    if (!out) throw std::runtime_error("cannot write " + path);
}
inline void write_file(const std::string & path, const std::vector<uint8_t> & bytes) { write_file(path, bytes.data(), bytes.size()); }
inline void write_file(const std::string & path, const std::string & text) { write_file(path, text.data(), text.size()); }

inline std::vector<uint8_t> read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline bool exists(const std::string & path) { return std::filesystem::exists(path); }

// Little-endian byte builder.
struct Bytes {
    std::vector<uint8_t> v;

    template <typename T> Bytes & put(T x) {
        const size_t at = v.size();
        v.resize(at + sizeof(T));
        std::memcpy(v.data() + at, &x, sizeof(T));
        return *this;
    }
    Bytes & u8(uint8_t x) { return put(x); }
    Bytes & u32(uint32_t x) { return put(x); }
    Bytes & u64(uint64_t x) { return put(x); }
    Bytes & i64(int64_t x) { return put(x); }
    Bytes & raw(const std::string & s) {
        v.insert(v.end(), s.begin(), s.end());
        return *this;
    }
    Bytes & zeros(size_t n) {
        v.resize(v.size() + n, 0);
        return *this;
    }
    Bytes & pad_to(size_t alignment) {
        v.resize((v.size() + alignment - 1) / alignment * alignment, 0);
        return *this;
    }
    size_t size() const { return v.size(); }
};

// The error a call throws: nullopt when it succeeds.
struct Failure {
    spark_status status;
    std::string  message;
};
inline std::optional<Failure> failure_of(const std::function<void()> & fn) {
    try {
        fn();
    } catch (const Error & e) {
        return Failure{e.status(), e.what()};
    }
    return std::nullopt;
}

// Checks that `fn` fails with `status` and a message containing `needle`.
#define CHECK_FAILS_WITH(fn, status_, needle)                                                           \
    do {                                                                                                \
        auto failure_ = ::spark::test::failure_of(fn);                                                  \
        REQUIRE_MESSAGE(failure_.has_value(), "expected an error containing '" << (needle) << "'");     \
        CHECK_MESSAGE(failure_->status == (status_), failure_->message);                                \
        CHECK_MESSAGE(failure_->message.find(needle) != std::string::npos, failure_->message);          \
    } while (0)

}  // namespace spark::test
