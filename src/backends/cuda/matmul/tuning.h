// Process-wide knobs of the matmul dispatch, for tests and the kernel lab: force one path so that
// every path is exercised on shapes where the automatic choice would not take it (e.g. the generic
// fallback, or the GEMV split over K across blocks). Not thread-safe; set before building graphs.
#pragma once

namespace spark::cuda::mm {

enum class ForcePath : int {
    Auto    = 0,
    Gemv    = 1,  // the decode GEMV for any row count (row batches of 8 beyond 8 rows)
    Gemm    = 2,  // the tensor-core GEMM (dense or grouped) for any row count
    Generic = 3,  // the per-element fallback
};

struct Overrides {
    ForcePath path        = ForcePath::Auto;
    int       gemv_ksplit = 0;   // > 0: split K across this many blocks (as far as K allows)
    int       gemv_mma    = -1;  // -1: as SPARK_GEMV_MMA (default on); 0: the FMA decode GEMV only; 1: MMA where it applies
    // GEMV plan sweeps (kernel lab): restrict the planner's candidates; 0 / -1: any.
    int       gemv_wk     = 0;   // > 0: only this many K-warps per block
    int       gemv_lpr    = 0;   // > 0: FMA kernel, only this many lanes per row
    int       gemv_kpair  = -1;  // 0 / 1: MMA kernel, only plans without / with the K-pair mapping
    int       gemm_ksplit = 0;   // > 0: the dense GEMM splits K across this many blocks (as far as K allows)
    // W4A4 for NVFP4 weights with activation scales on devices that run it (op_plan.cpp, w4a4_takes):
    // -1 as SPARK_W4A4 (unset: prefill steps only), 0 never, 1 every row count (decode too; A/B runs).
    int       w4a4        = -1;
    // The MMA GEMV's plans on a device faster than the H100 (plan.cpp): 1 as the H100's (default), 0
    // with the device's own bandwidth (SPARK_GEMV_BW_CAP=0: A/B runs).
    int       gemv_bw_cap = 1;
    // The one-wave 3-block variant at one row (plan.cpp): 1 (default) the fused gate/up and the single
    // weights the rule takes, 2 the fused gate/up only, 0 never (SPARK_GEMV_WAVE=0 / 2: A/B runs). The
    // lab's plan restrictions (wk, ksplit, kpair) turn it off.
    int       gemv_wave   = 1;
    // The residual ADD + RMS_NORM inside the decode GEMV (op_add_norm_matmul), as SPARK_NORM_MATMUL:
    // 1 (default) where the planner's rule takes it (matmul.h, kGemvNormMinRows), 0 never (the
    // separate launches), 2 also on grids of fewer blocks than the device has SMs (A/B runs: measured
    // slower on the shapes it adds, docs/PERF.md; the GPU tests' small shapes).
    int       norm_matmul = 1;
    // A MoE GEMV block computes its expert's addresses from the id where the set lies at one stride
    // (matmul.h, expert_grid; INT4): 1 (default), 0 it reads the table entry first
    // (SPARK_EXPERT_GRID=0: A/B runs).
    int       expert_grid = 1;
    // The MoE combine adds the residual and writes the next norm's weighted rows and sums of squares,
    // the GEMV after it applies the 1 / rms (op_combine_norm_matmul): 1 (default), 0 the combine, the
    // ADD + RMS_NORM and the GEMV as launches of their own (SPARK_COMBINE_NORM=0: A/B runs).
    int       combine_norm = 1;
    // The experts' down projection writing the combine and the norm's half (op_experts_norm_matmul);
    // SPARK_EXPERTS_COMBINE=0: the down projection, then the combine's launch (A/B runs).
    int       experts_combine = 1;
};

Overrides & overrides();

}  // namespace spark::cuda::mm
