#include "runtime/memory/memory.h"

#include "common/checked.h"
#include "common/error.h"
#include "runtime/memory/kv_cache.h"
#include "runtime/memory/recurrent_state.h"
#include "runtime/model.h"

#include <algorithm>

namespace spark {

namespace {

// Every step uploads the whole block table: past this many entries a step would move hundreds of
// MiB, and a hostile n_ctx x n_seq_max would size a host allocation without bound.
constexpr int64_t kMaxBlockTableEntries = int64_t(1) << 24;

// Sizes as messages show them (INT64_MAX: the size overflowed).
std::string gib(int64_t bytes) {
    return bytes == INT64_MAX ? std::string("more than 2^63 bytes") : strfmt("%.1f GiB", double(bytes) / double(int64_t(1) << 30));
}

}  // namespace

MemoryLayout MemoryLayout::of(const Model & model) {
    const HParams & hp = model.hparams;
    MemoryLayout    l;
    for (int64_t il = 0; il < hp.n_layer; ++il) l.attention.push_back(hp.layer_kinds[size_t(il)] == LayerKind::Attention);
    const spark_status st = SPARK_ERR_INVALID_FORMAT;
    l.kv_row     = product_or_fail(st, "config.json: a KV cache row", {hp.n_head_kv, hp.head_dim});
    l.conv_bytes = size_t(product_or_fail(st, "config.json: the conv state", {hp.conv_state_floats(), int64_t(sizeof(float))}));
    l.ssm_bytes  = size_t(product_or_fail(st, "config.json: the linear-attention state", {hp.ssm_state_floats(), int64_t(sizeof(float))}));
    return l;
}

int64_t MemoryFootprint::total() const { return checked_sum(kv_bytes, recurrent_bytes).value_or(INT64_MAX); }

MemoryFootprint MemoryFootprint::of(const MemoryLayout & l, DType kv_type, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots,
                                    int32_t n_rollback) {
    const int64_t n_attention = std::count(l.attention.begin(), l.attention.end(), true);
    const int64_t n_recurrent = int64_t(l.attention.size()) - n_attention;
    const int64_t state       = checked_sum(int64_t(l.conv_bytes), int64_t(l.ssm_bytes)).value_or(INT64_MAX);
    MemoryFootprint f;
    if (n_attention > 0) {
        f.block_table_entries = checked_product({n_seq_max, KvCache::pages_per_seq(n_ctx)}).value_or(INT64_MAX);
        f.kv_bytes = checked_product({n_attention, 2, KvCache::pages_total(n_ctx, n_seq_max), KvCache::kPageSize, l.kv_row,
                                      int64_t(dtype_size(kv_type))})
                         .value_or(INT64_MAX);
    }
    if (n_recurrent > 0) {
        const int64_t rings    = checked_product({n_recurrent, state, int64_t(n_rollback) + 1, n_seq_max}).value_or(INT64_MAX);
        const int64_t backup   = checked_product({n_recurrent, state, n_seq_max}).value_or(INT64_MAX);
        const int64_t snapshot = checked_product({n_recurrent, state, n_snapshots}).value_or(INT64_MAX);
        f.recurrent_bytes      = checked_sum(checked_sum(rings, backup).value_or(INT64_MAX), snapshot).value_or(INT64_MAX);
    }
    return f;
}

void Memory::check_footprint(const Model & model, int32_t n_snapshots, int32_t n_rollback) const {
    const MemoryFootprint f = MemoryFootprint::of(MemoryLayout::of(model), model.backend->caps().kv_type, n_ctx_, n_seq_, n_snapshots, n_rollback);
    if (f.block_table_entries > kMaxBlockTableEntries)
        fail(SPARK_ERR_INVALID_ARGUMENT,
             "context: n_ctx %d for each of n_seq_max %d sequences needs a block table of %lld pages (at most %lld); lower n_ctx or n_seq_max",
             n_ctx_, n_seq_, (long long) f.block_table_entries, (long long) kMaxBlockTableEntries);
    const uint64_t capacity = model.backend->memory_capacity();
    if (capacity > 0 && uint64_t(f.total()) > capacity)
        fail(SPARK_ERR_OUT_OF_MEMORY,
             "context: n_ctx %d, n_seq_max %d, n_rollback %d, n_snapshots %d need %s (KV cache %s, recurrent state %s), more than the %s "
             "of the %s backend",
             n_ctx_, n_seq_, n_rollback, n_snapshots, gib(f.total()).c_str(), gib(f.kv_bytes).c_str(), gib(f.recurrent_bytes).c_str(),
             gib(int64_t(std::min<uint64_t>(capacity, INT64_MAX - 1))).c_str(), model.backend->name().c_str());
}

Memory::Memory(const Model & model, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots, int32_t n_rollback)
    : n_ctx_(n_ctx), n_seq_(n_seq_max), n_rollback_(n_rollback), model_(model) {
    if (n_ctx <= 0 || n_seq_max <= 0 || n_snapshots < 0 || n_rollback < 0)
        fail(SPARK_ERR_INVALID_ARGUMENT, "context: n_ctx, n_seq_max must be positive and n_snapshots, n_rollback not negative (got %d, %d, %d, %d)",
             n_ctx, n_seq_max, n_snapshots, n_rollback);
    check_footprint(model, n_snapshots, n_rollback);
    n_snapshots_ = n_snapshots;
    const MemoryLayout layout = MemoryLayout::of(model);
    const bool any_attention  = std::count(layout.attention.begin(), layout.attention.end(), true) > 0;
    const bool any_recurrent  = std::count(layout.attention.begin(), layout.attention.end(), false) > 0;
    if (any_attention) kv_ = std::make_unique<KvCache>(*model.backend, layout, n_ctx, n_seq_max);
    if (any_recurrent) recurrent_ = std::make_unique<RecurrentState>(*model.backend, layout, n_seq_max, n_rollback);
    seq_len_.assign(size_t(n_seq_max), 0);
    no_pages_.assign(size_t(n_seq_max), -1);
    snapshots_.resize(size_t(n_snapshots));
    if (recurrent_)
        for (Snapshot & s : snapshots_) s.data = recurrent_->snapshot_buffers();
}

Memory::~Memory() = default;

std::vector<SequenceState *> Memory::parts() const {
    std::vector<SequenceState *> p;
    if (kv_) p.push_back(kv_.get());
    if (recurrent_) p.push_back(recurrent_.get());
    return p;
}

void Memory::check_seq(int32_t seq) const {
    if (seq < 0 || seq >= n_seq_) fail(SPARK_ERR_INVALID_ARGUMENT, "sequence id %d out of range [0, %d)", seq, n_seq_);
}

int32_t Memory::total_tokens() const {
    int32_t n = 0;
    for (int32_t l : seq_len_) n += l;
    return n;
}

void Memory::check_room(const std::vector<int32_t> & n_new) const {
    int32_t total = total_tokens();
    for (int32_t n : n_new) total += n;
    if (total > n_ctx_)
        fail(SPARK_ERR_CONTEXT_FULL, "context full: the batch needs %d tokens of KV cache but the context holds %d (n_ctx)", total, n_ctx_);
}

void Memory::reserve(const std::vector<int32_t> & n_new) {
    check_room(n_new);
    for (SequenceState * p : parts()) p->reserve(seq_len_, n_new);
}

void Memory::advance(int32_t seq, int32_t n) {
    seq_len_[size_t(seq)] += n;
    for (SequenceState * p : parts()) p->appended(seq, seq_len_[size_t(seq)]);
}

void Memory::backup(const std::vector<int32_t> & seqs) {
    backed_up_.assign(size_t(n_seq_), false);
    if (!recurrent_) return;
    for (int32_t s : seqs) {
        recurrent_->backup(s, seq_len_[size_t(s)]);
        backed_up_[size_t(s)] = true;
    }
}

void Memory::undo(const std::vector<int32_t> & len) {
    for (int32_t s = 0; s < n_seq_; ++s) {
        seq_len_[size_t(s)] = len[size_t(s)];
        if (kv_) kv_->truncate(s, len[size_t(s)]);  // pages reserved beyond the length return to the free list
        if (recurrent_ && size_t(s) < backed_up_.size() && backed_up_[size_t(s)]) recurrent_->restore_backup(s, len[size_t(s)]);
    }
    backed_up_.clear();
}

void Memory::invalidate_snapshots(int32_t seq, int32_t below, const char * why) {
    for (size_t id = 0; id < snapshots_.size(); ++id) {
        Snapshot & s = snapshots_[id];
        if (!s.used || !s.valid || s.seq != seq || s.length <= below) continue;
        s.valid       = false;
        s.why_invalid = strfmt("snapshot %zu of sequence %d (at %d tokens) is no longer valid: %s", id, seq, s.length, why);
    }
}

void Memory::clear() {
    for (int32_t s = 0; s < n_seq_; ++s) {
        seq_len_[size_t(s)] = 0;
        for (SequenceState * p : parts()) p->truncate(s, 0);
        invalidate_snapshots(s, 0, "the memory was cleared");
    }
}

bool Memory::can_rm(int32_t seq, int32_t p0, int32_t p1, std::string * why) const {
    auto no = [&](std::string msg) {
        if (why) *why = std::move(msg);
        return false;
    };
    if (seq >= n_seq_) return no(strfmt("sequence id %d out of range [0, %d)", seq, n_seq_));
    if (seq < 0) {
        for (int32_t s = 0; s < n_seq_; ++s)
            if (!can_rm(s, p0, p1, why)) return false;
        return true;
    }
    const int32_t len = seq_len_[size_t(seq)];
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > len) p1 = len;
    if (p0 >= p1) return true;
    if (p1 != len) return no(strfmt("memory: only a tail can be removed (positions are contiguous); asked [%d, %d) of %d", p0, p1, len));
    for (SequenceState * p : parts()) {
        const int32_t floor = p->min_length(seq, len);
        if (p0 != 0 && p0 < floor)
            return no(strfmt("memory: the recurrent state of sequence %d (%d tokens) can be rolled back to %d tokens at the earliest, not %d "
                             "(context parameter n_rollback = %d; use a snapshot)",
                             seq, len, floor, p0, n_rollback_));
    }
    return true;
}

