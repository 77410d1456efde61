#include "io/gguf.h"

#include "common/error.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <limits>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spark::io {

// The file is little-endian and values are copied straight out of the mapping.
static_assert(std::endian::native == std::endian::little, "spark's GGUF code assumes a little-endian host");

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

// Bytes per element of the ggml types spark reads; 0 for every other id.
size_t ggml_plain_type_size(uint32_t t) {
    switch (t) {
        case ggml_type::kF32: return 4;
        case ggml_type::kF16: return 2;
        case ggml_type::kBF16: return 2;
        case ggml_type::kF64: return 8;
        case ggml_type::kI8: return 1;
        case ggml_type::kI16: return 2;
        case ggml_type::kI32: return 4;
        case ggml_type::kI64: return 8;
        default: return 0;
    }
}

// The dtype a plain GGUF file (no spark metadata) means by a ggml type.
DType dtype_of_plain_ggml(uint32_t t) {
    switch (t) {
        case ggml_type::kF32: return DType::F32;
        case ggml_type::kF16: return DType::F16;
        case ggml_type::kBF16: return DType::BF16;
        case ggml_type::kF64: return DType::F64;
        case ggml_type::kI8: return DType::I8;
        case ggml_type::kI16: return DType::I16;
        case ggml_type::kI32: return DType::I32;
        case ggml_type::kI64: return DType::I64;
        default: fail(SPARK_ERR_INTERNAL, "ggml type %u is not a plain type", t);
    }
}

constexpr const char * kGgufTypeNames[kGgufTypeCount] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
    "UINT64", "INT64", "FLOAT64",
};

// Size of a fixed-size GGUF value type; 0 for STRING and ARRAY.
size_t gguf_fixed_size(GgufType t) {
    switch (t) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
        case GgufType::UINT16: case GgufType::INT16: return 2;
        case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
        case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
        default: return 0;
    }
}

bool gguf_is_integer(GgufType t) {
    switch (t) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
        case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64: return true;
        default: return false;
    }
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t & out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t & out) { return !__builtin_add_overflow(a, b, &out); }

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

unsigned long long ull(uint64_t v) { return (unsigned long long) v; }

// Smallest encoding of one element of `t` inside an array: bounds hostile counts by the bytes left.
uint64_t min_encoded_size(GgufType t) {
    if (t == GgufType::STRING) return 8;                // u64 length
    if (t == GgufType::ARRAY) return 4 + 8;             // u32 type + u64 count
    return gguf_fixed_size(t);
}

// How a PyTorch shape is laid out as GGUF dims (docs/FORMAT.md "Dimensions"): scalars become [1],
// ranks above 4 fold their outer dimensions into one, the order is reversed, and a dtype stored as
// ggml I8 over its bytes has ne[0] in bytes. nullopt on overflow.
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

// The PyTorch shape GGUF dims stand for when no spark.tensor_shapes record overrides it; nullopt
// when ne[0] of a byte-stored dtype is not a whole number of elements.
std::optional<std::vector<int64_t>> shape_of_gguf_dims(const std::vector<int64_t> & ne, DType dtype) {
    std::vector<int64_t> shape(ne.rbegin(), ne.rend());
    const int64_t esize = int64_t(dtype_size(dtype));
    if (ggml_type_for(dtype) == ggml_type::kI8 && esize > 1) {
        if (shape.back() % esize != 0) return std::nullopt;
        shape.back() /= esize;
    }
    return shape;
}

std::optional<uint64_t> numel_of(const std::vector<int64_t> & shape) {
    uint64_t n = 1;
    for (int64_t d : shape)
        if (d < 0 || !checked_mul(n, uint64_t(d), n)) return std::nullopt;
    return n;
}

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

