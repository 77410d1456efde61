// The KV cache of the softmax-attention layers: per layer two buffers
// [n_pages][page_size][n_head_kv * head_dim] in the backend's KV dtype; position p of a sequence
// lives at page block_table[seq][p / page_size], slot p % page_size. Pages are handed out as
// sequences grow and return to a free list when they are cut.
#pragma once

#include "runtime/memory/memory.h"

namespace spark {

class KvCache final : public SequenceState {
public:
    KvCache(Backend & backend, const MemoryLayout & layout, int32_t n_ctx, int32_t n_seq_max);

    static constexpr int32_t kPageSize = 64;  // tokens per page
    // Pages one sequence may need (n_ctx tokens), and the pages of a context: n_ctx tokens however
    // they are spread over the sequences (each sequence may leave one page partly empty).
    static int64_t pages_per_seq(int32_t n_ctx) { return (int64_t(n_ctx) + kPageSize - 1) / kPageSize; }
    static int64_t pages_total(int32_t n_ctx, int32_t n_seq_max) { return pages_per_seq(n_ctx) + n_seq_max; }

    void    reserve(const std::vector<int32_t> & len, const std::vector<int32_t> & n_new) override;
    void    appended(int32_t, int32_t) override {}
    int32_t min_length(int32_t, int32_t) const override { return 1; }  // any tail can be dropped
    void    truncate(int32_t seq, int32_t len) override;
    void    copy(int32_t src, int32_t dst, int32_t len) override;
    std::vector<std::unique_ptr<Buffer>> snapshot_buffers() override { return {}; }
    void    save(int32_t, int32_t, std::vector<std::unique_ptr<Buffer>> &) override {}  // tails only shrink: nothing to save
    void    load(int32_t, int32_t, const std::vector<std::unique_ptr<Buffer>> &) override {}
    size_t  state_bytes(int32_t len) const override;
    void    write_state(int32_t seq, int32_t len, uint8_t * out) const override;
    void    read_state(int32_t seq, int32_t len, const uint8_t * in) override;
    void    add_info(spark_memory_info & info) const override;
    int32_t n_layers() const { return int32_t(k_.size()); }
    DType   kv_type() const { return kv_type_; }
    int64_t kv_row() const { return kv_row_; }

    int32_t                      max_pages_per_seq() const { return max_pages_per_seq_; }
    const std::vector<int32_t> & block_table() const { return block_table_; }
    Tensor *                     k_cache(Graph & g, int il) const;
    Tensor *                     v_cache(Graph & g, int il) const;

private:
    int32_t & page(int32_t seq, int32_t p) { return block_table_[size_t(seq) * size_t(max_pages_per_seq_) + size_t(p)]; }
    int32_t   page(int32_t seq, int32_t p) const { return block_table_[size_t(seq) * size_t(max_pages_per_seq_) + size_t(p)]; }
    // Copies the first len rows of seq in every layer between the cache and host memory laid out
    // as [layer][K rows | V rows].
    template <bool kToHost, typename Bytes> void transfer(int32_t seq, int32_t len, Bytes host) const;

    Backend &                            backend_;
    int32_t                              n_seq_, page_size_, n_pages_, max_pages_per_seq_;
    DType                                kv_type_;
    int64_t                              kv_row_;
    std::vector<int>                     slot_of_layer_;  // layer -> index in k_/v_ (-1: none)
    std::vector<std::unique_ptr<Buffer>> k_, v_;
    std::vector<int32_t>                 block_table_;
    std::vector<int32_t>                 free_pages_;
};

}  // namespace spark
