#include "runtime/memory.h"

#include "graph/error.h"

#include <algorithm>

namespace spark {

namespace {
constexpr int32_t kPageSize = 64;
int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }
}  // namespace

Memory::Memory(const Model & model, int32_t n_ctx, int32_t n_seq_max, int32_t n_snapshots)
    : model_(model), backend_(*model.backend), n_ctx_(n_ctx), n_seq_(n_seq_max), page_size_(kPageSize) {
    const HParams & hp = model.hparams;
    if (n_ctx <= 0 || n_seq_max <= 0 || n_snapshots < 0)
        fail(SPARK_ERR_INVALID_ARGUMENT, "context: n_ctx, n_seq_max must be positive (got %d, %d)", n_ctx, n_seq_max);
    max_pages_per_seq_ = ceil_div(n_ctx, page_size_);
    // Enough pages for n_ctx tokens however they are spread over the sequences (each sequence may
    // leave one page partly empty).
    n_pages_ = max_pages_per_seq_ + n_seq_max;
    kv_type_ = backend_.caps().kv_type;
    kv_row_  = hp.n_head_kv * hp.head_dim;

    attn_slot_.assign(size_t(hp.n_layer), -1);
    rec_slot_.assign(size_t(hp.n_layer), -1);
    const size_t kv_bytes = size_t(n_pages_) * size_t(page_size_) * size_t(kv_row_) * dtype_size(kv_type_);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        if (hp.layer_kinds[size_t(il)] == LayerKind::Attention) {
            attn_slot_[size_t(il)] = int(k_.size());
            k_.push_back(backend_.alloc(kv_bytes));
            v_.push_back(backend_.alloc(kv_bytes));
        } else {
            rec_slot_[size_t(il)] = int(conv_.size());
            conv_.push_back(backend_.alloc(conv_slot_bytes() * size_t(n_seq_max)));
            ssm_.push_back(backend_.alloc(ssm_slot_bytes() * size_t(n_seq_max)));
        }
    }
    block_table_.assign(size_t(n_seq_max) * size_t(max_pages_per_seq_), -1);
    for (int32_t p = n_pages_ - 1; p >= 0; --p) free_pages_.push_back(p);
    seq_len_.assign(size_t(n_seq_max), 0);

    snapshots_.resize(size_t(n_snapshots));
    for (Snapshot & s : snapshots_)
        for (int64_t il = 0; il < hp.n_layer; ++il)
            if (rec_slot_[size_t(il)] >= 0) {
                s.conv.push_back(backend_.alloc(conv_slot_bytes()));
                s.ssm.push_back(backend_.alloc(ssm_slot_bytes()));
            }
}

size_t Memory::conv_slot_bytes() const {
    const HParams & hp       = model_.hparams;
    const int64_t   channels = 2 * hp.ssm_n_k_heads * hp.ssm_k_dim + hp.ssm_n_v_heads * hp.ssm_v_dim;
    return size_t((hp.ssm_conv_kernel - 1) * channels) * sizeof(float);
}

size_t Memory::ssm_slot_bytes() const {
    const HParams & hp = model_.hparams;
    return size_t(hp.ssm_k_dim * hp.ssm_v_dim * hp.ssm_n_v_heads) * sizeof(float);
}

int32_t Memory::total_tokens() const {
    int32_t n = 0;
    for (int32_t l : seq_len_) n += l;
    return n;
}

void Memory::reserve(const std::vector<int32_t> & n_new) {
    int32_t total = total_tokens();
    for (int32_t n : n_new) total += n;
    if (total > n_ctx_)
        fail(SPARK_ERR_CONTEXT_FULL, "context full: the batch needs %d tokens of KV cache but the context holds %d (n_ctx)", total, n_ctx_);
    if (k_.empty()) return;  // no attention layers: nothing to page
    // Count pages first so that a failure changes nothing.
    int32_t need = 0;
    for (int32_t s = 0; s < n_seq_; ++s) {
        if (!n_new[size_t(s)]) continue;
        const int32_t have = ceil_div(seq_len_[size_t(s)], page_size_);
        const int32_t want = ceil_div(seq_len_[size_t(s)] + n_new[size_t(s)], page_size_);
        if (want > max_pages_per_seq_) fail(SPARK_ERR_CONTEXT_FULL, "context full: sequence %d would exceed n_ctx = %d tokens", s, n_ctx_);
        for (int32_t p = have; p < want; ++p)
            if (block_table_[size_t(s) * size_t(max_pages_per_seq_) + size_t(p)] < 0) ++need;
    }
    if (need > int32_t(free_pages_.size())) fail(SPARK_ERR_CONTEXT_FULL, "context full: no free KV pages");
    for (int32_t s = 0; s < n_seq_; ++s) {
        const int32_t want = ceil_div(seq_len_[size_t(s)] + n_new[size_t(s)], page_size_);
        for (int32_t p = 0; p < want; ++p) {
            int32_t & e = block_table_[size_t(s) * size_t(max_pages_per_seq_) + size_t(p)];
            if (e < 0) {
                e = free_pages_.back();
                free_pages_.pop_back();
            }
        }
    }
}