void Memory::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
    std::string why;
    if (!can_rm(seq, p0, p1, &why))
        fail(seq >= n_seq_ ? SPARK_ERR_INVALID_ARGUMENT : SPARK_ERR_UNSUPPORTED, "%s", why.c_str());
    if (seq < 0) {
        for (int32_t s = 0; s < n_seq_; ++s) seq_rm(s, p0, p1);
        return;
    }
    const int32_t len = seq_len_[size_t(seq)];
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > len) p1 = len;
    if (p0 >= p1) return;
    seq_len_[size_t(seq)] = p0;
    for (SequenceState * p : parts()) p->truncate(seq, p0);
    invalidate_snapshots(seq, p0, "the sequence was truncated below it");
}

void Memory::seq_cp(int32_t src, int32_t dst) {
    check_seq(src);
    check_seq(dst);
    if (src == dst) return;
    const int32_t len = seq_len_[size_t(src)];
    // Room for dst's copy counts dst's current tokens as freed.
    std::vector<int32_t> after = seq_len_, need(size_t(n_seq_), 0);
    after[size_t(dst)]         = 0;
    need[size_t(dst)]          = len;
    int32_t total              = len;
    for (int32_t l : after) total += l;
    if (total > n_ctx_) fail(SPARK_ERR_CONTEXT_FULL, "context full: copying sequence %d (%d tokens) needs more than n_ctx = %d", src, len, n_ctx_);
    seq_len_[size_t(dst)] = 0;
    for (SequenceState * p : parts()) p->truncate(dst, 0);
    invalidate_snapshots(dst, 0, "the sequence was overwritten by a copy");
    for (SequenceState * p : parts()) {
        p->reserve(seq_len_, need);
        p->copy(src, dst, len);
    }
    seq_len_[size_t(dst)] = len;
}

