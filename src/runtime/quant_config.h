// The quantization description of a checkpoint: config.json's `quantization_config` or ModelOpt's
// legacy hf_quant_config.json. It supplies what the tensors alone cannot tell (INT4 packing and
// zero-point convention, FP8 block size, group sizes); which layers are quantized is decided per
// tensor from what the checkpoint holds (src/runtime/weight_resolver.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace spark {

enum class QuantMethod { None, ModelOpt, CompressedTensors, Fp8, AutoRound, Gptq, Awq };

struct QuantConfig {
    QuantMethod method = QuantMethod::None;
    std::string method_name;       // as spelled in the checkpoint
    std::string quant_algo;        // ModelOpt: NVFP4, FP8, FP8_PB_WO, ...
    std::string format;            // compressed-tensors: nvfp4-pack-quantized, float-quantized, pack-quantized
    std::string packing_format;    // AutoRound
    std::string checkpoint_format; // GPTQ: gptq (v1) / gptq_v2
    int         bits       = 0;
    int         group_size = 0;    // INT4 groups (-1: per channel)
    bool        sym        = true;
    int         fp8_block_n = 0, fp8_block_k = 0;  // block FP8 (weight_block_size / block_structure)
    nlohmann::json extra_config;   // AutoRound per-layer overrides
    nlohmann::json raw;            // the whole description (provenance)

    // INT4: whether qweight/qzeros use AWQ's layout, and the zero-point offset to add to stored zeros.
    bool int4_is_awq() const;
    int  int4_zero_offset() const;
    // Group size for a module (extra_config override, else global); 0 when unknown.
    int  group_size_for(const std::string & module) const;
    int  bits_for(const std::string & module) const;
    std::string describe() const;
};

// `config` is config.json; `hf_quant_config` is hf_quant_config.json or null. Throws
// SPARK_ERR_INVALID_FORMAT for values that cannot be right (group sizes that do not fit an int),
// SPARK_ERR_UNSUPPORTED for unknown methods; with `origin`, messages start with it (the file).
QuantConfig parse_quant_config(const nlohmann::json & config, const nlohmann::json & hf_quant_config);
QuantConfig parse_quant_config(const nlohmann::json & config, const nlohmann::json & hf_quant_config, const std::string & origin);

}  // namespace spark
