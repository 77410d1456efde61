#include "quant/slice.h"

#include "common/error.h"

#include <cstring>

namespace spark {

namespace {

// A copy of `rows` runs of `run` bytes, the r-th starting at src + r * stride, packed in `owner`.
const void * copy_runs(SliceOwner & owner, const void * src, int64_t rows, int64_t stride, int64_t run) {
    owner.emplace_back(size_t(rows * run));
    uint8_t *       dst = owner.back().data();
    const uint8_t * s   = static_cast<const uint8_t *>(src);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * run, s + r * stride, size_t(run));
    return dst;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

[[noreturn]] void cannot_cut(const QWeight & w, const char * what, int64_t at, const char * why) {
    fail(SPARK_ERR_UNSUPPORTED, "cannot split a %s weight [%lld x %lld] at %s %lld: %s", weight_format_name(w.format), (long long) w.n,
         (long long) w.k, what, (long long) at, why);
}

void check_range(const QWeight & w, const char * what, int64_t a, int64_t b, int64_t limit) {
    if (a < 0 || b > limit || a >= b)
        fail(SPARK_ERR_INVALID_ARGUMENT, "weight slice: %s [%lld, %lld) of a [%lld x %lld] %s weight", what, (long long) a, (long long) b,
             (long long) w.n, (long long) w.k, weight_format_name(w.format));
}

size_t dense_size(WeightFormat f) { return f == WeightFormat::F32 ? 4 : 2; }

}  // namespace

QWeight slice_rows(const QWeight & w, int64_t n0, int64_t n1, SliceOwner & owner) {
    check_range(w, "rows", n0, n1, w.n);
    QWeight s = w;
    s.n       = n1 - n0;
    s.device_layout = nullptr;
    const int64_t N = w.n, K = w.k, n = n1 - n0;
    switch (w.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: {
            const int64_t row = K * int64_t(dense_size(w.format));
            s.data            = copy_runs(owner, static_cast<const uint8_t *>(w.data) + n0 * row, 1, 0, n * row);
            break;
        }
        case WeightFormat::NVFP4:
            s.data   = copy_runs(owner, static_cast<const uint8_t *>(w.data) + n0 * (K / 2), 1, 0, n * (K / 2));
            s.scales = copy_runs(owner, static_cast<const uint8_t *>(w.scales) + n0 * (K / 16), 1, 0, n * (K / 16));
            break;
        case WeightFormat::INT4: {  // [K/8][N] words, [G][N] scales, [G][N/8] zeros: a column block of each
            if (w.zeros && (n0 % 8 || (n1 % 8 && n1 != N))) cannot_cut(w, "row", n0 % 8 ? n0 : n1, "its zero points pack 8 rows a word");
            s.data   = copy_runs(owner, static_cast<const uint32_t *>(w.data) + n0, K / 8, N * 4, n * 4);
            s.scales = copy_runs(owner, static_cast<const uint16_t *>(w.scales) + n0, w.n_groups, N * 2, n * 2);
            if (w.zeros) s.zeros = copy_runs(owner, static_cast<const uint32_t *>(w.zeros) + n0 / 8, w.n_groups, (N / 8) * 4, ceil_div(n, 8) * 4);
            if (w.g_idx) s.g_idx = static_cast<const int32_t *>(copy_runs(owner, w.g_idx, 1, 0, K * 4));
            break;
        }
        case WeightFormat::FP8: {
            const int64_t bn = w.block_n, bk = w.block_k, KB = ceil_div(K, bk);
            if (n0 % bn && bn < N) cannot_cut(w, "row", n0, "its scale blocks span the cut");
            s.data = copy_runs(owner, static_cast<const uint8_t *>(w.data) + n0 * K, 1, 0, n * K);
            const int64_t b0 = bn >= N ? 0 : n0 / bn, b1 = bn >= N ? 1 : ceil_div(n1, bn);
            s.scales = copy_runs(owner, static_cast<const float *>(w.scales) + b0 * KB, 1, 0, (b1 - b0) * KB * 4);
            break;
        }
    }
    return s;
}

QWeight slice_cols(const QWeight & w, int64_t k0, int64_t k1, SliceOwner & owner) {
    check_range(w, "columns", k0, k1, w.k);
    QWeight s = w;
    s.k       = k1 - k0;
    s.device_layout = nullptr;
    const int64_t N = w.n, K = w.k, k = k1 - k0;
    switch (w.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: {
            const int64_t e = int64_t(dense_size(w.format));
            s.data          = copy_runs(owner, static_cast<const uint8_t *>(w.data) + k0 * e, N, K * e, k * e);
            break;
        }
        case WeightFormat::NVFP4:
            if (k0 % 16 || k1 % 16) cannot_cut(w, "column", k0 % 16 ? k0 : k1, "its scale blocks are 16 columns");
            s.data   = copy_runs(owner, static_cast<const uint8_t *>(w.data) + k0 / 2, N, K / 2, k / 2);
            s.scales = copy_runs(owner, static_cast<const uint8_t *>(w.scales) + k0 / 16, N, K / 16, k / 16);
            break;
        case WeightFormat::INT4: {
            if (k0 % 8 || k1 % 8) cannot_cut(w, "column", k0 % 8 ? k0 : k1, "its words pack 8 columns");
            s.data = copy_runs(owner, static_cast<const uint32_t *>(w.data) + (k0 / 8) * N, 1, 0, (k / 8) * N * 4);
            const int64_t gs = w.group_size;
            if (w.g_idx) {  // act-order: every group may be anywhere; keep them all, cut the map
                s.scales = copy_runs(owner, w.scales, 1, 0, int64_t(w.n_groups) * N * 2);
                if (w.zeros) s.zeros = copy_runs(owner, w.zeros, 1, 0, int64_t(w.n_groups) * (N / 8) * 4);
                s.g_idx = static_cast<const int32_t *>(copy_runs(owner, w.g_idx + k0, 1, 0, k * 4));
                break;
            }
            // The groups the columns touch; a cut inside a group maps columns to them explicitly.
            const int64_t g0 = k0 / gs, g1 = ceil_div(k1, gs);
            s.n_groups = int32_t(g1 - g0);
            s.scales   = copy_runs(owner, static_cast<const uint16_t *>(w.scales) + g0 * N, 1, 0, (g1 - g0) * N * 2);
            if (w.zeros) s.zeros = copy_runs(owner, static_cast<const uint32_t *>(w.zeros) + g0 * (N / 8), 1, 0, (g1 - g0) * (N / 8) * 4);
            if (g1 - g0 == 1) {
                s.group_size = int32_t(k);  // one group: per-channel for the slice
            } else if (k0 % gs) {
                owner.emplace_back(size_t(k) * 4);
                auto * map = reinterpret_cast<int32_t *>(owner.back().data());
                for (int64_t c = 0; c < k; ++c) map[c] = int32_t((k0 + c) / gs - g0);
                s.g_idx = map;
            }
            break;
        }
        case WeightFormat::FP8: {
            const int64_t bn = w.block_n, bk = w.block_k, NB = ceil_div(N, bn), KB = ceil_div(K, bk);
            if (bk < K && k0 % bk) cannot_cut(w, "column", k0, "its scale blocks span the cut");
            s.data = copy_runs(owner, static_cast<const uint8_t *>(w.data) + k0, N, K, k);
            const int64_t b0 = bk >= K ? 0 : k0 / bk, b1 = bk >= K ? 1 : ceil_div(k1, bk);
            s.scales = copy_runs(owner, static_cast<const float *>(w.scales) + b0, NB, KB * 4, (b1 - b0) * 4);
            break;
        }
    }
    return s;
}

}  // namespace spark
