// Speculative decoding: the interface every draft source implements, and what the loop
// (speculator.h) tells it about the sequences it speculates on.
//
// The loop, per sequence: the target's cache holds the sequence but its last emitted token (the
// "pending" token, decoded by the next verify step). A step asks the source for up to k drafts,
// runs one target step over [pending, drafts...], keeps the drafts the acceptance rule accepts plus
// the target's own next token, and cuts the rejected rows from the target's memory (an exact cut:
// Memory keeps the recurrent states of the last n_rollback positions). Sources:
//   draft_model.cpp  a second, smaller model with the same vocabulary (its own context)
//   heads.cpp        an EAGLE3 head or Qwen3-Next's MTP head, fed the target's hidden states
//   ngram.cpp        prompt lookup: the continuation of the latest earlier match of the last n tokens
// Model-based sources keep their drafts on the backend: the verify step reads them from there and
// the host sees them only with the verdict (one synchronisation per step).
#pragma once

#include "runtime/context.h"

#include <spark/spark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spark::spec {

// What the loop knows of one sequence.
struct SeqState {
    std::vector<int32_t> tokens;          // the target's cached tokens, then the pending token if any
    bool                 pending = false;
    bool                 begun   = false;
    // After begin(): the prompt's last logits and greedy token, for the first token of the answer.
    std::vector<float> first_logits;
    int32_t            first_greedy = -1;

    int32_t cached() const { return int32_t(tokens.size()) - (pending ? 1 : 0); }
};

// Rows of a target step that belong to one sequence: rows [first, first + count) at positions
// pos0, pos0 + 1, ...
struct Span {
    int32_t seq, first, count, pos0;
};

// The drafts of one step: sequence i of the step gets n[i] tokens, at host[i * k + j] or, on the
// backend, at device[i * k + j].
struct Drafts {
    int32_t              k = 0;
    std::vector<int32_t> n;
    std::vector<int32_t> host;
    const int32_t *      device = nullptr;
};

class DraftSource {
public:
    virtual ~DraftSource() = default;
    virtual const char * name() const = 0;

    // Hidden states the target's steps must output for this source (heads).
    virtual HiddenCapture capture() const { return {}; }

    // begin() wants the target to keep the first `common` tokens of `seq`: the most this source
    // can go along with (a head needs the hidden state of the last kept position).
    virtual int32_t keep(int32_t seq, int32_t common) const { return common; }
    // The target's cache of `seq` now holds its first `len` tokens: forget what lies beyond.
    virtual void truncate(int32_t seq, int32_t len) = 0;
    // The target ran a prompt step of begin(); st[i] is the state of spans[i].seq.
    virtual void prefilled(const Context & target, const std::vector<Span> & spans, const std::vector<const SeqState *> & st) {}
    // Up to k[i] drafts for sequence seqs[i] (each has a pending token; k[i] may be 0). p_min > 0:
    // stop a sequence's drafts at the first token the drafter gives less probability.
    virtual void draft(const std::vector<const SeqState *> & st, const std::vector<int32_t> & seqs, const std::vector<int32_t> & k,
                       int32_t k_max, float p_min, Drafts & out) = 0;
    // The target verified: spans of its verify step, and how many of each span's rows the target
    // kept (the pending token and the accepted drafts).
    virtual void verified(const Context & target, const std::vector<Span> & spans, const std::vector<int32_t> & kept) {}
};

struct SourceOptions {
    spark_spec_kind kind;
    std::string     path;
    int32_t         k_max;
    int32_t         ngram_min, ngram_max;
};

// Throws SPARK_ERR_INVALID_ARGUMENT / SPARK_ERR_UNSUPPORTED (a head or draft that does not fit the
// target, no MTP head), the loading errors of spark_model_load.
std::unique_ptr<DraftSource> make_draft_model_source(Context & target, const SourceOptions & o);
std::unique_ptr<DraftSource> make_head_source(Context & target, const SourceOptions & o);
std::unique_ptr<DraftSource> make_ngram_source(const SourceOptions & o);

// The probability of the most likely token of a row of logits (p_min checks).
float top_probability(const float * logits, int64_t n);

}  // namespace spark::spec
