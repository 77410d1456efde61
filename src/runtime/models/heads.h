// Heads of speculative decoding that are loaded beside a target model. (The Qwen3-Next MTP head is
// part of its checkpoint and is loaded with it: Model::mtp.)
#pragma once

#include "runtime/models/arch.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace spark {

// An EAGLE3 head (LlamaForCausalLMEagle3 directory) for `target`, sharing its backend and, unless
// the head has its own, its embedding. Throws SPARK_ERR_INVALID_ARGUMENT when the head does not
// fit the target (vocabulary, hidden size, aux layers the target does not have), the loading
// errors of spark_model_load otherwise. The target must outlive the head.
std::unique_ptr<Model> load_eagle3_head(const std::string & path, const Model & target, const spark_model_params & params);

// The hyper-parameters of an EAGLE3 head from its config.json, checked against the target's; fills
// `aux` with the target layers the head reads. `origin` names the file in errors.
HParams parse_eagle3_config(const nlohmann::json & config, const HParams & target, std::vector<int32_t> & aux, const std::string & origin);

}  // namespace spark
