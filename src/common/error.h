// Errors inside spark are exceptions carrying a public status code; the C API glue (src/runtime/api.cpp
// and the per-component api files) catches them at the boundary, stores the message as the thread's
// last error and returns the status. Nothing throws across the C boundary.
#pragma once

#include <spark/spark.h>

#include <cstdio>
#include <exception>
#include <string>
#include <utility>

namespace spark {

class Error : public std::exception {
public:
    Error(spark_status status, std::string message) : status_(status), message_(std::move(message)) {}
    spark_status status() const noexcept { return status_; }
    const char * what() const noexcept override { return message_.c_str(); }

private:
    spark_status status_;
    std::string  message_;
};

// printf-style formatting into a std::string. The format is always a literal at the call sites
// (fail(status, "...", ...)); a template cannot carry the format attribute that would let the
// compiler see that, hence the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-security"
template <typename... Args> std::string strfmt(const char * fmt, Args... args) {
    int n = std::snprintf(nullptr, 0, fmt, args...);
    std::string s(n > 0 ? size_t(n) : 0, '\0');
    if (n > 0) std::snprintf(s.data(), s.size() + 1, fmt, args...);
    return s;
}
#pragma GCC diagnostic pop

template <typename... Args> [[noreturn]] void fail(spark_status status, const char * fmt, Args... args) {
    throw Error(status, strfmt(fmt, args...));
}

// Thread-local last error used by spark_last_error().
void        set_last_error(const std::string & message);
const char * get_last_error();

// Runs `fn` and converts any exception into a status (+ last error). For C API entry points.
template <typename Fn> spark_status api_guard(Fn && fn) noexcept {
    try {
        fn();
        set_last_error("");
        return SPARK_OK;
    } catch (const Error & e) {
        set_last_error(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        set_last_error("out of host memory");
        return SPARK_ERR_OUT_OF_MEMORY;
    } catch (const std::exception & e) {
        set_last_error(std::string("internal error: ") + e.what());
        return SPARK_ERR_INTERNAL;
    } catch (...) {
        set_last_error("internal error: unknown exception");
        return SPARK_ERR_INTERNAL;
    }
}

}  // namespace spark

// Internal invariant check: a failure is a bug in spark, reported as SPARK_ERR_INTERNAL (never abort).
#define SPARK_ASSERT(cond)                                                                              \
    do {                                                                                                \
        if (!(cond)) ::spark::fail(SPARK_ERR_INTERNAL, "assertion failed: %s (%s:%d)", #cond, __FILE__, \
                                   __LINE__);                                                           \
    } while (0)
