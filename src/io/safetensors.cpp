#include "io/safetensors.h"

#include "common/error.h"
#include "common/parallel.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <optional>

namespace spark::io {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // as the reference implementation

bool checked_mul(uint64_t a, uint64_t b, uint64_t & out) {
    if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
    out = a * b;
    return true;
}

// The kinds of JSON value the readers below tell apart.
enum class Value { Object, Array, String, Unsigned, Other };

// Reads a safetensors header in one SAX pass straight into TensorInfo records: a DOM would build
// a tree of maps for 300K tensors (Qwen3-Next-80B's shards) only to walk it once. Depths: 1 = the
// top-level object (tensor names and "__metadata__"), 2 = a tensor's fields, 3 = its shape and
// data_offsets entries; anything else a field holds is skipped. Semantic errors throw at once;
// a syntax error anywhere is reported as invalid JSON.
class HeaderReader {
public:
    HeaderReader(const char * what, uint64_t data_size, std::vector<TensorInfo> & tensors, std::map<std::string, std::string> & metadata,
                 std::vector<std::pair<uint64_t, uint64_t>> & offsets)
        : what_(what), data_size_(data_size), tensors_(tensors), metadata_(metadata), offsets_(offsets) {}

    std::string syntax_error;

    bool null() { return value(Value::Other); }
    bool boolean(bool) { return value(Value::Other); }
    bool number_integer(json::number_integer_t) { return value(Value::Other); }
    bool number_unsigned(json::number_unsigned_t u) { return value(Value::Unsigned, u); }
    bool number_float(json::number_float_t, const std::string &) { return value(Value::Other); }
    bool string(std::string & s) { return value(Value::String, 0, &s); }
    bool binary(json::binary_t &) { return value(Value::Other); }
    bool start_object(std::size_t) { return value(Value::Object), ++depth_, true; }
    bool start_array(std::size_t) { return value(Value::Array), ++depth_, true; }
    bool end_object() { return end(), true; }
    bool end_array() { return end(), true; }
    bool key(std::string & k) {
        if (depth_ == 1) {
            name_ = std::move(k);
        } else if (depth_ == 2 && in_metadata_) {
            field_key_ = std::move(k);
        } else if (depth_ == 2) {
            field_ = k == "dtype" ? Field::Dtype : k == "shape" ? Field::Shape : k == "data_offsets" ? Field::Offsets : Field::Ignored;
        }
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception & e) {
        syntax_error = e.what();
        return false;
    }

private:
    enum class Field { Ignored, Dtype, Shape, Offsets };

    // Every value, at the depth it starts.
    bool value(Value v, uint64_t u = 0, const std::string * s = nullptr) {
        if (depth_ == 1) {
            begin_entry(v);
        } else if (depth_ == 2 && in_metadata_) {
            if (v != Value::String) fail(SPARK_ERR_INVALID_FORMAT, "%s: __metadata__ value of '%s' is not a string", what_, field_key_.c_str());
            metadata_[field_key_] = *s;
        } else if (depth_ == 2) {
            field_value(v, s);
        } else if (depth_ == 3 && array_ == Field::Shape) {
            if (v != Value::Unsigned) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': shape entries must be non-negative integers", what_, name_.c_str());
            if (shape_.size() == 8) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': bad shape", what_, name_.c_str());
            shape_.push_back(u);
        } else if (depth_ == 3 && array_ == Field::Offsets) {
            if (v != Value::Unsigned || offsets_seen_ == 2) bad_offsets();
            offset_[offsets_seen_++] = u;
        }
        return true;
    }

    void begin_entry(Value v) {
        in_metadata_ = name_ == "__metadata__";
        if (in_metadata_) {
            if (v != Value::Object) fail(SPARK_ERR_INVALID_FORMAT, "%s: __metadata__ is not an object", what_);
            if (metadata_seen_) fail(SPARK_ERR_INVALID_FORMAT, "%s: duplicate tensor name '__metadata__'", what_);
            metadata_seen_ = true;
            return;
        }
        if (v != Value::Object) lacks_fields();
        dtype_.reset();
        has_shape_ = has_offsets_ = false;
    }

