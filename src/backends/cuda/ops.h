// The CUDA implementation of every graph op, one launcher per op (as cpu_ops.h for the CPU). A
// launcher reads the node's bound inputs (device pointers) and enqueues kernels on ctx.stream; it
// never synchronises and never allocates except through ctx.workspace (so a step can be captured
// into a CUDA graph and replayed). Shapes and strides follow src/graph/graph.h.
#pragma once

#include "backends/backend.h"
#include "backends/cuda/device_weight.h"
#include "graph/graph.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spark::cuda {

// Scratch device memory for one op at a time (split-K partials, converted activations, MoE
// routing tables). get() may grow the buffer only when growing is allowed (eager runs); during
// graph capture a too-small workspace is an error, which cannot happen because every captured step
// ran eagerly with the same shapes first.
class Workspace {
public:
    virtual ~Workspace() = default;
    virtual void * get(size_t bytes) = 0;
};

struct DeviceProps {
    int cc                  = 0;  // major*100 + minor*10
    int sm_count            = 0;
    int max_smem_per_block  = 0;  // opt-in maximum (bytes)
    size_t l2_bytes         = 0;
    // The W4A4 NVFP4 kernels run here: a 12.x device and this build's cubin for its exact
    // arch-specific target (fp4/w4a4.h, w4a4_device; the dispatch tests inject it).
    bool w4a4 = false;
    // What the decode GEMV planner's cost model takes from the device (matmul/op_plan.h,
    // device_rates): the DRAM bandwidth a streaming kernel reaches (bytes per microsecond) and one
    // SM's sustained instruction issue (lanes per microsecond). 0: an H100's, where the model's other
    // costs were fitted (docs/PERF.md, "What the planners take from the device").
    double bw_bytes_per_us = 0.0;
    double issue_per_sm_us = 0.0;
};

struct OpContext {
    cudaStream_t        stream = nullptr;
    Workspace *         workspace = nullptr;
    const DeviceProps * props = nullptr;
    // Device array of the DeviceWeights of a MATMUL_ID node's experts (built once, cached).
    const DeviceWeight * (*expert_table)(void * backend, const QWeight * experts, int32_t n) = nullptr;
    void *              backend = nullptr;
    // Set by the dispatch for one node: a launch before this node's first kernel lets the next one
    // start only after its own wait, and this node's expert ids were written before that launch
    // (pdl.cuh): a MATMUL_ID GEMV may read them before its wait (GemvArgs::ids_early).
    bool ids_before_wait = false;
    // The same for the node's activations (GemvArgs::x_early): a MATMUL_ID GEMV may convert them
    // before its wait (the experts' gate/up, whose activations the norm wrote before the router).
    bool x_before_wait = false;
    // The step is a prompt step (Graph::prompt_step): matmuls may take W4A4 (op_plan.h, w4a4_takes).
    bool prompt_step = false;
    // Set by an op: its last launch lets the next kernel start only after its own wait (a MATMUL_ID
    // GEMV that waited for its ids first, the FMA GEMV).
    // The dispatch clears it before each node and keeps the latest such launch as the barrier of
    // the early reads above (FusionPass::launched).
    mutable bool last_waits_first = false;
};

inline const DeviceWeight & device_weight(const QWeight & w) { return *static_cast<const DeviceWeight *>(w.device_layout); }

