// upload_weight: canonical host QWeight (src/quant/qweight.h) -> DeviceWeight (device_weight.h).
//
// F32 / F16 / BF16 and FP8 are already row-major with K contiguous and are copied as they are, and
// so are NVFP4's scales; NVFP4 codes of a tile-major weight (DeviceWeight::tiled) are copied to a
// staging buffer and stored in that order by a device kernel (tile_w4_chunks; the batched loader
// does the same a slot at a time). INT4 arrives in GPTQ orientation and is repacked on the device
// from a staging copy:
//   words  u32 [K/8][N] -> [N][K/8]        (32x32 tile transpose through shared memory; stored in
//                                           the order of w4_word_index: tile-major if d.tiled)
//   scales u16 [G][N]   -> [N][G]          (same)
//   zeros  packed [G][N/8] nibbles + zero_offset -> u8 [N][G] effective zeros (nullptr: symmetric)
// Act-order (a g_idx that is not k / group_size): input channels are sorted by group (stable), so
// stored column k' is input channel perm[k'] and belongs to group k' / group_size; the nibbles are
// gathered in that order and `perm` is uploaded for the kernels (which read x[perm[k']]). Groups of
// unequal size cannot be expressed that way and are refused (SPARK_ERR_UNSUPPORTED).
//
// plan_weight_upload / place_weight_upload / repack_int4 are the steps; upload_weight runs them at once
// for one weight and synchronises (the host buffers are not needed afterwards), the CUDA backend's
// weight batch (weight_batch.cpp) runs them for a whole model with parallel reads.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "common/error.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace spark::cuda {

namespace {

constexpr int kTile = 32;

// One 32x32 tile (bx over N, by over K/8) of the device words: word w of row n (at w4_word_index)
// from src[w][n] GPTQ words. With perm, nibble j of the output word is input channel perm[8w + j].
__device__ void int4_words_tile(const uint32_t * src, int64_t n, int64_t k8, const int32_t * perm, bool tiled, uint32_t * dst, int64_t bx,
                                int64_t by) {
    __shared__ uint32_t tile[kTile][kTile + 1];
    const int64_t n0 = bx * kTile, w0 = by * kTile;
    for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
        const int64_t w = w0 + i, nn = n0 + threadIdx.x;
        if (w < k8 && nn < n) {
            uint32_t word = 0;
            if (perm == nullptr) {
                word = src[w * n + nn];
            } else {
                for (int j = 0; j < 8; ++j) {
                    const int64_t k = perm[8 * w + j];
                    word |= ((src[(k / 8) * n + nn] >> (4 * (k % 8))) & 0xFu) << (4 * j);
                }
            }
            tile[i][threadIdx.x] = word;
        }
    }
    __syncthreads();
    for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
        const int64_t nn = n0 + i, w = w0 + threadIdx.x;
        if (nn < n && w < k8) dst[w4_word_index(tiled, nn, w, k8)] = tile[threadIdx.x][i];
    }
}

// One 32x32 tile (bx over cols, by over rows) of [rows][cols] u16 -> [cols][rows].
__device__ void transpose_u16_tile(const uint16_t * src, int64_t rows, int64_t cols, uint16_t * dst, int64_t bx, int64_t by) {
    __shared__ uint16_t tile[kTile][kTile + 1];
    const int64_t c0 = bx * kTile, r0 = by * kTile;
    for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
        const int64_t r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
        const int64_t c = c0 + i, r = r0 + threadIdx.x;
        if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][i];
    }
}

// packed zeros [G][N/8] -> u8 [N][G] (+ offset), elements [first, first + stride * ...) of a grid-stride loop.
__device__ void int4_zeros_range(const uint32_t * src, int64_t n, int64_t groups, int32_t offset, uint8_t * dst, int64_t first, int64_t stride) {
    const int64_t count = n * groups;
    for (int64_t i = first; i < count; i += stride) {
        const int64_t nn = i / groups, g = i % groups;
        const int32_t z  = int32_t((src[g * (n / 8) + nn / 8] >> (4 * (nn % 8))) & 0xFu) + offset;
        dst[i]           = uint8_t(z);
    }
}

