// The tensor core: tensors, the fixed op set, and the graph builder.
//
// Conventions (ggml's): ne[0] is the innermost, contiguous dimension ("row length"); nb[] are byte
// strides. A matrix of T rows of K floats has ne = {K, T}. Activations are F32 everywhere; token
// ids, positions and routing ids are I32. Weights are not tensors: ops that read weights take a
// spark::QWeight (src/quant/qweight.h) in any format.
//
// Architectures build one Graph per internal step (src/runtime/models/*.cpp); the planner
// (planner.h) gives every intermediate an offset in one arena, reusing memory once a value is dead;
// a backend (src/backends/) executes the nodes in order. State that outlives a step (KV cache,
// recurrent state) enters the graph as external tensors that stateful ops update in place.
#pragma once

#include "graph/dtype.h"
#include "quant/qweight.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace spark {

constexpr int kMaxDims = 4;
constexpr int kMaxSrc  = 10;

// How MOE_ROUTE scores the experts (its ip[2]).
enum class RouterScore : int32_t {
    Softmax = 0,  // softmax over the router logits (Qwen3-MoE, Qwen3-Next)
    Sigmoid = 1,  // an independent sigmoid per expert (MiniMax-M2)
};

enum class Op : uint8_t {
    NONE,         // leaf: graph input, external state or constant
    VIEW,         // alias of src0 (offset + strides, possibly another 4-byte dtype); no compute
    CONT,         // contiguous copy of src0
    CONCAT,       // rows of src0, src1[, src2] side by side: [n0 + n1 + n2, rows]
    GET_ROWS,     // rows src1[i] (I32) of a dense weight (weight) or of a F32 / I32 tensor (src0)
    MATMUL,       // y[n, r] = sum_k x[k, r] * W[n, k]   (src0 = x, weight = W, any format)
    MATMUL_ID,    // MoE: x src0 [K, A, T] (A = 1: shared by all slots, A = k: one row per slot),
                  // ids src1 I32 [k, T] -> y [N, k, T] with expert ids[j, t]; experts[n_experts]
    ADD,          // src0 + src1, src1 rows broadcast when it has one row
    MUL,          // src0 * src1, same broadcast
    SCALE,        // src0 * fp[0]
    RMS_NORM,     // per row: x / sqrt(mean(x^2) + eps) * w   (src1 = w [ne0] or none);
                  // ip[0] = 1: zero-centred weight (1 + w); src2 (optional): a gate, the
                  // output then silu(gate) * norm (Graph::rms_norm_gated); src3 (optional): the
                  // rows' sums of squares [1, rows] over fp[1] elements (a row split over ranks)
    L2_NORM,      // per row: x / sqrt(sum(x^2) + eps)
    ROPE,         // rotate-half (NEOX) RoPE of src0 [hd, nh, T] at positions src1 [T];
                  // ip[0] = n_rot (first n_rot dims rotated), fp[0] = theta
    SWIGLU,       // silu(src0) * src1
    MUL_SIGMOID,  // src0 * sigmoid(src1) (src1 broadcast along rows when its ne0 == 1)
    ATTENTION,    // causal GQA attention over the paged KV cache; see Graph::attention
    MOE_ROUTE,    // scores (ip2: RouterScore) + top-k of router logits src0 [E, T] (+ choice bias src1) -> [2k, T]: k weights (F32)
                  // then k expert ids (I32 bits); ip[0] = k, ip[1] = normalize top-k weights; ip[3] = 1:
                  // one more id, E, after the k chosen ([2k + 1, T]: the shared expert as slot k)
    MOE_COMBINE,  // sum_j w[j, t] * y[:, j, t]: src0 y [H, k, T], src1 w [k, T] -> [H, T];
                  // src2 (optional) a shared expert's s [H, T] added as s * sigmoid(src3 [1, T])
    CONV1D_SSM,   // causal depthwise conv + silu with rolling state; see Graph::conv1d_ssm
                  // (input parts: src0, src3, src4; ip[0] = their number)
    GATED_DELTA,  // gated delta rule recurrence; see Graph::gated_delta (ip[0] = 1: q/k
                  // l2-normalised in the op with eps fp[0], q scaled by fp[1])
    ARGMAX,       // per row index of the maximum -> I32 [T]
    SUM_SQR,      // per row sum of squares times fp[0] -> [1, rows] (a split RMSNorm's part)
    ALL_REDUCE,   // src0 summed over the ranks of the graph's communicator (a split model)
    COUNT
};

