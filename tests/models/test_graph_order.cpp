// The order of a step graph's nodes that the CUDA dispatch's fusion pass relies on
// (src/backends/cuda/fusion.cpp), checked where CI runs: on the CPU, from the graph the architecture
// builds. A builder that breaks the order still computes the same (the CPU goldens pass); only the
// GPU's fused launch silently falls away, so the order itself is the contract tested here.
#include "harness.h"

#include "graph/graph.h"
#include "runtime/memory/memory.h"
#include "runtime/model.h"
#include "runtime/models/arch.h"

#include <doctest/doctest.h>

#include <memory>

namespace {

using spark::Op;
using spark::Tensor;

// The decode graph (one token) of a fixture, as the runtime builds it.
struct DecodeGraph {
    std::unique_ptr<spark::Model>  model;
    std::unique_ptr<spark::Memory> memory;
    spark::Graph                   graph;

    explicit DecodeGraph(const std::string & name) {
        spark_model_params p = spark_model_default_params();
        p.load_tokenizer     = false;
        model                = spark::load_model(test::model_dir(name), p);
        memory               = std::make_unique<spark::Memory>(*model, 256, 1, 0, 0);
        spark::GraphContext gc{graph, *model, *memory, {}, nullptr, nullptr, 1, nullptr, nullptr, nullptr, {}};
        gc.tokens           = graph.input(spark::DType::I32, {1}, "tokens");
        gc.step.pos         = graph.input(spark::DType::I32, {1}, "pos");
        gc.step.seq         = graph.input(spark::DType::I32, {1}, "seq");
        gc.step.block_table = graph.input(spark::DType::I32, {memory->max_pages_per_seq(), 1}, "block_table");
        gc.step.seq_ranges  = graph.input(spark::DType::I32, {3, 1}, "seq_ranges");
        gc.out_ids          = graph.input(spark::DType::I32, {1}, "out_ids");
        model->arch->build(gc);
    }
};

// The first node at or after i that computes something (views and NONE nodes compute nothing).
size_t next_computing(const std::vector<Tensor *> & nodes, size_t i) {
    while (i < nodes.size() && (nodes[i]->op == Op::VIEW || nodes[i]->op == Op::NONE)) ++i;
    return i;
}

}  // namespace

TEST_CASE("graph order: MiniMax-M2's whole-projection q / k norms each directly before the RoPE of their heads") {
    // The fusion pass runs RMS_NORM (whole rows) -> view -> ROPE of q, then the same of k, as one
    // launch (op_whole_norm_rope_pair) only where nothing but views lies between the four.
    const DecodeGraph              d("minimax_m2-bf16");
    const std::vector<Tensor *> &  nodes = d.graph.nodes();
    int                            pairs = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Tensor * norm = nodes[i];
        if (norm->op != Op::RMS_NORM) continue;
        const size_t j = next_computing(nodes, i + 1);
        REQUIRE(j < nodes.size());
        const Tensor * next = nodes[j];
        // A norm of the residual (attention or MoE input, the output norm) is read by matmuls.
        const bool heads_of_this_norm = next->op == Op::ROPE && next->src[0] && next->src[0]->op == Op::VIEW && next->src[0]->src[0] == norm;
        if (!heads_of_this_norm) {
            for (const Tensor * n : nodes)  // no ROPE reads this norm's heads further away
                CHECK_FALSE((n->op == Op::ROPE && n->src[0] && n->src[0]->op == Op::VIEW && n->src[0]->src[0] == norm));
            continue;
        }
        ++pairs;
        if (pairs % 2 == 1) {  // q: the k norm and its RoPE follow directly
            const size_t k = next_computing(nodes, j + 1);
            REQUIRE(k < nodes.size());
            CHECK(nodes[k]->op == Op::RMS_NORM);
        }
    }
    CHECK(pairs == 2 * d.model->hparams.n_layer);
}
