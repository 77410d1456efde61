// Per-context sequence memory: a paged KV cache for softmax-attention layers and the recurrent
// state (conv window + delta-rule matrix) of linear-attention layers, behind one sequence
// interface (remove, copy, snapshot/restore) so hybrid models are a composition and rollback is
// exact.
//
// KV layout: per attention layer two buffers [n_pages][page_size][n_head_kv * head_dim] in the
// backend's KV dtype; a sequence's position p lives at page block_table[seq][p / page_size],
// slot p % page_size. Positions of a sequence are always 0 .. length-1 (no holes).
#pragma once

#include "backends/backend.h"
#include "graph/graph.h"
#include "runtime/model.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace spark {

class Memory {
public:
    Memory(const Model & model, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots);

    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_seq_max() const { return n_seq_; }
    int32_t page_size() const { return page_size_; }
    int32_t max_pages_per_seq() const { return max_pages_per_seq_; }
    int32_t seq_length(int32_t seq) const { return seq_len_[size_t(seq)]; }
    int32_t total_tokens() const;

    // Makes room for `n_new[s]` more tokens in each sequence s (allocating pages). Throws
    // SPARK_ERR_CONTEXT_FULL (nothing changed) when the cache cannot hold them.
    void reserve(const std::vector<int32_t> & n_new);
    // Records that `n` tokens were appended to `seq` (after a successful step).
    void advance(int32_t seq, int32_t n) { seq_len_[size_t(seq)] += n; }
    // Returns pages beyond each sequence's length to the free list (after a failed step).
    void release_unused();

    // Host copy of the block table, [n_seq_max][max_pages_per_seq], -1 for unused entries.
    const std::vector<int32_t> & block_table() const { return block_table_; }

    // External graph tensors of layer `il`'s state.
    Tensor * k_cache(Graph & g, int il) const;
    Tensor * v_cache(Graph & g, int il) const;
    Tensor * conv_state(Graph & g, int il) const;
    Tensor * ssm_state(Graph & g, int il) const;

    // The sequence interface.
    void clear();
    void seq_rm(int32_t seq, int32_t p0, int32_t p1);  // seq < 0: all sequences
    void seq_cp(int32_t src, int32_t dst);
    int32_t snapshot(int32_t seq);
    void restore(int32_t seq, int32_t snapshot);
    void snapshot_free(int32_t snapshot);

    spark_memory_info info() const;
    bool has_recurrent() const { return !conv_.empty(); }

private:
    void free_pages_from(int32_t seq, int32_t first_page);
    void zero_recurrent(int32_t seq);
    // Bytes of one sequence's state in one linear-attention layer.
    size_t conv_slot_bytes() const;
    size_t ssm_slot_bytes() const;

    const Model & model_;
    Backend &     backend_;
    int32_t       n_ctx_, n_seq_, page_size_, n_pages_, max_pages_per_seq_;
    DType         kv_type_;
    int64_t       kv_row_;  // n_head_kv * head_dim

    std::vector<int>                      attn_slot_;  // layer -> index in k_/v_ (-1: none)
    std::vector<int>                      rec_slot_;   // layer -> index in conv_/ssm_ (-1: none)
    std::vector<std::unique_ptr<Buffer>>  k_, v_, conv_, ssm_;
    std::vector<int32_t>                  block_table_;
    std::vector<int32_t>                  free_pages_;
    std::vector<int32_t>                  seq_len_;

    struct Snapshot {
        bool                                 used = false;
        int32_t                              seq = -1, length = 0;
        std::vector<std::unique_ptr<Buffer>> conv, ssm;  // per recurrent layer
    };
    std::vector<Snapshot> snapshots_;
};

}  // namespace spark
