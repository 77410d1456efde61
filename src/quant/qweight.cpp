#include "quant/qweight.h"

namespace spark {

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
