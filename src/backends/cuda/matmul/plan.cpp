// Host-side planning shared by the dispatch (matmul.cpp) and the kernel lab (dev/kernels/matmul):
// which weights the chunked kernels take, and how the GEMV splits its work.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/launch.h"
#include "backends/cuda/matmul/tuning.h"

#include <algorithm>

namespace spark::cuda::mm {

Overrides & overrides() {
    static Overrides o;
    return o;
}

int elems_per_chunk(WeightFormat f) {
    switch (f) {
        case WeightFormat::F32: return 4;
        case WeightFormat::F16:
        case WeightFormat::BF16: return 8;
        case WeightFormat::FP8: return 16;
        case WeightFormat::NVFP4:
        case WeightFormat::INT4: return 32;
    }
    return 0;
}

bool chunk_ok(const DeviceWeight & w) {
    const int e = elems_per_chunk(w.format);
    if (e == 0 || w.k % e != 0) return false;
    if (w.format == WeightFormat::INT4) return w.group_size % 32 == 0 || w.group_size >= w.k;
    if (w.format == WeightFormat::FP8) return w.block_k % 16 == 0 || w.block_k >= w.k;
    return true;
}

GemvPlan plan_gemv(WeightFormat f, int64_t N, int64_t K, int64_t jobs, int rows, int nw, int sm_count) {
    GemvPlan p;
    p.r_tmpl          = rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8;
    const int     e   = elems_per_chunk(f);
    const int     U   = gemv_rows_per_warp(p.r_tmpl, nw, e);
    const int64_t KC  = K / e;
    auto          blocks = [&](int wk) { return ceil_div(N, int64_t(kGemvThreads / 32 / wk) * U) * jobs; };
    // Warps along K until the grid fills the GPU (about 4 blocks of 8 warps per SM), as long as
    // every lane keeps at least one chunk.
    int wk = 1;
    while (wk < 8 && KC >= 64 * wk && blocks(wk) < 4 * int64_t(sm_count)) wk *= 2;
    // Split K across blocks only for skinny matrices that are big enough for it to matter.
    int64_t      ksplit = 1;
    const double bytes  = double(N) * double(K) * 16.0 / e * nw * double(jobs);
    if (overrides().gemv_ksplit > 0)
        ksplit = overrides().gemv_ksplit;
    else if (blocks(wk) < sm_count && bytes >= double(1 << 20))
        ksplit = ceil_div(2 * int64_t(sm_count), blocks(wk));
    ksplit            = std::clamp<int64_t>(ksplit, 1, std::max<int64_t>(1, std::min<int64_t>(64, KC / (32 * wk))));
    const int64_t step = 32 * wk;
    p.cps             = ceil_div(ceil_div(KC, ksplit), step) * step;
    p.ksplit          = int(ceil_div(KC, p.cps));
    p.wk              = wk;
    p.grid            = dim3(unsigned(ceil_div(N, int64_t(kGemvThreads / 32 / wk) * U)), unsigned(p.ksplit), unsigned(jobs));
    return p;
}

}  // namespace spark::cuda::mm
