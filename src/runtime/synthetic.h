// Synthetic models of real shapes with random weights (see synthetic.cpp).
#pragma once

#include "runtime/model.h"

#include <functional>
#include <memory>
#include <string>

namespace spark {

bool is_synthetic_path(const std::string & path);

// `finish` completes the model (info, metadata) like a loaded checkpoint.
std::unique_ptr<Model> load_synthetic_model(const std::string & path, const spark_model_params & params,
                                            std::function<void(Model &, int64_t n_params)> finish);

}  // namespace spark