    void field_value(Value v, const std::string * s) {
        array_ = Field::Ignored;
        switch (field_) {
        case Field::Dtype:
            if (v != Value::String) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': dtype is not a string", what_, name_.c_str());
            dtype_ = dtype_from_safetensors(*s);
            if (!dtype_) fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown or unsupported dtype '%s'", what_, name_.c_str(), s->c_str());
            break;
        case Field::Shape:
            if (v != Value::Array) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': bad shape", what_, name_.c_str());
            shape_.clear();
            has_shape_ = true;
            array_     = Field::Shape;
            break;
        case Field::Offsets:
            if (v != Value::Array) bad_offsets();
            offsets_seen_ = 0;
            has_offsets_  = true;
            array_        = Field::Offsets;
            break;
        case Field::Ignored: break;
        }
    }

    void end() {
        --depth_;
        if (depth_ == 2 && array_ == Field::Offsets && offsets_seen_ != 2) bad_offsets();
        if (depth_ == 2) array_ = Field::Ignored;
        if (depth_ == 1 && !in_metadata_) finish_entry();
        if (depth_ == 1) in_metadata_ = false;
    }

    void finish_entry() {
        if (!dtype_ || !has_shape_ || !has_offsets_) lacks_fields();
        TensorInfo t;
        t.name  = name_;
        t.dtype = *dtype_;
        uint64_t numel = 1;
        for (uint64_t dim : shape_) {
            if (dim > (uint64_t(1) << 48) || !checked_mul(numel, dim, numel))
                fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': shape overflows", what_, name_.c_str());
            t.shape.push_back(int64_t(dim));
        }
        const uint64_t b = offset_[0], e = offset_[1];
        if (e < b) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets end before begin", what_, name_.c_str());
        if (e > data_size_)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) point outside the file (data section is %llu bytes)", what_,
                 name_.c_str(), (unsigned long long) b, (unsigned long long) e, (unsigned long long) data_size_);
        uint64_t nbytes = 0;
        if (!checked_mul(numel, dtype_size(t.dtype), nbytes) || nbytes != e - b)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span %llu", what_, name_.c_str(), dtype_name(t.dtype),
                 t.shape_str().c_str(), (unsigned long long) nbytes, (unsigned long long) (e - b));
        t.nbytes = size_t(nbytes);
        tensors_.push_back(std::move(t));
        offsets_.emplace_back(b, e);
    }

    [[noreturn]] void lacks_fields() const { fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' lacks dtype/shape/data_offsets", what_, name_.c_str()); }
    [[noreturn]] void bad_offsets() const {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", what_, name_.c_str());
    }

    const char *                                 what_;
    uint64_t                                     data_size_;
    std::vector<TensorInfo> &                    tensors_;
    std::map<std::string, std::string> &         metadata_;
    std::vector<std::pair<uint64_t, uint64_t>> & offsets_;

    int                   depth_ = 0;
    std::string           name_, field_key_;
    bool                  in_metadata_ = false, metadata_seen_ = false;
    Field                 field_ = Field::Ignored, array_ = Field::Ignored;
    std::optional<DType>  dtype_;
    std::vector<uint64_t> shape_;
    bool                  has_shape_ = false, has_offsets_ = false;
    uint64_t              offset_[2] = {0, 0};
    int                   offsets_seen_ = 0;
};

// Reads the "weight_map" of model.safetensors.index.json (tensor name -> shard file name), in
// one SAX pass like the headers.
class IndexReader {
public:
    explicit IndexReader(const char * what) : what_(what) {}

    std::vector<std::pair<std::string, std::string>> entries;  // (tensor, shard)
    bool                                             found = false;
    std::string                                      syntax_error;

