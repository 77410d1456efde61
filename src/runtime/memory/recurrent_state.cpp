#include "runtime/memory/recurrent_state.h"

#include "common/checked.h"
#include "common/error.h"

#include <algorithm>

namespace spark {

RecurrentState::RecurrentState(Backend & backend, const MemoryLayout & layout, int32_t n_seq_max, int32_t n_rollback)
    : backend_(backend), layout_(layout), n_seq_(n_seq_max), ring_(n_rollback + 1) {
    slot_of_layer_.assign(layout.attention.size(), -1);
    for (size_t il = 0; il < layout.attention.size(); ++il) {
        if (layout.attention[il]) continue;
        slot_of_layer_[il] = int(layers_.size());
        layers_.push_back({backend_.alloc(ring_bytes(layout.conv_bytes, ring_)), backend_.alloc(ring_bytes(layout.ssm_bytes, ring_))});
    }
    floor_.assign(size_t(n_seq_), 0);
}

size_t RecurrentState::ring_bytes(size_t state_bytes, int32_t ring) const {
    return size_t(product_or_fail(SPARK_ERR_INVALID_ARGUMENT, "the recurrent state of one layer", {int64_t(state_bytes), ring, n_seq_}));
}

size_t RecurrentState::entry(int32_t seq, int32_t len, size_t bytes) const {
    SPARK_ASSERT(len > 0);
    return (size_t(seq) * size_t(ring_) + size_t((len - 1) % ring_)) * bytes;
}

void RecurrentState::appended(int32_t seq, int32_t len) {
    // The step wrote the states after its last R positions: with the entries older steps left,
    // the ring holds the states after positions len - R .. len - 1, except entries that an earlier
    // cut made stale, which lie at or above the old floor: the floor never moves down.
    floor_[size_t(seq)] = std::max({floor_[size_t(seq)], len - ring_ + 1, 1});
}

int32_t RecurrentState::min_length(int32_t seq, int32_t len) const { return len == 0 ? 0 : floor_[size_t(seq)]; }

void RecurrentState::truncate(int32_t seq, int32_t len) {
    if (len == 0) floor_[size_t(seq)] = 0;  // the next step starts from zeros
}

void RecurrentState::copy(int32_t src, int32_t dst, int32_t len) {
    if (len > 0)
        for (Layer & l : layers_)
            for (const auto * b : {&l.conv, &l.ssm}) {
                const size_t seq_bytes = (*b)->size() / size_t(n_seq_);
                char *       base      = static_cast<char *>((*b)->data());
                backend_.copy(base + size_t(dst) * seq_bytes, base + size_t(src) * seq_bytes, seq_bytes);
            }
    floor_[size_t(dst)] = len == 0 ? 0 : floor_[size_t(src)];
}

std::vector<std::unique_ptr<Buffer>> RecurrentState::snapshot_buffers() {
    std::vector<std::unique_ptr<Buffer>> out;
    for (size_t i = 0; i < layers_.size(); ++i) {
        out.push_back(backend_.alloc(layout_.conv_bytes));
        out.push_back(backend_.alloc(layout_.ssm_bytes));
    }
    return out;
}

// Copies the state after position len - 1 of seq between the ring and `other` ([conv, ssm] per
// layer, each holding one state, or n_seq states for the backup).
void RecurrentState::copy_state(bool to_ring, int32_t seq, int32_t len, const std::vector<std::unique_ptr<Buffer>> & other) {
    if (len == 0) return;  // position 0 starts from zeros: nothing to keep
    SPARK_ASSERT(other.size() == 2 * layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Buffer * ring[2] = {layers_[i].conv.get(), layers_[i].ssm.get()};
        const size_t   bytes[2] = {layout_.conv_bytes, layout_.ssm_bytes};
        for (int j = 0; j < 2; ++j) {
            const Buffer & o   = *other[2 * i + size_t(j)];
            char *         r   = static_cast<char *>(ring[j]->data()) + entry(seq, len, bytes[j]);
            char *         off = static_cast<char *>(o.data()) + (o.size() > bytes[j] ? size_t(seq) * bytes[j] : 0);
            if (to_ring) backend_.copy(r, off, bytes[j]);
            else backend_.copy(off, r, bytes[j]);
        }
    }
}

void RecurrentState::save(int32_t seq, int32_t len, std::vector<std::unique_ptr<Buffer>> & to) { copy_state(false, seq, len, to); }

void RecurrentState::load(int32_t seq, int32_t len, const std::vector<std::unique_ptr<Buffer>> & from) {
    copy_state(true, seq, len, from);
    floor_[size_t(seq)] = len;  // other entries may hold states of the history the snapshot undid
}

void RecurrentState::backup(int32_t seq, int32_t len) {
    if (backup_.empty())
        for (size_t i = 0; i < layers_.size(); ++i) {
            backup_.push_back(backend_.alloc(ring_bytes(layout_.conv_bytes, 1)));
            backup_.push_back(backend_.alloc(ring_bytes(layout_.ssm_bytes, 1)));
        }
    copy_state(false, seq, len, backup_);
}

void RecurrentState::restore_backup(int32_t seq, int32_t len) {
    copy_state(true, seq, len, backup_);
    floor_[size_t(seq)] = len;
}

void RecurrentState::set_rollback(int32_t n_rollback, const std::vector<int32_t> & len) {
    if (n_rollback + 1 == ring_) return;
    const int32_t      old_ring = ring_;
    std::vector<Layer> fresh;
    for (size_t i = 0; i < layers_.size(); ++i)
        fresh.push_back({backend_.alloc(ring_bytes(layout_.conv_bytes, n_rollback + 1)), backend_.alloc(ring_bytes(layout_.ssm_bytes, n_rollback + 1))});
    // Nothing changed until here (allocation may fail); now move each current state over.
    for (int32_t s = 0; s < n_seq_; ++s) {
        if (len[size_t(s)] == 0) continue;
        for (size_t i = 0; i < layers_.size(); ++i) {
            const size_t cb = layout_.conv_bytes, sb = layout_.ssm_bytes;
            ring_           = old_ring;
            const size_t oc = entry(s, len[size_t(s)], cb), os = entry(s, len[size_t(s)], sb);
            ring_           = n_rollback + 1;
            const size_t nc = entry(s, len[size_t(s)], cb), ns = entry(s, len[size_t(s)], sb);
            backend_.copy(static_cast<char *>(fresh[i].conv->data()) + nc, static_cast<char *>(layers_[i].conv->data()) + oc, cb);
            backend_.copy(static_cast<char *>(fresh[i].ssm->data()) + ns, static_cast<char *>(layers_[i].ssm->data()) + os, sb);
        }
        floor_[size_t(s)] = len[size_t(s)];
    }
    ring_ = n_rollback + 1;
    backend_.synchronize();  // the old rings are freed below
    layers_ = std::move(fresh);
}

// Only the current state travels: a loaded sequence can grow, or be cut back to 0.
size_t RecurrentState::state_bytes(int32_t len) const { return len == 0 ? 0 : layers_.size() * (layout_.conv_bytes + layout_.ssm_bytes); }

void RecurrentState::write_state(int32_t seq, int32_t len, uint8_t * out) const {
    if (len == 0) return;
    for (const Layer & l : layers_) {
        backend_.download(out, static_cast<const char *>(l.conv->data()) + entry(seq, len, layout_.conv_bytes), layout_.conv_bytes);
        out += layout_.conv_bytes;
        backend_.download(out, static_cast<const char *>(l.ssm->data()) + entry(seq, len, layout_.ssm_bytes), layout_.ssm_bytes);
        out += layout_.ssm_bytes;
    }
}

void RecurrentState::read_state(int32_t seq, int32_t len, const uint8_t * in) {
    if (len == 0) return;
    for (Layer & l : layers_) {
        backend_.upload(static_cast<char *>(l.conv->data()) + entry(seq, len, layout_.conv_bytes), in, layout_.conv_bytes);
        in += layout_.conv_bytes;
        backend_.upload(static_cast<char *>(l.ssm->data()) + entry(seq, len, layout_.ssm_bytes), in, layout_.ssm_bytes);
        in += layout_.ssm_bytes;
    }
    floor_[size_t(seq)] = len;
}

void RecurrentState::add_info(spark_memory_info & info) const {
    for (const Layer & l : layers_) info.recurrent_bytes += l.conv->size() + l.ssm->size();
}

Tensor * RecurrentState::conv_state(Graph & g, int il) const {
    const int s = slot_of_layer_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(DType::F32, {int64_t(layout_.conv_bytes / 4), ring_, n_seq_}, layers_[size_t(s)].conv->data(),
                      "conv_state-" + std::to_string(il));
}

Tensor * RecurrentState::ssm_state(Graph & g, int il) const {
    const int s = slot_of_layer_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(DType::F32, {int64_t(layout_.ssm_bytes / 4), ring_, n_seq_}, layers_[size_t(s)].ssm->data(),
                      "ssm_state-" + std::to_string(il));
}

}  // namespace spark
