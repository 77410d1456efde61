// spark-convert --synthetic: a Hugging Face checkpoint directory of one of spark's synthetic shapes
// (src/runtime/synthetic.cpp), with random weights, written as the real producers write theirs:
// transformers' config.json and sharding (model-00001-of-0000N.safetensors of at most ~5 GB and
// model.safetensors.index.json, or one model.safetensors), safetensors' tensor order, and the
// quantized layouts of AutoRound INT4 (auto_round:auto_gptq, sym, group 128), ModelOpt NVFP4 and
// block FP8 (128x128). For load-time benchmarks and tests that need real-shape files on disk.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace spark::convert {

struct SyntheticOptions {
    std::string shape;             // qwen3-8b, qwen3-30b-a3b, qwen3-next-80b-a3b, tiny-qwen3, tiny-qwen3-moe, tiny-qwen3-next
    std::string format = "bf16";   // bf16, int4, nvfp4, fp8
    std::string output;            // the directory to create
    bool        overwrite   = false;             // replace an existing non-empty model directory
    uint64_t    shard_bytes = 5000000000ull;     // transformers' max_shard_size "5GB"
    int         threads     = 0;                 // generating threads; <= 0: one per hardware thread

    // Bytes of tensor data written so far out of the total; called on the calling thread.
    std::function<void(uint64_t done, uint64_t total)> progress;
    const std::atomic<bool> * cancel = nullptr;  // set to stop (nothing is left behind)
};

struct SyntheticStats {
    size_t   tensors = 0, shards = 0;
    uint64_t bytes   = 0;  // tensor data
};

// Splits "SHAPE:FORMAT" (FORMAT defaults to bf16). Throws SPARK_ERR_INVALID_ARGUMENT.
void parse_synthetic_spec(const std::string & spec, SyntheticOptions & o);

// Writes the directory: to a temporary next to it (<output>.tmp-<pid>) that is renamed into place
// at the end, so that an error, a cancel or a killed run leaves no directory that looks complete.
// An existing empty directory is replaced; a non-empty one only with `overwrite`, and only if it is
// a model directory (has config.json or safetensors). The bytes depend only on shape and format
// (and on shard_bytes for the split). Throws spark::Error.
SyntheticStats write_synthetic_checkpoint(const SyntheticOptions & o);

}  // namespace spark::convert