const char * op_name(Op op);

enum TensorFlags : uint32_t {
    TENSOR_INPUT    = 1u << 0,  // filled by the host before compute (arena memory)
    TENSOR_OUTPUT   = 1u << 1,  // read back after compute: kept alive to the end
    TENSOR_EXTERNAL = 1u << 2,  // memory owned outside the graph (state buffers, constants)
};

struct Tensor {
    DType   type = DType::F32;
    int64_t ne[kMaxDims] = {1, 1, 1, 1};
    size_t  nb[kMaxDims] = {0, 0, 0, 0};

    Op       op = Op::NONE;
    Tensor * src[kMaxSrc] = {};
    const QWeight * weight    = nullptr;  // MATMUL / GET_ROWS: the weight
    const QWeight * experts   = nullptr;  // MATMUL_ID: array of n_experts weights
    int32_t         n_experts = 0;
    int32_t         ip[8]     = {};
    float           fp[4]     = {};

    Tensor * view_src  = nullptr;  // VIEW: the aliased tensor (always a non-view)
    size_t   view_offs = 0;

    void *   data  = nullptr;  // bound by the planner (arena) or set by the owner (external)
    uint32_t flags = 0;
    int32_t  id    = -1;       // index in Graph::tensors
    std::string name;

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    size_t  nbytes() const;  // bytes spanned (contiguous: nelements * size)
    bool    is_contiguous() const;
    // Address of row (i1, i2, i3).
    char * row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
        return static_cast<char *>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
    }
};

// Batch metadata shared by the stateful ops of one step (attention, conv, delta rule). Every token
// t of the step belongs to exactly one sequence slot seq[t] at position pos[t]. The tokens of a
// step are grouped by sequence (the context orders them so), in position order, and positions
// continue the state already cached.
struct StepInputs {
    Tensor * pos         = nullptr;  // I32 [T]
    Tensor * seq         = nullptr;  // I32 [T] sequence slot of each token
    Tensor * block_table = nullptr;  // I32 [max_pages_per_seq, n_seq_slots] KV page of (seq, page)
    Tensor * seq_ranges  = nullptr;  // I32 [3, S]: (slot, first token, n tokens) of each sequence
};

// The source slots of CONV1D_SSM's input parts (Graph::conv1d_ssm): part i is src[kConvPartSrc[i]].
constexpr int kConvPartSrc[3] = {0, 3, 4};

// Graph::gated_delta: whether q and k are l2-normalised (and q scaled) inside the op.
struct QkNorm {
    bool  l2_norm = false;
    float eps = 0.0f, q_scale = 1.0f;
};

class Communicator;

class Graph {
public:
    Graph() = default;
    Graph(const Graph &) = delete;
    Graph & operator=(const Graph &) = delete;

    // ---- leaves
    Tensor * input(DType type, std::initializer_list<int64_t> ne, const std::string & name);
    Tensor * external(DType type, std::initializer_list<int64_t> ne, void * data, const std::string & name);

    // ---- ops (all outputs F32 unless stated)
    Tensor * get_rows(const QWeight & w, Tensor * ids);       // -> [K, n_ids]
    Tensor * get_rows(Tensor * src, Tensor * ids);            // rows of a F32 or I32 [ne0, rows] tensor
    Tensor * matmul(Tensor * x, const QWeight & w);           // [K, ...] -> [N, ...]
    Tensor * matmul_id(Tensor * x, const QWeight * experts, int32_t n_experts, Tensor * ids);
    Tensor * add(Tensor * a, Tensor * b);
    Tensor * mul(Tensor * a, Tensor * b);
    Tensor * scale(Tensor * a, float s);
    Tensor * rms_norm(Tensor * x, Tensor * w, float eps, bool zero_centered = false);
    // silu(gate) * rms_norm(x, w) in one op (Qwen3-Next's gated norm of the linear-attention
    // output); gate has x's row length and row count, its rows in x's row order (any strides).
    Tensor * rms_norm_gated(Tensor * x, Tensor * w, Tensor * gate, float eps);
    Tensor * l2_norm(Tensor * x, float eps);
    Tensor * rope(Tensor * x, Tensor * pos, int32_t n_rot, float theta);
    Tensor * swiglu(Tensor * gate, Tensor * up);
    Tensor * mul_sigmoid(Tensor * a, Tensor * gate);
    Tensor * argmax(Tensor * x);                              // -> I32 [rows]

