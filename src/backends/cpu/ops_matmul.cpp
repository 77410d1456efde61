// Matmuls against weights in any format. A weight is never expanded to float as a whole: tiles of
// kTileRows output rows are dequantized into a per-thread buffer (src/quant/dequant.h) and
// multiplied with all input rows by Eigen, so memory stays at the checkpoint's size and every
// dequantized tile is reused across the whole batch.
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"
#include "quant/dequant.h"

#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <vector>

namespace spark::cpu {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride   = Eigen::OuterStride<>;

constexpr int64_t kTileRows = 32;

thread_local std::vector<float> t_tile;

// Y[r][n0 .. n0 + nt) = X[r] . W[n0 .. n0 + nt)^T for all r.
//   x: rows of K floats with a stride of x_stride floats; y: rows with y_stride floats.
void matmul_tile(const QWeight & w, int64_t n0, int64_t nt, const float * x, int64_t n_rows, int64_t x_stride,
                 float * y, int64_t y_stride) {
    const int64_t K = w.k;
    const float * wt;
    if (w.format == WeightFormat::F32) {
        wt = static_cast<const float *>(w.data) + n0 * K;
    } else {
        if (t_tile.size() < size_t(nt * K)) t_tile.resize(size_t(nt * K));
        dequantize_rows(w, n0, nt, t_tile.data());
        wt = t_tile.data();
    }
    Eigen::Map<const RowMajor, 0, Stride> X(x, n_rows, K, Stride(x_stride));
    Eigen::Map<const RowMajor>            W(wt, nt, K);
    Eigen::Map<RowMajor, 0, Stride>       Y(y, n_rows, nt, Stride(y_stride));
    Y.noalias() = X * W.transpose();
}

// A contiguous [K, rows] copy of x when its rows are not evenly strided.
const float * rows_of(const Tensor & x, std::vector<float> & scratch, int64_t & stride) {
    SPARK_ASSERT(x.nb[0] == 4);
    const bool uniform = x.ne[2] * x.ne[3] == 1 || (x.nb[2] == x.nb[1] * size_t(x.ne[1]) && x.nb[3] == x.nb[2] * size_t(x.ne[2]));
    if (uniform && x.nb[1] % 4 == 0) {
        stride = x.ne[1] > 1 || x.ne[2] > 1 || x.ne[3] > 1 ? int64_t(x.nb[1] / 4) : x.ne[0];
        return static_cast<const float *>(x.data);
    }
    scratch.resize(size_t(x.nelements()));
    for (int64_t r = 0; r < x.nrows(); ++r) std::memcpy(&scratch[size_t(r * x.ne[0])], row_ptr(x, r), size_t(x.ne[0]) * 4);
    stride = x.ne[0];
    return scratch.data();
}

}  // namespace

void op_matmul(const Tensor & t, ThreadPool & pool) {
    const Tensor &     x = *t.src[0];
    const QWeight &    w = *t.weight;
    std::vector<float> scratch;
    int64_t            x_stride = 0;
    const float *      xs       = rows_of(x, scratch, x_stride);
    SPARK_ASSERT(t.is_contiguous());
    const int64_t n_rows  = x.nrows();
    const int64_t n_tiles = (w.n + kTileRows - 1) / kTileRows;
    float *       y       = static_cast<float *>(t.data);
    pool.parallel_for(n_tiles, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t tile = b; tile < e; ++tile) {
            const int64_t n0 = tile * kTileRows, nt = std::min(kTileRows, w.n - n0);
            matmul_tile(w, n0, nt, xs, n_rows, x_stride, y + n0, w.n);
        }
    });
}

