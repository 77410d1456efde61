#include "io/writer/gguf_writer.h"

#include "common/error.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spark::io {

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
    if (key.empty() || key.size() > kGgufMaxKeyBytes) fail(SPARK_ERR_INVALID_ARGUMENT, "metadata key must be 1 to %llu bytes", ull(kGgufMaxKeyBytes));
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
    const auto expect = tensor_nbytes(t.shape, dtype);
    if (!expect || !gguf_dims_of(t.shape, dtype))
        fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s': invalid shape %s", name.c_str(), TensorInfo{name, dtype, t.shape}.shape_str().c_str());
    if (*expect != nbytes)
        fail(SPARK_ERR_INVALID_ARGUMENT, "tensor '%s': %s %s is %llu bytes, not %llu", name.c_str(), dtype_name(dtype), TensorInfo{name, dtype, t.shape}.shape_str().c_str(), ull(*expect), ull(nbytes));
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
