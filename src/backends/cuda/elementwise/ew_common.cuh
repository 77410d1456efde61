// Shared pieces of the small-op kernels (src/backends/cuda/elementwise/): how a kernel addresses the
// rows of a (possibly strided) tensor, the vector-width decision, warp/block reductions, and the
// launch-shape helpers. Device code here is float32 and IEEE (no fast-math intrinsics), so results
// stay within an ulp or two of the CPU backend.
#pragma once

#include "backends/cuda/common/kernel_args.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/common/math.cuh"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "graph/dtype.h"
#include "common/error.h"
#include "graph/graph.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace spark::cuda::ew {

// The rows of a tensor viewed as [ne0, nrows], rows enumerated over dims 1..3 exactly like the CPU
// backend's row_ptr(): row r = i1 + ne1 * (i2 + ne2 * i3). Strides are in bytes.
struct Rows {
    char *  data = nullptr;
    int64_t ne1 = 1, ne2 = 1;
    int64_t nb1 = 0, nb2 = 0, nb3 = 0;

    __device__ __forceinline__ char * row(int64_t r) const {
        if (ne1 == 1 && ne2 == 1) return data + r * nb3;  // [ne0, 1, 1, n]
        const int64_t q  = r / ne1;
        const int64_t i1 = r - q * ne1;
        const int64_t i3 = q / ne2;
        const int64_t i2 = q - i3 * ne2;
        return data + i1 * nb1 + i2 * nb2 + i3 * nb3;
    }
};

inline Rows rows_of(const Tensor & t) {
    Rows r;
    r.data = static_cast<char *>(t.data);
    r.ne1  = t.ne[1];
    r.ne2  = t.ne[2];
    r.nb1  = int64_t(t.nb[1]);
    r.nb2  = int64_t(t.nb[2]);
    r.nb3  = int64_t(t.nb[3]);
    // Evenly spaced rows (contiguous tensors, row views, [ne0, 1, 1, n] shapes) collapse to one
    // stride, which spares the kernels two 64-bit divisions per row.
    int64_t stride = -1, span = 1;
    bool    flat   = true;
    for (int d = 1; d < kMaxDims && flat; ++d) {
        if (t.ne[d] == 1) continue;
        if (stride < 0) stride = int64_t(t.nb[d]);
        else flat = int64_t(t.nb[d]) == stride * span;
        span *= t.ne[d];
    }
    if (flat) {
        r.ne1 = 1;
        r.ne2 = 1;
        r.nb3 = stride < 0 ? 0 : stride;
    }
    return r;
}

// True when every row start of t is aligned to `bytes` (the data pointer and every stride of a
// dimension that has more than one index).
inline bool rows_aligned(const Tensor & t, size_t bytes) {
    if (reinterpret_cast<uintptr_t>(t.data) % bytes) return false;
    for (int d = 1; d < kMaxDims; ++d)
        if (t.ne[d] > 1 && t.nb[d] % bytes) return false;
    return true;
}

// float4 loads/stores are used when the row length is a multiple of 4 floats and every row starts on
// a 16-byte boundary (arena tensors always do; views at odd offsets take the scalar path).
inline bool vec4_ok(const Tensor & t) { return t.ne[0] % 4 == 0 && rows_aligned(t, 16); }

inline void require(bool ok, const char * op, const char * what) {
    if (!ok) fail(SPARK_ERR_UNSUPPORTED, "cuda %s: %s", op, what);
}

inline void require_f32_rows(const Tensor & t, const char * op) {
    require(t.type == DType::F32, op, "expects F32 tensors");
    require(t.nb[0] == sizeof(float), op, "expects rows with contiguous elements (nb[0] == 4)");
    require(t.data != nullptr || t.nelements() == 0, op, "tensor has no device memory bound");
}

inline bool same_shape(const Tensor & a, const Tensor & b) {
    for (int d = 0; d < kMaxDims; ++d)
        if (a.ne[d] != b.ne[d]) return false;
    return true;
}

// The weight of an RMS_NORM node (src1, [ne0] F32) or nullptr; `aligned`: 16-byte aligned.
inline const float * norm_weight(const Tensor & norm, int64_t n, bool & aligned) {
    aligned = true;
    const Tensor * w = norm.src[1];
    if (!w) return nullptr;
    require_f32_rows(*w, "RMS_NORM");
    require(w->ne[0] == n && w->nrows() == 1, "RMS_NORM", "weight must be [ne0]");
    aligned = reinterpret_cast<uintptr_t>(w->data) % 16 == 0;
    return static_cast<const float *>(w->data);
}

// Blocks for a grid-stride loop over `items` work items: enough to fill the device, never more
// than there are items.
inline unsigned grid_for(int64_t items, const OpContext & ctx, int blocks_per_sm = 16) {
    const int64_t sms = ctx.props && ctx.props->sm_count > 0 ? ctx.props->sm_count : 132;
    const int64_t cap = std::max<int64_t>(1, sms * blocks_per_sm);
    return unsigned(std::max<int64_t>(1, std::min(items, cap)));
}

// ---- loads

// Read-only loads through the non-coherent path (weights, and activations a kernel never writes).
__device__ __forceinline__ float  ldg(const float * p) { return __ldg(p); }
__device__ __forceinline__ float4 ldg4(const float * p) { return __ldg(reinterpret_cast<const float4 *>(p)); }

// ---- order-preserving float <-> uint32 keys (a < b as floats <=> key(a) < key(b) as unsigned, for
// non-NaN values; -0 and +0 get different keys, callers canonicalise where that matters)

__device__ __forceinline__ uint32_t ordered_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_key(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---- reductions (warp_sum: common/math.cuh)

// Sum over a group of G threads (G = 32: the warp; G > 32: the whole block, blockDim.x == G).
// `scratch` holds 32 floats of shared memory; every thread of the group gets the total.
template <int G> __device__ __forceinline__ float group_sum(float v, float * scratch) {
    v = warp_sum(v);
    if constexpr (G > 32) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        __syncthreads();  // scratch may still be read by a previous reduction
        if (lane == 0) scratch[warp] = v;
        __syncthreads();
        v = lane < G / 32 ? scratch[lane] : 0.0f;
        v = warp_sum(v);
    }
    return v;
}

}  // namespace spark::cuda::ew
