#include "runtime/memory/kv_cache.h"

#include "common/checked.h"
#include "common/error.h"

#include <algorithm>

namespace spark {

namespace {
// Lengths are at most n_ctx (an int32) and a page holds 64 tokens: no overflow.
int32_t ceil_div(int32_t a, int32_t b) { return int32_t((int64_t(a) + b - 1) / b); }
}  // namespace

KvCache::KvCache(Backend & backend, const MemoryLayout & layout, int32_t n_ctx, int32_t n_seq_max)
    : backend_(backend), n_seq_(n_seq_max), page_size_(kPageSize) {
    // Memory checked the footprint (block table, bytes) against its limits before this.
    max_pages_per_seq_ = int32_t(pages_per_seq(n_ctx));
    n_pages_           = int32_t(pages_total(n_ctx, n_seq_max));
    kv_type_           = backend_.caps().kv_type;
    kv_row_            = layout.kv_row;
    const size_t bytes = size_t(product_or_fail(SPARK_ERR_INVALID_ARGUMENT, "the KV cache of one layer",
                                                {n_pages_, page_size_, kv_row_, int64_t(dtype_size(kv_type_))}));
    slot_of_layer_.assign(layout.attention.size(), -1);
    for (size_t il = 0; il < layout.attention.size(); ++il) {
        if (!layout.attention[il]) continue;
        slot_of_layer_[il] = int(k_.size());
        k_.push_back(backend_.alloc(bytes));
        v_.push_back(backend_.alloc(bytes));
    }
    block_table_.assign(size_t(n_seq_max) * size_t(max_pages_per_seq_), -1);
    for (int32_t p = n_pages_ - 1; p >= 0; --p) free_pages_.push_back(p);
}

void KvCache::reserve(const std::vector<int32_t> & len, const std::vector<int32_t> & n_new) {
    // Count pages first so that a failure changes nothing.
    int32_t need = 0;
    for (int32_t s = 0; s < n_seq_; ++s) {
        if (!n_new[size_t(s)]) continue;
        const int32_t want = ceil_div(len[size_t(s)] + n_new[size_t(s)], page_size_);
        if (want > max_pages_per_seq_)
            fail(SPARK_ERR_CONTEXT_FULL, "context full: sequence %d would exceed n_ctx = %d tokens", s, max_pages_per_seq_ * page_size_);
        for (int32_t p = 0; p < want; ++p)
            if (page(s, p) < 0) ++need;
    }
    if (need > int32_t(free_pages_.size())) fail(SPARK_ERR_CONTEXT_FULL, "context full: no free KV pages");
    for (int32_t s = 0; s < n_seq_; ++s) {
        if (!n_new[size_t(s)]) continue;
        const int32_t want = ceil_div(len[size_t(s)] + n_new[size_t(s)], page_size_);
        for (int32_t p = 0; p < want; ++p) {
            if (page(s, p) >= 0) continue;
            page(s, p) = free_pages_.back();
            free_pages_.pop_back();
        }
    }
}

void KvCache::truncate(int32_t seq, int32_t len) {
    for (int32_t p = ceil_div(len, page_size_); p < max_pages_per_seq_; ++p) {
        if (page(seq, p) < 0) continue;
        free_pages_.push_back(page(seq, p));
        page(seq, p) = -1;
    }
}

void KvCache::copy(int32_t src, int32_t dst, int32_t len) {
    const size_t page_bytes = size_t(page_size_) * size_t(kv_row_) * dtype_size(kv_type_);
    for (int32_t p = 0; p < ceil_div(len, page_size_); ++p) {
        const size_t from = size_t(page(src, p)) * page_bytes, to = size_t(page(dst, p)) * page_bytes;
        for (size_t i = 0; i < k_.size(); ++i) {
            backend_.copy(static_cast<char *>(k_[i]->data()) + to, static_cast<char *>(k_[i]->data()) + from, page_bytes);
            backend_.copy(static_cast<char *>(v_[i]->data()) + to, static_cast<char *>(v_[i]->data()) + from, page_bytes);
        }
    }
}

size_t KvCache::state_bytes(int32_t len) const { return k_.size() * 2 * size_t(len) * size_t(kv_row_) * dtype_size(kv_type_); }

template <bool kToHost, typename Bytes> void KvCache::transfer(int32_t seq, int32_t len, Bytes host) const {
    const size_t row_bytes = size_t(kv_row_) * dtype_size(kv_type_), page_bytes = size_t(page_size_) * row_bytes;
    for (size_t i = 0; i < k_.size(); ++i)
        for (const Buffer * b : {k_[i].get(), v_[i].get()})
            for (int32_t p = 0; p * page_size_ < len; ++p) {
                const size_t bytes  = size_t(std::min(page_size_, len - p * page_size_)) * row_bytes;
                char *       cached = static_cast<char *>(b->data()) + size_t(page(seq, p)) * page_bytes;
                if constexpr (kToHost) backend_.download(host, cached, bytes);
                else backend_.upload(cached, host, bytes);
                host += bytes;
            }
}

void KvCache::write_state(int32_t seq, int32_t len, uint8_t * out) const { transfer<true>(seq, len, out); }

void KvCache::read_state(int32_t seq, int32_t len, const uint8_t * in) { transfer<false>(seq, len, in); }

void KvCache::add_info(spark_memory_info & info) const {
    for (const auto & b : k_) info.kv_bytes += b->size();
    for (const auto & b : v_) info.kv_bytes += b->size();
}

Tensor * KvCache::k_cache(Graph & g, int il) const {
    const int s = slot_of_layer_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(kv_type_, {kv_row_, page_size_, n_pages_}, k_[size_t(s)]->data(), "k_cache-" + std::to_string(il));
}

Tensor * KvCache::v_cache(Graph & g, int il) const {
    const int s = slot_of_layer_[size_t(il)];
    SPARK_ASSERT(s >= 0);
    return g.external(kv_type_, {kv_row_, page_size_, n_pages_}, v_[size_t(s)]->data(), "v_cache-" + std::to_string(il));
}

}  // namespace spark