    bool null() { return value(Value::Other); }
    bool boolean(bool) { return value(Value::Other); }
    bool number_integer(json::number_integer_t) { return value(Value::Other); }
    bool number_unsigned(json::number_unsigned_t) { return value(Value::Other); }
    bool number_float(json::number_float_t, const std::string &) { return value(Value::Other); }
    bool string(std::string & s) { return value(Value::String, &s); }
    bool binary(json::binary_t &) { return value(Value::Other); }
    bool start_object(std::size_t) { return value(Value::Object), ++depth_, true; }
    bool start_array(std::size_t) { return value(Value::Array), ++depth_, true; }
    bool end_object() { return --depth_, true; }
    bool end_array() { return --depth_, true; }
    bool key(std::string & k) {
        if (depth_ == 1) in_map_ = k == "weight_map";
        if (depth_ == 2 && in_map_) key_ = std::move(k);
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception & e) {
        syntax_error = e.what();
        return false;
    }

private:
    bool value(Value v, std::string * s = nullptr) {
        if (depth_ == 0 && v != Value::Object) fail(SPARK_ERR_INVALID_FORMAT, "%s: no weight_map object", what_);
        if (depth_ == 1 && in_map_) {
            if (v != Value::Object) fail(SPARK_ERR_INVALID_FORMAT, "%s: no weight_map object", what_);
            found = true;
            entries.clear();  // a repeated key: the last one counts, as in a DOM
        }
        if (depth_ == 2 && in_map_) {
            if (v != Value::String) fail(SPARK_ERR_INVALID_FORMAT, "%s: weight_map entry '%s' is not a file name", what_, key_.c_str());
            entries.emplace_back(std::move(key_), std::move(*s));
        }
        return true;
    }

    const char * what_;
    int          depth_  = 0;
    bool         in_map_ = false;
    std::string  key_;
};

