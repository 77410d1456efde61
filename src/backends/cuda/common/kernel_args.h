// The host side of the kernels' parameter structs: what the ops (attention_op.cpp, ssm.cu, the
// elementwise and matmul ops) take from a graph Tensor, written once instead of field by field. The structs keep flat fields
// (pointer, then byte strides), as the kernels read them.
#pragma once

#include "graph/graph.h"

#include <cstdint>
#include <tuple>

namespace spark::cuda {

// Whether the byte spans of two tensors intersect (an output the memory plan placed over an input).
inline bool overlaps(const Tensor & p, const Tensor & q) {
    const char * p0 = static_cast<const char *>(p.data);
    const char * q0 = static_cast<const char *>(q.data);
    return p.nelements() > 0 && q.nelements() > 0 && p0 < q0 + q.nbytes() && q0 < p0 + p.nbytes();
}

// Whether t is F32 with contiguous rows (nb[0] == 4), as the kernels read their F32 inputs.
inline bool f32_rows(const Tensor & t) { return t.type == DType::F32 && t.nb[0] == sizeof(float); }

// The data and the byte strides of dims 1 and 2 of a tensor [D, heads, tokens] (row (h, t) at
// data + t nb2 + h nb1), for a struct's (x, x_nb1, x_nb2) fields:
//   std::tie(p.q, p.q_nb1, p.q_nb2) = head_rows(q);
inline std::tuple<const char *, int64_t, int64_t> head_rows(const Tensor & t) {
    return {static_cast<const char *>(t.data), int64_t(t.nb[1]), int64_t(t.nb[2])};
}

}  // namespace spark::cuda
