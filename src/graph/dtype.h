// Element types of tensors (activations, state, and the raw buffers of checkpoint tensors).
// Quantized *weights* are not a dtype: they are a QWeight (src/quant/qweight.h) built from several
// raw tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace spark {

enum class DType : uint8_t {
    F32, F16, BF16, F64,
    I8, U8, I16, U16, I32, U32, I64, U64,
    BOOL,
    F8_E4M3, F8_E5M2,
    COUNT
};

size_t           dtype_size(DType t);           // bytes per element
const char *     dtype_name(DType t);           // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_safetensors(std::string_view s);  // nullopt for unknown/unsupported
bool             dtype_is_float(DType t);

}  // namespace spark
