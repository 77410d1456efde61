// Overflow-checked size arithmetic. Sizes derived from files (config.json dimensions, header fields)
// or from caller parameters are multiplied through these: a product that does not fit is an error
// that says what was being sized, never a wrapped value that later sizes an allocation.
#pragma once

#include "common/error.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace spark {

// The product of non-negative factors, or nullopt when a factor is negative or the product exceeds
// `limit`.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t limit = INT64_MAX) {
    int64_t p = 1;
    for (int64_t f : factors) {
        if (f < 0 || __builtin_mul_overflow(p, f, &p) || p > limit) return std::nullopt;
    }
    return p;
}

// a + b for non-negative operands, or nullopt past `limit`.
inline std::optional<int64_t> checked_sum(int64_t a, int64_t b, int64_t limit = INT64_MAX) {
    int64_t s = 0;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &s) || s > limit) return std::nullopt;
    return s;
}

// The product, or Error(status) "<what> overflows (a x b x ...)".
inline int64_t product_or_fail(spark_status status, const char * what, std::initializer_list<int64_t> factors, int64_t limit = INT64_MAX) {
    if (auto p = checked_product(factors, limit)) return *p;
    std::string terms;
    for (int64_t f : factors) terms += (terms.empty() ? "" : " x ") + std::to_string(f);
    fail(status, "%s overflows (%s)", what, terms.c_str());
}

// a + b, or Error(status) "<what> overflows (a + b)".
inline int64_t sum_or_fail(spark_status status, const char * what, int64_t a, int64_t b, int64_t limit = INT64_MAX) {
    if (auto s = checked_sum(a, b, limit)) return *s;
    fail(status, "%s overflows (%lld + %lld)", what, (long long) a, (long long) b);
}

}  // namespace spark
