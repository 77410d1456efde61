// The CUDA dispatch's peephole fusion: which nodes of a step one launch covers. A walk over the
// step's nodes in order yields launches, each a node alone or a group the matmul / elementwise
// layers (ops.h) run as one kernel:
//   SWIGLU of two MATMULs (or two MATMUL_IDs) over the same input    op_matmul_swiglu
//   MATMULs over the same activations with only views between them   op_matmul_multi
//   ADD, the RMS_NORM of its sum, and the MATMULs that alone read the norm when they are one
//   tensor-core decode GEMV of one row                                op_add_norm_matmul
//   MOE_COMBINE, the ADD of its output, the RMS_NORM of that sum and the MATMULs that alone read
//   the norm when they are one tensor-core decode GEMV of one row   op_combine_norm_matmul
//   the same with a MATMUL of one weight in the combine's place      op_matmul_norm_matmul
//   the same with the MATMUL_ID the combine combines before it       op_experts_norm_matmul
//   ADD directly followed by the RMS_NORM of its sum                 op_add_rms_norm
//   per-head RMS_NORM read only by the ROPE after it (q, then k)     op_rms_norm_rope(_pair)
//   ... whose two ROPE outputs only the next ATTENTION reads          op_attention_norm_rope
//   RMS_NORM of whole rows read only by the ROPE of its heads (q, k)  op_whole_norm_rope_pair
// Views and NONE nodes launch nothing; the nodes a fused launch computes are not launched again.
// A collective (ALL_REDUCE) is a launch of its own, never part of a group; norms of rows split over ranks (RMS_NORM with src3, Graph::rms_norm_split) are
// never fused: the fused kernels sum their own rows.
#pragma once

#include "backends/cuda/ops.h"
#include "graph/graph.h"

#include <cstddef>
#include <vector>

namespace spark::cuda {

struct FusedLaunch {
    enum class Kind {
        Node,
        MatmulSwiglu,
        MatmulMulti,
        AddNormMatmul,
        CombineNormMatmul,
        MatmulNormMatmul,
        ExpertsNormMatmul,
        AddRmsNorm,
        RmsNormRope,
        RmsNormRopePair,
        AttentionNormRope,
        WholeNormRope
    };
    static constexpr int kMaxNodes    = 7;
    static constexpr int kMaxMatmuls  = 4;  // of a MatmulMulti launch

    Kind           kind  = Kind::Node;
    int            count = 1;  // nodes[0 .. count): MatmulMulti the matmuls; AddNormMatmul the ADD, the RMS_NORM,
                               // then the matmuls; CombineNormMatmul the MOE_COMBINE, then as
                               // AddNormMatmul; MatmulNormMatmul likewise with the producer's
                               // MATMUL first; ExpertsNormMatmul the MATMUL_ID, then as
                               // CombineNormMatmul; RmsNormRopePair norm q, rope q, norm k,
                               // rope k; AttentionNormRope those and the attention; WholeNormRope
                               // norm q, rope q (then norm k, rope k)
    const Tensor * nodes[kMaxNodes] = {};
    const char *   label = nullptr;  // the op profiler's name of a fused launch (nullptr: the node's op)
};

class FusionPass {
public:
    // ctx: asked whether a group of matmuls can share a launch (matmul_multi_supported).
    FusionPass(const Graph & graph, const OpContext & ctx);

    // The step's next launch, in node order; false after the last.
    bool next(FusedLaunch & launch);

    // The position of the last node the launch next() returned last computes (its nodes read their
    // inputs until that launch ends).
    size_t last_position(const FusedLaunch & launch) const;

    // The dispatch tells, after each launch next() returned, whether its last kernel lets the next
    // one start only after its own PDL wait (ops.h: OpContext::last_waits_first). Once such a
    // launch has let the next one start, every launch before it has completed (pdl.cuh): the
    // latest one is the barrier the early reads below are judged against.
    void launched(bool waits_first);

    // Early expert ids and activations (ops.h: OpContext::ids_before_wait, x_before_wait): whether
    // the launch next() returned last is a MATMUL_ID (or the SWIGLU of two) whose expert ids / whose
    // activations were computed by a launch before the barrier (a fused launch covers nodes after
    // its first one, and skipped nodes are computed by a later launch).
    bool ids_written_before_barrier(const FusedLaunch & launch) const;
    bool x_written_before_barrier(const FusedLaunch & launch) const;

private:
    bool fusable_swiglu(const Tensor & sw) const;
    int  add_norm_matmul_at(size_t i, const Tensor ** after) const;
    int  producer_norm_matmul_at(size_t i, const Tensor ** add_norm, const Tensor ** after) const;
    int  norm_after_at(size_t i, const Tensor ** add_norm, const Tensor ** after) const;
    bool norm_rope_at(size_t i) const;
    size_t whole_norm_rope_at(size_t i) const;
    size_t next_launching(size_t i) const;
    const Tensor * attention_after_pair(size_t i) const;
    int  matmul_group(size_t first, const Tensor ** group) const;
    bool moe_source_before_barrier(const FusedLaunch & launch, int src) const;

    const std::vector<Tensor *> & nodes_;
    const OpContext &             ctx_;
    std::vector<int>              uses_;  // readers of each tensor, by id
    std::vector<int>              pos_;   // position of each node, by tensor id (-1: not a node)
    std::vector<bool>             skip_;  // computed by another launch
    size_t                        i_        = 0;
    const Tensor *                barrier_  = nullptr;  // the first node of the barrier launch (launched())
    const Tensor *                last_     = nullptr;  // the first node of the last launch
};

// For the memory planner (planner.h, launch_last): per node of the graph, the position of the last
// node of the launch that computes it, where a launch reads its nodes' inputs after an earlier node
// of it wrote an output (ADD + RMS_NORM + MATMULs: the GEMV's blocks read the addends while others
// write the sum and the matmuls' rows; MOE_COMBINE + ADD + RMS_NORM + MATMULs: the combine's blocks
// read the experts' rows while others write the sum, and the GEMV reads the sums of squares the
// combine wrote over its own output; the q / k norm + RoPE pairs, with the attention or not: the k
// pair's blocks read k while the q pair's write q's rotation, which the launch refuses to overlap
// with k, and a plan unaware of the launch may place it there); -1 elsewhere. The plan then keeps those inputs apart from the
// launch's outputs. Asked before the graph has memory (only the nodes' structure counts).
std::vector<int> launch_last_nodes(const Graph & graph, const OpContext & ctx);

}  // namespace spark::cuda
