#include "runtime/model_source.h"

#include "common/error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"

#include <cstring>

namespace spark {

namespace {

std::string read_if_present(const std::string & path) { return io::file_exists(path) ? io::read_text_file(path) : std::string(); }

ModelSource open_directory(const std::string & dir) {
    const std::string config = io::path_join(dir, "config.json");
    if (!io::file_exists(config)) fail(SPARK_ERR_IO, "'%s' has no config.json", dir.c_str());
    ModelSource src;
    src.config_json            = io::read_text_file(config);
    src.config_origin          = config;
    src.hf_quant_config_json   = read_if_present(io::path_join(dir, "hf_quant_config.json"));
    src.tokenizer_json         = read_if_present(io::path_join(dir, "tokenizer.json"));
    src.tokenizer_config_json  = read_if_present(io::path_join(dir, "tokenizer_config.json"));
    src.generation_config_json = read_if_present(io::path_join(dir, "generation_config.json"));
    src.tensors                = io::SafetensorsSource::open_dir(dir);
    src.meta["general.source"] = dir;
    return src;
}

bool has_gguf_magic(const std::string & path) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char magic[4] = {};
    const bool ok = std::fread(magic, 1, 4, f) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
    std::fclose(f);
    return ok;
}

}  // namespace

ModelSource open_model_source(const std::string & path) {
    if (io::is_directory(path)) return open_directory(path);
    if (!io::file_exists(path)) fail(SPARK_ERR_IO, "model path '%s' does not exist", path.c_str());
    if (has_gguf_magic(path)) return open_spark_file(path);
    fail(SPARK_ERR_INVALID_FORMAT, "'%s' is neither a model directory nor a spark (GGUF) file", path.c_str());
}

}  // namespace spark