template <typename T> T load(const uint8_t * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Element i of a fixed-size array as a scalar value.
GgufValue fixed_element(const GgufArray & a, size_t i) {
    const uint8_t * p = a.raw.data() + i * gguf_fixed_size(a.elem_type);
    switch (a.elem_type) {
        case GgufType::UINT8: return GgufValue(load<uint8_t>(p));
        case GgufType::INT8: return GgufValue(load<int8_t>(p));
        case GgufType::UINT16: return GgufValue(load<uint16_t>(p));
        case GgufType::INT16: return GgufValue(load<int16_t>(p));
        case GgufType::UINT32: return GgufValue(load<uint32_t>(p));
        case GgufType::INT32: return GgufValue(load<int32_t>(p));
        case GgufType::FLOAT32: return GgufValue(load<float>(p));
        case GgufType::BOOL: return GgufValue(*p != 0);
        case GgufType::UINT64: return GgufValue(load<uint64_t>(p));
        case GgufType::INT64: return GgufValue(load<int64_t>(p));
        case GgufType::FLOAT64: return GgufValue(load<double>(p));
        default: fail(SPARK_ERR_INTERNAL, "not a fixed-size GGUF type");
    }
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
                else s += fixed_element(a, i).to_display_string();
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

// ---- reader ------------------------------------------------------------------------------------

namespace {

constexpr uint64_t kMaxKeyBytes       = 65535;              // GGUF spec
// Everything before the data section (a real header is a few tens of MiB, mostly tokenizer.json);
// with the count checks this bounds what a hostile header can make the reader allocate.
constexpr uint64_t kMaxHeaderBytes    = uint64_t(256) << 20;
// Counts are only trusted up to what is parsed: reservations stop here, growth follows real bytes.
constexpr size_t   kMaxReserve        = 4096;
constexpr uint64_t kMinKvBytes        = 8 + 1 + 4 + 1;      // key length + 1-byte key + type + 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name + n_dims + one ne + type + offset

// What is being read, for error messages; formatted only when a read fails (parsing stays cheap).
struct Where {
    const char *        field;
    const std::string * subject = nullptr;  // a key or tensor name
    std::string str() const { return subject ? strfmt("%s '%s'", field, subject->c_str()) : std::string(field); }
};

// Bounds-checked reads from the mapping; every failure names the file, the offset and what was read.
class Cursor {
public:
    // Reads stop at `limit` (<= size); running into it is reported as an oversized header.
    Cursor(const uint8_t * data, uint64_t size, uint64_t limit, const std::string & path)
        : data_(data), size_(limit), file_size_(size), path_(path) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }

    const uint8_t * take(uint64_t n, const Where & where) {
        if (n > remaining()) {
            if (size_ < file_size_)
                fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu runs past the %llu MiB header limit", path_.c_str(), where.str().c_str(), ull(pos_), ull(size_ >> 20));
            fail(SPARK_ERR_INVALID_FORMAT, "%s: truncated: %s at offset %llu needs %llu bytes, %llu left", path_.c_str(), where.str().c_str(), ull(pos_), ull(n), ull(remaining()));
        }
        const uint8_t * p = data_ + pos_;
        pos_ += n;
        return p;
    }
    template <typename T> T read(const Where & where) { return load<T>(take(sizeof(T), where)); }
    std::string read_string(const Where & where) {
        const uint64_t n = read<uint64_t>(where);
        if (n > remaining())
            fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu claims %llu bytes but only %llu remain%s", path_.c_str(), where.str().c_str(), ull(pos_ - 8), ull(n), ull(remaining()), size_ < file_size_ ? " within the header limit" : "");
        const uint8_t * p = take(n, where);
        return std::string(reinterpret_cast<const char *>(p), size_t(n));
    }

private:
    const uint8_t *     data_;
    uint64_t            size_;
    uint64_t            file_size_;
    uint64_t            pos_ = 0;
    const std::string & path_;
};

GgufType checked_value_type(uint32_t raw, const std::string & path, const Where & where, uint64_t at) {
    if (raw >= kGgufTypeCount)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu has unknown value type %u", path.c_str(), where.str().c_str(), ull(at), raw);
    return GgufType(raw);
}

GgufArray read_array_body(Cursor & c, int depth, const std::string & path, const Where & where);

GgufValue read_scalar_or_string(Cursor & c, GgufType t, const std::string & path, const Where & where) {
    switch (t) {
        case GgufType::UINT8: return GgufValue(c.read<uint8_t>(where));
        case GgufType::INT8: return GgufValue(c.read<int8_t>(where));
        case GgufType::UINT16: return GgufValue(c.read<uint16_t>(where));
        case GgufType::INT16: return GgufValue(c.read<int16_t>(where));
        case GgufType::UINT32: return GgufValue(c.read<uint32_t>(where));
        case GgufType::INT32: return GgufValue(c.read<int32_t>(where));
        case GgufType::FLOAT32: return GgufValue(c.read<float>(where));
        case GgufType::UINT64: return GgufValue(c.read<uint64_t>(where));
        case GgufType::INT64: return GgufValue(c.read<int64_t>(where));
        case GgufType::FLOAT64: return GgufValue(c.read<double>(where));
        case GgufType::BOOL: {
            const uint8_t b = c.read<uint8_t>(where);
            if (b > 1) fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu: bool byte is %u, not 0 or 1", path.c_str(), where.str().c_str(), ull(c.pos() - 1), b);
            return GgufValue(b != 0);
        }
        case GgufType::STRING: return GgufValue(c.read_string(where));
        case GgufType::ARRAY: return GgufValue(read_array_body(c, 1, path, where));
    }
    fail(SPARK_ERR_INTERNAL, "unhandled GGUF type");
}

// An array after its ARRAY tag: element type, count, elements. `depth` is 1 for a top-level array.
GgufArray read_array_body(Cursor & c, int depth, const std::string & path, const Where & where) {
    if (depth > int(kGgufMaxArrayDepth))
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu: arrays nested deeper than %d", path.c_str(), where.str().c_str(), ull(c.pos()), int(kGgufMaxArrayDepth));
    const uint64_t at = c.pos();
    GgufArray      a;
    a.elem_type          = checked_value_type(c.read<uint32_t>(where), path, where, at);
    const uint64_t count = c.read<uint64_t>(where);
    // Bounded by the bytes left before anything is allocated or looped over.
    if (count > c.remaining() / min_encoded_size(a.elem_type))
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at offset %llu: array of %llu %s elements cannot fit in the %llu bytes left", path.c_str(), where.str().c_str(), ull(at), ull(count), gguf_type_name(a.elem_type), ull(c.remaining()));
    a.count = size_t(count);
    if (a.elem_type == GgufType::STRING) {
        a.strings.reserve(std::min(a.count, kMaxReserve));
        for (uint64_t i = 0; i < count; ++i) a.strings.push_back(c.read_string(where));
    } else if (a.elem_type == GgufType::ARRAY) {
        a.arrays.reserve(std::min(a.count, kMaxReserve));
        for (uint64_t i = 0; i < count; ++i) a.arrays.push_back(GgufValue(read_array_body(c, depth + 1, path, where)));
    } else {
        const uint64_t  nbytes = count * gguf_fixed_size(a.elem_type);  // <= remaining: no overflow
        const uint8_t * p      = c.take(nbytes, where);
        if (a.elem_type == GgufType::BOOL)
            for (uint64_t i = 0; i < count; ++i)
                if (p[i] > 1) fail(SPARK_ERR_INVALID_FORMAT, "%s: %s: bool array element %llu is %u, not 0 or 1", path.c_str(), where.str().c_str(), ull(i), p[i]);
        a.raw.assign(p, p + nbytes);
    }
    return a;
}

}  // namespace

std::unique_ptr<GgufFile> GgufFile::open(const std::string & path) {
    auto f   = std::unique_ptr<GgufFile>(new GgufFile());
    f->file_ = MappedFile::open(path);
    f->parse();
    f->resolve_tensors();
    return f;
}

void GgufFile::parse() {
    const std::string & p    = file_->path();
    const char *        what = p.c_str();
    const uint64_t      size = file_->size();
    Cursor              c(file_->data(), size, std::min(size, kMaxHeaderBytes), p);

    if (size >= 4 && load<uint32_t>(file_->data()) != kGgufMagic)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: not a GGUF file (bad magic)", what);
    c.read<uint32_t>({"magic"});
    version_ = c.read<uint32_t>({"version"});
    if (version_ == 0) fail(SPARK_ERR_INVALID_FORMAT, "%s: GGUF version 0 is invalid", what);
    if (version_ == 1) fail(SPARK_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (only 2 and 3)", what);
    if (version_ > kGgufVersion) {
        if ((version_ & 0xFFFF) == 0)
            fail(SPARK_ERR_UNSUPPORTED, "%s: GGUF version field is 0x%08x: a big-endian file? Only little-endian files are supported", what, version_);
        fail(SPARK_ERR_UNSUPPORTED, "%s: GGUF version %u is newer than the supported version %u", what, version_, kGgufVersion);
    }
    const uint64_t n_tensors = c.read<uint64_t>({"tensor count"});
    const uint64_t n_kv      = c.read<uint64_t>({"metadata count"});
    // Hostile counts are refused before anything is allocated for them.
    if (n_kv > c.remaining() / kMinKvBytes)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata count %llu cannot fit in the %llu header bytes", what, ull(n_kv), ull(c.remaining()));
    if (n_tensors > c.remaining() / kMinTensorInfoBytes)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor count %llu cannot fit in the %llu header bytes", what, ull(n_tensors), ull(c.remaining()));
    if (n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > c.remaining())
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %llu metadata entries and %llu tensors cannot fit in the %llu header bytes", what, ull(n_kv), ull(n_tensors), ull(c.remaining()));

    kv_.reserve(std::min(size_t(n_kv), kMaxReserve));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const uint64_t at  = c.pos();
        std::string    key = c.read_string({"metadata key"});
        if (key.empty()) fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata entry %llu at offset %llu has an empty key", what, ull(i), ull(at));
        if (key.size() > kMaxKeyBytes) fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata key at offset %llu is %llu bytes (limit %llu)", what, ull(at), ull(key.size()), ull(kMaxKeyBytes));
        if (kv_index_.count(key)) fail(SPARK_ERR_INVALID_FORMAT, "%s: duplicate metadata key '%s'", what, key.c_str());
        const Where    where{"value of", &key};
        const uint64_t tat = c.pos();
        const GgufType t   = checked_value_type(c.read<uint32_t>(where), p, where, tat);
        GgufValue      v   = read_scalar_or_string(c, t, p, where);
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const GgufValue * a = find(gguf_key::kAlignment)) {
        const uint32_t * v = a->get_if<uint32_t>();
        if (!v) fail(SPARK_ERR_INVALID_FORMAT, "%s: general.alignment is %s, must be UINT32", what, gguf_type_name(a->type()));
        if (*v == 0 || (*v & (*v - 1)) != 0) fail(SPARK_ERR_INVALID_FORMAT, "%s: general.alignment %u is not a power of two", what, *v);
        alignment_ = *v;
    }

    raw_tensors_.reserve(std::min(size_t(n_tensors), kMaxReserve));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        const uint64_t at = c.pos();
        t.name            = c.read_string({"tensor name"});
        if (t.name.empty()) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor %llu at offset %llu has an empty name", what, ull(i), ull(at));
        const char *   name   = t.name.c_str();
        const Where    where{"info of tensor", &t.name};
        const uint32_t n_dims = c.read<uint32_t>(where);
        if (n_dims < 1 || n_dims > kGgufMaxDims) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' has %u dimensions (must be 1 to %d)", what, name, n_dims, int(kGgufMaxDims));
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = c.read<uint64_t>(where);
            if (ne > uint64_t(INT64_MAX)) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' has a negative dimension ne[%u]", what, name, d);
            t.ne.push_back(int64_t(ne));
        }
        t.ggml_type = c.read<uint32_t>(where);
        const size_t esize = ggml_plain_type_size(t.ggml_type);
        if (esize == 0) {
            if (std::string(ggml_type_name(t.ggml_type)) != "?")
                fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %s (%u), which spark does not read (only F32, F16, BF16, F64, I8, I16, I32, I64)", what, name, ggml_type_name(t.ggml_type), t.ggml_type);
            fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown ggml type id %u", what, name, t.ggml_type);
        }
        uint64_t nbytes = esize;
        for (int64_t ne : t.ne)
            if (!checked_mul(nbytes, uint64_t(ne), nbytes))
                fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': the byte size of its dimensions overflows", what, name);
        t.nbytes = nbytes;
        t.offset = c.read<uint64_t>(where);
        raw_tensors_.push_back(std::move(t));
    }
    // Indexed once the names have their final addresses (views, not a third copy of 300K names).
    tensor_index_.reserve(raw_tensors_.size());
    for (size_t i = 0; i < raw_tensors_.size(); ++i)
        if (!tensor_index_.try_emplace(raw_tensors_[i].name, i).second)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: duplicate tensor name '%s'", what, raw_tensors_[i].name.c_str());

    data_offset_ = align_up(c.pos(), alignment_);  // pos <= size < 2^63, alignment <= 2^31: no overflow
    if (n_tensors > 0 && data_offset_ > size)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: truncated: the data section would start at %llu, past the end of the file (%llu bytes)", what, ull(data_offset_), ull(size));
    const uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;

    struct Range { uint64_t begin, end; size_t index; };
    std::vector<Range> ranges;
    ranges.reserve(raw_tensors_.size());
    for (size_t i = 0; i < raw_tensors_.size(); ++i) {
        const GgufTensorInfo & t = raw_tensors_[i];
        if (t.offset % alignment_ != 0)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' offset %llu is not a multiple of the alignment %u", what, t.name.c_str(), ull(t.offset), alignment_);
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' data [%llu, +%llu) lies outside the data section (%llu bytes)", what, t.name.c_str(), ull(t.offset), ull(t.nbytes), ull(data_size));
        if (t.nbytes > 0) ranges.push_back({t.offset, t.offset + t.nbytes, i});
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range & a, const Range & b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].begin < ranges[i - 1].end)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensors '%s' and '%s' overlap", what, raw_tensors_[ranges[i - 1].index].name.c_str(), raw_tensors_[ranges[i].index].name.c_str());
}