__global__ void int4_words_kernel(const uint32_t * src, int64_t n, int64_t k8, const int32_t * perm, bool tiled, uint32_t * dst) {
    int4_words_tile(src, n, k8, perm, tiled, dst, blockIdx.x, blockIdx.y);
}

__global__ void transpose_u16_kernel(const uint16_t * src, int64_t rows, int64_t cols, uint16_t * dst) {
    transpose_u16_tile(src, rows, cols, dst, blockIdx.x, blockIdx.y);
}

__global__ void int4_zeros_kernel(const uint32_t * src, int64_t n, int64_t groups, int32_t offset, uint8_t * dst) {
    const int64_t tid = int64_t(threadIdx.y) * blockDim.x + threadIdx.x, threads = int64_t(blockDim.x) * blockDim.y;
    int4_zeros_range(src, n, groups, offset, dst, int64_t(blockIdx.x) * threads + tid, int64_t(gridDim.x) * threads);
}

// Many weights, one launch: block b belongs to the item whose block range holds it (binary search
// over first_block), and is a words tile, a scales tile or a chunk of zero points of that item.
__device__ int64_t tiles_of(int64_t v) { return (v + kTile - 1) / kTile; }

__global__ void int4_repack_many_kernel(const Int4RepackItem * items, int count) {
    const int64_t b  = blockIdx.x;
    int           lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (items[mid].first_block <= b) lo = mid;
        else hi = mid - 1;
    }
    const Int4RepackItem & it = items[lo];
    int64_t               t  = b - it.first_block;
    const int64_t         wx = tiles_of(it.n), wt = wx * tiles_of(it.k8);
    if (t < wt) return int4_words_tile(it.words, it.n, it.k8, nullptr, it.tiled, it.dst_words, t % wx, t / wx);
    t -= wt;
    const int64_t sx = tiles_of(it.n), st = sx * tiles_of(it.groups);
    if (t < st) return transpose_u16_tile(it.scales, it.groups, it.n, it.dst_scales, t % sx, t / sx);
    t -= st;
    const int64_t tid = int64_t(threadIdx.y) * blockDim.x + threadIdx.x, threads = int64_t(blockDim.x) * blockDim.y;
    if (it.zeros) int4_zeros_range(it.zeros, it.n, it.groups, it.zero_offset, it.dst_zeros, t * threads + tid, int64_t(1) << 62);
}

// Chunk i of src is 16-byte chunk first + i of a 4-bit weight's row-major data (kc chunks a row):
// stored at its place in the tile-major order (w4_chunk_index).
__global__ void tile_w4_kernel(const uint4 * src, int64_t first, int64_t count, int64_t kc, uint4 * dst) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t c = first + i;
        dst[w4_chunk_index(true, c / kc, c % kc, kc)] = src[i];
    }
}

struct Staging {
    cudaStream_t        stream;
    std::vector<void *> bufs;
    void * get(size_t bytes) {
        void * p = nullptr;
        SPARK_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
        bufs.push_back(p);
        return p;
    }
    ~Staging() {
        for (void * p : bufs) cudaFreeAsync(p, stream);
    }
};