void Memory::free_pages_from(int32_t seq, int32_t first_page) {
    for (int32_t p = first_page; p < max_pages_per_seq_; ++p) {
        int32_t & e = block_table_[size_t(seq) * size_t(max_pages_per_seq_) + size_t(p)];
        if (e >= 0) {
            free_pages_.push_back(e);
            e = -1;
        }
    }
}

void Memory::release_unused() {
    for (int32_t s = 0; s < n_seq_; ++s) free_pages_from(s, ceil_div(seq_len_[size_t(s)], page_size_));
}

void Memory::zero_recurrent(int32_t seq) {
    for (size_t i = 0; i < conv_.size(); ++i) {
        backend_.fill_zero(static_cast<char *>(conv_[i]->data()) + size_t(seq) * conv_slot_bytes(), conv_slot_bytes());
        backend_.fill_zero(static_cast<char *>(ssm_[i]->data()) + size_t(seq) * ssm_slot_bytes(), ssm_slot_bytes());
    }
}

Tensor * Memory::k_cache(Graph & g, int il) const {
    const int s = attn_slot_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(kv_type_, {kv_row_, page_size_, n_pages_}, k_[size_t(s)]->data(), "k_cache-" + std::to_string(il));
}

Tensor * Memory::v_cache(Graph & g, int il) const {
    const int s = attn_slot_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(kv_type_, {kv_row_, page_size_, n_pages_}, v_[size_t(s)]->data(), "v_cache-" + std::to_string(il));
}

Tensor * Memory::conv_state(Graph & g, int il) const {
    const int s = rec_slot_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(DType::F32, {int64_t(conv_slot_bytes() / 4), n_seq_}, conv_[size_t(s)]->data(), "conv_state-" + std::to_string(il));
}

Tensor * Memory::ssm_state(Graph & g, int il) const {
    const int s = rec_slot_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(DType::F32, {int64_t(ssm_slot_bytes() / 4), n_seq_}, ssm_[size_t(s)]->data(), "ssm_state-" + std::to_string(il));
}

void Memory::clear() {
    for (int32_t s = 0; s < n_seq_; ++s) {
        seq_len_[size_t(s)] = 0;
        free_pages_from(s, 0);
        zero_recurrent(s);
    }
}

void Memory::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
    if (seq >= n_seq_) fail(SPARK_ERR_INVALID_ARGUMENT, "sequence id %d out of range [0, %d)", seq, n_seq_);
    if (seq < 0) {
        for (int32_t s = 0; s < n_seq_; ++s) seq_rm(s, p0, p1);
        return;
    }
    const int32_t len = seq_len_[size_t(seq)];
    if (p0 < 0) p0 = 0;
    if (p1 < 0 || p1 > len) p1 = len;
    if (p0 >= p1) return;
    if (p1 != len) fail(SPARK_ERR_UNSUPPORTED, "memory: only a tail can be removed (positions are contiguous); asked [%d, %d) of %d", p0, p1, len);
    if (has_recurrent() && p0 != 0)
        fail(SPARK_ERR_UNSUPPORTED, "memory: the recurrent state of a linear-attention model cannot be rolled back to position %d; use a snapshot", p0);
    seq_len_[size_t(seq)] = p0;
    free_pages_from(seq, ceil_div(p0, page_size_));
    if (p0 == 0) zero_recurrent(seq);
}

