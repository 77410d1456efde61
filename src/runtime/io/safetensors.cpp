#include "runtime/io/safetensors.h"

#include "graph/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_set>

namespace spark::io {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // as the reference implementation

// Parses JSON, rejecting duplicate keys of the top-level object (nlohmann keeps the last silently).
// The header's top-level keys, to find a duplicate (nlohmann keeps the last of equal keys without a
// word). A SAX pass of its own: a parser callback would do it too, but nlohmann's DOM parser then
// rescans the parent object at the end of every child, which is quadratic in the tensor count
// (seconds per shard for a 30B MoE's 20K tensors).
struct TopLevelKeys {
    std::unordered_set<std::string> seen;
    std::string                     duplicate;
    int                             depth = 0;

    bool null() { return true; }
    bool boolean(bool) { return true; }
    bool number_integer(json::number_integer_t) { return true; }
    bool number_unsigned(json::number_unsigned_t) { return true; }
    bool number_float(json::number_float_t, const std::string &) { return true; }
    bool string(std::string &) { return true; }
    bool binary(json::binary_t &) { return true; }
    bool start_object(std::size_t) { return ++depth, true; }
    bool end_object() { return --depth, true; }
    bool start_array(std::size_t) { return ++depth, true; }
    bool end_array() { return --depth, true; }
    bool key(std::string & k) {
        if (depth == 1 && !seen.insert(k).second && duplicate.empty()) duplicate = k;
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) { return false; }
};

json parse_rejecting_duplicates(const char * begin, const char * end, const std::string & what) {
    json j;
    try {
        j = json::parse(begin, end);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid JSON header: %s", what.c_str(), e.what());
    }
    TopLevelKeys keys;
    json::sax_parse(begin, end, &keys);  // valid JSON: it was just parsed
    if (!keys.duplicate.empty())
        fail(SPARK_ERR_INVALID_FORMAT, "%s: duplicate tensor name '%s'", what.c_str(), keys.duplicate.c_str());
    return j;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t & out) {
    if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
    out = a * b;
    return true;
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

    json hdr = parse_rejecting_duplicates(reinterpret_cast<const char *>(p + 8), reinterpret_cast<const char *>(p + 8 + n), path);
    if (!hdr.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "%s: header is not a JSON object", what);

    const uint64_t  data_size = size - 8 - n;
    const uint8_t * data      = p + 8 + n;

    struct Range { uint64_t begin, end; size_t index; };
    std::vector<Range> ranges;
    for (auto it = hdr.begin(); it != hdr.end(); ++it) {
        const std::string & name = it.key();
        const json &        v    = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "%s: __metadata__ is not an object", what);
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string()) fail(SPARK_ERR_INVALID_FORMAT, "%s: __metadata__ value of '%s' is not a string", what, m.key().c_str());
                f->metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' lacks dtype/shape/data_offsets", what, name.c_str());
        const json & jd = v["dtype"];
        const json & js = v["shape"];
        const json & jo = v["data_offsets"];
        if (!jd.is_string()) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': dtype is not a string", what, name.c_str());
        auto dt = dtype_from_safetensors(jd.get<std::string>());
        if (!dt) fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown or unsupported dtype '%s'", what, name.c_str(), jd.get<std::string>().c_str());
        if (!js.is_array() || js.size() > 8) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': bad shape", what, name.c_str());
        TensorInfo t;
        t.name  = name;
        t.dtype = *dt;
        uint64_t numel = 1;
        for (const json & d : js) {
            if (!d.is_number_unsigned()) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': shape entries must be non-negative integers", what, name.c_str());
            uint64_t dim = d.get<uint64_t>();
            if (dim > (uint64_t(1) << 48) || !checked_mul(numel, dim, numel))
                fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': shape overflows", what, name.c_str());
            t.shape.push_back(int64_t(dim));
        }
        if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", what, name.c_str());
        uint64_t b = jo[0].get<uint64_t>(), e = jo[1].get<uint64_t>();
        if (e < b) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets end before begin", what, name.c_str());
        if (e > data_size) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) point outside the file (data section is %llu bytes)", what, name.c_str(), (unsigned long long) b, (unsigned long long) e, (unsigned long long) data_size);
        uint64_t nbytes = 0;
        if (!checked_mul(numel, dtype_size(*dt), nbytes) || nbytes != e - b)
            fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span %llu", what, name.c_str(), dtype_name(*dt), t.shape_str().c_str(), (unsigned long long) nbytes, (unsigned long long) (e - b));
        t.data   = data + b;
        t.nbytes = size_t(nbytes);
        ranges.push_back({b, e, f->tensors_.size()});
        f->tensors_.push_back(std::move(t));
    }

    // Tensors must tile the data section exactly: no overlap, no hole, nothing after the last one.
    std::sort(ranges.begin(), ranges.end(), [](const Range & a, const Range & b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
    uint64_t expect = 0;
    for (const Range & r : ranges) {
        if (r.begin < expect) fail(SPARK_ERR_INVALID_FORMAT, "%s: tensor '%s' overlaps another tensor", what, f->tensors_[r.index].name.c_str());
        if (r.begin > expect) fail(SPARK_ERR_INVALID_FORMAT, "%s: hole in the data section before tensor '%s'", what, f->tensors_[r.index].name.c_str());
        expect = r.end;
    }
    if (expect != data_size) fail(SPARK_ERR_INVALID_FORMAT, "%s: data section has %llu bytes but tensors cover %llu", what, (unsigned long long) data_size, (unsigned long long) expect);
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

void SafetensorsSource::add(std::unique_ptr<SafetensorsFile> f) {
    for (const TensorInfo & t : f->tensors()) {
        if (index_.count(t.name)) fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s' appears in more than one shard (%s)", t.name.c_str(), f->path().c_str());
        index_[t.name] = all_.size();
        all_.push_back(t);
    }
    files_.push_back(std::move(f));
}

std::unique_ptr<SafetensorsSource> SafetensorsSource::open_file(const std::string & path) {
    auto s     = std::unique_ptr<SafetensorsSource>(new SafetensorsSource());
    s->origin_ = path;
    s->add(SafetensorsFile::open(path));
    return s;
}

std::unique_ptr<SafetensorsSource> SafetensorsSource::open_dir(const std::string & dir) {
    const std::string index_path = path_join(dir, "model.safetensors.index.json");
    const std::string single     = path_join(dir, "model.safetensors");
    if (!file_exists(index_path)) {
        if (!file_exists(single)) fail(SPARK_ERR_IO, "'%s' has neither model.safetensors nor model.safetensors.index.json", dir.c_str());
        return open_file(single);
    }
    std::string text = read_text_file(index_path);
    json        idx;
    try {
        idx = json::parse(text);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid JSON: %s", index_path.c_str(), e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
        fail(SPARK_ERR_INVALID_FORMAT, "%s: no weight_map object", index_path.c_str());
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
        if (!it.value().is_string()) fail(SPARK_ERR_INVALID_FORMAT, "%s: weight_map entry '%s' is not a file name", index_path.c_str(), it.key().c_str());
        std::string shard = it.value().get<std::string>();
        // A hostile index must not reach outside the model directory.
        if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos || shard == "." || shard == "..")
            fail(SPARK_ERR_INVALID_FORMAT, "%s: invalid shard file name '%s'", index_path.c_str(), shard.c_str());
        by_shard[shard].push_back(it.key());
    }
    if (by_shard.empty()) fail(SPARK_ERR_INVALID_FORMAT, "%s: weight_map is empty", index_path.c_str());
    auto s     = std::unique_ptr<SafetensorsSource>(new SafetensorsSource());
    s->origin_ = dir;
    for (auto & [shard, names] : by_shard) {
        auto f = SafetensorsFile::open(path_join(dir, shard));
        std::set<std::string> present;
        for (const TensorInfo & t : f->tensors()) present.insert(t.name);
        for (const std::string & n : names)
            if (!present.count(n)) fail(SPARK_ERR_MISSING_TENSOR, "%s lists tensor '%s' in %s, which does not contain it", index_path.c_str(), n.c_str(), shard.c_str());
        s->add(std::move(f));
    }
    return s;
}

const TensorInfo * SafetensorsSource::find(const std::string & name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &all_[it->second];
}

}  // namespace spark::io
