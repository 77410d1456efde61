// Synthetic models of real shapes with random weights (see synthetic.cpp).
#pragma once

#include "runtime/model.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace spark {

bool is_synthetic_path(const std::string & path);

// `finish` completes the model (info, metadata) like a loaded checkpoint. With a shard of size > 1,
// a rank's part of the split model (random values of the parts' shapes).
std::unique_ptr<Model> load_synthetic_model(const std::string & path, const spark_model_params & params,
                                            std::function<void(Model &, int64_t n_params)> finish, const Shard & shard = {});

}  // namespace spark

namespace spark {

// One tensor request of an architecture's load (ModelLoader::linear / dense / param), as recorded
// by synthetic_checkpoint_layout: what a checkpoint of the shape holds, without duplicating the
// architectures' knowledge. spark-convert --synthetic writes these as a Hugging Face directory.
struct SyntheticTensor {
    enum class Kind : uint8_t { Linear, Dense, Param };
    // How a parameter's values are made (synthetic_param_value), as the synthetic loader makes them.
    enum class Init : uint8_t { None, Norm, NormZeroCentred, ALog, DtBias, Conv };

    Kind                 kind = Kind::Linear;
    std::string          name;    // Linear: the module ("model.layers.0.self_attn.q_proj"); else the tensor
    int64_t              n = 0;   // Linear / Dense: out_features
    int64_t              k = 0;   // Linear / Dense: in_features
    std::vector<int64_t> shape;   // Param: the checkpoint's shape
    WeightFormat         format = WeightFormat::BF16;  // Linear: after the keep-dense and divisibility rules
    Init                 init   = Init::None;          // Param
};

// The tensors of synthetic shape `shape` (the names of "synthetic:<shape>:<format>") in the order the
// architecture loads them, each Linear in the format the synthetic model gives it in `format` (BF16
// for embeddings, lm_head, routers and shared-expert gates, and where the shape does not divide).
// `config_out` (optional) receives the shape's config.json fields that spark reads. Throws
// SPARK_ERR_INVALID_ARGUMENT for an unknown shape.
std::vector<SyntheticTensor> synthetic_checkpoint_layout(const std::string & shape, WeightFormat format, nlohmann::json * config_out);

// Value of element with uniform draw u in [0, 1) of a parameter (the synthetic loader's formula).
float synthetic_param_value(SyntheticTensor::Init init, float u);

}  // namespace spark
