// The host side of the kernels' parameter structs: what the ops (attention_op.cpp, ssm.cu) take
// from a graph Tensor, written once instead of field by field. The structs keep flat fields
// (pointer, then byte strides), as the kernels read them.
#pragma once

#include "graph/graph.h"

#include <cstdint>
#include <tuple>

namespace spark::cuda {

// Whether t is F32 with contiguous rows (nb[0] == 4), as the kernels read their F32 inputs.
inline bool f32_rows(const Tensor & t) { return t.type == DType::F32 && t.nb[0] == sizeof(float); }

// The data and the byte strides of dims 1 and 2 of a tensor [D, heads, tokens] (row (h, t) at
// data + t nb2 + h nb1), for a struct's (x, x_nb1, x_nb2) fields:
//   std::tie(p.q, p.q_nb1, p.q_nb2) = head_rows(q);
inline std::tuple<const char *, int64_t, int64_t> head_rows(const Tensor & t) {
    return {static_cast<const char *>(t.data), int64_t(t.nb[1]), int64_t(t.nb[2])};
}

}  // namespace spark::cuda
