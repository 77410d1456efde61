#include "text/bpe.h"

#include "common/error.h"
#include "text/unicode.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace spark {

namespace {

// FNV-1a is plenty for short token strings and keeps the map deterministic.
uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 1469598103934665603ull;
    for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
    return h ^ (h >> 29);
}

uint64_t hash_pair(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return key;
}

constexpr uint64_t kEmptyKey = ~0ull;
constexpr size_t   kScanLimit = 48;  // words up to this many symbols use the linear scan

}  // namespace

// ------------------------------------------------------------------------------------------------
// StringIdMap

void StringIdMap::reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{0, 0, 0, -1});
    for (const Slot & s : old) {
        if (s.id < 0) continue;
        size_t i = s.hash & (cap - 1);
        while (slots_[i].id >= 0) i = (i + 1) & (cap - 1);
        slots_[i] = s;
    }
}

void StringIdMap::insert(std::string_view key, int32_t id) {
    if ((count_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(8, (count_ + 1) * 2));
    const uint64_t h    = hash_bytes(key);
    const size_t   mask = slots_.size() - 1;
    size_t         i    = h & mask;
    while (slots_[i].id >= 0) {
        const Slot & s = slots_[i];
        if (s.hash == h && s.length == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
            slots_[i].id = id;
            return;
        }
        i = (i + 1) & mask;
    }
    slots_[i] = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), id};
    arena_.append(key);
    ++count_;
}

int32_t StringIdMap::find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h    = hash_bytes(key);
    const size_t   mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot & s = slots_[i];
        if (s.id < 0) return -1;
        if (s.hash == h && s.length == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
            return s.id;
    }
}

// ------------------------------------------------------------------------------------------------
// WordCache

bool WordCache::lookup(std::string_view word, std::vector<int32_t> & out) const {
    Shard & shard = shards_[std::hash<std::string_view>{}(word) % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
}

void WordCache::store(std::string_view word, const int32_t * ids, size_t n) const {
    if (word.size() > kMaxWordBytes) return;
    Shard & shard = shards_[std::hash<std::string_view>{}(word) % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.map.size() >= kShardCapacity) shard.map.clear();
    shard.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

// ------------------------------------------------------------------------------------------------
// BpeModel

BpeModel::BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
                   const std::vector<std::pair<std::string, std::string>> & merges, BpeOptions options)
    : options_(std::move(options)) {
    int32_t max_id = -1;
    vocab_.reserve(vocab.size());
    for (const auto & [token, id] : vocab) {
        if (id < 0) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: negative id %d for token '%s'", id, token.c_str());
        vocab_.insert(token, id);
        max_id = std::max(max_id, id);
    }
    if (max_id >= (1 << 30)) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: token id %d is too large", max_id);
    id_to_token_.resize(size_t(max_id + 1));
    for (auto & [token, id] : vocab) id_to_token_[size_t(id)] = std::move(token);

    if (options_.unk_token) {
        const int32_t id = vocab_.find(*options_.unk_token);
        if (id < 0)
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: unk_token '%s' is not in the vocabulary",
                 options_.unk_token->c_str());
        unk_id_ = id;
    }

    // Merge table, sized for a load factor below 1/2.
    size_t cap = 16;
    while (cap < merges.size() * 2) cap <<= 1;
    merge_keys_.assign(cap, kEmptyKey);
    merge_rules_.assign(cap, MergeRule{0, -1});
    merge_mask_ = cap - 1;
    const std::string & prefix = options_.continuing_subword_prefix;
    std::string merged;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto & [a, b] = merges[rank];
        const int32_t ia = vocab_.find(a), ib = vocab_.find(b);
        if (ia < 0 || ib < 0)
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: merge %zu ('%s' '%s') uses a token that is not in the vocabulary",
                 rank, a.c_str(), b.c_str());
        merged.assign(a);
        // The right part drops its continuing-subword prefix when merged (as HF does).
        const bool strip = !prefix.empty() && b.compare(0, prefix.size(), prefix) == 0;
        merged.append(b, strip ? prefix.size() : 0);
        const int32_t im = vocab_.find(merged);
        if (im < 0)
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: the result of merge %zu ('%s') is not in the vocabulary", rank,
                 merged.c_str());
        const uint64_t key = (uint64_t(uint32_t(ia)) << 32) | uint32_t(ib);
        size_t i = hash_pair(key) & merge_mask_;
        while (merge_keys_[i] != kEmptyKey && merge_keys_[i] != key) i = (i + 1) & merge_mask_;
        if (merge_keys_[i] == key) continue;  // a duplicate merge keeps its first (lowest) rank
        merge_keys_[i]  = key;
        merge_rules_[i] = MergeRule{uint32_t(rank), im};
    }

    const auto & alphabet = unicode::byte_to_codepoint();
    std::string ch;
    for (int b = 0; b < 256; ++b) {
        ch.clear();
        unicode::append_utf8(ch, alphabet[size_t(b)]);
        byte_ids_[b] = vocab_.find(ch);
    }
}

std::string_view BpeModel::id_to_token(int32_t id) const {
    if (id < 0 || size_t(id) >= id_to_token_.size()) return {};
    return id_to_token_[size_t(id)];
}

