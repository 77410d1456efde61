#include "quant/qweight.h"

namespace spark {

static size_t ceil_div(int64_t a, int64_t b) { return size_t((a + b - 1) / b); }

QWeightBytes qweight_bytes(const QWeight & w) {
    QWeightBytes b;
    const size_t n = size_t(w.n), k = size_t(w.k);
    switch (w.format) {
        case WeightFormat::F32:  b.data = n * k * 4; break;
        case WeightFormat::F16:
        case WeightFormat::BF16: b.data = n * k * 2; break;
        case WeightFormat::NVFP4:
            b.data   = n * (k / 2);
            b.scales = n * (k / 16);
            break;
        case WeightFormat::INT4:
            b.data   = (k / 8) * n * 4;
            b.scales = size_t(w.n_groups) * n * 2;
            b.zeros  = w.zeros ? size_t(w.n_groups) * (n / 8) * 4 : 0;
            b.g_idx  = w.g_idx ? k * 4 : 0;
            break;
        case WeightFormat::FP8:
            b.data   = n * k;
            b.scales = (w.block_n > 0 && w.block_k > 0)
                           ? ceil_div(w.n, w.block_n) * ceil_div(w.k, w.block_k) * 4
                           : 0;
            break;
    }
    return b;
}

const char * weight_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::F32:   return "f32";
        case WeightFormat::F16:   return "f16";
        case WeightFormat::BF16:  return "bf16";
        case WeightFormat::NVFP4: return "nvfp4";
        case WeightFormat::INT4:  return "int4";
        case WeightFormat::FP8:   return "fp8";
    }
    return "unknown";
}

}  // namespace spark