    // ---- a model split over ranks (runtime/shard.h): the graph's communicator joins them
    // x summed over the ranks (x contiguous F32); every rank's graph makes the same calls.
    Tensor * all_reduce(Tensor * x);
    // RMSNorm of rows split over the ranks: x holds this rank's part of each row, whose sums of
    // squares over every rank (the all-reduce of sum_sqr) are `sums` [1, rows] over `width` elements.
    Tensor * sum_sqr(Tensor * x, float scale);
    Tensor * rms_norm_split(Tensor * x, Tensor * w, Tensor * sums, int64_t width, float eps, bool zero_centered);
    void           set_comm(Communicator * c) { comm_ = c; }
    Communicator * comm() const { return comm_; }

    // Causal attention of q [hd, n_head, T] over the sequence's cached keys/values after first
    // appending k, v [hd, n_head_kv, T] at (seq[t], pos[t]). The cache of this layer is two external
    // tensors k_cache, v_cache of [hd * n_head_kv, page_size, n_pages] (F32 on the CPU; the
    // backend's KV dtype elsewhere). Query head h reads KV head h / (n_head / n_head_kv).
    // Output [hd * n_head, T].
    Tensor * attention(Tensor * q, Tensor * k, Tensor * v, Tensor * k_cache, Tensor * v_cache,
                       const StepInputs & step, float scale);

    // MoE routing: scores over experts (a softmax, or sigmoids), top-k, optional renormalisation.
    // Returns the packed [2k, T] result; moe_weights / moe_ids are views of it. choice_bias
    // (sigmoid only, optional F32 [E]: MiniMax-M2's e_score_correction_bias) is added to the scores
    // to choose the experts; the weights are the chosen scores without it. shared_slot: every token's
    // ids end with one more, E (the shared expert stored after the E routed ones), so the routed
    // matmuls compute the shared expert as slot k in the same launches (Qwen3-Next).
    Tensor * moe_route(Tensor * logits, int32_t k, bool normalize, RouterScore score = RouterScore::Softmax, Tensor * choice_bias = nullptr,
                       bool shared_slot = false);
    Tensor * moe_weights(Tensor * route);   // F32 [k, T]
    Tensor * moe_ids(Tensor * route);       // I32 [k, T] ([k + 1, T] with the shared slot)
    // shared (optional): a shared expert's output [H, T] gated by sigmoid(shared_gate [1, T]) and
    // added, as add(combine, mul_sigmoid(shared, shared_gate)) in one op (Qwen3-Next).
    Tensor * moe_combine(Tensor * y, Tensor * weights, Tensor * shared = nullptr, Tensor * shared_gate = nullptr);

    // Recurrent state with rollback. A linear-attention state tensor is external F32
    // [state_size, R, n_seq_slots]: per sequence slot a ring of R states, where entry p mod R holds
    // the state after position p. An op reads the state after position pos0 - 1 (pos0: the first
    // position of the sequence in this step; a sequence starting at position 0 starts from zeros,
    // whatever the ring holds) and writes the state after each of the step's last min(count, R)
    // positions. So the states after the last R positions of a sequence stay available: removing up
    // to R - 1 trailing positions is exact without recompute (Memory, n_rollback = R - 1).
    //
    // Causal depthwise conv1d over time, then silu. x [C, T]; w F32 [K, C] (tap j of channel c at
    // w[c*K + j], tap K-1 multiplies the current input); state [(K-1) * C, R, n_seq_slots], one
    // state being the previous K-1 inputs as [K-1][C], oldest first. Output [C, T].
    //
    // The input may also be given as up to three parts whose channels are concatenated (so the
    // concat and the copies that would make them contiguous are not separate ops): a part is a
    // strided view [len, groups, T] whose channels are (group, element) in that order, each row of
    // len floats contiguous (the op always holds its input so: x [C, T] becomes a [C, 1, T] view). Qwen3-Next reads q, k and v this way straight out of the
    // in_proj_qkvz output, where they are interleaved per key head.
    Tensor * conv1d_ssm(Tensor * x, Tensor * w, Tensor * state, const StepInputs & step);
    Tensor * conv1d_ssm(std::initializer_list<Tensor *> parts, Tensor * w, Tensor * state, const StepInputs & step);

