// Random weights of real shape generated on the GPU in the device layout (device_weight.h), from
// the same per-element definition as the CPU (src/quant/random_weights.h): spark-bench's synthetic
// models need no host memory and no upload.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "quant/random_weights.h"

namespace spark::cuda {

namespace rw = random_weights;

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 16)); }

__global__ void fill_dense(void * out, WeightFormat f, int64_t N, int64_t K, uint64_t seed, float scale) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = rw::dense(seed, i / K, i % K, K, scale);
        if (f == WeightFormat::F32) static_cast<float *>(out)[i] = v;
        else static_cast<uint16_t *>(out)[i] = f == WeightFormat::F16 ? f32_to_f16(v) : f32_to_bf16(v);
    }
}

// Codes in the order of w4_byte_index (device_weight.h), scales row-major.
__global__ void fill_nvfp4(uint8_t * codes, bool tiled, uint8_t * scales, int64_t N, int64_t K, uint64_t seed) {
    const int64_t n_bytes = N * K / 2;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_bytes; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t n = i / (K / 2), k = (i % (K / 2)) * 2;
        codes[w4_byte_index(tiled, n, k / 2, K / 2)] = uint8_t(rw::nvfp4_code(seed, n, k, K) | (rw::nvfp4_code(seed, n, k + 1, K) << 4));
        if (k % 16 == 0) scales[n * (K / 16) + k / 16] = rw::nvfp4_block_scale(seed, n, k / 16, K / 16);
    }
}

// Device layout [N][K/8] (in the order of w4_word_index): nibble j of word w of row n is q[n][8w + j].
__global__ void fill_int4(uint32_t * words, bool tiled, uint16_t * scales, int64_t N, int64_t K, int64_t gs, int64_t G, uint64_t seed,
                          float scale) {
    const int64_t n_words = N * (K / 8);
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t n = i / (K / 8), w = i % (K / 8);
        uint32_t      word = 0;
        for (int j = 0; j < 8; ++j) word |= rw::int4_code(seed, n, 8 * w + j, K) << (4 * j);
        words[w4_word_index(tiled, n, w, K / 8)] = word;
        if ((8 * w) % gs == 0) {
            const int64_t g = (8 * w) / gs;
            scales[n * G + g] = rw::int4_scale_f16(seed, n, g, G, scale);
        }
    }
}

__global__ void fill_fp8(uint8_t * data, float * scales, int64_t N, int64_t K, int64_t bn, int64_t bk, uint64_t seed, float scale) {
    const int64_t KB = (K + bk - 1) / bk;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t n = i / K, k = i % K;
        data[i] = rw::fp8_code(seed, n, k, K);
        if (n % bn == 0 && k % bk == 0) scales[(n / bn) * KB + k / bk] = rw::fp8_block_scale(seed, n / bn, k / bk, KB, scale);
    }
}

}  // namespace

DeviceWeight random_device_weight(const RandomWeightSpec & s, void * (*alloc)(void *, size_t), void * owner, cudaStream_t stream) {
    const int64_t N = s.n, K = s.k;
    DeviceWeight  w = device_weight_shape(random_weight_layout(s));
    switch (s.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: {
            void * d = alloc(owner, size_t(N * K) * (s.format == WeightFormat::F32 ? 4 : 2));
            fill_dense<<<blocks_for(N * K), kThreads, 0, stream>>>(d, s.format, N, K, s.seed, s.scale);
            w.data = d;
            break;
        }
        case WeightFormat::NVFP4: {
            if (K % 16) fail(SPARK_ERR_UNSUPPORTED, "random NVFP4 weight: K = %lld is not a multiple of 16", (long long) K);
            auto * codes  = static_cast<uint8_t *>(alloc(owner, size_t(N * K / 2)));
            auto * scales = static_cast<uint8_t *>(alloc(owner, size_t(N * K / 16)));
            fill_nvfp4<<<blocks_for(N * K / 2), kThreads, 0, stream>>>(codes, w.tiled, scales, N, K, s.seed);
            w.data   = codes;
            w.scales = scales;
            break;
        }
        case WeightFormat::INT4: {
            if (K % 8) fail(SPARK_ERR_UNSUPPORTED, "random INT4 weight: K = %lld is not a multiple of 8", (long long) K);
            const int64_t gs = w.group_size, G = w.n_groups;
            if (gs % 8) fail(SPARK_ERR_UNSUPPORTED, "random INT4 weight: group size %lld is not a multiple of 8", (long long) gs);
            auto * words  = static_cast<uint32_t *>(alloc(owner, size_t(N * K / 8) * 4));
            auto * scales = static_cast<uint16_t *>(alloc(owner, size_t(N * G) * 2));
            fill_int4<<<blocks_for(N * K / 8), kThreads, 0, stream>>>(words, w.tiled, scales, N, K, gs, G, s.seed, s.scale);
            w.data   = words;
            w.scales = scales;
            break;
        }
        case WeightFormat::FP8: {
            const int64_t NB = (N + w.block_n - 1) / w.block_n, KB = (K + w.block_k - 1) / w.block_k;
            auto *        data   = static_cast<uint8_t *>(alloc(owner, size_t(N * K)));
            auto *        scales = static_cast<float *>(alloc(owner, size_t(NB * KB) * 4));
            fill_fp8<<<blocks_for(N * K), kThreads, 0, stream>>>(data, scales, N, K, w.block_n, w.block_k, s.seed, s.scale);
            w.data   = data;
            w.scales = scales;
            break;
        }
    }
    SPARK_CUDA_CHECK_LAUNCH();
    return w;
}

}  // namespace spark::cuda
