// The writing side of the spark file (gguf.h), for spark-convert and the tests: a streaming writer
// (metadata + tensor descriptors up front, then the data of one tensor at a time from a callback,
// into a temporary file renamed on success). Component spark_io_writer: libspark only reads.
#pragma once

#include "io/gguf.h"

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace spark::io {

class GgufWriter {
public:
    struct Tensor {
        std::string          name;
        DType                dtype = DType::F32;
        std::vector<int64_t> shape;  // PyTorch order; {} for a scalar
        uint64_t             nbytes = 0;
    };

    // Receives the bytes of one tensor, in one or more pieces; together exactly Tensor::nbytes.
    class Sink {
    public:
        virtual ~Sink() = default;
        virtual void write(const void * data, size_t n) = 0;
    };

    // Called once per tensor, in add_tensor order, with the tensor's index. Returning false aborts
    // the write (Error(SPARK_ERR_ABORTED)); an exception thrown here aborts it too and propagates.
    using DataProvider = std::function<bool(size_t index, const Tensor & tensor, Sink & out)>;

    GgufWriter();

    // Adds or replaces a KV pair (first insertion fixes its position). Keys are printable ASCII
    // without spaces, at most 65535 bytes. general.alignment, spark.format_version,
    // spark.tensor_dtypes and spark.tensor_shapes are the writer's own: setting them is an error.
    // Strings must be well-formed UTF-8. Nested arrays are refused (ggml's reader rejects a whole
    // file that has one).
    void set(const std::string & key, GgufValue value);
    void set_string(const std::string & key, std::string v) { set(key, GgufValue(std::move(v))); }
    void set_u32(const std::string & key, uint32_t v) { set(key, GgufValue(v)); }
    void set_i32(const std::string & key, int32_t v) { set(key, GgufValue(v)); }
    void set_u64(const std::string & key, uint64_t v) { set(key, GgufValue(v)); }
    void set_i64(const std::string & key, int64_t v) { set(key, GgufValue(v)); }
    void set_f32(const std::string & key, float v) { set(key, GgufValue(v)); }
    void set_f64(const std::string & key, double v) { set(key, GgufValue(v)); }
    void set_bool(const std::string & key, bool v) { set(key, GgufValue(v)); }
    void set_string_array(const std::string & key, std::vector<std::string> v) { set(key, GgufValue::string_array(std::move(v))); }
    const GgufValue * find(const std::string & key) const;

    // Declares a tensor. Error(SPARK_ERR_INVALID_ARGUMENT) for an empty, duplicate, non-UTF-8 or
    // > 63-byte name, a rank above 8, a negative dimension, or nbytes != numel * dtype size.
    void add_tensor(const std::string & name, DType dtype, std::vector<int64_t> shape, uint64_t nbytes);
    const std::vector<Tensor> & tensors() const { return tensors_; }

    // Writes the file: `<path>.tmp-<pid>` first, renamed to `path` on success. On any error the
    // temporary is removed and `path` is untouched. Refuses (SPARK_ERR_IO) to replace an existing
    // `path` unless `overwrite`. Requires general.architecture and spark.hf_config_json (strings).
    // Temporaries of `path` left by writers that were killed (their process is gone) are removed.
    void write(const std::string & path, const DataProvider & provide, bool overwrite = false) const;

private:
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t>        kv_index_;
    std::vector<Tensor>                            tensors_;
    std::unordered_map<std::string, size_t>        tensor_index_;
};

// For a SIGINT/SIGTERM handler of a program that writes spark files: removes the temporary file of
// the GgufWriter::write in progress, if any, with only async-signal-safe calls (unlink). The handler
// should then end the process (_exit) rather than return into the interrupted write. Only one write
// at a time is tracked (the first of concurrent writes); the others still clean up on errors.
void gguf_remove_temp_file_on_signal() noexcept;

}  // namespace spark::io
