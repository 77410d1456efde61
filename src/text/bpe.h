// Byte-pair encoding model: vocabulary, ranked merges and the merge loop, with a per-word cache.
// Semantics follow Hugging Face tokenizers' BPE model (models/bpe/model.rs) exactly: the lowest
// ranked adjacent pair merges first, ties go to the leftmost pair.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spark {

// Open-addressing map from token strings to ids; the strings live in one arena.
class StringIdMap {
public:
    void    reserve(size_t n);
    void    insert(std::string_view key, int32_t id);  // replaces the id of an existing key
    int32_t find(std::string_view key) const;         // -1 when absent
    size_t  size() const { return count_; }

private:
    struct Slot {
        uint64_t hash;
        uint32_t offset, length;
        int32_t  id;  // -1: empty
    };
    std::vector<Slot> slots_;
    std::string       arena_;
    size_t            count_ = 0;
};

// Bounded, thread-safe cache of BPE results per pre-token word. Sharded so that threads encoding
// at the same time rarely contend; a full shard is simply cleared.
class WordCache {
public:
    bool lookup(std::string_view word, std::vector<int32_t> & out) const;  // appends on a hit
    void store(std::string_view word, const int32_t * ids, size_t n) const;

    static constexpr size_t kMaxWordBytes = 128;

private:
    static constexpr size_t kShards = 16, kShardCapacity = 4096;
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
    };
    struct Shard {
        std::mutex                                                                  mutex;
        std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
    };
    mutable Shard shards_[kShards];
};

struct BpeOptions {
    std::optional<std::string> unk_token;
    std::string                continuing_subword_prefix;
    std::string                end_of_word_suffix;
    bool                       fuse_unk      = false;
    bool                       byte_fallback = false;
    bool                       ignore_merges = false;
    bool                       byte_level    = false;  // input words are raw bytes of a ByteLevel pre-tokenizer
};

class BpeModel {
public:
    // vocab: (token string, id) pairs; merges: (left, right) token strings in rank order.
    // Throws Error(SPARK_ERR_INVALID_FORMAT) for merges whose parts or result are not in the vocab.
    BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
             const std::vector<std::pair<std::string, std::string>> & merges, BpeOptions options);

    // Appends the ids of one pre-token word. With options.byte_level the word is raw bytes (the
    // byte-to-unicode mapping is folded into the initial symbols); otherwise it is model text.
    void tokenize(std::string_view word, std::vector<int32_t> & out) const;

    int32_t             token_to_id(std::string_view token) const { return vocab_.find(token); }
    // Model-form token string of an id ("" for ids not in the vocabulary).
    std::string_view    id_to_token(int32_t id) const;
    int32_t             max_id() const { return int32_t(id_to_token_.size()) - 1; }
    size_t              vocab_size() const { return vocab_.size(); }  // distinct entries (HF get_vocab_size)
    const BpeOptions &  options() const { return options_; }

    // The merge loop on given initial symbols, with either strategy (exposed so tests can check
    // that the linear scan used for short words agrees with the heap used for long ones).
    void merge_symbols(std::vector<int32_t> & symbols, bool use_heap) const;

private:
    struct MergeRule {
        uint32_t rank;
        int32_t  new_id;
    };
    const MergeRule * find_merge(int32_t left, int32_t right) const;
    void              initial_symbols(std::string_view word, std::vector<int32_t> & symbols) const;
    void              merge_with_scan(std::vector<int32_t> & symbols) const;
    void              merge_with_heap(std::vector<int32_t> & symbols) const;

    StringIdMap              vocab_;
    std::vector<std::string> id_to_token_;
    // Open-addressing table: key = (left << 32) | right.
    std::vector<uint64_t>    merge_keys_;
    std::vector<MergeRule>   merge_rules_;
    uint64_t                 merge_mask_ = 0;
    int32_t                  byte_ids_[256];  // byte-level: id of each byte's alphabet character, -1 if absent
    std::optional<int32_t>   unk_id_;
    BpeOptions               options_;
    WordCache                cache_;
};

}  // namespace spark
