// Reading a spark file as a ModelSource. The converter stores config.json and the side files
// verbatim (docs/FORMAT.md), so a spark file is parsed by exactly the code that parses a directory.
#include "common/error.h"
#include "io/gguf_reader.h"
#include "runtime/model_source.h"

namespace spark {

ModelSource open_spark_file(const std::string & path) {
    auto gguf = io::GgufSource::open(path);
    const io::GgufFile & f = gguf->file();
    if (!f.is_spark()) fail(SPARK_ERR_UNSUPPORTED, "'%s' is a GGUF file but not a spark file (no spark.format_version); convert the checkpoint with spark-convert", path.c_str());
    ModelSource src;
    auto config = f.get_string("spark.hf_config_json");
    if (!config) fail(SPARK_ERR_INVALID_FORMAT, "'%s': spark file lacks spark.hf_config_json", path.c_str());
    src.config_json            = *config;
    src.config_origin          = path + ": spark.hf_config_json (config.json)";
    src.hf_quant_config_json   = f.get_string("spark.hf_quant_config_json").value_or("");
    src.tokenizer_json         = f.get_string("tokenizer.huggingface.json").value_or("");
    src.tokenizer_config_json  = f.get_string("spark.tokenizer_config_json").value_or("");
    src.generation_config_json = f.get_string("spark.generation_config_json").value_or("");
    for (const auto & [key, value] : f.metadata())
        if (const std::string * s = value.as_string(); s && s->size() < 4096) src.meta[key] = *s;
    src.meta["general.source"] = path;
    src.tensors = std::move(gguf);
    return src;
}

}  // namespace spark