// Experts are run only for the (token, slot) pairs routed to them: the pairs are grouped by expert,
// their input rows gathered, and each (expert, row tile) is one task.
void op_matmul_id(const Tensor & t, ThreadPool & pool) {
    const Tensor &  x   = *t.src[0];
    const Tensor &  ids = *t.src[1];
    const int64_t   K = x.ne[0], k_slots = ids.ne[0], n_tok = ids.ne[1], N = t.ne[0];
    const bool      shared_input = x.ne[1] == 1;
    SPARK_ASSERT(x.nb[0] == 4 && t.is_contiguous());

    std::vector<std::vector<int64_t>> routed(size_t(t.n_experts));  // slot index j + k * tok
    for (int64_t tok = 0; tok < n_tok; ++tok)
        for (int64_t j = 0; j < k_slots; ++j) {
            const int32_t e = *reinterpret_cast<const int32_t *>(ids.row(tok) + j * ids.nb[0]);
            if (e < 0 || e >= t.n_experts) fail(SPARK_ERR_INTERNAL, "matmul_id: expert id %d out of range", e);
            // An expert another rank holds (expert parallelism) contributes zeros here.
            if (t.experts[e].n == 0) std::memset(t.row(j, tok), 0, size_t(N) * 4);
            else routed[size_t(e)].push_back(j + k_slots * tok);
        }

    // Gather inputs per expert into one contiguous block (row order = routed order).
    std::vector<int64_t> first(size_t(t.n_experts) + 1, 0);
    for (int32_t e = 0; e < t.n_experts; ++e) first[size_t(e) + 1] = first[size_t(e)] + int64_t(routed[size_t(e)].size());
    std::vector<float> xin(size_t(first.back() * K));
    std::vector<float> yout(size_t(first.back() * N));
    for (int32_t e = 0; e < t.n_experts; ++e)
        for (size_t i = 0; i < routed[size_t(e)].size(); ++i) {
            const int64_t slot = routed[size_t(e)][i], j = slot % k_slots, tok = slot / k_slots;
            std::memcpy(&xin[size_t((first[size_t(e)] + int64_t(i)) * K)], x.row(shared_input ? 0 : j, tok), size_t(K) * 4);
        }

    struct Task { int32_t expert; int64_t n0; };
    std::vector<Task> tasks;
    for (int32_t e = 0; e < t.n_experts; ++e)
        if (!routed[size_t(e)].empty())
            for (int64_t n0 = 0; n0 < N; n0 += kTileRows) tasks.push_back({e, n0});
    pool.parallel_for(int64_t(tasks.size()), 1, [&](int64_t b, int64_t en, int) {
        for (int64_t i = b; i < en; ++i) {
            const Task &  task = tasks[size_t(i)];
            const int64_t rows = first[size_t(task.expert) + 1] - first[size_t(task.expert)];
            const int64_t nt   = std::min(kTileRows, N - task.n0);
            matmul_tile(t.experts[task.expert], task.n0, nt, &xin[size_t(first[size_t(task.expert)] * K)], rows, K,
                        &yout[size_t(first[size_t(task.expert)] * N + task.n0)], N);
        }
    });
    for (int32_t e = 0; e < t.n_experts; ++e)
        for (size_t i = 0; i < routed[size_t(e)].size(); ++i) {
            const int64_t slot = routed[size_t(e)][i], j = slot % k_slots, tok = slot / k_slots;
            std::memcpy(t.row(j, tok), &yout[size_t((first[size_t(e)] + int64_t(i)) * N)], size_t(N) * 4);
        }
}

void op_get_rows(const Tensor & t, ThreadPool & pool) {
    const Tensor &  ids = *t.src[1];
    const int32_t * idx = static_cast<const int32_t *>(ids.data);
    const int64_t   n   = ids.ne[0];
    if (t.weight) {
        const QWeight & w = *t.weight;
        for (int64_t i = 0; i < n; ++i)
            if (idx[i] < 0 || idx[i] >= w.n) fail(SPARK_ERR_INVALID_TOKEN, "row id %d out of range [0, %lld)", idx[i], (long long) w.n);
        pool.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) dequantize_rows(w, idx[i], 1, reinterpret_cast<float *>(t.row(i)));
        });
        return;
    }
    const Tensor & s = *t.src[0];
    for (int64_t i = 0; i < n; ++i) {
        SPARK_ASSERT(idx[i] >= 0 && idx[i] < s.ne[1]);
        std::memcpy(t.row(i), s.row(idx[i]), size_t(s.ne[0]) * 4);
    }
}

}  // namespace spark::cpu
