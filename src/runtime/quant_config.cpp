#include "runtime/quant_config.h"

#include "common/error.h"

namespace spark {

using json = nlohmann::json;

namespace {

std::string str_or(const json & j, const char * key, const std::string & fallback = "") {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Bits, group sizes and block sizes: -1 (per channel) or small positive numbers. A value outside
// this range would be truncated to int, so it is refused.
constexpr int64_t kMaxQuantParam = int64_t(1) << 24;

int int_or(const json & j, const char * key, int fallback) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return fallback;
    const bool fits = it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(kMaxQuantParam)
                                               : it->get<int64_t>() >= -1 && it->get<int64_t>() <= kMaxQuantParam;
    if (!fits) fail(SPARK_ERR_INVALID_FORMAT, "quantization_config: '%s' = %s is outside [-1, %lld]", key, it->dump().c_str(), (long long) kMaxQuantParam);
    return int(it->get<int64_t>());
}

}  // namespace

bool QuantConfig::int4_is_awq() const {
    return method == QuantMethod::Awq || (method == QuantMethod::AutoRound && packing_format.find("awq") != std::string::npos);
}

// formats.md 4.2: "auto_round:auto_gptq" and GPTQ v1 store z - 1; "auto_round",
// "auto_round:gptqmodel", GPTQ v2 and AWQ store z.
int QuantConfig::int4_zero_offset() const {
    if (int4_is_awq()) return 0;
    if (method == QuantMethod::AutoRound) {
        if (packing_format.empty() || packing_format == "auto_round:auto_gptq") return 1;  // vLLM's default
        if (packing_format == "auto_round" || packing_format == "auto_round:gptqmodel") return 0;
        if (packing_format.find("gptqmodel") != std::string::npos) return 0;
        if (packing_format.find("gptq") != std::string::npos) return 1;
        fail(SPARK_ERR_UNSUPPORTED, "AutoRound packing_format '%s' is not supported", packing_format.c_str());
    }
    if (method == QuantMethod::Gptq) return checkpoint_format == "gptq_v2" ? 0 : 1;
    return 0;
}

int QuantConfig::group_size_for(const std::string & module) const {
    if (extra_config.is_object()) {
        auto it = extra_config.find(module);
        if (it != extra_config.end() && it->is_object()) return int_or(*it, "group_size", group_size);
    }
    return group_size;
}

int QuantConfig::bits_for(const std::string & module) const {
    if (extra_config.is_object()) {
        auto it = extra_config.find(module);
        if (it != extra_config.end() && it->is_object()) return int_or(*it, "bits", bits);
    }
    return bits;
}

std::string QuantConfig::describe() const { return raw.is_null() ? std::string("none") : raw.dump(); }

QuantConfig parse_quant_config(const json & config, const json & hf_quant_config, const std::string & origin) {
    try {
        return parse_quant_config(config, hf_quant_config);
    } catch (const Error & e) {
        throw Error(e.status(), origin + ": " + e.what());
    }
}

QuantConfig parse_quant_config(const json & config, const json & hf_quant_config) {
    QuantConfig qc;
    json        q;
    if (config.is_object() && config.contains("quantization_config") && config["quantization_config"].is_object())
        q = config["quantization_config"];
    else if (hf_quant_config.is_object() && hf_quant_config.contains("quantization")) {
        // ModelOpt's legacy side file: {"producer": ..., "quantization": {"quant_algo": ...}}
        q = hf_quant_config["quantization"];
        if (q.is_null()) return qc;
        if (!q.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "hf_quant_config.json: 'quantization' must be an object");
        q["quant_method"] = "modelopt";
    }
    if (q.is_null()) return qc;
    if (!q.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "'quantization_config' must be an object");
    qc.raw         = q;
    qc.method_name = str_or(q, "quant_method");
    const std::string & m = qc.method_name;
    if (m == "modelopt") qc.method = QuantMethod::ModelOpt;
    else if (m == "compressed-tensors") qc.method = QuantMethod::CompressedTensors;
    else if (m == "fp8") qc.method = QuantMethod::Fp8;
    else if (m == "auto-round" || m == "intel/auto-round") qc.method = QuantMethod::AutoRound;
    else if (m == "gptq") qc.method = QuantMethod::Gptq;
    else if (m == "awq") qc.method = QuantMethod::Awq;
    else fail(SPARK_ERR_UNSUPPORTED, "quantization method '%s' is not supported", m.c_str());

    qc.quant_algo        = str_or(q, "quant_algo");
    qc.format            = str_or(q, "format");
    qc.packing_format    = str_or(q, "packing_format");
    qc.checkpoint_format = str_or(q, "checkpoint_format");
    qc.bits              = int_or(q, "bits", int_or(q, "w_bit", 0));
    qc.group_size        = int_or(q, "group_size", int_or(q, "q_group_size", 0));
    if (q.contains("sym") && q["sym"].is_boolean()) qc.sym = q["sym"].get<bool>();
    if (q.contains("extra_config")) qc.extra_config = q["extra_config"];

    auto read_block = [&](const json & b) {
        if (b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer()) {
            const json pair = {{"n", b[0]}, {"k", b[1]}};
            qc.fp8_block_n  = int_or(pair, "n", 0);
            qc.fp8_block_k  = int_or(pair, "k", 0);
            if (qc.fp8_block_n <= 0 || qc.fp8_block_k <= 0)
                fail(SPARK_ERR_INVALID_FORMAT, "quantization_config: the FP8 block size %s must be positive", b.dump().c_str());
        }
    };
    if (q.contains("weight_block_size")) read_block(q["weight_block_size"]);
    // compressed-tensors: config_groups.*.weights.{block_structure, group_size, num_bits}
    if (q.contains("config_groups") && q["config_groups"].is_object())
        for (auto & [name, group] : q["config_groups"].items()) {
            if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) continue;
            const json & w = group["weights"];
            if (w.contains("block_structure")) read_block(w["block_structure"]);
            if (qc.group_size == 0) qc.group_size = int_or(w, "group_size", 0);
            if (qc.bits == 0) qc.bits = int_or(w, "num_bits", 0);
            if (w.contains("symmetric") && w["symmetric"].is_boolean()) qc.sym = w["symmetric"].get<bool>();
            if (qc.format.empty()) qc.format = str_or(group, "format");
        }
    if (qc.method == QuantMethod::ModelOpt && qc.quant_algo == "FP8_PB_WO" && qc.fp8_block_n == 0) qc.fp8_block_n = qc.fp8_block_k = 128;
    return qc;
}

}  // namespace spark
