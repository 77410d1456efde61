// The recurrent state of the linear-attention layers (Gated DeltaNet: the conv window and the
// delta-rule matrix). Per layer and sequence it is a ring of R = n_rollback + 1 states: entry
// p mod R holds the state after position p, written by the step that processed p (graph.h:
// "Recurrent state with rollback"). The states after the last R positions are therefore kept, and
// cutting a sequence back by up to n_rollback tokens changes only its length: no copy, no
// recompute. A sequence at position 0 starts from zeros, so clearing writes nothing either.
#pragma once

#include "runtime/memory/memory.h"

namespace spark {

class RecurrentState final : public SequenceState {
public:
    RecurrentState(Backend & backend, const MemoryLayout & layout, int32_t n_seq_max, int32_t n_rollback);

    void    reserve(const std::vector<int32_t> &, const std::vector<int32_t> &) override {}
    void    appended(int32_t seq, int32_t len) override;
    int32_t min_length(int32_t seq, int32_t len) const override;
    void    truncate(int32_t seq, int32_t len) override;
    void    copy(int32_t src, int32_t dst, int32_t len) override;
    std::vector<std::unique_ptr<Buffer>> snapshot_buffers() override;
    void    save(int32_t seq, int32_t len, std::vector<std::unique_ptr<Buffer>> & to) override;
    void    load(int32_t seq, int32_t len, const std::vector<std::unique_ptr<Buffer>> & from) override;
    size_t  state_bytes(int32_t len) const override;
    void    write_state(int32_t seq, int32_t len, uint8_t * out) const override;
    void    read_state(int32_t seq, int32_t len, const uint8_t * in) override;
    void    add_info(spark_memory_info & info) const override;
    int32_t n_layers() const { return int32_t(layers_.size()); }
    const MemoryLayout & layout() const { return layout_; }

    // A copy of each sequence's current state, put back by restore_backup() (a decode that fails
    // after some of its steps ran has overwritten ring entries the undo needs).
    void backup(int32_t seq, int32_t len);
    void restore_backup(int32_t seq, int32_t len);

    // Grows or shrinks the rings to n_rollback + 1 entries, keeping the current states.
    void set_rollback(int32_t n_rollback, const std::vector<int32_t> & len);

    Tensor * conv_state(Graph & g, int il) const;
    Tensor * ssm_state(Graph & g, int il) const;

private:
    struct Layer {
        std::unique_ptr<Buffer> conv, ssm;  // [n_seq][R][bytes]
    };
    // Byte offset of ring entry (state after position len - 1) of seq.
    size_t entry(int32_t seq, int32_t len, size_t bytes) const;
    // Bytes of `ring` states of every sequence, overflow-checked.
    size_t ring_bytes(size_t state_bytes, int32_t ring) const;
    void   copy_state(bool to_ring, int32_t seq, int32_t len, const std::vector<std::unique_ptr<Buffer>> & other);

    Backend &            backend_;
    MemoryLayout         layout_;
    int32_t              n_seq_, ring_;
    std::vector<int>     slot_of_layer_;  // layer -> index in layers_ (-1: none)
    std::vector<Layer>   layers_;
    std::vector<int32_t> floor_;  // per sequence: the smallest length > 0 whose state is in the ring
    std::vector<std::unique_ptr<Buffer>> backup_;  // [conv, ssm] per layer, n_seq states each
};

}  // namespace spark