const BpeModel::MergeRule * BpeModel::find_merge(int32_t left, int32_t right) const {
    const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    for (size_t i = hash_pair(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
        if (merge_keys_[i] == key) return &merge_rules_[i];
        if (merge_keys_[i] == kEmptyKey) return nullptr;
    }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t> & symbols) const {
    // Unknown characters become unk (fused when fuse_unk) or are dropped when there is no unk token.
    bool pending_unk = false;
    auto flush_unk   = [&] {
        if (pending_unk) symbols.push_back(*unk_id_);
        pending_unk = false;
    };
    auto unknown = [&] {
        if (!unk_id_) return;
        if (!(pending_unk && options_.fuse_unk)) flush_unk();
        pending_unk = true;
    };
    const bool plain_bytes = options_.byte_level && options_.continuing_subword_prefix.empty() &&
                             options_.end_of_word_suffix.empty();
    if (plain_bytes) {
        for (char c : word) {
            const int32_t id = byte_ids_[uint8_t(c)];
            if (id >= 0) {
                flush_unk();
                symbols.push_back(id);
            } else {
                unknown();
            }
        }
        flush_unk();
        return;
    }

    // General path on the model-form text: one symbol per character, with prefix/suffix.
    std::string mapped;
    std::string_view text = word;
    if (options_.byte_level) {
        const auto & alphabet = unicode::byte_to_codepoint();
        for (char c : word) unicode::append_utf8(mapped, alphabet[uint8_t(c)]);
        text = mapped;
    }
    std::string s;
    size_t i = 0;
    while (i < text.size()) {
        const size_t start = i;
        unicode::next_codepoint(text, i);
        s.clear();
        if (start > 0) s += options_.continuing_subword_prefix;
        s.append(text.substr(start, i - start));
        if (i == text.size()) s += options_.end_of_word_suffix;
        const int32_t id = vocab_.find(s);
        if (id >= 0) {
            flush_unk();
            symbols.push_back(id);
            continue;
        }
        if (options_.byte_fallback) {
            bool all = true;
            const size_t before = symbols.size();
            char name[8];
            for (size_t k = start; k < i; ++k) {
                std::snprintf(name, sizeof name, "<0x%02X>", unsigned(uint8_t(text[k])));
                const int32_t bid = vocab_.find(name);
                if (bid < 0) {
                    all = false;
                    break;
                }
                symbols.push_back(bid);
            }
            if (all) continue;
            symbols.resize(before);
        }
        unknown();
    }
    flush_unk();
}

void BpeModel::merge_with_scan(std::vector<int32_t> & sym) const {
    // Short words: find the best pair by scanning, merge in place.
    while (sym.size() > 1) {
        uint32_t best_rank = UINT32_MAX;
        size_t   best_pos  = 0;
        int32_t  best_id   = -1;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            const MergeRule * m = find_merge(sym[i], sym[i + 1]);
            if (m && m->rank < best_rank) {
                best_rank = m->rank;
                best_pos  = i;
                best_id   = m->new_id;
            }
        }
        if (best_id < 0) return;
        sym[best_pos] = best_id;
        sym.erase(sym.begin() + std::ptrdiff_t(best_pos) + 1);
    }
}

void BpeModel::merge_with_heap(std::vector<int32_t> & sym) const {
    // Long words: a linked list of symbols and a min-heap of candidate merges ordered by
    // (rank, position), with stale entries skipped when popped (HF's Word::merge_all).
    struct Node {
        int32_t id, prev, next;
    };
    struct Candidate {
        uint32_t rank;
        int32_t  pos, new_id;
        bool operator>(const Candidate & o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    const int32_t n = int32_t(sym.size());
    std::vector<Node> nodes(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) nodes[size_t(i)] = Node{sym[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1};
    std::vector<Candidate> heap;
    auto push = [&](int32_t pos) {
        const int32_t next = nodes[size_t(pos)].next;
        if (next < 0) return;
        if (const MergeRule * m = find_merge(nodes[size_t(pos)].id, nodes[size_t(next)].id)) {
            heap.push_back(Candidate{m->rank, pos, m->new_id});
            std::push_heap(heap.begin(), heap.end(), std::greater<>{});
        }
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> removed(size_t(n), false);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
        const Candidate top = heap.back();
        heap.pop_back();
        Node & cur = nodes[size_t(top.pos)];
        if (removed[size_t(top.pos)] || cur.next < 0) continue;
        const MergeRule * m = find_merge(cur.id, nodes[size_t(cur.next)].id);
        if (!m || m->new_id != top.new_id) continue;  // stale
        const int32_t right = cur.next;
        cur.id              = top.new_id;
        cur.next            = nodes[size_t(right)].next;
        removed[size_t(right)] = true;
        if (cur.next >= 0) nodes[size_t(cur.next)].prev = top.pos;
        if (cur.prev >= 0) push(cur.prev);
        push(top.pos);
    }
    sym.clear();
    for (int32_t i = 0; i >= 0 && i < n; i = nodes[size_t(i)].next) sym.push_back(nodes[size_t(i)].id);
}

void BpeModel::merge_symbols(std::vector<int32_t> & symbols, bool use_heap) const {
    if (use_heap) merge_with_heap(symbols);
    else merge_with_scan(symbols);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t> & out) const {
    if (word.empty()) return;
    if (cache_.lookup(word, out)) return;
    const size_t start = out.size();
    bool done = false;
    if (options_.ignore_merges) {
        // A word that is itself a token is emitted whole, before any merging.
        int32_t id;
        if (options_.byte_level) {
            std::string mapped;
            const auto & alphabet = unicode::byte_to_codepoint();
            for (char c : word) unicode::append_utf8(mapped, alphabet[uint8_t(c)]);
            id = vocab_.find(mapped);
        } else {
            id = vocab_.find(word);
        }
        if (id >= 0) {
            out.push_back(id);
            done = true;
        }
    }
    if (!done) {
        thread_local std::vector<int32_t> symbols;
        symbols.clear();
        initial_symbols(word, symbols);
        merge_symbols(symbols, symbols.size() > kScanLimit);
        out.insert(out.end(), symbols.begin(), symbols.end());
    }
    cache_.store(word, out.data() + start, out.size() - start);
}

}  // namespace spark
