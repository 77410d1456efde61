// What a model is loaded from, whatever the container: the tensors, the text of config.json and of
// the optional side files (quantization, tokenizer, generation config), and metadata. A Hugging
// Face directory and a spark file give the same ModelSource, so everything downstream is shared.
#pragma once

#include "io/tensor_source.h"

#include <map>
#include <memory>
#include <string>

namespace spark {

struct ModelSource {
    std::unique_ptr<io::TensorSource>  tensors;
    std::string                        config_json;
    std::string                        config_origin;           // names config.json in messages: its path, or the spark file's key
    std::string                        hf_quant_config_json;    // "" when absent
    std::string                        tokenizer_json;          // "" when absent
    std::string                        tokenizer_config_json;   // "" when absent
    std::string                        generation_config_json;  // "" when absent
    std::map<std::string, std::string> meta;
};

// A directory (config.json + safetensors) or a spark file. Throws SPARK_ERR_IO when the path does
// not exist or lacks config.json, SPARK_ERR_INVALID_FORMAT for corrupt containers.
ModelSource open_model_source(const std::string & path);

// A spark file (docs/FORMAT.md): the same pieces, read from its metadata.
ModelSource open_spark_file(const std::string & path);

}  // namespace spark