// ---- matmul (src/backends/cuda/matmul/) ----
// MATMUL: y = x W^T for any weight format; batch rows <= 8 use the dequant-in-register GEMV,
// more use the tensor-core GEMM.
void op_matmul(const Tensor & t, const OpContext & ctx);
// MATMUL_ID: all routed experts of all tokens in one launch (GEMV) or grouped GEMM.
void op_matmul_id(const Tensor & t, const OpContext & ctx);
// Fused gate/up projections with SwiGLU: out = silu(x Wg^T) * (x Wu^T). `swiglu` is the SWIGLU node
// whose src0 / src1 are the two MATMUL (or two MATMUL_ID) nodes over the same input and ids.
void op_matmul_swiglu(const Tensor & swiglu, const OpContext & ctx);
// Several MATMUL nodes reading the same activations (q/k/v; in_proj_qkvz + in_proj_ba; ...): each
// node's output in ONE decode-GEMV launch (blocks over the concatenated output rows).
// matmul_multi_supported() says whether that single launch applies: 2..4 nodes, the same src[0]
// (F32, at most 8 rows), weights of one format and K without act-order permutations, contiguous F32
// outputs that overlap neither the input nor each other. op_matmul_multi() runs the nodes one by one
// (op_matmul) when it does not, so it is always correct. Each output must be allocated and the input
// live when it runs (e.g. at the position of the last of the nodes).
bool matmul_multi_supported(const Tensor * const * matmuls, int count, const OpContext & ctx);
void op_matmul_multi(const Tensor * const * matmuls, int count, const OpContext & ctx);
// The residual ADD, the RMS_NORM of its sum and the MATMULs (1..4) that read that norm in ONE decode
// GEMV launch (GemvArgs::norm; one row: decode steps): the blocks read the addends, the matmuls take
// (a + b) * w and each result is scaled by its row's 1 / rms, which every block sums up itself; the
// sum (the ADD's output) is written, the norm is not (nothing else may read it: the fusion pass
// takes the norm's readers only, add_norm_matmul_supported refuses a norm that is a graph output).
// add_norm_matmul_supported() answers from the nodes alone (f32 rows of one shape, one row, no
// broadcast; one tensor-core GEMV launch as planned for it: blocks of 64 rows or more, one per SM at
// least, no K split, not the one-wave variant: matmul.h, kGemvNormMinRows): the memory planner
// asks it before any memory exists (fusion.h). op_add_norm_matmul() also needs the addresses to
// allow it (aligned rows; no output over an addend or another output) and otherwise runs the
// nodes' own launches (op_add_rms_norm, then the matmul op): always correct.
// with_addresses: the dispatch's answer (the tensors have their memory).
bool add_norm_matmul_supported(const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count, const OpContext & ctx,
                               bool with_addresses = false);
void op_add_norm_matmul(const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count, const OpContext & ctx);
// The MOE_COMBINE `comb`, the residual ADD of its output, the RMS_NORM of that sum and the MATMULs
// (1..4) that read the norm, as two launches with no kernel between them where the ADD + RMS_NORM
// had one of its own (one row: decode steps): the combine adds the residual, writes the sum (the
// ADD's output), the norm's weighted rows (sum * w, into the norm's output: the norm itself is never
// written) and per warp the sum of its squares; the tensor-core GEMV reads the weighted rows and
// multiplies each result by 1 / rms from those sums (GemvArgs::rs). The combine's own output is not
// written. combine_norm_matmul_supported() answers from the nodes alone (the combine's output read
// by the ADD only, the norm by the MATMULs only, neither a graph output; one row; the MATMULs one
// tensor-core GEMV launch as they would run anyway); op_combine_norm_matmul() also checks the
// addresses (aligned rows, no output over an input or another output) and otherwise runs the nodes'
// own launches.
bool combine_norm_matmul_supported(const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                   const OpContext & ctx, bool with_addresses = false);
void op_combine_norm_matmul(const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                            const OpContext & ctx);
// The same with a MATMUL `mm` (one weight, one tensor-core GEMV launch of whole K per block, at most
// 256 blocks: a dense layer's down projection before the next layer's q / k / v) as the producer: its epilogue adds the residual and
// writes the sum, the norm's weighted row and a sum of squares per block; mm's own output is not
// written (its only reader is the ADD; the parts go there).
bool matmul_norm_matmul_supported(const Tensor & mm, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                  const OpContext & ctx, bool with_addresses = false);
void op_matmul_norm_matmul(const Tensor & mm, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                           const OpContext & ctx);
// The same with the experts' down projection `down` (a MATMUL_ID of INT4 experts, one token, a slot
// per warp of the tensor-core GEMV) and the MOE_COMBINE `comb` of its output (no shared expert) as
// the producer: each block sums its rows' slots times the route weights in slot order (the
// combine, no launch of its own) and writes the norm's half as above; neither down's nor the
// combine's output is written (the parts go over the combine's).
bool experts_norm_matmul_supported(const Tensor & down, const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms,
                                   int count, const OpContext & ctx, bool with_addresses = false);
