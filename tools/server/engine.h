// The server's decode loop: one thread owns the spark context and runs every sequence of every
// slot in one batch per step (continuous batching). HTTP threads submit requests and read their
// tokens as events; they never touch the context.
//
// A step holds one row for each answering slot (its last sampled token) and, in the room left in
// n_batch, a chunk of each new request's prompt, so a long prompt does not stop the running
// streams. A new request takes the idle slot whose cached tokens share the longest prefix with its
// prompt and decodes only the rest. Models with linear-attention layers cannot cut their recurrent
// state back to an arbitrary position: their slots keep snapshots at a prompt's last block
// boundary and at its end, and a reused prefix starts from the latest snapshot inside it. Models
// with attention layers only can also start from a copy of another slot's sequence (a shared system
// prompt), so that the slot holding it keeps its own conversation.
#pragma once

#include <spark/spark.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace spark_server {

struct SamplingParams {
    float                                  temperature     = 0.8f;  // <= 0: greedy
    int32_t                                top_k           = 40;
    float                                  top_p           = 0.95f;
    float                                  min_p           = 0.05f;
    float                                  presence        = 0.0f;
    float                                  frequency       = 0.0f;
    float                                  repeat_penalty  = 1.0f;
    int32_t                                repeat_last_n   = 64;
    uint32_t                               seed            = 0;
    std::vector<std::pair<spark_token, float>> logit_bias;
};

struct GenerationParams {
    std::vector<spark_token> prompt;
    int32_t                  max_tokens = -1;  // -1: until the slot's context is full
    std::vector<std::string> stop;            // stop strings (not part of the answer)
    SamplingParams           sampling;
    int32_t                  logprobs = -1;   // -1: none; else the top alternatives per token (0 .. 20)
};

struct TopLogprob {
    spark_token token;
    float       logprob;
};
struct TokenLogprob {
    spark_token             token;
    float                   logprob;
    std::vector<TopLogprob> top;
};

// What the engine tells a request's reader: answer text as it becomes final (stop strings cut,
// never half a UTF-8 character) and, at the end, why it ended.
struct Event {
    std::string               text;
    std::vector<TokenLogprob> logprobs;  // of the tokens generated since the previous event
};

struct Usage {
    int32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    double  prompt_ms = 0, generation_ms = 0;
};

// One request's state, shared by the engine thread and the HTTP thread that waits on it.
class Request {
public:
    explicit Request(GenerationParams p) : params(std::move(p)) {}
    const GenerationParams params;

    // Reader side: waits until there is an event, the request finished, or `deadline` passed.
    // Returns the events taken (empty when only finished / timed out).
    std::vector<Event> wait(std::chrono::steady_clock::time_point deadline);
    bool               finished() const;
    std::string        finish_reason() const;  // "stop", "length"; "" while running or on error
    std::string        error() const;          // non-empty when the request failed
    Usage              usage() const;
    // The client went away or stopped: the engine frees the slot at its next step.
    void               cancel() { cancelled_.store(true); }
    bool               cancelled() const { return cancelled_.load(); }

    // Engine side.
    void push(Event e);
    void finish(const std::string & reason, const Usage & u);
    void fail(const std::string & error, const Usage & u);

private:
    mutable std::mutex      mu_;
    std::condition_variable cv_;
    std::deque<Event>       events_;
    bool                    done_ = false;
    std::string             reason_, error_;
    Usage                   usage_;
    std::atomic<bool>       cancelled_{false};
};

struct EngineOptions {
    int32_t n_parallel  = 4;    // slots: sequences decoded together
    int32_t n_ctx_slot  = 0;    // tokens per slot (prompt + answer)
    int32_t n_batch     = 512;  // rows per step
    int32_t max_queue   = 64;   // requests waiting for a slot; more are refused (overload)
    spark_spec * spec   = nullptr;  // speculative decoding (attached to the context), or none
};

struct EngineStats {
    int64_t requests_total = 0, requests_failed = 0, requests_cancelled = 0, requests_rejected = 0;
    int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0, steps = 0;
    int32_t running = 0, queued = 0;
    double  generated_per_s = 0;  // answer tokens per second over the last few seconds
};

class Engine {
public:
    // ctx must have n_seq_max >= n_parallel and room for n_parallel * n_ctx_slot tokens.
    Engine(spark_model * model, spark_context * ctx, EngineOptions opt);
    ~Engine();
    Engine(const Engine &)             = delete;
    Engine & operator=(const Engine &) = delete;

    // Ends every request (they fail with "the server is shutting down") and stops the loop; later
    // submissions are refused. The destructor does it too.
    void shutdown();
    // Queues a request; nullptr when the queue is full or the engine stopped (the caller answers
    // "overloaded"). A prompt that is empty or does not leave room for an answer in a slot comes back
    // already failed.
    std::shared_ptr<Request> submit(GenerationParams params);
    EngineStats              stats() const;
    const EngineOptions &    options() const { return opt_; }

private:
    struct Slot;
    struct Admission {
        Slot *                   slot;
        std::shared_ptr<Request> req;
        Slot *                   copy_from;  // start from a copy of this slot's sequence (or nullptr)
    };
    void loop();
    void admit(Slot & slot, std::shared_ptr<Request> req);
    void step();
    void spec_begin(Slot & slot);
    void spec_step();
    // Samples row `row` of the last step for `slot` and takes the token.
    void emit_token(Slot & slot, int32_t row, std::chrono::steady_clock::time_point now);
    // One answer token: its text out (stop strings cut, held back while they may still match), or
    // the end (end of turn, stop string, max_tokens, the slot's context). False when it ended.
    bool take_token(Slot & slot, spark_token t, const TokenLogprob * lp, std::chrono::steady_clock::time_point now);
    void end(Slot & slot, const std::string & reason, const std::string & error);  // error "": finished for `reason`
    void release(Slot & slot);
    void take_snapshot(Slot & slot, int which, int32_t pos);

    spark_model *             model_;
    spark_context *           ctx_;
    const spark_tokenizer *   tok_;
    EngineOptions             opt_;
    int32_t                   n_vocab_   = 0;
    bool                      recurrent_ = false;  // linear-attention layers: reuse through snapshots
    uint64_t                  use_counter_ = 0;    // slot recency (LRU among equal prefixes)
    std::vector<std::unique_ptr<Slot>> slots_;
    spark_batch               batch_{};

    mutable std::mutex                   mu_;
    std::condition_variable              cv_;
    std::deque<std::shared_ptr<Request>> queue_;
    bool                                 stop_ = false;
    EngineStats                          stats_;
    std::deque<std::pair<std::chrono::steady_clock::time_point, int32_t>> recent_;  // (step end, tokens) for the rate
    std::thread                          thread_;
};

}  // namespace spark_server