    // Gated delta rule (Qwen3-Next linear attention), per value head h and token t:
    //   g = -exp(A_log[h]) * softplus(a[h, t] + dt_bias[h]); beta = sigmoid(b[h, t])
    //   S = S * exp(g); S += k (x) ((v - S^T k) * beta); o = S^T q
    // q, k [dk, n_k_heads, T], v [dv, n_v_heads, T], a, b [n_v_heads, T] or strided views
    // [r, groups, T] with r * groups = n_v_heads (value head h at (h % r, h / r); the op holds
    // [n_v_heads, T] as a [n_v_heads, 1, T] view); A_log,
    // dt_bias F32 [n_v_heads]; value head h uses key head h / (n_v_heads / n_k_heads).
    // qk.l2_norm: q and k are first l2-normalised per head, x / sqrt(sum(x^2) + qk.eps) as
    // l2_norm, and q then multiplied by qk.q_scale (what transformers does inside the kernel with
    // use_qk_l2norm_in_kernel); otherwise they are used as given. state [dk * dv * n_v_heads, R,
    // n_seq_slots], a ring as above (S[h] is dk x dv, row i = key dim). Output [dv, n_v_heads, T].
    Tensor * gated_delta(Tensor * q, Tensor * k, Tensor * v, Tensor * a, Tensor * b, Tensor * A_log,
                         Tensor * dt_bias, Tensor * state, const StepInputs & step, QkNorm qk = QkNorm{});

    // ---- shapes
    Tensor * reshape(Tensor * x, std::initializer_list<int64_t> ne);  // x must be contiguous
    // A view with explicit sizes, byte strides (nb[0] is the element size) and byte offset.
    Tensor * view(Tensor * x, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset);
    Tensor * cont(Tensor * x);
    // Concatenation along ne[0] of 2 or 3 tensors with the same number of rows.
    Tensor * concat(Tensor * a, Tensor * b, Tensor * c = nullptr);

    void mark_output(Tensor * t) { t->flags |= TENSOR_OUTPUT; }

    // All tensors in creation order (leaves included); nodes() only those with an op, in execution
    // order (creation order is a valid topological order).
    const std::deque<Tensor> &    tensors() const { return tensors_; }
    std::deque<Tensor> &          tensors() { return tensors_; }
    const std::vector<Tensor *> & nodes() const { return nodes_; }

    // Identity for backends that cache per-graph work (the CUDA fingerprint): a process-unique id and
    // a generation bumped whenever the graph's memory is (re)bound.
    uint64_t uid() const { return uid_; }
    uint64_t generation() const { return generation_; }
    void     bump_generation() { ++generation_; }

    // A prompt step: some of its rows produce no logits anybody reads (a prompt's tokens before its
    // last). Its rows need not compute exactly what one-row decode steps compute, so a backend may use
    // arithmetic that only pays for many rows and rounds differently (W4A4 NVFP4 on sm_120a /
    // sm_121a: docs/SM120.md). Decode and speculative-verify steps, whose every row is read and must
    // match a one-row step, are not prompt steps. Set by the builder of the step (the context).
    bool prompt_step() const { return prompt_step_; }
    void set_prompt_step(bool on) { prompt_step_ = on; }

    // Name the most recent tensor ("attn_norm-3"), for debugging and dumps.
    Tensor * named(Tensor * t, const std::string & name, int layer = -1);

private:
    Tensor * new_tensor(DType type, const int64_t * ne, int n_dims, Op op);
    Tensor * new_op(Op op, DType type, const Tensor * shape_like);
    Tensor * unary(Op op, Tensor * a);
    Tensor * binary(Op op, Tensor * a, Tensor * b);

    std::deque<Tensor>    tensors_;
    std::vector<Tensor *> nodes_;
    uint64_t              uid_        = next_uid();
    uint64_t              generation_ = 0;
    bool                  prompt_step_ = false;
    Communicator *        comm_        = nullptr;
    static uint64_t       next_uid();
};

}  // namespace spark
