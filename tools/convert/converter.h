// spark-convert's engine: a Hugging Face checkpoint directory -> one spark file (docs/FORMAT.md),
// tensors in their native layouts, optionally quantizing a bf16/f16/f32 checkpoint with
// round-to-nearest into a real producer's layout (ModelOpt NVFP4, AutoRound INT4, block FP8,
// compressed-tensors per-channel FP8). Streams one tensor at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace spark::convert {

enum class Quantize { None, NVFP4, INT4, FP8 };

struct Options {
    std::string input;              // Hugging Face directory
    std::string output;             // spark file
    bool        overwrite = false;
    Quantize    quantize  = Quantize::None;
    int32_t     group_size = 128;   // INT4: 32, 64, 128, or -1 (per channel)
    bool        asymmetric = false; // INT4
    bool        fp8_per_channel = false;  // FP8: per output channel instead of 128x128 blocks
    bool        quantize_lm_head = false;

    // Progress over tensors written; called from the writing thread.
    std::function<void(size_t done, size_t total, const std::string & tensor)> progress;
    // Progress in bytes of tensor data written of the total (0 of the total before the first
    // tensor, then after each one); called from the writing thread.
    std::function<void(uint64_t done, uint64_t total)> progress_bytes;
    // Relative error ||W - dequant(Q)|| / ||W|| of each tensor the converter quantized.
    std::function<void(const std::string & tensor, double rel_error)> report;
    const std::atomic<bool> * cancel = nullptr;  // set to stop (the output is not written)
};

struct Stats {
    size_t   tensors_in = 0, tensors_out = 0, quantized = 0, kept_dense = 0;
    uint64_t bytes_out = 0;
};

// Throws spark::Error (SPARK_ERR_IO, SPARK_ERR_INVALID_FORMAT, SPARK_ERR_UNSUPPORTED, SPARK_ERR_ABORTED).
// On any error no output file exists (the writer works on a temporary and renames at the end).
Stats convert(const Options & options);

// Prints a spark file's metadata and tensor table.
void print_info(const std::string & path, FILE * out);

}  // namespace spark::convert
