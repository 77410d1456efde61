// Row copies: CONT (any element type), CONCAT (F32, up to three sources side by side in one launch)
// and GET_ROWS (rows of a dense F32/F16/BF16 weight or of an F32 tensor, converted to F32).
//
// Copies move bytes with the widest vector (16/8/4/2/1 bytes) that every row start, stride and row
// length allows, so a contiguous F32 copy is one 16-byte load and store per thread.
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"
#include "quant/formats.h"

namespace spark::cuda {

namespace {

using ew::Rows;

// One source of a row copy: `row_bytes` bytes of each source row go to destination column byte
// `dst_col` of the same destination row.
struct CopySeg {
    Rows    src;
    int64_t row_bytes = 0;
    int64_t dst_col   = 0;
    int64_t chunks    = 0;  // blocks-worth of work per row (row_bytes / (blockDim * W), rounded up)
};

struct CopyArgs {
    CopySeg seg[3];
    Rows    dst;
    int64_t nrows = 0;
};

// blockIdx.y selects the segment; blocks stride over (row, chunk) pairs of that segment.
template <typename VT> __global__ void copy_rows_kernel(const CopyArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    const CopySeg & s     = args.seg[blockIdx.y];
    const int64_t   items = args.nrows * s.chunks;
    constexpr int   W     = int(sizeof(VT));
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t r   = item / s.chunks;
        const int64_t c   = item - r * s.chunks;
        const int64_t off = (c * blockDim.x + threadIdx.x) * W;
        if (off >= s.row_bytes) continue;
        const VT * src = reinterpret_cast<const VT *>(s.src.row(r) + off);
        VT *       dst = reinterpret_cast<VT *>(args.dst.row(r) + s.dst_col + off);
        *dst           = *src;
    }
}

// Largest power-of-two width <= 16 dividing every value.
int vec_width(const int64_t * values, int n) {
    int w = 16;
    for (int i = 0; i < n; ++i)
        while (w > 1 && values[i] % w) w >>= 1;
    return w;
}

void push_alignment_terms(const Tensor & t, int64_t extra_offset, int64_t * v, int & n) {
    v[n++] = int64_t(reinterpret_cast<uintptr_t>(t.data)) + extra_offset;
    for (int d = 1; d < kMaxDims; ++d)
        if (t.ne[d] > 1) v[n++] = int64_t(t.nb[d]);
}

template <typename VT> void launch_copy_w(CopyArgs & args, int nseg, const OpContext & ctx) {
    constexpr int kThreads = 256;
    constexpr int W        = int(sizeof(VT));
    int64_t       most     = 0;
    for (int i = 0; i < nseg; ++i) {
        args.seg[i].chunks = std::max<int64_t>(1, ceil_div(args.seg[i].row_bytes, int64_t(kThreads) * W));
        most               = std::max(most, args.nrows * args.seg[i].chunks);
    }
    if (most == 0) return;
    const dim3 grid(ew::grid_for(most, ctx), unsigned(nseg));
    launch(copy_rows_kernel<VT>, grid, kThreads, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

void copy_rows(CopyArgs & args, int nseg, const int64_t * align_terms, int n_terms, const OpContext & ctx) {
    if (args.nrows == 0) return;
    switch (vec_width(align_terms, n_terms)) {
        case 16: return launch_copy_w<uint4>(args, nseg, ctx);
        case 8: return launch_copy_w<uint2>(args, nseg, ctx);
        case 4: return launch_copy_w<uint32_t>(args, nseg, ctx);
        case 2: return launch_copy_w<uint16_t>(args, nseg, ctx);
        default: return launch_copy_w<uint8_t>(args, nseg, ctx);
    }
}

// ---- GET_ROWS

template <typename T> struct RowElem;
template <> struct RowElem<float> {
    static __device__ __forceinline__ float load(const float * p) { return *p; }
    static __device__ __forceinline__ float4 load4(const float * p) { return *reinterpret_cast<const float4 *>(p); }
};
struct F16Tag {};
struct BF16Tag {};
template <> struct RowElem<F16Tag> {
    static __device__ __forceinline__ float load(const uint16_t * p) { return f16_to_f32(*p); }
    static __device__ __forceinline__ float4 load4(const uint16_t * p) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        return make_float4(f16_to_f32(uint16_t(u.x)), f16_to_f32(uint16_t(u.x >> 16)), f16_to_f32(uint16_t(u.y)),
                           f16_to_f32(uint16_t(u.y >> 16)));
    }
};
template <> struct RowElem<BF16Tag> {
    static __device__ __forceinline__ float load(const uint16_t * p) { return bf16_to_f32(*p); }
    static __device__ __forceinline__ float4 load4(const uint16_t * p) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        return make_float4(bf16_to_f32(uint16_t(u.x)), bf16_to_f32(uint16_t(u.x >> 16)), bf16_to_f32(uint16_t(u.y)),
                           bf16_to_f32(uint16_t(u.y >> 16)));
    }
};
template <typename Tag> struct StoreType {
    using type = uint16_t;
};
template <> struct StoreType<float> {
    using type = float;
};

// out row i = source row ids[i] as F32. An id outside [0, n_src) writes a row of zeros: the kernel
// can neither report the error nor read past the table (the CPU backend rejects such ids with
// SPARK_ERR_INVALID_TOKEN before computing; the runtime validates token ids on the host).
template <typename Tag, int V>
__global__ void get_rows_kernel(const char * src, int64_t src_stride, int64_t n_src, const int32_t * ids, int64_t n_ids,
                                Rows out, int64_t k, int64_t chunks) {
    pdl::launch_dependents();
    pdl::wait();
    using E             = typename StoreType<Tag>::type;
    const int64_t items = n_ids * chunks;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t i = item / chunks;
        const int64_t c = item - i * chunks;
        const int64_t j = (c * blockDim.x + threadIdx.x) * V;
        if (j >= k) continue;
        const int32_t id = ids[i];
        float *       o  = reinterpret_cast<float *>(out.row(i)) + j;
        if (id < 0 || int64_t(id) >= n_src) {
            if constexpr (V == 4) *reinterpret_cast<float4 *>(o) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            else *o = 0.0f;
            continue;
        }
        const E * s = reinterpret_cast<const E *>(src + int64_t(id) * src_stride) + j;
        if constexpr (V == 4) *reinterpret_cast<float4 *>(o) = RowElem<Tag>::load4(s);
        else *o = RowElem<Tag>::load(s);
    }
}

