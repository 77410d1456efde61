// CPU implementations of every op (float32 accumulation everywhere). Each takes the node whose
// inputs are bound and writes its output. These are the reference every other backend is tested
// against.
#pragma once

#include "backends/cpu/thread_pool.h"
#include "graph/graph.h"

namespace spark::cpu {

void op_cont(const Tensor & t, ThreadPool & pool);
void op_concat(const Tensor & t, ThreadPool & pool);
void op_get_rows(const Tensor & t, ThreadPool & pool);
void op_matmul(const Tensor & t, ThreadPool & pool);
void op_matmul_id(const Tensor & t, ThreadPool & pool);
void op_binary(const Tensor & t, ThreadPool & pool);   // ADD, MUL, SWIGLU, MUL_SIGMOID
void op_scale(const Tensor & t, ThreadPool & pool);
void op_rms_norm(const Tensor & t, ThreadPool & pool);
void op_sum_sqr(const Tensor & t, ThreadPool & pool);
void op_l2_norm(const Tensor & t, ThreadPool & pool);
void op_rope(const Tensor & t, ThreadPool & pool);
void op_argmax(const Tensor & t, ThreadPool & pool);
void op_attention(const Tensor & t, ThreadPool & pool);
void op_moe_route(const Tensor & t, ThreadPool & pool);
void op_moe_combine(const Tensor & t, ThreadPool & pool);
void op_conv1d_ssm(const Tensor & t, ThreadPool & pool);
void op_gated_delta(const Tensor & t, ThreadPool & pool);

// Row r of a tensor viewed as [ne0, nrows] (rows enumerated over dims 1..3).
inline char * row_ptr(const Tensor & t, int64_t r) {
    const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
    return t.row(i1, i2, i3);
}

}  // namespace spark::cpu
