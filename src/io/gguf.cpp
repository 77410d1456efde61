#include "io/gguf.h"

#include "common/error.h"

#include <algorithm>

namespace spark::io {

// ---- registries --------------------------------------------------------------------------------

namespace {

struct DTypeEntry {
    DType    dtype;
    uint32_t spark_id;   // docs/FORMAT.md "dtype registry": stable, never reused
    uint32_t ggml_type;  // how it is stored
};
// 0 is deliberately unassigned so a zero-filled dtype array is caught.
constexpr DTypeEntry kDTypes[] = {
    {DType::F32, 1, ggml_type::kF32},      {DType::F16, 2, ggml_type::kF16},
    {DType::BF16, 3, ggml_type::kBF16},    {DType::F64, 4, ggml_type::kF64},
    {DType::I8, 5, ggml_type::kI8},        {DType::U8, 6, ggml_type::kI8},
    {DType::I16, 7, ggml_type::kI16},      {DType::U16, 8, ggml_type::kI8},
    {DType::I32, 9, ggml_type::kI32},      {DType::U32, 10, ggml_type::kI8},
    {DType::I64, 11, ggml_type::kI64},     {DType::U64, 12, ggml_type::kI8},
    {DType::BOOL, 13, ggml_type::kI8},     {DType::F8_E4M3, 14, ggml_type::kI8},
    {DType::F8_E5M2, 15, ggml_type::kI8},
};
static_assert(sizeof(kDTypes) / sizeof(kDTypes[0]) == size_t(DType::COUNT), "every DType needs a registry entry");

const DTypeEntry & entry_of(DType t) {
    for (const DTypeEntry & e : kDTypes)
        if (e.dtype == t) return e;
    fail(SPARK_ERR_INTERNAL, "dtype %d has no spark registry entry", int(t));
}

// ggml's names, indexed by type id; "" for ids ggml has retired.
constexpr const char * kGgmlTypeNames[] = {
    "F32", "F16", "Q4_0", "Q4_1", "", "", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
    "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "", "", "", "TQ1_0", "TQ2_0", "", "",
    "", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
};

constexpr const char * kGgufTypeNames[kGgufTypeCount] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
    "UINT64", "INT64", "FLOAT64",
};

bool checked_mul(uint64_t a, uint64_t b, uint64_t & out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

uint32_t spark_dtype_id(DType t) { return entry_of(t).spark_id; }

std::optional<DType> dtype_from_spark_id(uint32_t id) {
    for (const DTypeEntry & e : kDTypes)
        if (e.spark_id == id) return e.dtype;
    return std::nullopt;
}

uint32_t ggml_type_for(DType t) { return entry_of(t).ggml_type; }

const char * ggml_type_name(uint32_t t) {
    if (t >= sizeof(kGgmlTypeNames) / sizeof(kGgmlTypeNames[0]) || kGgmlTypeNames[t][0] == '\0') return "?";
    return kGgmlTypeNames[t];
}

const char * gguf_type_name(GgufType t) {
    return uint32_t(t) < kGgufTypeCount ? kGgufTypeNames[uint32_t(t)] : "?";
}

size_t gguf_fixed_size(GgufType t) {
    switch (t) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
        case GgufType::UINT16: case GgufType::INT16: return 2;
        case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
        case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
        default: return 0;
    }
}

// ---- values ------------------------------------------------------------------------------------

bool GgufArray::operator==(const GgufArray & o) const {
    return elem_type == o.elem_type && count == o.count && raw == o.raw && strings == o.strings && arrays == o.arrays;
}

GgufValue GgufValue::string_array(std::vector<std::string> elems) {
    GgufArray a;
    a.elem_type = GgufType::STRING;
    a.count     = elems.size();
    a.strings   = std::move(elems);
    return GgufValue(std::move(a));
}

GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> elems) {
    for (const GgufValue & e : elems)
        if (e.type() != GgufType::ARRAY) fail(SPARK_ERR_INVALID_ARGUMENT, "array_of_arrays: an element is %s, not an array", gguf_type_name(e.type()));
    GgufArray a;
    a.elem_type = GgufType::ARRAY;
    a.count     = elems.size();
    a.arrays    = std::move(elems);
    return GgufValue(std::move(a));
}

std::optional<int64_t> GgufValue::to_i64() const {
    return std::visit([](const auto & x) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) return std::nullopt;
        else if constexpr (std::is_same_v<T, uint64_t>) {
            if (x > uint64_t(INT64_MAX)) return std::nullopt;
            return int64_t(x);
        } else return int64_t(x);
    }, v_);
}

std::optional<uint64_t> GgufValue::to_u64() const {
    return std::visit([](const auto & x) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) return std::nullopt;
        else if constexpr (std::is_signed_v<T>) {
            if (x < 0) return std::nullopt;
            return uint64_t(x);
        } else return uint64_t(x);
    }, v_);
}