int32_t Memory::snapshot(int32_t seq) {
    check_seq(seq);
    for (size_t id = 0; id < snapshots_.size(); ++id) {
        Snapshot & s = snapshots_[id];
        if (s.used) continue;
        for (SequenceState * p : parts()) p->save(seq, seq_len_[size_t(seq)], s.data);
        s.used   = true;
        s.valid  = true;
        s.seq    = seq;
        s.length = seq_len_[size_t(seq)];
        s.why_invalid.clear();
        return int32_t(id);
    }
    fail(SPARK_ERR_OUT_OF_MEMORY, "all %zu snapshot slots are in use (raise n_snapshots)", snapshots_.size());
}

void Memory::restore(int32_t seq, int32_t id) {
    check_seq(seq);
    if (id < 0 || size_t(id) >= snapshots_.size() || !snapshots_[size_t(id)].used) fail(SPARK_ERR_INVALID_ARGUMENT, "invalid snapshot id %d", id);
    Snapshot & s = snapshots_[size_t(id)];
    if (s.seq != seq) fail(SPARK_ERR_INVALID_ARGUMENT, "snapshot %d was taken from sequence %d, not %d", id, s.seq, seq);
    if (!s.valid) fail(SPARK_ERR_INVALID_ARGUMENT, "%s", s.why_invalid.c_str());
    SPARK_ASSERT(seq_len_[size_t(seq)] >= s.length);
    seq_len_[size_t(seq)] = s.length;
    for (SequenceState * p : parts()) {
        p->truncate(seq, s.length);
        p->load(seq, s.length, s.data);
    }
    invalidate_snapshots(seq, s.length, "the sequence was restored to an earlier snapshot");
}