void GgufFile::resolve_tensors() {
    const char * what = path().c_str();
    const size_t n    = raw_tensors_.size();
    std::vector<DType>                               dtypes(n);
    std::vector<std::optional<std::vector<int64_t>>> shapes(n);

    if (const GgufValue * fv = find(gguf_key::kFormatVersion)) {
        const uint32_t * v = fv->get_if<uint32_t>();
        if (!v) fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.format_version is %s, must be UINT32", what, gguf_type_name(fv->type()));
        if (*v == 0) fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.format_version is 0", what);
        if (*v > kSparkFormatVersion)
            fail(SPARK_ERR_UNSUPPORTED, "%s: spark file format version %u is newer than this build reads (%u); update spark", what, *v, kSparkFormatVersion);
        spark_format_version_ = *v;

        for (const char * key : {gguf_key::kArchitecture, gguf_key::kHfConfigJson}) {
            const GgufValue * s = find(key);
            if (!s || !s->as_string() || s->as_string()->empty())
                fail(SPARK_ERR_INVALID_FORMAT, "%s: spark file lacks the required string '%s'", what, key);
        }

        const GgufValue * dv = find(gguf_key::kTensorDtypes);
        const GgufArray * da = dv ? dv->as_array() : nullptr;
        if (!da || da->elem_type != GgufType::UINT32)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: spark file lacks spark.tensor_dtypes (an array of UINT32)", what);
        if (da->size() != n)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_dtypes has %llu entries for %llu tensors", what, ull(da->size()), ull(n));
        for (size_t i = 0; i < n; ++i) {
            const uint32_t id = load<uint32_t>(da->raw.data() + 4 * i);
            auto           dt = dtype_from_spark_id(id);
            if (!dt) fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown spark dtype id %u", what, raw_tensors_[i].name.c_str(), id);
            if (ggml_type_for(*dt) != raw_tensors_[i].ggml_type)
                fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' is %s but stored as ggml %s (expected %s)", what, raw_tensors_[i].name.c_str(), dtype_name(*dt), ggml_type_name(raw_tensors_[i].ggml_type), ggml_type_name(ggml_type_for(*dt)));
            dtypes[i] = *dt;
        }

        // Records [tensor index, rank, dims...], indices strictly increasing.
        if (const GgufValue * sv = find(gguf_key::kTensorShapes)) {
            const GgufArray * sa = sv->as_array();
            if (!sa || sa->elem_type != GgufType::INT64)
                fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes must be an array of INT64", what);
            const size_t count = sa->size();
            auto         at    = [&](size_t k) { return load<int64_t>(sa->raw.data() + 8 * k); };
            int64_t      prev  = -1;
            for (size_t k = 0; k < count;) {
                if (count - k < 2) fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes ends inside a record", what);
                const int64_t index = at(k), rank = at(k + 1);
                if (index <= prev || uint64_t(index) >= n)
                    fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes: tensor index %lld is out of order or out of range", what, (long long) index);
                if (rank < 0 || rank > int64_t(kSparkMaxRank))
                    fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes: tensor '%s' has rank %lld (must be 0 to %d)", what, raw_tensors_[size_t(index)].name.c_str(), (long long) rank, int(kSparkMaxRank));
                if (uint64_t(rank) > count - k - 2) fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes ends inside a record", what);
                std::vector<int64_t> shape;
                for (int64_t d = 0; d < rank; ++d) {
                    const int64_t dim = at(k + 2 + size_t(d));
                    if (dim < 0) fail(SPARK_ERR_INVALID_FORMAT, "%s: spark.tensor_shapes: tensor '%s' has a negative dimension", what, raw_tensors_[size_t(index)].name.c_str());
                    shape.push_back(dim);
                }
                shapes[size_t(index)] = std::move(shape);
                prev                  = index;
                k += 2 + size_t(rank);
            }
        }
    } else {
        for (size_t i = 0; i < n; ++i) dtypes[i] = dtype_of_plain_ggml(raw_tensors_[i].ggml_type);
    }

    uint64_t data_end = 0;
    tensors_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const GgufTensorInfo & r = raw_tensors_[i];
        TensorInfo             t;
        t.name  = r.name;
        t.dtype = dtypes[i];
        if (shapes[i]) {
            t.shape = *shapes[i];
        } else {
            auto s = shape_of_gguf_dims(r.ne, t.dtype);
            if (!s) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': ne[0] = %lld bytes is not a whole number of %s elements", what, r.name.c_str(), (long long) r.ne[0], dtype_name(t.dtype));
            t.shape = std::move(*s);
        }
        // The shape must be the one these GGUF dims canonically encode, and account for every byte.
        auto dims  = gguf_dims_of(t.shape, t.dtype);
        auto numel = numel_of(t.shape);
        uint64_t nbytes = 0;
        if (!dims || *dims != r.ne || !numel || !checked_mul(*numel, dtype_size(t.dtype), nbytes) || nbytes != r.nbytes)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': %s shape %s does not match its GGUF dimensions", what, r.name.c_str(), dtype_name(t.dtype), t.shape_str().c_str());
        t.data   = file_->data() + data_offset_ + r.offset;
        t.nbytes = size_t(r.nbytes);
        tensors_.push_back(std::move(t));
        data_end = std::max(data_end, r.offset + r.nbytes);
    }

    // A spark file ends exactly after the padded last tensor: truncation and appended bytes are errors.
    if (is_spark()) {
        uint64_t expect = 0;
        if (!checked_add(data_offset_, align_up(data_end, alignment_), expect) || expect != file_->size())
            fail(SPARK_ERR_INVALID_FORMAT, "%s: file is %llu bytes but its header describes %llu (truncated or extended)", what, ull(file_->size()), ull(expect));
    }
}

