#include "quant/slice.h"

#include "common/error.h"

#include <algorithm>
#include <cstring>
#include <numeric>

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

QWeight slice_rows(const QWeight & w, int64_t n0, int64_t n1, SliceOwner & owner) { return slice_rows(w, {{n0, n1}}, owner); }

QWeight slice_rows(const QWeight & w, const std::vector<RowRange> & ranges, SliceOwner & owner) {
    SPARK_ASSERT(!ranges.empty());
    int64_t n = 0;
    for (auto [a, b] : ranges) {
        check_range(w, "rows", a, b, w.n);
        n += b - a;
    }
    QWeight s       = w;
    s.n             = n;
    s.device_layout = nullptr;
    const int64_t N = w.n, K = w.k;
    // Copies every range's rows of a row-major [rows][row_bytes] array, packed.
    auto gather = [&](const void * src, int64_t row_bytes) {
        owner.emplace_back(size_t(n * row_bytes));
        uint8_t * dst = owner.back().data();
        for (auto [a, b] : ranges) {
            std::memcpy(dst, static_cast<const uint8_t *>(src) + a * row_bytes, size_t((b - a) * row_bytes));
            dst += (b - a) * row_bytes;
        }
        return owner.back().data();
    };
    // The same for the columns of a [lines][N * elem] array whose columns are the weight's rows.
    auto gather_columns = [&](const void * src, int64_t lines, int64_t per_line, int64_t elem, int64_t unit) {
        int64_t width = 0;
        for (auto [a, b] : ranges) width += (b - a + unit - 1) / unit;
        owner.emplace_back(size_t(lines * width * elem));
        uint8_t * dst = owner.back().data();
        for (int64_t l = 0; l < lines; ++l)
            for (auto [a, b] : ranges) {
                const int64_t c = (b - a + unit - 1) / unit;
                std::memcpy(dst, static_cast<const uint8_t *>(src) + (l * per_line + a / unit) * elem, size_t(c * elem));
                dst += c * elem;
            }
        return owner.back().data();
    };
    switch (w.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: s.data = gather(w.data, K * int64_t(dense_size(w.format))); break;
        case WeightFormat::NVFP4:
            s.data   = gather(w.data, K / 2);
            s.scales = gather(w.scales, K / 16);
            break;
        case WeightFormat::INT4: {  // [K/8][N] words, [G][N] scales, [G][N/8] zeros: columns of each
            if (w.zeros)
                for (size_t i = 0; i < ranges.size(); ++i) {
                    const auto [a, b] = ranges[i];
                    if (a % 8 || (b % 8 && !(b == N && i + 1 == ranges.size())))
                        cannot_cut(w, "row", a % 8 ? a : b, "its zero points pack 8 rows a word");
                }
            s.data   = gather_columns(w.data, K / 8, N, 4, 1);
            s.scales = gather_columns(w.scales, w.n_groups, N, 2, 1);
            if (w.zeros) s.zeros = gather_columns(w.zeros, w.n_groups, N / 8, 4, 8);
            if (w.g_idx) s.g_idx = static_cast<const int32_t *>(copy_runs(owner, w.g_idx, 1, 0, K * 4));
            break;
        }
        case WeightFormat::FP8: {
            // A cut inside a scale block keeps exact values with smaller blocks: block_n becomes the
            // gcd of block_n and every range's start (in the weight and in the slice), each new
            // block row a copy of the scales of the block it lies in.
            const int64_t bn = w.block_n, KB = ceil_div(K, w.block_k);
            s.data = gather(w.data, K);
            if (bn >= N) {  // one block row (per-tensor or per-column-block scales): it covers every row
                s.scales  = copy_runs(owner, w.scales, 1, 0, KB * 4);
                s.block_n = int32_t(std::max(n, bn));
                break;
            }
            int64_t nbs = bn, at = 0;
            for (auto [a, b] : ranges) {
                nbs = std::gcd(nbs, std::gcd(a, at));
                at += b - a;
            }
            const int64_t rows = ceil_div(n, nbs);
            s.block_n = int32_t(nbs);
            owner.emplace_back(size_t(rows * KB) * 4);
            auto * sc = reinterpret_cast<float *>(owner.back().data());
            for (int64_t r = 0; r < rows; ++r) {
                int64_t row = r * nbs, orig = 0;  // the slice's row -> the weight's
                for (auto [a, b] : ranges) {
                    if (row < b - a) {
                        orig = a + row;
                        break;
                    }
                    row -= b - a;
                }
                std::memcpy(sc + r * KB, static_cast<const float *>(w.scales) + (orig / bn) * KB, size_t(KB) * 4);
            }
            s.scales = sc;
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
            // As for rows: a cut inside a scale block gives block_k = gcd(block_k, k0).
            const int64_t bn = w.block_n, bk = w.block_k, NB = ceil_div(N, bn), KB = ceil_div(K, bk);
            s.data = copy_runs(owner, static_cast<const uint8_t *>(w.data) + k0, N, K, k);
            if (bk >= K) {
                s.scales = copy_runs(owner, w.scales, 1, 0, NB * 4);
                break;
            }
            const int64_t kbs = std::gcd(bk, k0), cols = ceil_div(k, kbs);
            s.block_k = int32_t(kbs);
            owner.emplace_back(size_t(NB * cols) * 4);
            auto * sc = reinterpret_cast<float *>(owner.back().data());
            for (int64_t b = 0; b < NB; ++b)
                for (int64_t c = 0; c < cols; ++c) sc[b * cols + c] = static_cast<const float *>(w.scales)[b * KB + (k0 + c * kbs) / bk];
            s.scales = sc;
            break;
        }
    }
    return s;
}

}  // namespace spark