void op_experts_norm_matmul(const Tensor & down, const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms,
                            int count, const OpContext & ctx);
// Host-side upload and device repack of one weight (INT4 transpose, act-order sort, ...). Device
// buffers are allocated with `alloc` (owned by the caller). Synchronises the stream.
DeviceWeight upload_weight(const QWeight & host, void * (*alloc)(void * owner, size_t bytes), void * owner, cudaStream_t stream);

// The same in steps, for uploads that stream many weights (matmul/upload.cu):
struct WeightUploadPlan {
    DeviceWeight         layout;         // device pointers set by place_weight_upload
    QWeightBytes         host;           // bytes of each host buffer to move
    QWeightBytes         device;         // bytes of each device buffer (g_idx: the act-order perm)
    bool                 repack = false; // INT4: host words/scales/zeros go to scratch, then repack_int4
    std::vector<int32_t> perm;           // INT4 act-order (uploaded to layout.perm); empty otherwise
};
// Validates the weight and sizes its device buffers. Throws like upload_weight.
WeightUploadPlan plan_weight_upload(const QWeight & host);
void             place_weight_upload(WeightUploadPlan & plan, void * (*alloc)(void * owner, size_t bytes), void * owner);
// INT4: the host layout's words / scales / packed zeros (nullptr: symmetric), already on the device,
// into d's layout (d.perm uploaded first when act-order).
void repack_int4(const DeviceWeight & d, const void * words, const void * scales, const void * zeros, int32_t zero_offset, cudaStream_t stream);
// Several INT4 weights without act-order repacked in one launch (small weights streamed together).
// `items` is a device array; first_block: the item's first block, the running sum of
// int4_repack_blocks over the items before it.
struct Int4RepackItem {
    const uint32_t * words  = nullptr;  // host layout, on the device
    const uint16_t * scales = nullptr;
    const uint32_t * zeros  = nullptr;  // nullptr: symmetric
    uint32_t *       dst_words  = nullptr;
    uint16_t *       dst_scales = nullptr;
    uint8_t *        dst_zeros  = nullptr;
    int64_t          n = 0, k8 = 0, groups = 0;
    int32_t          zero_offset = 0;
    bool             tiled       = false;  // DeviceWeight::tiled of the destination
    int64_t          first_block = 0;
};
int64_t int4_repack_blocks(const Int4RepackItem & item);
void    repack_int4_many(const Int4RepackItem * items, int count, int64_t blocks, cudaStream_t stream);

// Row-major 16-byte chunks [first, first + count) of a 4-bit weight with kc chunks a row (src: those
// chunks, on the device) stored into `data` in the tile-major order (device_weight.h).
void tile_w4_chunks(const void * src, int64_t first, int64_t count, int64_t kc, void * data, cudaStream_t stream);

// A random weight generated on the device in the device layout (src/backends/cuda/random_weights.cu).
DeviceWeight random_device_weight(const RandomWeightSpec & spec, void * (*alloc)(void * owner, size_t bytes), void * owner, cudaStream_t stream);

// ---- attention (src/backends/cuda/attention/) ----
// ATTENTION: append k/v to the paged FP16 cache, then causal GQA attention; split-KV decode for
// few query tokens, tiled for prefill.
void op_attention(const Tensor & t, const OpContext & ctx);
// The q / k norm + RoPE pair of a layer (op_rms_norm_rope_pair's nodes) together with the ATTENTION
// `attn` that reads the two ROPE outputs as its q and k (and is their only reader): one decode
// launch that normalises and rotates q and this step's k itself (attention.h, NormRope). The
// ROPE and RMS_NORM outputs are left unwritten. Where that does not apply (a prefill step, partial
// rotation, norms or rotations that differ between q and k, other positions than the attention's),
// the pair and the attention run as two launches.
void op_attention_norm_rope(const Tensor & norm_q, const Tensor & rope_q, const Tensor & norm_k, const Tensor & rope_k,
                            const Tensor & attn, const OpContext & ctx);

