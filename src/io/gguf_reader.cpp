#include "io/gguf_reader.h"

#include "common/error.h"

#include <algorithm>
#include <limits>

namespace spark::io {

namespace {

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

bool gguf_is_integer(GgufType t) {
    switch (t) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
        case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64: return true;
        default: return false;
    }
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t & out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t & out) { return !__builtin_add_overflow(a, b, &out); }

// Smallest encoding of one element of `t` inside an array: bounds hostile counts by the bytes left.
uint64_t min_encoded_size(GgufType t) {
    if (t == GgufType::STRING) return 8;                // u64 length
    if (t == GgufType::ARRAY) return 4 + 8;             // u32 type + u64 count
    return gguf_fixed_size(t);
}

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
    template <typename T> T read(const Where & where) { return load_le<T>(take(sizeof(T), where)); }
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

    if (size >= 4 && load_le<uint32_t>(file_->data()) != kGgufMagic)
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
        if (key.size() > kGgufMaxKeyBytes) fail(SPARK_ERR_INVALID_FORMAT, "%s: metadata key at offset %llu is %llu bytes (limit %llu)", what, ull(at), ull(key.size()), ull(kGgufMaxKeyBytes));
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
            const uint32_t id = load_le<uint32_t>(da->raw.data() + 4 * i);
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
            auto         at    = [&](size_t k) { return load_le<int64_t>(sa->raw.data() + 8 * k); };
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
        const auto dims   = gguf_dims_of(t.shape, t.dtype);
        const auto nbytes = tensor_nbytes(t.shape, t.dtype);
        if (!dims || *dims != r.ne || !nbytes || *nbytes != r.nbytes)
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
        auto x = a->element(i).to_i64();
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
    for (size_t i = 0; i < a->size(); ++i) out.push_back(*a->element(i).to_f64());
    return out;
}

std::unique_ptr<GgufSource> GgufSource::open(const std::string & path) {
    return std::make_unique<GgufSource>(GgufFile::open(path));
}

}  // namespace spark::io