void Memory::seq_cp(int32_t src, int32_t dst) {
    if (src < 0 || src >= n_seq_ || dst < 0 || dst >= n_seq_) fail(SPARK_ERR_INVALID_ARGUMENT, "sequence id out of range");
    if (src == dst) return;
    seq_rm(dst, 0, -1);
    const int32_t len   = seq_len_[size_t(src)];
    std::vector<int32_t> need(size_t(n_seq_), 0);
    need[size_t(dst)] = len;
    reserve(need);
    const size_t page_bytes = size_t(page_size_) * size_t(kv_row_) * dtype_size(kv_type_);
    for (int32_t p = 0; p < ceil_div(len, page_size_); ++p) {
        const int32_t from = block_table_[size_t(src) * size_t(max_pages_per_seq_) + size_t(p)];
        const int32_t to   = block_table_[size_t(dst) * size_t(max_pages_per_seq_) + size_t(p)];
        for (size_t i = 0; i < k_.size(); ++i) {
            backend_.copy(static_cast<char *>(k_[i]->data()) + size_t(to) * page_bytes, static_cast<char *>(k_[i]->data()) + size_t(from) * page_bytes, page_bytes);
            backend_.copy(static_cast<char *>(v_[i]->data()) + size_t(to) * page_bytes, static_cast<char *>(v_[i]->data()) + size_t(from) * page_bytes, page_bytes);
        }
    }
    for (size_t i = 0; i < conv_.size(); ++i) {
        const size_t cb = conv_slot_bytes(), sb = ssm_slot_bytes();
        backend_.copy(static_cast<char *>(conv_[i]->data()) + size_t(dst) * cb, static_cast<char *>(conv_[i]->data()) + size_t(src) * cb, cb);
        backend_.copy(static_cast<char *>(ssm_[i]->data()) + size_t(dst) * sb, static_cast<char *>(ssm_[i]->data()) + size_t(src) * sb, sb);
    }
    seq_len_[size_t(dst)] = len;
}

int32_t Memory::snapshot(int32_t seq) {
    if (seq < 0 || seq >= n_seq_) fail(SPARK_ERR_INVALID_ARGUMENT, "sequence id %d out of range [0, %d)", seq, n_seq_);
    for (size_t id = 0; id < snapshots_.size(); ++id) {
        Snapshot & s = snapshots_[id];
        if (s.used) continue;
        s.used   = true;
        s.seq    = seq;
        s.length = seq_len_[size_t(seq)];
        for (size_t i = 0; i < conv_.size(); ++i) {
            backend_.copy(s.conv[i]->data(), static_cast<char *>(conv_[i]->data()) + size_t(seq) * conv_slot_bytes(), conv_slot_bytes());
            backend_.copy(s.ssm[i]->data(), static_cast<char *>(ssm_[i]->data()) + size_t(seq) * ssm_slot_bytes(), ssm_slot_bytes());
        }
        return int32_t(id);
    }
    fail(SPARK_ERR_OUT_OF_MEMORY, "all %zu snapshot slots are in use (raise n_snapshots)", snapshots_.size());
}

void Memory::restore(int32_t seq, int32_t id) {
    if (id < 0 || size_t(id) >= snapshots_.size() || !snapshots_[size_t(id)].used) fail(SPARK_ERR_INVALID_ARGUMENT, "invalid snapshot id %d", id);
    Snapshot & s = snapshots_[size_t(id)];
    if (s.seq != seq) fail(SPARK_ERR_INVALID_ARGUMENT, "snapshot %d was taken from sequence %d, not %d", id, s.seq, seq);
    if (seq_len_[size_t(seq)] < s.length)
        fail(SPARK_ERR_INVALID_ARGUMENT, "sequence %d was truncated to %d tokens, below its snapshot (%d)", seq, seq_len_[size_t(seq)], s.length);
    seq_len_[size_t(seq)] = s.length;
    free_pages_from(seq, ceil_div(s.length, page_size_));
    for (size_t i = 0; i < conv_.size(); ++i) {
        backend_.copy(static_cast<char *>(conv_[i]->data()) + size_t(seq) * conv_slot_bytes(), s.conv[i]->data(), conv_slot_bytes());
        backend_.copy(static_cast<char *>(ssm_[i]->data()) + size_t(seq) * ssm_slot_bytes(), s.ssm[i]->data(), ssm_slot_bytes());
    }
}

void Memory::snapshot_free(int32_t id) {
    if (id >= 0 && size_t(id) < snapshots_.size()) snapshots_[size_t(id)].used = false;
}

spark_memory_info Memory::info() const {
    spark_memory_info i{};
    for (const auto & b : k_) i.kv_bytes += b->size();
    for (const auto & b : v_) i.kv_bytes += b->size();
    for (const auto & b : conv_) i.recurrent_bytes += b->size();
    for (const auto & b : ssm_) i.recurrent_bytes += b->size();
    for (const Snapshot & s : snapshots_) {
        for (const auto & b : s.conv) i.snapshot_bytes += b->size();
        for (const auto & b : s.ssm) i.snapshot_bytes += b->size();
    }
    i.kv_cells_total = n_ctx_;
    i.kv_cells_used  = total_tokens();
    return i;
}

}  // namespace spark