// ---- linear attention (src/backends/cuda/ssm/) ----
void op_conv1d_ssm(const Tensor & t, const OpContext & ctx);
void op_gated_delta(const Tensor & t, const OpContext & ctx);

// ---- small ops (src/backends/cuda/elementwise/) ----
void op_cont(const Tensor & t, const OpContext & ctx);
void op_concat(const Tensor & t, const OpContext & ctx);
void op_get_rows(const Tensor & t, const OpContext & ctx);
void op_binary(const Tensor & t, const OpContext & ctx);  // ADD, MUL, SWIGLU, MUL_SIGMOID
void op_scale(const Tensor & t, const OpContext & ctx);
void op_rms_norm(const Tensor & t, const OpContext & ctx);  // with src3: rms_norm_split
void op_sum_sqr(const Tensor & t, const OpContext & ctx);
void op_l2_norm(const Tensor & t, const OpContext & ctx);
void op_rope(const Tensor & t, const OpContext & ctx);
void op_argmax(const Tensor & t, const OpContext & ctx);
void op_moe_route(const Tensor & t, const OpContext & ctx);
void op_moe_combine(const Tensor & t, const OpContext & ctx);
// The producer half of op_combine_norm_matmul (moe.cu): the combine `comb` + the other addend of the
// ADD `add` into add's output, that sum times the norm's weight into norm's output, and each warp's
// sum of squares into parts[t * combine_norm_parts(...) + ...]. combine_norm_parts: the parts per
// token, or 0 where the producer cannot run on these rows (it moves 4 floats a thread: every row
// 16-byte aligned, widths a multiple of 4).
int64_t combine_norm_parts(const Tensor & comb, const Tensor & add, const Tensor & norm);
void    launch_combine_norm(const Tensor & comb, const Tensor & add, const Tensor & norm, float * parts, const OpContext & ctx);
// Fused: out = rms_norm(a + b) * w, also writing the sum (residual stream) to `add`'s output.
// `norm` is the RMS_NORM node whose src0 is the ADD node `add`.
void op_add_rms_norm(const Tensor & add, const Tensor & norm, const OpContext & ctx);
// Fused per-head RMS_NORM + ROPE (q/k norm then RoPE): `norm` is an RMS_NORM node over [hd, nh, T]
// (optional weight, plain or zero-centred) whose output is read only by `rope`, the ROPE node whose
// src0 is `norm` (NEOX, partial n_rot allowed). Writes rope's output only; norm's output is left
// unwritten (except on the fallback for an output partially overlapping norm's input).
void op_rms_norm_rope(const Tensor & norm, const Tensor & rope, const OpContext & ctx);
// Two such pairs (a layer's q and k heads) in one launch where they rotate alike; otherwise in turn.
void op_rms_norm_rope_pair(const Tensor & norm_q, const Tensor & rope_q, const Tensor & norm_k, const Tensor & rope_k,
                           const OpContext & ctx);
// Fused RMS_NORM of whole rows + ROPE of their heads (MiniMax-M2's q / k norms over the whole
// projection): `norm` over [hd * nh, T] (optional weight of hd * nh), read only by a contiguous view
// [hd, nh, T] that only the ROPE node `rope` reads; the k pair (optional) in the same launch where
// both rotate alike. Writes the ROPE outputs only; otherwise the nodes run in turn.
void op_whole_norm_rope_pair(const Tensor & norm_q, const Tensor & rope_q, const Tensor * norm_k, const Tensor * rope_k,
                             const OpContext & ctx);

// Which kernel path each weight format takes on a device, decode / prefill, as the matmul planner
// (matmul/op_plan.h) chooses it for representative weights (spark_device_info::kernel_paths), e.g.
// "bf16=gemv-fma/gemm-f16 ... int4=gemv-mma(g128),gemv-fma(g32)/gemm-f16 ...".
std::string kernel_paths(const DeviceProps & dev);

}  // namespace spark::cuda
