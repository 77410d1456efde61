// A safetensors checkpoint directory -> SafetensorsSource, the reader every model load and
// spark-convert uses (docs/RELIABILITY.md, "Model files"). An input that starts with '{' is a shard
// index (model.safetensors.index.json) up to its first NUL byte, followed by the bytes of the shard
// model-00001-of-00002.safetensors; any other input is the bytes of a single model.safetensors.
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    const fs::path         dir = fuzz::scratch_dir() / "safetensors";
    fs::remove_all(dir);
    fs::create_directories(dir);
    if (!in.empty() && in.front() == '{') {
        const auto [index, shard] = fuzz::split_at_nul(in);
        fuzz::write_file(dir / "model.safetensors.index.json", index);
        fuzz::write_file(dir / "model-00001-of-00002.safetensors", shard);
    } else {
        fuzz::write_file(dir / "model.safetensors", in);
    }
    fuzz::expect_spark_errors_only([&] {
        const auto src = spark::io::SafetensorsSource::open_dir(dir.string());
        // Every tensor the reader accepts lies inside the mapping: touch its first and last byte.
        uint8_t sum = 0;
        for (const spark::io::TensorInfo & t : src->tensors()) {
            if (t.nbytes > 0) sum ^= t.data[0] ^ t.data[t.nbytes - 1];
            if (src->find(t.name) != &t) __builtin_trap();
            (void) t.shape_str();
        }
        (void) src->describe();
        asm volatile("" : : "r"(sum));
    });
    return 0;
}