std::optional<double> GgufValue::to_f64() const {
    if (auto f = get_if<float>()) return double(*f);
    if (auto d = get_if<double>()) return *d;
    return std::nullopt;
}

GgufValue GgufArray::element(size_t i) const {
    const uint8_t * p = raw.data() + i * gguf_fixed_size(elem_type);
    switch (elem_type) {
        case GgufType::UINT8: return GgufValue(load_le<uint8_t>(p));
        case GgufType::INT8: return GgufValue(load_le<int8_t>(p));
        case GgufType::UINT16: return GgufValue(load_le<uint16_t>(p));
        case GgufType::INT16: return GgufValue(load_le<int16_t>(p));
        case GgufType::UINT32: return GgufValue(load_le<uint32_t>(p));
        case GgufType::INT32: return GgufValue(load_le<int32_t>(p));
        case GgufType::FLOAT32: return GgufValue(load_le<float>(p));
        case GgufType::BOOL: return GgufValue(*p != 0);
        case GgufType::UINT64: return GgufValue(load_le<uint64_t>(p));
        case GgufType::INT64: return GgufValue(load_le<int64_t>(p));
        case GgufType::FLOAT64: return GgufValue(load_le<double>(p));
        default: fail(SPARK_ERR_INTERNAL, "not a fixed-size GGUF type");
    }
}

namespace {

std::string quoted(const std::string & s, size_t max_chars) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '\n') out += "\\n";
        else if (c == '"') out += "\\\"";
        else if (c < 0x20) out += strfmt("\\x%02x", c);
        else out += char(c);
    }
    out += "\"";
    if (s.size() > max_chars) out += strfmt("... (%llu bytes)", ull(s.size()));
    return out;
}

}  // namespace

std::string GgufValue::to_display_string(size_t max_chars) const {
    switch (type()) {
        case GgufType::STRING: return quoted(*as_string(), max_chars);
        case GgufType::BOOL: return *get_if<bool>() ? "true" : "false";
        case GgufType::FLOAT32: return strfmt("%.9g", double(*get_if<float>()));
        case GgufType::FLOAT64: return strfmt("%.17g", *get_if<double>());
        case GgufType::ARRAY: {
            const GgufArray & a = *as_array();
            std::string       s = "[";
            const size_t      shown = std::min<size_t>(a.size(), 8);
            for (size_t i = 0; i < shown; ++i) {
                if (i) s += ", ";
                if (a.elem_type == GgufType::STRING) s += quoted(a.strings[i], 24);
                else if (a.elem_type == GgufType::ARRAY) s += a.arrays[i].to_display_string(24);
                else s += a.element(i).to_display_string();
            }
            if (shown < a.size()) s += strfmt(", ... (%llu items)", ull(a.size()));
            return s + "]";
        }
        default: {
            if (auto i = to_i64()) return std::to_string(*i);
            return std::to_string(*to_u64());
        }
    }
}

// ---- tensor layout -----------------------------------------------------------------------------

std::optional<std::vector<int64_t>> gguf_dims_of(const std::vector<int64_t> & shape, DType dtype) {
    std::vector<int64_t> dims;
    if (shape.empty()) {
        dims = {1};
    } else if (shape.size() > kGgufMaxDims) {
        uint64_t outer = 1;
        for (size_t i = 0; i + 3 < shape.size(); ++i)
            if (!checked_mul(outer, uint64_t(shape[i]), outer) || outer > uint64_t(INT64_MAX)) return std::nullopt;
        dims = {int64_t(outer), shape[shape.size() - 3], shape[shape.size() - 2], shape[shape.size() - 1]};
    } else {
        dims = shape;
    }
    std::reverse(dims.begin(), dims.end());
    const size_t esize = dtype_size(dtype);
    if (ggml_type_for(dtype) == ggml_type::kI8 && esize > 1) {
        uint64_t bytes = 0;
        if (!checked_mul(uint64_t(dims[0]), esize, bytes) || bytes > uint64_t(INT64_MAX)) return std::nullopt;
        dims[0] = int64_t(bytes);
    }
    return dims;
}

std::optional<std::vector<int64_t>> shape_of_gguf_dims(const std::vector<int64_t> & ne, DType dtype) {
    std::vector<int64_t> shape(ne.rbegin(), ne.rend());
    const int64_t esize = int64_t(dtype_size(dtype));
    if (ggml_type_for(dtype) == ggml_type::kI8 && esize > 1) {
        if (shape.back() % esize != 0) return std::nullopt;
        shape.back() /= esize;
    }
    return shape;
}

std::optional<uint64_t> tensor_nbytes(const std::vector<int64_t> & shape, DType dtype) {
    uint64_t n = 1;
    for (int64_t d : shape)
        if (d < 0 || !checked_mul(n, uint64_t(d), n)) return std::nullopt;
    if (!checked_mul(n, dtype_size(dtype), n)) return std::nullopt;
    return n;
}

}  // namespace spark::io
