#include "graph/dtype.h"

namespace spark {

namespace {
struct DTypeInfo {
    const char * name;
    size_t       size;
    bool         is_float;
};
constexpr DTypeInfo kInfo[] = {
    {"F32", 4, true}, {"F16", 2, true}, {"BF16", 2, true}, {"F64", 8, true},
    {"I8", 1, false}, {"U8", 1, false}, {"I16", 2, false}, {"U16", 2, false},
    {"I32", 4, false}, {"U32", 4, false}, {"I64", 8, false}, {"U64", 8, false},
    {"BOOL", 1, false},
    {"F8_E4M3", 1, true}, {"F8_E5M2", 1, true},
};
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == size_t(DType::COUNT));
}  // namespace

size_t dtype_size(DType t) { return kInfo[size_t(t)].size; }
const char * dtype_name(DType t) { return t < DType::COUNT ? kInfo[size_t(t)].name : "?"; }
bool dtype_is_float(DType t) { return kInfo[size_t(t)].is_float; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
    for (size_t i = 0; i < size_t(DType::COUNT); ++i)
        if (s == kInfo[i].name) return DType(i);
    return std::nullopt;
}

}  // namespace spark