template <typename Tag>
void launch_get_rows(const char * src, int64_t src_stride, int64_t n_src, bool src_vec, const Tensor & ids, const Tensor & t,
                     const OpContext & ctx) {
    constexpr int kThreads = 256;
    const int64_t k        = t.ne[0];
    const int64_t n_ids    = ids.ne[0];
    if (n_ids == 0 || k == 0) return;
    const Rows    out    = ew::rows_of(t);
    const bool    vec    = src_vec && ew::vec4_ok(t);
    const int     V      = vec ? 4 : 1;
    const int64_t chunks = ceil_div(k, int64_t(kThreads) * V);
    const unsigned grid  = ew::grid_for(n_ids * chunks, ctx);
    const auto *  idp    = static_cast<const int32_t *>(ids.data);
    if (vec) launch(get_rows_kernel<Tag, 4>, grid, kThreads, 0, ctx.stream, src, src_stride, n_src, idp, n_ids, out, k, chunks);
    else launch(get_rows_kernel<Tag, 1>, grid, kThreads, 0, ctx.stream, src, src_stride, n_src, idp, n_ids, out, k, chunks);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void op_cont(const Tensor & t, const OpContext & ctx) {
    const Tensor & s = *t.src[0];
    const size_t   es = dtype_size(s.type);
    ew::require(t.type == s.type && es == dtype_size(t.type), "CONT", "source and destination types differ");
    ew::require(ew::same_shape(s, t), "CONT", "source and destination shapes differ");
    ew::require(s.nb[0] == es && t.nb[0] == es, "CONT", "rows with non-contiguous elements");
    CopyArgs args;
    args.seg[0].src       = ew::rows_of(s);
    args.seg[0].row_bytes = s.ne[0] * int64_t(es);
    args.dst              = ew::rows_of(t);
    args.nrows            = t.nrows();
    if (args.seg[0].row_bytes == 0) return;
    int64_t terms[12];
    int     n = 0;
    terms[n++] = args.seg[0].row_bytes;
    push_alignment_terms(s, 0, terms, n);
    push_alignment_terms(t, 0, terms, n);
    copy_rows(args, 1, terms, n, ctx);
}

void op_concat(const Tensor & t, const OpContext & ctx) {
    ew::require_f32_rows(t, "CONCAT");
    CopyArgs args;
    args.dst   = ew::rows_of(t);
    args.nrows = t.nrows();
    int64_t terms[3 * 12];
    int     n    = 0;
    int     nseg = 0;
    int64_t col  = 0;
    for (int i = 0; i < 3 && t.src[i]; ++i) {
        const Tensor & s = *t.src[i];
        ew::require_f32_rows(s, "CONCAT");
        ew::require(s.nrows() == t.nrows(), "CONCAT", "sources have different numbers of rows");
        const int64_t bytes = s.ne[0] * int64_t(sizeof(float));
        if (bytes > 0) {
            CopySeg & g = args.seg[nseg++];
            g.src       = ew::rows_of(s);
            g.row_bytes = bytes;
            g.dst_col   = col;
            terms[n++]  = bytes;
            push_alignment_terms(s, 0, terms, n);
            push_alignment_terms(t, col, terms, n);
        }
        col += bytes;
    }
    ew::require(col == t.ne[0] * int64_t(sizeof(float)), "CONCAT", "output width is not the sum of the source widths");
    if (nseg == 0) return;
    copy_rows(args, nseg, terms, n, ctx);
}

void op_get_rows(const Tensor & t, const OpContext & ctx) {
    const Tensor & ids = *t.src[1];
    // Rows of an I32 table (an EAGLE3 head's draft-to-target token map) are copied as 4-byte words
    // by the F32 path: a float load and store move the bits unchanged.
    const bool words = !t.weight && t.type == DType::I32 && t.src[0] && t.src[0]->type == DType::I32;
    if (words) {
        Tensor as_f32 = t;
        as_f32.type   = DType::F32;
        Tensor src    = *t.src[0];
        src.type      = DType::F32;
        as_f32.src[0] = &src;
        return op_get_rows(as_f32, ctx);
    }
    ew::require_f32_rows(t, "GET_ROWS");
    ew::require(ids.type == DType::I32 && ids.nb[0] == sizeof(int32_t), "GET_ROWS", "ids must be contiguous I32");
    ew::require(ids.nrows() == 1 && t.ne[1] == ids.ne[0] && t.nrows() == t.ne[1], "GET_ROWS", "output must be [K, n_ids]");
    if (t.weight) {
        const QWeight &      qw = *t.weight;
        const DeviceWeight & w  = device_weight(qw);
        ew::require(t.ne[0] == w.k, "GET_ROWS", "output row length differs from the weight's K");
        const char * src = static_cast<const char *>(w.data);
        const bool   a16 = reinterpret_cast<uintptr_t>(src) % 16 == 0;
        switch (w.format) {
            case WeightFormat::F32:
                return launch_get_rows<float>(src, w.k * 4, w.n, a16 && w.k % 4 == 0, ids, t, ctx);
            case WeightFormat::F16:
                return launch_get_rows<F16Tag>(src, w.k * 2, w.n, a16 && w.k % 4 == 0, ids, t, ctx);
            case WeightFormat::BF16:
                return launch_get_rows<BF16Tag>(src, w.k * 2, w.n, a16 && w.k % 4 == 0, ids, t, ctx);
            default: ew::require(false, "GET_ROWS", "weight rows can only be gathered from F32/F16/BF16 weights");
        }
        return;
    }
    const Tensor & s = *t.src[0];
    ew::require_f32_rows(s, "GET_ROWS");
    ew::require(s.ne[2] == 1 && s.ne[3] == 1, "GET_ROWS", "source must be a matrix [ne0, rows]");
    ew::require(s.ne[0] == t.ne[0], "GET_ROWS", "output row length differs from the source's");
    const bool svec = ew::vec4_ok(s);
    launch_get_rows<float>(static_cast<const char *>(s.data), int64_t(s.nb[1]), s.ne[1], svec, ids, t, ctx);
}

}  // namespace spark::cuda