template <typename Reader> void sax_read(const char * begin, const char * end, Reader & reader, const char * what) {
    if (!json::sax_parse(begin, end, &reader)) fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid JSON: %s", what, reader.syntax_error.c_str());
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string & path) {
    auto f   = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
    f->file_ = MappedFile::open(path);
    const uint8_t * p    = f->file_->data();
    const uint64_t  size = f->file_->size();
    const char *    what = path.c_str();

    if (size < 8) fail(SPARK_ERR_INVALID_FORMAT, "%s: truncated safetensors file (%llu bytes)", what, (unsigned long long) size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
    if (n > kMaxHeaderSize) fail(SPARK_ERR_INVALID_FORMAT, "%s: header length %llu exceeds the limit", what, (unsigned long long) n);
    if (8 + n > size) fail(SPARK_ERR_INVALID_FORMAT, "%s: truncated: header of %llu bytes but file has %llu", what, (unsigned long long) n, (unsigned long long) size);
    if (n == 0 || p[8] != '{') fail(SPARK_ERR_INVALID_FORMAT, "%s: header is not a JSON object", what);

    const uint64_t  data_size = size - 8 - n;
    const uint8_t * data      = p + 8 + n;

    std::vector<std::pair<uint64_t, uint64_t>> offsets;  // [begin, end) of each tensor, in the data section
    HeaderReader reader(what, data_size, f->tensors_, f->metadata_, offsets);
    const char * header = reinterpret_cast<const char *>(p + 8);
    if (!json::sax_parse(header, header + n, &reader)) fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid JSON header: %s", what, reader.syntax_error.c_str());
    for (size_t i = 0; i < f->tensors_.size(); ++i) f->tensors_[i].data = data + offsets[i].first;

    // Tensors must tile the data section exactly: no overlap, no hole, nothing after the last one.
    std::vector<size_t> by_offset(offsets.size());
    for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
    std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
    uint64_t expect = 0;
    for (size_t i : by_offset) {
        if (offsets[i].first < expect) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' overlaps another tensor", what, f->tensors_[i].name.c_str());
        if (offsets[i].first > expect) fail(SPARK_ERR_INVALID_FORMAT, "%s: hole in the data section before tensor '%s'", what, f->tensors_[i].name.c_str());
        expect = offsets[i].second;
    }
    if (expect != data_size) fail(SPARK_ERR_INVALID_FORMAT, "%s: data section has %llu bytes but tensors cover %llu", what, (unsigned long long) data_size, (unsigned long long) expect);

    // In name order, as the reference implementation lists them (and the model fingerprint reads
    // them); equal neighbours are a duplicate key, which a JSON reader would let pass silently.
    std::sort(f->tensors_.begin(), f->tensors_.end(), [](const TensorInfo & a, const TensorInfo & b) { return a.name < b.name; });
    for (size_t i = 1; i < f->tensors_.size(); ++i)
        if (f->tensors_[i].name == f->tensors_[i - 1].name)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: duplicate tensor name '%s'", what, f->tensors_[i].name.c_str());
    return f;
}

std::vector<std::string> SafetensorsSource::file_paths() const {
    std::vector<std::string> out;
    for (const auto & f : files_) out.push_back(f->path());
    return out;
}

std::vector<const MappedFile *> SafetensorsSource::files() const {
    std::vector<const MappedFile *> out;
    for (const auto & f : files_) out.push_back(&f->mapping());
    return out;
}

// Moves the files' tensors into one list and indexes it: the index holds views of the names, so
// it is built once all_ has its final size (300K names copied and rehashed shard by shard were a
// third of a Qwen3-Next-80B directory's open).
void SafetensorsSource::take(std::vector<std::unique_ptr<SafetensorsFile>> files) {
    size_t total = 0;
    for (const auto & f : files) total += f->tensors_.size();
    all_.reserve(total);
    index_.reserve(total);
    for (const auto & f : files) {
        const size_t first = all_.size();
        for (TensorInfo & t : f->tensors_) all_.push_back(std::move(t));
        f->tensors_.clear();
        for (size_t i = first; i < all_.size(); ++i)
            if (!index_.try_emplace(all_[i].name, i).second)
                fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s' appears in more than one shard (%s)", all_[i].name.c_str(), f->path().c_str());
    }
    files_ = std::move(files);
}

std::unique_ptr<SafetensorsSource> SafetensorsSource::open_file(const std::string & path) {
    auto s     = std::unique_ptr<SafetensorsSource>(new SafetensorsSource());
    s->origin_ = path;
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    files.push_back(SafetensorsFile::open(path));
    s->take(std::move(files));
    return s;
}

std::unique_ptr<SafetensorsSource> SafetensorsSource::open_dir(const std::string & dir) {
    const std::string index_path = path_join(dir, "model.safetensors.index.json");
    const std::string single     = path_join(dir, "model.safetensors");
    if (!file_exists(index_path)) {
        if (!file_exists(single)) fail(SPARK_ERR_IO, "'%s' has neither model.safetensors nor model.safetensors.index.json", dir.c_str());
        return open_file(single);
    }
    const std::string text = read_text_file(index_path);
    IndexReader       index(index_path.c_str());
    sax_read(text.data(), text.data() + text.size(), index, index_path.c_str());
    if (!index.found) fail(SPARK_ERR_INVALID_FORMAT, "%s: no weight_map object", index_path.c_str());
    std::map<std::string_view, size_t> shard_index;  // the distinct shard names, in order
    for (const auto & [tensor, shard] : index.entries) shard_index.emplace(shard, 0);
    if (shard_index.empty()) fail(SPARK_ERR_INVALID_FORMAT, "%s: weight_map is empty", index_path.c_str());
    std::vector<std::string> shards;
    for (auto & [shard, i] : shard_index) {
        // A hostile index must not reach outside the model directory.
        if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos || shard == "." || shard == "..")
            fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid shard file name '%s'", index_path.c_str(), std::string(shard).c_str());
        i = shards.size();
        shards.emplace_back(shard);
    }

    // The shards' headers are independent (Qwen3-Next-80B: 9 shards, 300K tensors): read them on
    // several threads.
    std::vector<std::unique_ptr<SafetensorsFile>> files(shards.size());
    parallel_for(shards.size(), load_threads(0), [&](size_t i) { files[i] = SafetensorsFile::open(path_join(dir, shards[i])); });

    auto s     = std::unique_ptr<SafetensorsSource>(new SafetensorsSource());
    s->origin_ = dir;
    std::vector<std::vector<const std::string *>> listed(shards.size());  // the tensors the index puts in each shard
    for (const auto & [tensor, shard] : index.entries)
        listed[shard_index.at(shard)].push_back(&tensor);
    for (size_t i = 0; i < files.size(); ++i) {
        const std::vector<TensorInfo> & present = files[i]->tensors();  // in name order
        for (const std::string * name : listed[i]) {
            auto at = std::lower_bound(present.begin(), present.end(), *name, [](const TensorInfo & t, const std::string & n) { return t.name < n; });
            if (at == present.end() || at->name != *name)
                fail(SPARK_ERR_MISSING_TENSOR, "%s lists tensor '%s' in %s, which does not contain it", index_path.c_str(), name->c_str(), shards[i].c_str());
        }
    }
    s->take(std::move(files));
    return s;
}

const TensorInfo * SafetensorsSource::find(const std::string & name) const {
    auto it = index_.find(std::string_view(name));
    return it == index_.end() ? nullptr : &all_[it->second];
}

}  // namespace spark::io
