// Per-context sequence memory behind one sequence interface (remove a tail, copy, snapshot /
// restore), so a hybrid model is a composition and speculative rollback is exact:
//
//   Memory            the sequences: their lengths, the snapshots, and the parts below; every
//                     operation asks every part first, so it happens in all parts or in none.
//   SequenceState     what a part implements: the state one kind of layer keeps per sequence.
//     KvCache         softmax-attention layers: a paged KV cache (kv_cache.cpp).
//     RecurrentState  linear-attention layers: conv window + delta-rule matrix, each a ring of the
//                     states after the last n_rollback + 1 positions (recurrent_state.cpp).
//
// Positions of a sequence are always 0 .. length-1 (no holes): tokens are appended by decode
// steps and removed from the tail.
#pragma once

#include "backends/backend.h"
#include "graph/graph.h"

#include <spark/spark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spark {

struct Model;

// What a model keeps per sequence, per layer (derived from the hyper-parameters by the model).
struct MemoryLayout {
    std::vector<bool> attention;       // per layer: true = KV cache, false = recurrent state
    int64_t           kv_row     = 0;  // n_head_kv * head_dim
    size_t            conv_bytes = 0;  // one recurrent layer's conv state of one sequence
    size_t            ssm_bytes  = 0;  // one recurrent layer's delta-rule state of one sequence

    static MemoryLayout of(const Model & model);
};

// What a context of these parameters allocates, in bytes (INT64_MAX when it overflows).
struct MemoryFootprint {
    int64_t block_table_entries = 0;  // [n_seq_max][pages per sequence], uploaded every step
    int64_t kv_bytes            = 0;
    int64_t recurrent_bytes     = 0;  // rings, the backup of a multi-step call, snapshots
    int64_t total() const;

    static MemoryFootprint of(const MemoryLayout & layout, DType kv_type, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots,
                              int32_t n_rollback);
};

// One kind of per-sequence state. Lengths live in Memory; parts receive them.
class SequenceState {
public:
    virtual ~SequenceState() = default;

    // Makes room for n_new[s] more tokens after len[s] in every sequence s. Throws
    // SPARK_ERR_CONTEXT_FULL with nothing changed.
    virtual void reserve(const std::vector<int32_t> & len, const std::vector<int32_t> & n_new) = 0;
    // A step appended tokens to `seq`, which now holds `len`.
    virtual void appended(int32_t seq, int32_t len) = 0;
    // The smallest length > 0 that `seq` (holding `len` tokens) can be cut back to without
    // recompute; 0 (clearing) is always possible.
    virtual int32_t min_length(int32_t seq, int32_t len) const = 0;
    // `seq` now holds `len` tokens (a cut to at least min_length, or undoing a failed step).
    virtual void truncate(int32_t seq, int32_t len) = 0;
    // dst (empty, with room reserved) becomes a copy of src's first len tokens.
    virtual void copy(int32_t src, int32_t dst, int32_t len) = 0;

    // Snapshots: the state of a sequence at its length, saved into / restored from buffers this
    // part allocates (a part with nothing to save returns no buffers).
    virtual std::vector<std::unique_ptr<Buffer>> snapshot_buffers() = 0;
    virtual void save(int32_t seq, int32_t len, std::vector<std::unique_ptr<Buffer>> & to) = 0;
    virtual void load(int32_t seq, int32_t len, const std::vector<std::unique_ptr<Buffer>> & from) = 0;

    // Serialised contents (spark_state_seq_*): the bytes of `seq` holding `len` tokens, written to
    // and read from host memory. read_state finds `seq` empty with room reserved for `len`.
    virtual size_t state_bytes(int32_t len) const = 0;
    virtual void   write_state(int32_t seq, int32_t len, uint8_t * out) const = 0;
    virtual void   read_state(int32_t seq, int32_t len, const uint8_t * in) = 0;

    virtual void add_info(spark_memory_info & info) const = 0;
};

// What a serialised sequence state is made of in a context: a state loads only where these agree.
struct StateShape {
    int32_t  kv_layers = 0, recurrent_layers = 0;
    uint32_t kv_type   = 0;  // DType of the KV cache
    int64_t  kv_row    = 0;  // values per token per layer, for K and for V
    uint64_t conv_bytes = 0, ssm_bytes = 0;
    bool     operator==(const StateShape &) const = default;
};

class KvCache;
class RecurrentState;