// Act-order permutation: empty when g_idx is the trivial k / group_size.
std::vector<int32_t> act_order_perm(const QWeight & w) {
    const int64_t K = w.k, gs = w.group_size;
    bool trivial = true;
    for (int64_t k = 0; k < K; ++k) {
        const int32_t g = w.g_idx[k];
        if (g < 0 || g >= w.n_groups)
            fail(SPARK_ERR_INVALID_FORMAT, "int4 weight: g_idx[%lld] = %d outside [0, %d)", (long long) k, g, w.n_groups);
        trivial = trivial && g == k / gs;
    }
    if (trivial) return {};
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return w.g_idx[a] < w.g_idx[b]; });
    for (int64_t k = 0; k < K; ++k)
        if (w.g_idx[perm[size_t(k)]] != k / gs)
            fail(SPARK_ERR_UNSUPPORTED,
                 "int4 weight with act-order: groups of unequal size (sorted channel %lld is in group %d, expected %lld); "
                 "only g_idx with group_size channels per group is supported",
                 (long long) k, w.g_idx[perm[size_t(k)]], (long long) (k / gs));
    return perm;
}

}  // namespace

WeightUploadPlan plan_weight_upload(const QWeight & host) {
    WeightUploadPlan p;
    p.layout = device_weight_shape(host);
    if (host.n <= 0 || host.k <= 0 || !host.data)
        fail(SPARK_ERR_INVALID_ARGUMENT, "upload_weight: empty %s weight [%lld, %lld]", weight_format_name(host.format),
             (long long) host.n, (long long) host.k);
    p.host = qweight_bytes(host);
    switch (host.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: break;
        case WeightFormat::NVFP4:
            if (host.k % 16 != 0 || !host.scales)
                fail(SPARK_ERR_UNSUPPORTED, "nvfp4 weight [%lld, %lld]: K must be a multiple of 16, with block scales",
                     (long long) host.n, (long long) host.k);
            break;
        case WeightFormat::FP8:
            if (host.block_n <= 0 || host.block_k <= 0 || !host.scales)
                fail(SPARK_ERR_UNSUPPORTED, "fp8 weight [%lld, %lld]: missing block scales", (long long) host.n, (long long) host.k);
            break;
        case WeightFormat::INT4: {
            const int64_t N = host.n, K = host.k, G = host.n_groups, gs = host.group_size;
            if (K % 8 != 0 || gs <= 0 || G <= 0 || G * gs < K || !host.scales)
                fail(SPARK_ERR_UNSUPPORTED, "int4 weight [%lld, %lld]: needs K %% 8 == 0 and groups covering K (group %lld, %lld groups)",
                     (long long) N, (long long) K, (long long) gs, (long long) G);
            if (host.zeros && N % 8 != 0)
                fail(SPARK_ERR_UNSUPPORTED, "int4 weight [%lld, %lld]: packed zero points need N %% 8 == 0", (long long) N, (long long) K);
            if (host.zeros && (host.zero_offset < 0 || host.zero_offset > 16))
                fail(SPARK_ERR_UNSUPPORTED, "int4 weight: zero_offset %d", host.zero_offset);
            if (host.g_idx) p.perm = act_order_perm(host);
            p.repack = true;
            break;
        }
    }
    p.device.data   = p.host.data;
    p.device.scales = p.host.scales;
    if (p.repack) {
        p.device.zeros = host.zeros ? size_t(host.n * host.n_groups) : 0;  // u8 [N][G]
        p.device.g_idx = p.perm.size() * sizeof(int32_t);
    }
    return p;
}

void place_weight_upload(WeightUploadPlan & p, void * (*alloc)(void * owner, size_t bytes), void * owner) {
    DeviceWeight & d = p.layout;
    d.data           = alloc(owner, p.device.data);
    if (p.device.scales) d.scales = alloc(owner, p.device.scales);
    if (p.device.zeros) d.zeros = static_cast<uint8_t *>(alloc(owner, p.device.zeros));
    if (p.device.g_idx) d.perm = static_cast<int32_t *>(alloc(owner, p.device.g_idx));
}

