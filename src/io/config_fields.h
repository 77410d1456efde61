// Typed, bounded reads of the fields of JSON configuration files (config.json of a model or an
// EAGLE3 head, the small sections of tokenizer.json, tokenizer_config.json): every value a file
// gives is checked for its type and against a plausible range before it sizes anything, and every
// error names the file and the field.
#pragma once

#include "common/error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace spark {

namespace config_limits {
// Plausible upper bounds of every dimension. The largest published models are far below them
// (hidden 16k, 128 heads of 256, 512 experts, 256k vocabulary, contexts of 10M tokens). Under them
// the shape of any one tensor (at most three dimensions: experts x rows x columns, 2^58 elements)
// fits an int64 in bytes; sizes that multiply more (caches, recurrent states over sequences and
// layers) go through the checked arithmetic of common/checked.h.
constexpr int64_t kMaxVocab      = int64_t(1) << 24;
constexpr int64_t kMaxEmbd       = int64_t(1) << 20;
constexpr int64_t kMaxLayers     = 4096;
constexpr int64_t kMaxHeads      = int64_t(1) << 14;
constexpr int64_t kMaxHeadDim    = int64_t(1) << 14;
constexpr int64_t kMaxFF         = int64_t(1) << 24;
constexpr int64_t kMaxExperts    = int64_t(1) << 14;
constexpr int64_t kMaxConvKernel = 1024;
constexpr int64_t kMaxPositions  = INT32_MAX;  // spark_model_info.n_ctx_train is an int32
}  // namespace config_limits

// Reads the fields of one JSON object; `origin` names its file in every error.
class ConfigFields {
public:
    ConfigFields(const nlohmann::json & j, const std::string & origin, std::string prefix = "")
        : j_(j), origin_(origin), prefix_(std::move(prefix)) {}

    template <typename... Args> [[noreturn]] void bad(const char * key, const char * fmt, Args... args) const {
        std::string what = fmt;  // a message without arguments is not a format (it may hold '%')
        if constexpr (sizeof...(Args) > 0) what = strfmt(fmt, args...);
        fail(SPARK_ERR_INVALID_FORMAT, "%s: '%s%s' %s", origin_.c_str(), prefix_.c_str(), key, what.c_str());
    }

    // An integer in [lo, hi]; `fallback` when absent (or an error when required).
    int64_t integer(const char * key, int64_t fallback, int64_t lo, int64_t hi, bool required = false) const {
        const nlohmann::json * v = find(key);
        if (!v) {
            if (required) bad(key, "is missing");
            return fallback;
        }
        if (!v->is_number_integer()) bad(key, "must be an integer, not %s", shown(*v).c_str());
        // An unsigned value above INT64_MAX would wrap when read as int64.
        if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi)) bad(key, "= %s exceeds the limit of %lld", shown(*v).c_str(), (long long) hi);
        const int64_t x = v->get<int64_t>();
        if (x < lo && lo == 0) bad(key, "must not be negative (got %lld)", (long long) x);
        if (x < lo || x > hi) bad(key, "= %lld is outside [%lld, %lld]", (long long) x, (long long) lo, (long long) hi);
        return x;
    }

    // A finite number in (lo, hi] (lo_open) or [lo, hi]; `fallback` when absent.
    double number(const char * key, double fallback, double lo, double hi, bool lo_open) const {
        const nlohmann::json * v = find(key);
        if (!v) return fallback;
        if (!v->is_number()) bad(key, "must be a number, not %s", shown(*v).c_str());
        const double x = v->get<double>();
        if (!std::isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || !(x <= hi))
            bad(key, "= %s is outside %c%g, %g]", shown(*v).c_str(), lo_open ? '(' : '[', lo, hi);
        return x;
    }

    // A positive float: in (0, hi] and still positive once rounded to float (1e-300 is not).
    float positive_float(const char * key, double fallback, double hi) const {
        const double x = number(key, fallback, 0.0, hi, true);
        if (!(float(x) > 0.0f)) bad(key, "= %g rounds to 0 as a float", x);
        return float(x);
    }

    // A string; `fallback` when absent (or an error when required).
    std::string string(const char * key, const std::string & fallback, bool required = false) const {
        const nlohmann::json * v = find(key);
        if (!v) {
            if (required) bad(key, "is missing");
            return fallback;
        }
        if (!v->is_string()) bad(key, "must be a string, not %s", shown(*v).c_str());
        return v->get<std::string>();
    }

    bool boolean(const char * key, bool fallback) const {
        const nlohmann::json * v = find(key);
        if (!v) return fallback;
        if (!v->is_boolean()) bad(key, "must be a boolean, not %s", shown(*v).c_str());
        return v->get<bool>();
    }

    // A token id, or a list of them (eos_token_id), each in [0, n_vocab). Negative ids mean "none"
    // and are dropped.
    std::vector<int32_t> token_ids(const char * key, int64_t n_vocab) const {
        std::vector<int32_t>   out;
        const nlohmann::json * v = find(key);
        if (!v) return out;
        auto one = [&](const nlohmann::json & x) {
            if (!x.is_number_integer()) bad(key, "must hold token ids, not %s", shown(x).c_str());
            if (x.is_number_unsigned() ? x.get<uint64_t>() >= uint64_t(n_vocab) : x.get<int64_t>() >= n_vocab)
                bad(key, "holds %s, outside the vocabulary [0, %lld)", shown(x).c_str(), (long long) n_vocab);
            if (x.get<int64_t>() >= 0) out.push_back(int32_t(x.get<int64_t>()));
        };
        if (v->is_array())
            for (const nlohmann::json & x : *v) one(x);
        else one(*v);
        return out;
    }

    // A value as a message shows it: its JSON text, cut short (a hostile value may be megabytes).
    static std::string shown(const nlohmann::json & v) {
        std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        constexpr size_t kMaxShown = 80;
        if (s.size() > kMaxShown) s = s.substr(0, kMaxShown) + "...";
        return s;
    }

    // The value of `key`; nullptr when it is absent or null.
    const nlohmann::json * find(const char * key) const {
        auto it = j_.find(key);
        return it == j_.end() || it->is_null() ? nullptr : &*it;
    }
    const std::string & origin() const { return origin_; }
    const std::string & prefix() const { return prefix_; }

private:
    const nlohmann::json & j_;
    const std::string &    origin_;  // the file, for messages
    std::string            prefix_;  // "rope_parameters." for fields of a nested object
};

}  // namespace spark