const GgufValue * GgufFile::find(const std::string & key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo * GgufFile::find_tensor(const std::string & name) const {
    auto it = tensor_index_.find(std::string_view(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void wrong_type(const std::string & path, const std::string & key, const GgufValue & v, const char * expected) {
    std::string got = gguf_type_name(v.type());
    if (const GgufArray * a = v.as_array()) got += std::string(" of ") + gguf_type_name(a->elem_type);
    fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata '%s' is %s, expected %s", path.c_str(), key.c_str(), got.c_str(), expected);
}

template <typename T> std::optional<T> get_integer(const GgufFile & f, const std::string & key, const char * expected) {
    const GgufValue * v = f.find(key);
    if (!v) return std::nullopt;
    if (!gguf_is_integer(v->type())) wrong_type(f.path(), key, *v, expected);
    if constexpr (std::is_signed_v<T>) {
        auto x = v->to_i64();
        if (!x || *x < int64_t(std::numeric_limits<T>::min()) || *x > int64_t(std::numeric_limits<T>::max()))
            fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata '%s' = %s is out of range for %s", f.path().c_str(), key.c_str(), v->to_display_string().c_str(), expected);
        return T(*x);
    } else {
        auto x = v->to_u64();
        if (!x || *x > uint64_t(std::numeric_limits<T>::max()))
            fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata '%s' = %s is out of range for %s", f.path().c_str(), key.c_str(), v->to_display_string().c_str(), expected);
        return T(*x);
    }
}

}  // namespace

std::optional<std::string> GgufFile::get_string(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    if (!v->as_string()) wrong_type(path(), key, *v, "STRING");
    return *v->as_string();
}

std::optional<uint32_t> GgufFile::get_u32(const std::string & key) const { return get_integer<uint32_t>(*this, key, "UINT32"); }
std::optional<int32_t>  GgufFile::get_i32(const std::string & key) const { return get_integer<int32_t>(*this, key, "INT32"); }
std::optional<uint64_t> GgufFile::get_u64(const std::string & key) const { return get_integer<uint64_t>(*this, key, "UINT64"); }
std::optional<int64_t>  GgufFile::get_i64(const std::string & key) const { return get_integer<int64_t>(*this, key, "INT64"); }

std::optional<double> GgufFile::get_f64(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    auto x = v->to_f64();
    if (!x) wrong_type(path(), key, *v, "FLOAT32 or FLOAT64");
    return *x;
}

std::optional<float> GgufFile::get_f32(const std::string & key) const {
    auto x = get_f64(key);
    if (!x) return std::nullopt;
    return float(*x);
}

std::optional<bool> GgufFile::get_bool(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    if (!v->get_if<bool>()) wrong_type(path(), key, *v, "BOOL");
    return *v->get_if<bool>();
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    const GgufArray * a = v->as_array();
    if (!a || a->elem_type != GgufType::STRING) wrong_type(path(), key, *v, "ARRAY of STRING");
    return a->strings;
}

std::optional<std::vector<int64_t>> GgufFile::get_i64_array(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    const GgufArray * a = v->as_array();
    if (!a || !gguf_is_integer(a->elem_type)) wrong_type(path(), key, *v, "ARRAY of integers");
    std::vector<int64_t> out;
    out.reserve(a->size());
    for (size_t i = 0; i < a->size(); ++i) {
        auto x = fixed_element(*a, i).to_i64();
        if (!x) fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata '%s' element %llu does not fit INT64", path().c_str(), key.c_str(), ull(i));
        out.push_back(*x);
    }
    return out;
}

std::optional<std::vector<double>> GgufFile::get_f64_array(const std::string & key) const {
    const GgufValue * v = find(key);
    if (!v) return std::nullopt;
    const GgufArray * a = v->as_array();
    if (!a || (a->elem_type != GgufType::FLOAT32 && a->elem_type != GgufType::FLOAT64)) wrong_type(path(), key, *v, "ARRAY of FLOAT32 or FLOAT64");
    std::vector<double> out;
    out.reserve(a->size());
    for (size_t i = 0; i < a->size(); ++i) out.push_back(*fixed_element(*a, i).to_f64());
    return out;
}

std::unique_ptr<GgufSource> GgufSource::open(const std::string & path) {
    return std::make_unique<GgufSource>(GgufFile::open(path));
}

// ---- writer ------------------------------------------------------------------------------------

namespace {

// The temporary file of the write in progress, for gguf_remove_temp_file_on_signal().
std::atomic<bool>          g_temp_slot_taken{false};
volatile std::sig_atomic_t g_temp_armed = 0;
char                       g_temp_path[4096];
static_assert(std::atomic<bool>::is_always_lock_free, "the signal-handler slot needs a lock-free flag");

class TempFileRegistration {
public:
    explicit TempFileRegistration(const std::string & path) {
        if (path.size() >= sizeof(g_temp_path) || g_temp_slot_taken.exchange(true)) return;
        std::memcpy(g_temp_path, path.c_str(), path.size() + 1);
        std::atomic_signal_fence(std::memory_order_seq_cst);  // the path is complete before it is armed
        g_temp_armed = 1;
        owner_       = true;
    }
    ~TempFileRegistration() {
        if (!owner_) return;
        g_temp_armed = 0;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        g_temp_slot_taken.store(false);
    }
    TempFileRegistration(const TempFileRegistration &) = delete;
    TempFileRegistration & operator=(const TempFileRegistration &) = delete;

private:
    bool owner_ = false;
};

bool is_reserved_writer_key(const std::string & key) {
    return key == gguf_key::kAlignment || key == gguf_key::kFormatVersion || key == gguf_key::kTensorDtypes ||
           key == gguf_key::kTensorShapes;
}

// Well-formed UTF-8 (Unicode table 3-7: no overlong forms, no surrogates, at most U+10FFFF). GGUF
// strings are UTF-8, and gguf-py cannot list a file whose strings are not.
bool is_utf8(const std::string & s) {
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    for (size_t i = 0; i < n;) {
        const unsigned c = p[i];
        size_t   len;
        unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
        if (c < 0x80) { ++i; continue; }
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return false;
        if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return false;
        for (size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

void check_writable_value(const std::string & key, const GgufValue & v) {
    if (const std::string * str = v.as_string())
        if (!is_utf8(*str)) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s' is not valid UTF-8", key.c_str());
    const GgufArray * a = v.as_array();
    if (!a) return;
    for (const std::string & e : a->strings)
        if (!is_utf8(e)) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s' has an element that is not valid UTF-8", key.c_str());
    if (a->elem_type == GgufType::ARRAY)
        fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s': nested arrays are not written (ggml's GGUF reader rejects files with them)", key.c_str());
    if (uint32_t(a->elem_type) >= kGgufTypeCount) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s': invalid array element type", key.c_str());
    const bool consistent = a->elem_type == GgufType::STRING
                                ? a->strings.size() == a->count && a->raw.empty()
                                : a->raw.size() == a->count * gguf_fixed_size(a->elem_type) && a->strings.empty();
    if (!consistent || !a->arrays.empty()) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s': array count and elements disagree", key.c_str());
    if (a->elem_type == GgufType::BOOL)
        for (uint8_t b : a->raw)
            if (b > 1) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s': bool array element is not 0 or 1", key.c_str());
}

class ByteWriter {
public:
    std::vector<uint8_t> bytes;
    template <typename T> void put(T v) {
        const size_t at = bytes.size();
        bytes.resize(at + sizeof(T));
        std::memcpy(bytes.data() + at, &v, sizeof(T));
    }
    void put_string(const std::string & s) {
        put<uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    void put_value(const GgufValue & v) {
        std::visit([&](const auto & x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>) put_string(x);
            else if constexpr (std::is_same_v<T, GgufArray>) {
                put<uint32_t>(uint32_t(x.elem_type));
                put<uint64_t>(x.count);
                if (x.elem_type == GgufType::STRING)
                    for (const std::string & s : x.strings) put_string(s);
                else bytes.insert(bytes.end(), x.raw.begin(), x.raw.end());
            } else if constexpr (std::is_same_v<T, bool>) put<uint8_t>(x ? 1 : 0);
            else put<T>(x);
        }, v.storage());
    }
    void put_kv(const std::string & key, const GgufValue & v) {
        put_string(key);
        put<uint32_t>(uint32_t(v.type()));
        put_value(v);
    }
};

// Buffered output to a file descriptor; every failure is SPARK_ERR_IO naming the file.
class FileOut {
public:
    FileOut(int fd, const std::string & path) : fd_(fd), path_(path) { buf_.reserve(kBufferBytes); }

    void write(const void * data, size_t n) {
        const uint8_t * p = static_cast<const uint8_t *>(data);
        if (buf_.size() + n > kBufferBytes) flush();
        if (n >= kBufferBytes) write_all(p, n);
        else buf_.insert(buf_.end(), p, p + n);
        written_ += n;
    }
    void write_zeros(size_t n) {
        static const uint8_t zeros[kSparkAlignment] = {};
        while (n > 0) {
            const size_t k = std::min(n, sizeof(zeros));
            write(zeros, k);
            n -= k;
        }
    }
    void flush() {
        write_all(buf_.data(), buf_.size());
        buf_.clear();
    }
    uint64_t written() const { return written_; }

private:
    static constexpr size_t kBufferBytes = size_t(4) << 20;

    void write_all(const uint8_t * p, size_t n) {
        while (n > 0) {
            const ssize_t k = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
            if (k < 0) {
                if (errno == EINTR) continue;
                fail(SPARK_ERR_IO, "cannot write '%s': %s", path_.c_str(), std::strerror(errno));
            }
            p += k;
            n -= size_t(k);
        }
    }

    int                  fd_;
    const std::string &  path_;
    std::vector<uint8_t> buf_;
    uint64_t             written_ = 0;
};

// Hands the provider's bytes for one tensor to the file, holding it to the declared size.
class TensorSink final : public GgufWriter::Sink {
public:
    TensorSink(FileOut & out, const GgufWriter::Tensor & t) : out_(out), t_(t) {}
    void write(const void * data, size_t n) override {
        if (n > t_.nbytes - written_)
            fail(SPARK_ERR_INVALID_ARGUMENT, "data for tensor '%s' exceeds its declared %llu bytes", t_.name.c_str(), ull(t_.nbytes));
        out_.write(data, n);
        written_ += n;
    }
    uint64_t written() const { return written_; }

private:
    FileOut &                  out_;
    const GgufWriter::Tensor & t_;
    uint64_t                   written_ = 0;
};

bool path_exists(const std::string & path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
}

// Renames without replacing an existing target when `overwrite` is false (where the filesystem
// supports it; otherwise the earlier existence check is what protects the target).
void rename_into_place(const std::string & from, const std::string & to, bool overwrite) {
#ifdef RENAME_NOREPLACE
    if (!overwrite) {
        if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
        if (errno == EEXIST) fail(SPARK_ERR_IO, "'%s' already exists (pass overwrite to replace it)", to.c_str());
        if (errno != EINVAL && errno != ENOSYS) fail(SPARK_ERR_IO, "cannot rename '%s' to '%s': %s", from.c_str(), to.c_str(), std::strerror(errno));
        if (path_exists(to)) fail(SPARK_ERR_IO, "'%s' already exists (pass overwrite to replace it)", to.c_str());
    }
#endif
    if (std::rename(from.c_str(), to.c_str()) != 0)
        fail(SPARK_ERR_IO, "cannot rename '%s' to '%s': %s", from.c_str(), to.c_str(), std::strerror(errno));
}

std::string parent_dir(const std::string & path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// The temporaries `<path>.tmp-<pid>` of writers that are gone. A writer removes its temporary on
// any error and on SIGINT/SIGTERM (gguf_remove_temp_file_on_signal), but SIGKILL or a power loss
// leaves it behind, at the full size of a model; the next write to the same path removes it. A
// writer holds an exclusive flock on its temporary while it writes: a temporary is stale when its
// process is gone (or is this process: the pid was reused) and nobody holds that lock (the pid
// is not proof: another PID namespace may share the directory). One whose pid is alive, or that
// is someone else's to signal, is left alone.
void remove_stale_temporaries(const std::string & path) {
    const std::string dir    = parent_dir(path);
    const size_t      slash  = path.find_last_of('/');
    const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp-";
    DIR *             d      = ::opendir(dir.c_str());
    if (!d) return;  // the write itself reports an unusable directory
    std::vector<std::string> stale;
    while (const dirent * e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string digits = name.substr(prefix.size());
        pid_t             pid    = 0;
        const auto [end, ec]     = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
        if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) continue;
        if (pid != ::getpid() && (::kill(pid, 0) == 0 || errno != ESRCH)) continue;  // alive, or someone else's (EPERM)
        stale.push_back(dir + "/" + name);
    }
    ::closedir(d);
    for (const std::string & f : stale) {
        const int fd = ::open(f.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st {};
        // Where flock is unsupported (some network filesystems), the pid decides alone.
        const bool unlocked = ::flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK;
        if (unlocked && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) ::unlink(f.c_str());
        ::close(fd);
    }
}

}  // namespace

void gguf_remove_temp_file_on_signal() noexcept {
    if (g_temp_armed) ::unlink(g_temp_path);
}

GgufWriter::GgufWriter() = default;

void GgufWriter::set(const std::string & key, GgufValue value) {
    if (key.empty() || key.size() > kMaxKeyBytes) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata key must be 1 to %llu bytes", ull(kMaxKeyBytes));
    for (char ch : key)
        if (ch <= 0x20 || ch >= 0x7F) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata key '%s' must be printable ASCII without spaces", key.c_str());
    if (is_reserved_writer_key(key)) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata '%s' is written by GgufWriter itself", key.c_str());
    check_writable_value(key, value);
    auto it = kv_index_.find(key);
    if (it != kv_index_.end()) {
        kv_[it->second].second = std::move(value);
        return;
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(key, std::move(value));
}

const GgufValue * GgufWriter::find(const std::string & key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

void GgufWriter::add_tensor(const std::string & name, DType dtype, std::vector<int64_t> shape, uint64_t nbytes) {
    if (name.empty()) fail(SPARK_ERR_INVALID_ARGUMENT, "tensor name is empty");
    if (name.size() > kSparkMaxTensorName)
        fail(SPARK_ERR_INVALID_ARGUMENT, "tensor name '%s' is %llu bytes; stock GGUF readers accept at most %llu", name.c_str(), ull(name.size()), ull(kSparkMaxTensorName));
    if (!is_utf8(name)) fail(SPARK_ERR_INVALID_ARGUMENT, "tensor name '%s' is not valid UTF-8", name.c_str());
    if (tensor_index_.count(name)) fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s' added twice", name.c_str());
    if (dtype >= DType::COUNT) fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s': invalid dtype", name.c_str());
    if (shape.size() > kSparkMaxRank) fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s' has rank %llu (at most %llu)", name.c_str(), ull(shape.size()), ull(kSparkMaxRank));
    Tensor t{name, dtype, std::move(shape), nbytes};
    auto   numel = numel_of(t.shape);
    uint64_t expect = 0;
    if (!numel || !checked_mul(*numel, dtype_size(dtype), expect) || !gguf_dims_of(t.shape, dtype))
        fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s': invalid shape %s", name.c_str(), TensorInfo{name, dtype, t.shape}.shape_str().c_str());
    if (expect != nbytes)
        fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s': %s %s is %llu bytes, not %llu", name.c_str(), dtype_name(dtype), TensorInfo{name, dtype, t.shape}.shape_str().c_str(), ull(expect), ull(nbytes));
    tensor_index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(t));
}

void GgufWriter::write(const std::string & path, const DataProvider & provide, bool overwrite) const {
    for (const char * key : {gguf_key::kArchitecture, gguf_key::kHfConfigJson}) {
        const GgufValue * v = find(key);
        if (!v || !v->as_string() || v->as_string()->empty())
            fail(SPARK_ERR_INVALID_ARGUMENT, "a spark file needs the string '%s' (set it before write)", key);
    }
    if (!overwrite && path_exists(path)) fail(SPARK_ERR_IO, "'%s' already exists (pass overwrite to replace it)", path.c_str());

    // Header: fixed keys first, then the caller's in insertion order, then the tensor tables.
    std::vector<uint32_t> dtype_ids;
    std::vector<int64_t>  shape_records;
    std::vector<uint64_t> offsets;
    uint64_t              data_size = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const Tensor & t = tensors_[i];
        dtype_ids.push_back(spark_dtype_id(t.dtype));
        const std::vector<int64_t> ne = *gguf_dims_of(t.shape, t.dtype);
        if (shape_of_gguf_dims(ne, t.dtype) != t.shape) {
            shape_records.push_back(int64_t(i));
            shape_records.push_back(int64_t(t.shape.size()));
            shape_records.insert(shape_records.end(), t.shape.begin(), t.shape.end());
        }
        offsets.push_back(data_size);
        data_size += align_up(t.nbytes, kSparkAlignment);
    }
    const bool has_shapes = !shape_records.empty();

    ByteWriter h;
    h.put<uint32_t>(kGgufMagic);
    h.put<uint32_t>(kGgufVersion);
    h.put<uint64_t>(tensors_.size());
    h.put<uint64_t>(kv_.size() + 3 + (has_shapes ? 1 : 0));
    h.put_kv(gguf_key::kArchitecture, *find(gguf_key::kArchitecture));
    h.put_kv(gguf_key::kAlignment, GgufValue(uint32_t(kSparkAlignment)));
    h.put_kv(gguf_key::kFormatVersion, GgufValue(uint32_t(kSparkFormatVersion)));
    for (const auto & [key, value] : kv_)
        if (key != gguf_key::kArchitecture) h.put_kv(key, value);
    h.put_kv(gguf_key::kTensorDtypes, GgufValue::array(dtype_ids));
    if (has_shapes) h.put_kv(gguf_key::kTensorShapes, GgufValue::array(shape_records));
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const Tensor &             t  = tensors_[i];
        const std::vector<int64_t> ne = *gguf_dims_of(t.shape, t.dtype);
        h.put_string(t.name);
        h.put<uint32_t>(uint32_t(ne.size()));
        for (int64_t d : ne) h.put<uint64_t>(uint64_t(d));
        h.put<uint32_t>(ggml_type_for(t.dtype));
        h.put<uint64_t>(offsets[i]);
    }
    h.bytes.resize(align_up(h.bytes.size(), kSparkAlignment), 0);

    remove_stale_temporaries(path);
    const std::string temp = path + ".tmp-" + std::to_string(::getpid());
    const int         fd   = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail(SPARK_ERR_IO, "cannot create '%s': %s", temp.c_str(), std::strerror(errno));
    (void) ::flock(fd, LOCK_EX | LOCK_NB);  // marks the temporary as in use (remove_stale_temporaries); released when the process ends
    TempFileRegistration registration(temp);
    bool                 fd_open = true;
    try {
        FileOut out(fd, temp);
        out.write(h.bytes.data(), h.bytes.size());
        out.flush();
        for (size_t i = 0; i < tensors_.size(); ++i) {
            const Tensor & t = tensors_[i];
            TensorSink     sink(out, t);
            if (!provide(i, t, sink)) fail(SPARK_ERR_ABORTED, "writing '%s' was cancelled at tensor '%s'", path.c_str(), t.name.c_str());
            if (sink.written() != t.nbytes)
                fail(SPARK_ERR_INVALID_ARGUMENT, "data for tensor '%s' is %llu bytes, declared %llu", t.name.c_str(), ull(sink.written()), ull(t.nbytes));
            out.write_zeros(size_t(align_up(t.nbytes, kSparkAlignment) - t.nbytes));
            out.flush();  // nothing of this tensor stays in memory once the next one is requested
        }
        if (::fsync(fd) != 0) fail(SPARK_ERR_IO, "cannot sync '%s': %s", temp.c_str(), std::strerror(errno));
        fd_open = false;
        if (::close(fd) != 0) fail(SPARK_ERR_IO, "cannot close '%s': %s", temp.c_str(), std::strerror(errno));
        rename_into_place(temp, path, overwrite);
    } catch (...) {
        if (fd_open) ::close(fd);
        ::unlink(temp.c_str());
        throw;
    }
    // Make the rename durable; failure here does not undo a complete file.
    const int dfd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

}  // namespace spark::io