void repack_int4(const DeviceWeight & d, const void * words, const void * scales, const void * zeros, int32_t zero_offset, cudaStream_t stream) {
    const int64_t N = d.n, K8 = d.k / 8, G = d.n_groups;
    {
        const dim3 grid(unsigned(ceil_div(N, kTile)), unsigned(ceil_div(K8, kTile)));
        int4_words_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(static_cast<const uint32_t *>(words), N, K8, d.perm, d.tiled,
                                                                static_cast<uint32_t *>(const_cast<void *>(d.data)));
        SPARK_CUDA_CHECK_LAUNCH();
    }
    {
        const dim3 grid(unsigned(ceil_div(N, kTile)), unsigned(ceil_div(G, kTile)));
        transpose_u16_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(static_cast<const uint16_t *>(scales), G, N,
                                                                   static_cast<uint16_t *>(const_cast<void *>(d.scales)));
        SPARK_CUDA_CHECK_LAUNCH();
    }
    if (d.zeros) {
        const int blocks = int(std::min<int64_t>(4096, ceil_div(N * G, 256)));
        int4_zeros_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint32_t *>(zeros), N, G, zero_offset, const_cast<uint8_t *>(d.zeros));
        SPARK_CUDA_CHECK_LAUNCH();
    }
}

void tile_w4_chunks(const void * src, int64_t first, int64_t count, int64_t kc, void * data, cudaStream_t stream) {
    if (count <= 0) return;
    const int blocks = int(std::min<int64_t>(4096, ceil_div(count, 256)));
    tile_w4_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4 *>(src), first, count, kc, static_cast<uint4 *>(data));
    SPARK_CUDA_CHECK_LAUNCH();
}

int64_t int4_repack_blocks(const Int4RepackItem & it) {
    const int64_t tiles = ceil_div(it.n, kTile) * (ceil_div(it.k8, kTile) + ceil_div(it.groups, kTile));
    return tiles + (it.zeros ? ceil_div(it.n * it.groups, kTile * 8) : 0);
}

void repack_int4_many(const Int4RepackItem * items, int count, int64_t blocks, cudaStream_t stream) {
    if (count <= 0 || blocks <= 0) return;
    int4_repack_many_kernel<<<unsigned(blocks), dim3(kTile, 8), 0, stream>>>(items, count);
    SPARK_CUDA_CHECK_LAUNCH();
}

DeviceWeight upload_weight(const QWeight & host, void * (*alloc)(void * owner, size_t bytes), void * owner, cudaStream_t stream) {
    WeightUploadPlan p = plan_weight_upload(host);
    place_weight_upload(p, alloc, owner);
    const DeviceWeight & d = p.layout;
    auto copy = [&](const void * dst, const void * src, size_t n) {
        if (n) SPARK_CUDA_CHECK(cudaMemcpyAsync(const_cast<void *>(dst), src, n, cudaMemcpyHostToDevice, stream));
    };
    if (!p.repack && d.tiled) {  // NVFP4 codes: through a staging copy into the tile-major order
        Staging staging{stream, {}};
        void *  codes = staging.get(p.host.data);
        copy(codes, host.data, p.host.data);
        tile_w4_chunks(codes, 0, int64_t(p.host.data / 16), d.k / 32, const_cast<void *>(d.data), stream);
        copy(d.scales, host.scales, p.host.scales);
        SPARK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging buffer goes (stream-ordered) here
    } else if (!p.repack) {
        copy(d.data, host.data, p.host.data);
        copy(d.scales, host.scales, p.host.scales);
    } else {
        Staging staging{stream, {}};
        void *  words  = staging.get(p.host.data);
        void *  scales = staging.get(p.host.scales);
        void *  zeros  = p.host.zeros ? staging.get(p.host.zeros) : nullptr;
        copy(words, host.data, p.host.data);
        copy(scales, host.scales, p.host.scales);
        copy(zeros, host.zeros, p.host.zeros);
        copy(d.perm, p.perm.data(), p.device.g_idx);
        repack_int4(d, words, scales, zeros, host.zero_offset, stream);
        SPARK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging buffers go (stream-ordered) here
    }
    SPARK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host buffers are not needed afterwards
    return d;
}

}  // namespace spark::cuda
