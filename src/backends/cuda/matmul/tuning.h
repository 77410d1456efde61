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
};

Overrides & overrides();

}  // namespace spark::cuda::mm