int32_t Memory::latest_snapshot(int32_t seq, int32_t at_most) const {
    int32_t best = -1;
    for (size_t id = 0; id < snapshots_.size(); ++id) {
        const Snapshot & s = snapshots_[id];
        if (s.used && s.valid && s.seq == seq && s.length <= at_most && s.length <= seq_len_[size_t(seq)] &&
            (best < 0 || s.length > snapshots_[size_t(best)].length))
            best = int32_t(id);
    }
    return best;
}

void Memory::snapshot_free(int32_t id) {
    if (id >= 0 && size_t(id) < snapshots_.size()) snapshots_[size_t(id)].used = false;
}

void Memory::set_rollback(int32_t n) {
    if (n < 0) fail(SPARK_ERR_INVALID_ARGUMENT, "n_rollback must not be negative (got %d)", n);
    check_footprint(model_, n_snapshots_, n);
    if (recurrent_) recurrent_->set_rollback(n, seq_len_);
    n_rollback_ = n;
}

StateShape Memory::state_shape() const {
    StateShape s;
    if (kv_) {
        s.kv_layers = kv_->n_layers();
        s.kv_type   = uint32_t(kv_->kv_type());
        s.kv_row    = kv_->kv_row();
    }
    if (recurrent_) {
        s.recurrent_layers = recurrent_->n_layers();
        s.conv_bytes       = recurrent_->layout().conv_bytes;
        s.ssm_bytes        = recurrent_->layout().ssm_bytes;
    }
    return s;
}

size_t Memory::state_bytes(int32_t len) const {
    size_t n = 0;
    for (SequenceState * p : parts()) n += p->state_bytes(len);
    return n;
}

void Memory::write_state(int32_t seq, uint8_t * out) const {
    check_seq(seq);
    const int32_t len = seq_len_[size_t(seq)];
    for (SequenceState * p : parts()) {
        p->write_state(seq, len, out);
        out += p->state_bytes(len);
    }
}

void Memory::read_state(int32_t seq, int32_t len, const uint8_t * in) {
    check_seq(seq);
    // As seq_cp: the sequence's current tokens count as freed.
    int32_t total = len;
    for (int32_t s = 0; s < n_seq_; ++s)
        if (s != seq) total += seq_len_[size_t(s)];
    if (len < 0 || total > n_ctx_)
        fail(SPARK_ERR_CONTEXT_FULL, "context full: the state holds %d tokens and the context has room for %d in sequence %d (n_ctx %d)", len,
             n_ctx_ - (total - len), seq, n_ctx_);
    seq_len_[size_t(seq)] = 0;
    for (SequenceState * p : parts()) p->truncate(seq, 0);
    invalidate_snapshots(seq, 0, "a saved state was loaded into its sequence");
    std::vector<int32_t> need(size_t(n_seq_), 0);
    need[size_t(seq)] = len;
    for (SequenceState * p : parts()) {
        p->reserve(seq_len_, need);
        p->read_state(seq, len, in);
        in += p->state_bytes(len);
    }
    seq_len_[size_t(seq)] = len;
}

spark_memory_info Memory::info() const {
    spark_memory_info i{};
    for (SequenceState * p : parts()) p->add_info(i);
    for (const Snapshot & s : snapshots_)
        for (const auto & b : s.data) i.snapshot_bytes += b->size();
    i.kv_cells_total = n_ctx_;
    i.kv_cells_used  = total_tokens();
    return i;
}

int32_t Memory::max_pages_per_seq() const { return kv_ ? kv_->max_pages_per_seq() : 1; }

const std::vector<int32_t> & Memory::block_table() const { return kv_ ? kv_->block_table() : no_pages_; }

Tensor * Memory::k_cache(Graph & g, int il) const {
    SPARK_ASSERT(kv_);
    return kv_->k_cache(g, il);
}
Tensor * Memory::v_cache(Graph & g, int il) const {
    SPARK_ASSERT(kv_);
    return kv_->v_cache(g, il);
}
Tensor * Memory::conv_state(Graph & g, int il) const {
    SPARK_ASSERT(recurrent_);
    return recurrent_->conv_state(g, il);
}
Tensor * Memory::ssm_state(Graph & g, int il) const {
    SPARK_ASSERT(recurrent_);
    return recurrent_->ssm_state(g, il);
}

}  // namespace spark