class Memory {
public:
    Memory(const Model & model, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots, int32_t n_rollback);
    ~Memory();

    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_seq_max() const { return n_seq_; }
    int32_t n_rollback() const { return n_rollback_; }
    int32_t seq_length(int32_t seq) const { return seq_len_[size_t(seq)]; }
    int32_t total_tokens() const;

    // Decode steps. reserve() makes room for n_new[s] more tokens in each sequence s (throws
    // SPARK_ERR_CONTEXT_FULL, nothing changed); advance() records a step's tokens after it ran.
    // A step that appends at least ring_size() tokens to a recurrent sequence overwrites the ring
    // entry it started from: backup() copies the current states first, and undo() after a failed
    // or aborted step puts the lengths back to `len` (pages beyond return to the free list) and the
    // backed-up states back in place.
    void    reserve(const std::vector<int32_t> & n_new);
    // Throws SPARK_ERR_CONTEXT_FULL where reserve(n_new) would; changes nothing.
    void    check_room(const std::vector<int32_t> & n_new) const;
    void    advance(int32_t seq, int32_t n);
    int32_t ring_size() const { return n_rollback_ + 1; }
    void    backup(const std::vector<int32_t> & seqs);
    void    undo(const std::vector<int32_t> & len);
    // Forgets the backup (a new step starts: undo() must not apply an earlier step's states).
    void    drop_backup() { backed_up_.clear(); }

    // The sequence interface (spark.h).
    void    clear();
    bool    can_rm(int32_t seq, int32_t p0, int32_t p1, std::string * why = nullptr) const;
    void    seq_rm(int32_t seq, int32_t p0, int32_t p1);  // seq < 0: all sequences
    void    seq_cp(int32_t src, int32_t dst);
    int32_t snapshot(int32_t seq);
    void    restore(int32_t seq, int32_t snapshot);
    void    snapshot_free(int32_t snapshot);
    // The valid snapshot of `seq` with the most tokens, at most `at_most` of them; -1 when none.
    int32_t latest_snapshot(int32_t seq, int32_t at_most) const;
    int32_t snapshot_length(int32_t snapshot) const { return snapshots_[size_t(snapshot)].length; }

    // Keeps the recurrent states after the last n positions of every sequence (reallocates the
    // rings; the current states are kept). The context rebuilds its step graphs afterwards.
    void set_rollback(int32_t n);

    // spark_state_seq_*: a sequence's contents as bytes (the KV rows of every attention layer, then
    // the current state of every linear-attention layer) and back. read_state replaces `seq` by
    // `len` tokens from `in` (state_bytes(len) bytes); SPARK_ERR_CONTEXT_FULL, with nothing
    // changed, when they do not fit.
    StateShape state_shape() const;
    size_t     state_bytes(int32_t len) const;
    void       write_state(int32_t seq, uint8_t * out) const;
    void       read_state(int32_t seq, int32_t len, const uint8_t * in);

    spark_memory_info info() const;
    bool              has_recurrent() const { return recurrent_ != nullptr; }

    // What the step graphs bind: block table (host copy, [n_seq_max][max_pages_per_seq], -1 for
    // unused entries) and the external tensors of layer il's state.
    int32_t                      max_pages_per_seq() const;
    const std::vector<int32_t> & block_table() const;
    Tensor *                     k_cache(Graph & g, int il) const;
    Tensor *                     v_cache(Graph & g, int il) const;
    Tensor *                     conv_state(Graph & g, int il) const;
    Tensor *                     ssm_state(Graph & g, int il) const;

private:
    struct Snapshot {
        bool                                 used = false, valid = false;
        int32_t                              seq = -1, length = 0;
        std::string                          why_invalid;
        std::vector<std::unique_ptr<Buffer>> data;  // the recurrent part's buffers
    };
    void check_seq(int32_t seq) const;
    // Throws before anything is allocated when a context of these parameters cannot fit.
    void check_footprint(const Model & model, int32_t n_snapshots, int32_t n_rollback) const;
    void invalidate_snapshots(int32_t seq, int32_t below, const char * why);
    std::vector<SequenceState *> parts() const;

    int32_t                         n_ctx_, n_seq_, n_rollback_, n_snapshots_ = 0;
    const Model &                   model_;
    std::unique_ptr<KvCache>        kv_;
    std::unique_ptr<RecurrentState> recurrent_;
    std::vector<int32_t>            seq_len_;
    std::vector<bool>               backed_up_;  // per sequence: backup() holds its state
    std::vector<int32_t>            no_pages_;  // the block table of a model without attention layers
    std::vector<Snapshot>           snapshots_;
};

}  // namespace spark
