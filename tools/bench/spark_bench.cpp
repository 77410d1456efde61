// spark-bench: prefill and decode speed the way users measure it (like llama-bench), for a model
// file or directory, or for synthetic models with the exact shapes of Qwen3-8B, Qwen3-30B-A3B and
// Qwen3-Next-80B-A3B in each weight format (random weights generated on the device).
//
//   spark-bench --synthetic qwen3-30b-a3b --format int4,nvfp4 -d 0,2048 [-p 512] [-n 128] [-r 5] [-o md|csv|json]
//   spark-bench -m /path/to/model [--device cuda]
//   spark-bench --synthetic qwen3-8b --format int4 --context-matrix
//   spark-bench -m /path/to/model --spec draft:/path/to/draft [--draft-max 3]
//   spark-bench --synthetic qwen3-8b --spec ngram --spec-sim-accept 0.84,0.53
//   spark-bench --synthetic qwen3-30b-a3b --parallel 1,4,16,64 -p 0
//
// pp<P>: tokens/s of one P-token prefill on top of a context of depth d. tg<N>: tokens/s of N
// single-token decode steps with greedy sampling (on the device) starting at depth d. Each figure is
// the median of r runs. For decode it also prints the bytes one step must read (weights actually
// touched, incl. the routed experts, + the KV cache at the mean depth + the recurrent state read and
// written) and the fraction of the device's measured copy bandwidth this speed implies.
//
// --parallel N1,N2,... adds, after each tg<N>, rows "tg<N> xK streams": K sequences at depth d decoded
// together, one row each per step (a server's continuous batch); the figure is the aggregate
// tokens/s of all K.
//
// --spec KIND[:PATH] (draft:PATH, eagle3:PATH, mtp, ngram) adds, after each tg<N>, a row for
// speculative decoding (spark_spec_*, greedy, in a context of its own): tokens/s of N tokens (the
// spark_spec_step calls only: the prompt is decoded untimed), the speed-up over that tg<N>, the
// tokens one verify step yields and the acceptance at each draft position; and the verify cost: the
// time of one target step of k + 1 rows over one of 1 row at the same depth (what a draft must beat).
// --spec-sim-accept p1,p2,... replaces the acceptance by chance at those per-position rates (as
// vLLM reports them), so a speed-up can be measured for a drafter that is not at hand: the work per
// step is real, the tokens are not the model's (rows marked "simulated").
//
//   spark-bench -m /path/to/model --load [-r N] [--cold] [--device cuda]
//
// --load measures a start instead: N times, the wall time of spark_model_load (load s) and, from the
// same start, the time until the first token is out (first token s: a context, a 1-token prompt
// decoded, its greedy token sampled), then everything is freed. It reports the bytes of the
// model's files (the safetensors shards or the spark file: what a load reads) over the load time,
// the share of those files' pages in the page cache when the run began (mincore) and the
// high-water mark of the process's resident memory during the run (VmHWM, reset before each run
// through /proc/self/clear_refs): a load must not hold a second copy of the model in host memory.
// --cold evicts the files from the page cache before each run, without root
// (posix_fadvise(POSIX_FADV_DONTNEED) on each file of the model); pages another process maps or
// that the kernel keeps anyway stay, which the cached % column shows. A cold start proper also needs,
// as root: sync; echo 3 > /proc/sys/vm/drop_caches. Synthetic models have no files: --load refuses
// them.
//
// --device defaults to cuda when a CUDA device is visible (spark_cuda_device_count), else cpu. -o
// picks the output: md (a Markdown table, the default), csv (one header line, one line per figure,
// RFC 4180 quoting) or json (--json is -o json); the messages go to stderr.
//
// The exit status is 0 when everything asked for ran, 1 when something failed (a model that did not
// load: a missing path, an unknown synthetic shape or format; --device cuda without a CUDA device; a
// run or a --spec row that could not be measured), 2 for bad options (a value that is not a number,
// options that do not go together).
#include <spark/spark.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "parse_args.h"
#include "../convert/synthetic_shapes.h"
#include "load_progress.h"
#include "log_stderr.h"
#include "spec_cli.h"
#include "split_cli.h"
#include "version.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream        ss(s);
    std::string              item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

// A comma list of non-negative integers (-d/--depth: "0,512,2048"); empty items are skipped. False
// with a message naming the flag and the bad value otherwise.
bool parse_count_list(const char * flag, const std::string & text, std::vector<int> & out, std::string & error) {
    out.clear();
    for (const std::string & item : split(text)) {
        int                          v   = 0;
        const char *                 end = item.data() + item.size();
        const std::from_chars_result r   = std::from_chars(item.data(), end, v);
        if (r.ec != std::errc() || r.ptr != end || v < 0) {
            error = std::string(flag) + ": '" + item + "' is " + (r.ec == std::errc::result_out_of_range ? "out of range" : "not a non-negative integer") +
                    " (expected e.g. 0,512,2048)";
            return false;
        }
        out.push_back(v);
    }
    if (out.empty()) {
        error = std::string(flag) + ": no value in '" + text + "' (expected e.g. 0,512,2048)";
        return false;
    }
    return true;
}

enum class Output { Md, Csv, Json };

// A string as a JSON string literal's contents.
std::string json_escape(const std::string & s) {
    std::string out;
    for (const char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
            out += buf;
        } else out += c;
    }
    return out;
}

// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string & s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string out = "\"";
    for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

std::string fmt(const char * format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

struct Stat {
    double median = 0, stdev = 0;
};

Stat stat_of(std::vector<double> v) {
    Stat s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.median    = v[v.size() / 2];
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    for (double x : v) s.stdev += (x - mean) * (x - mean);
    s.stdev = std::sqrt(s.stdev / double(v.size()));
    return s;
}

struct Result {
    std::string model, format, test;
    int         depth = 0;
    Stat        tps;
    double      step_bytes = 0, bw_fraction = 0;
    // Speculative rows only:
    bool                spec = false, simulated = false;
    std::string         spec_kind;
    int32_t             n_draft_max = 0;
    double              speedup = 0, tokens_per_step = 0, verify_ratio = 0;
    std::vector<double> acceptance;  // per draft position; < 0 where nothing was drafted
};

// The pseudo-random prompt token at position p (the same for plain and speculative runs).
int32_t prompt_token(int p, int32_t n_vocab) { return int32_t((uint64_t(p) * 2654435761u + 12345u) % uint64_t(n_vocab)); }

class Bench {
public:
    Bench(spark_model * m, int32_t n_ctx, int32_t n_batch, int32_t n_threads) {
        spark_model_get_info(m, &info_);
        spark_context_params cp = spark_context_default_params();
        cp.n_threads            = n_threads;
        cp.n_ctx                = n_ctx;
        cp.n_batch              = n_batch;
        cp.n_snapshots          = 1;
        if (spark_context_init(m, cp, &ctx_) != SPARK_OK) throw std::runtime_error(std::string("context: ") + spark_last_error());
        batch_ = spark_batch_init(n_batch, 1);
    }
    ~Bench() {
        spark_sampler_free(greedy_);
        spark_batch_free(batch_);
        spark_context_free(ctx_);
    }
    const spark_model_info & info() const { return info_; }

    // Fills the context to `depth` tokens (untimed) and snapshots that state.
    void prepare(int depth) {
        if (snapshot_ >= 0) spark_memory_snapshot_free(ctx_, snapshot_);
        spark_memory_clear(ctx_);
        for (int done = 0; done < depth;) {
            const int n = std::min(depth - done, batch_capacity());
            decode_span(done, n, false);
            done += n;
        }
        check(spark_memory_seq_snapshot(ctx_, 0, &snapshot_), "snapshot");
        depth_ = depth;
    }

    double prefill_tps(int n) {
        restore();
        const auto t0 = Clock::now();
        decode_span(depth_, n, true);
        spark_token t;
        check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");  // waits for the step
        return n / std::chrono::duration<double>(Clock::now() - t0).count();
    }

    // Seconds of one target step of `rows` tokens at the prepared depth with logits for every row and
    // their greedy tokens (what a greedy verify step reads), the median of `iters` (state restored
    // between them).
    double step_seconds(int rows, int iters) {
        std::vector<double> t;
        for (int it = 0; it <= iters; ++it) {  // the first one warms up
            restore();
            for (int i = 0; i < rows; ++i) {
                batch_.token[i]     = prompt_token(depth_ + i, info_.n_vocab);
                batch_.pos[i]       = depth_ + i;
                batch_.n_seq_id[i]  = 1;
                batch_.seq_id[i][0] = 0;
                batch_.logits[i]    = 1;
            }
            batch_.n_tokens = rows;
            const auto t0   = Clock::now();
            check(spark_decode(ctx_, &batch_), "decode");
            for (int i = 0; i < rows; ++i)
                if (spark_get_argmax_ith(ctx_, i) < 0) throw std::runtime_error("no greedy token for a verify row");
            if (it > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        return stat_of(t).median;
    }

    double decode_tps(int n) {
        restore();
        decode_span(depth_, 1, true);  // the first token's logits (not timed: part of prefill)
        const auto t0 = Clock::now();
        spark_token t;
        for (int i = 0; i < n; ++i) {
            check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");
            batch_.n_tokens     = 1;
            batch_.token[0]     = t;
            batch_.pos[0]       = depth_ + 1 + i;
            batch_.n_seq_id[0]  = 1;
            batch_.seq_id[0][0] = 0;
            batch_.logits[0]    = 1;
            check(spark_decode(ctx_, &batch_), "decode");
        }
        check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");
        return n / std::chrono::duration<double>(Clock::now() - t0).count();
    }

private:
    int batch_capacity() const { return 512; }
    spark_sampler * greedy() {
        if (!greedy_) greedy_ = spark_sampler_init_greedy();
        return greedy_;
    }
    void restore() { check(spark_memory_seq_restore(ctx_, 0, snapshot_), "restore"); }
    static void check(spark_status st, const char * what) {
        if (st != SPARK_OK) throw std::runtime_error(std::string(what) + ": " + spark_last_error());
    }
    // Decodes tokens at positions [pos, pos + n) (pseudo-random ids), logits for the last only.
    void decode_span(int pos, int n, bool last_logits) {
        for (int done = 0; done < n;) {
            const int m = std::min(n - done, batch_capacity());
            for (int i = 0; i < m; ++i) {
                const int p          = pos + done + i;
                batch_.token[i]      = prompt_token(p, info_.n_vocab);
                batch_.pos[i]        = p;
                batch_.n_seq_id[i]   = 1;
                batch_.seq_id[i][0]  = 0;
                batch_.logits[i]     = last_logits && done + i == n - 1;
            }
            batch_.n_tokens = m;
            check(spark_decode(ctx_, &batch_), "decode");
            done += m;
        }
    }

    spark_model_info info_{};
    spark_context *  ctx_ = nullptr;
    spark_batch      batch_{};
    spark_sampler *  greedy_ = nullptr;
    int32_t          snapshot_ = -1;
    int              depth_    = 0;
};

// Batched decode (what a server with N concurrent streams runs): N sequences, each filled to the
// depth (untimed), then steps of N rows, one per sequence, each row's greedy token fed back. The
// figure is the aggregate: N * steps / time. In a context of its own (N sequences).
class ParallelBench {
public:
    ParallelBench(spark_model * m, int32_t n_seqs, int32_t depth, int32_t n_gen, int32_t n_threads) : n_(n_seqs), depth_(depth) {
        spark_model_get_info(m, &info_);
        spark_context_params cp = spark_context_default_params();
        cp.n_threads            = n_threads;
        cp.n_seq_max            = n_seqs;
        cp.n_ctx                = n_seqs * (depth + n_gen + 16);
        cp.n_batch              = std::max(512, n_seqs);
        cp.n_snapshots          = 0;
        if (spark_context_init(m, cp, &ctx_) != SPARK_OK) throw std::runtime_error(std::string("context: ") + spark_last_error());
        batch_ = spark_batch_init(cp.n_batch, 1);
    }
    ~ParallelBench() {
        spark_batch_free(batch_);
        spark_context_free(ctx_);
    }

    // Aggregate tokens/s of n steps of n_ seqs (each sequence starts again at depth + 1 tokens).
    double tps(int n) {
        spark_memory_clear(ctx_);
        std::vector<spark_token> next(static_cast<size_t>(n_));
        for (int32_t s = 0; s < n_; ++s) {  // the prompts: depth + 1 tokens each, the last one's logits
            for (int done = 0; done <= depth_;) {
                const int m = std::min(depth_ + 1 - done, 512);
                batch_.n_tokens = 0;
                for (int i = 0; i < m; ++i) add(s, (done + i + 7 * s) % info_.n_vocab, done + i, done + i == depth_);
                check(spark_decode(ctx_, &batch_), "decode");
                done += m;
            }
            next[size_t(s)] = spark_get_argmax_ith(ctx_, -1);
        }
        const auto t0 = Clock::now();
        for (int step = 0; step < n; ++step) {
            batch_.n_tokens = 0;
            for (int32_t s = 0; s < n_; ++s) add(s, next[size_t(s)], depth_ + 1 + step, true);
            check(spark_decode(ctx_, &batch_), "decode");
            for (int32_t s = 0; s < n_; ++s) next[size_t(s)] = spark_get_argmax_ith(ctx_, s);  // waits for the step
        }
        return double(n) * n_ / std::chrono::duration<double>(Clock::now() - t0).count();
    }

private:
    void add(int32_t seq, spark_token t, int pos, bool logits) {
        const int i         = batch_.n_tokens++;
        batch_.token[i]     = t;
        batch_.pos[i]       = pos;
        batch_.n_seq_id[i]  = 1;
        batch_.seq_id[i][0] = seq;
        batch_.logits[i]    = logits;
    }
    static void check(spark_status st, const char * what) {
        if (st != SPARK_OK) throw std::runtime_error(std::string(what) + ": " + spark_last_error());
    }
    spark_model_info info_{};
    spark_context *  ctx_ = nullptr;
    spark_batch      batch_{};
    int32_t          n_ = 1;
    int              depth_ = 0;
};

// Speculative decoding in a context of its own (the loop makes its context's steps output hidden
// states and keep recurrent states for rollback: the plain figures stay those of plain decoding).
class SpecBench {
public:
    SpecBench(spark_model * m, int32_t n_ctx, int32_t n_threads, const spark_spec_params & sp) {
        spark_model_get_info(m, &info_);
        spark_context_params cp = spark_context_default_params();
        cp.n_threads            = n_threads;
        cp.n_ctx                = n_ctx;
        cp.n_snapshots          = 0;
        if (spark_context_init(m, cp, &ctx_) != SPARK_OK) throw std::runtime_error(std::string("context: ") + spark_last_error());
        if (spark_spec_init(ctx_, sp, &spec_) != SPARK_OK) {
            const std::string e = spark_last_error();
            spark_context_free(ctx_);
            throw std::runtime_error(e);
        }
        greedy_ = spark_sampler_init_greedy();
    }
    ~SpecBench() {
        spark_sampler_free(greedy_);
        spark_spec_free(spec_);
        spark_context_free(ctx_);
    }

    // Tokens/s of n tokens after a prompt of depth + 1 tokens (as tg: the context holds `depth`
    // tokens, the first answer token comes from the prompt's logits and is not counted). The
    // prompt (spark_spec_begin: only what changed since the last run, or all of it for recurrent
    // models) is not timed. Adds this run's acceptance counts to `acc`.
    double tps(int depth, int n, spark_spec_stats & acc) {
        std::vector<spark_token> prompt(size_t(depth) + 1);
        for (int p = 0; p <= depth; ++p) prompt[size_t(p)] = prompt_token(p, info_.n_vocab);
        if (!chat_prompt_.empty()) prompt = chat_prompt_;  // --prompt: acceptance on a real answer
        check(spark_spec_begin(spec_, 0, prompt.data(), int32_t(prompt.size())), "spark_spec_begin");
        spark_spec_reset_stats(spec_);
        spark_token  out[SPARK_SPEC_MAX_DRAFT + 2];
        spark_seq_id seq  = 0;
        int          made = -1;  // the first token is the prompt's
        const auto   t0   = Clock::now();
        while (made < n) {
            int32_t n_out = 0;
            check(spark_spec_step(spec_, 1, &seq, &greedy_, out, SPARK_SPEC_MAX_DRAFT + 2, &n_out), "spark_spec_step");
            made += n_out;  // an end-of-generation token ends nothing here: the next step goes on
        }
        const double     t = std::chrono::duration<double>(Clock::now() - t0).count();
        spark_spec_stats s{};
        check(spark_spec_get_stats(spec_, &s), "spark_spec_get_stats");
        acc.n_steps += s.n_steps;
        acc.n_drafted += s.n_drafted;
        acc.n_accepted += s.n_accepted;
        for (int i = 0; i < SPARK_SPEC_MAX_DRAFT; ++i) {
            acc.drafted_at[i] += s.drafted_at[i];
            acc.accepted_at[i] += s.accepted_at[i];
        }
        return made / t;  // the last step's tokens beyond n are real tokens too
    }

    // --prompt: the user message rendered with the model's chat template, as spark-chat sends it.
    void set_chat_prompt(spark_model * m, const std::string & text) {
        const spark_tokenizer * tok  = spark_model_get_tokenizer(m);
        const char *            tmpl = tok ? spark_tokenizer_chat_template(tok) : nullptr;
        if (!tmpl) throw std::runtime_error("--prompt needs a model with a tokenizer and a chat template");
        const spark_chat_message msg{"user", text.c_str(), nullptr, nullptr, nullptr};
        std::string              rendered(text.size() + 4096, '\0');
        size_t                   len = 0;
        check(spark_chat_apply_template(tmpl, &msg, 1, true, nullptr, nullptr, nullptr, nullptr, rendered.data(), rendered.size(), &len),
              "chat template");
        rendered.resize(len);
        chat_prompt_.resize(rendered.size() + 16);
        int32_t n = 0;
        check(spark_tokenize(tok, rendered.data(), rendered.size(), true, chat_prompt_.data(), int32_t(chat_prompt_.size()), &n), "tokenize");
        chat_prompt_.resize(size_t(n));
    }

private:
    static void check(spark_status st, const char * what) {
        if (st != SPARK_OK) throw std::runtime_error(std::string(what) + ": " + spark_last_error());
    }
    spark_model_info         info_{};
    spark_context *          ctx_    = nullptr;
    spark_spec *             spec_   = nullptr;
    spark_sampler *          greedy_ = nullptr;
    std::vector<spark_token> chat_prompt_;
};

// ---- --load: the files of a model, the page cache, the process's memory ----

struct ModelFiles {
    std::vector<std::string> weights;  // what a load reads: the safetensors shards or the spark file
    std::vector<std::string> all;      // evicted by --cold: every file of the model (config, tokenizer too)
    uint64_t                 weight_bytes = 0;
};

// The files behind a model path (a directory as spark_model_load reads it, or one file). False with a
// message when the path has none.
bool model_files(const std::string & path, ModelFiles & out, std::string & error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    out = ModelFiles{};
    if (fs::is_directory(path, ec)) {
        for (const fs::directory_entry & e : fs::directory_iterator(path, ec))
            if (e.is_regular_file(ec)) out.all.push_back(e.path().string());
        std::sort(out.all.begin(), out.all.end());
        const fs::path index = fs::path(path) / "model.safetensors.index.json";
        if (fs::exists(index, ec)) {
            std::set<std::string> shards;
            try {
                std::ifstream        in(index);
                const nlohmann::json j = nlohmann::json::parse(in);
                for (const auto & [name, shard] : j.at("weight_map").items()) shards.insert(shard.get<std::string>());
            } catch (const std::exception & e) {
                error = index.string() + ": " + e.what();
                return false;
            }
            for (const std::string & s : shards) out.weights.push_back((fs::path(path) / s).string());
        } else {
            out.weights.push_back((fs::path(path) / "model.safetensors").string());
        }
    } else if (fs::is_regular_file(path, ec)) {
        out.weights.push_back(path);
        out.all.push_back(path);
    } else {
        error = "'" + path + "' is neither a model directory nor a file";
        return false;
    }
    for (const std::string & f : out.weights) {
        const uint64_t n = fs::file_size(f, ec);
        if (ec) {
            error = f + ": " + ec.message();
            return false;
        }
        out.weight_bytes += n;
    }
    return true;
}

// Asks the kernel to drop the files' pages from the page cache (no root needed; it may keep pages
// that are mapped or dirty). False with a message when a file refused.
bool evict_from_page_cache(const std::vector<std::string> & files, std::string & error) {
    bool ok = true;
    for (const std::string & f : files) {
        const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            error += (error.empty() ? "" : "; ") + f + ": " + std::strerror(errno);
            ok = false;
            continue;
        }
        const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // returns the error number
        if (rc != 0) {
            error += (error.empty() ? "" : "; ") + f + ": posix_fadvise: " + std::strerror(rc);
            ok = false;
        }
        close(fd);
    }
    return ok;
}

// The fraction of the files' pages in the page cache (mincore on a mapping; reading nothing); < 0
// when it cannot be told.
double resident_fraction(const std::vector<std::string> & files) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    uint64_t     resident = 0, total = 0;
    for (const std::string & f : files) {
        const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        struct stat st {};
        if (fstat(fd, &st) != 0) {
            close(fd);
            return -1;
        }
        const size_t len = size_t(st.st_size);
        if (len == 0) {
            close(fd);
            continue;
        }
        void * p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return -1;
        std::vector<unsigned char> vec((len + page - 1) / page);
        const bool                 ok = mincore(p, len, vec.data()) == 0;
        munmap(p, len);
        if (!ok) return -1;
        for (unsigned char v : vec) resident += v & 1;
        total += vec.size();
    }
    return total ? double(resident) / double(total) : -1;
}

// A field of /proc/self/status in bytes (VmHWM, VmRSS); 0 when absent.
uint64_t proc_status_bytes(const char * field) {
    std::ifstream in("/proc/self/status");
    std::string   line;
    const size_t  n = std::strlen(field);
    while (std::getline(in, line))
        if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return uint64_t(std::stoull(line.substr(n + 1))) * 1024;
    return 0;
}

// Resets the resident-set high-water mark (Linux >= 4.0, own process, no root). False: it keeps
// counting from the start of the process.
bool reset_peak_rss() {
    FILE * f = std::fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = std::fputs("5", f) >= 0;
    return std::fclose(f) == 0 && ok;
}

uint64_t peak_rss_bytes() {
    if (const uint64_t hwm = proc_status_bytes("VmHWM")) return hwm;
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return uint64_t(ru.ru_maxrss) * 1024;  // kilobytes on Linux
}

struct LoadRun {
    std::string model;
    int         run = 0;
    bool        cold = false, ok = false;
    double      cached = -1;  // fraction of the files' pages resident when the run began; < 0: unknown
    double      load_s = 0, first_token_s = 0;
    uint64_t    file_bytes = 0, peak_rss = 0;
};

// Loads the model, then (from the same start) creates a context, decodes a 1-token prompt and samples
// its greedy token; frees everything. False with a message (the run's figures are then partial).
bool time_load(const std::string & path, spark_device_kind device, int32_t n_threads, LoadRun & r, std::string & error) {
    spark_model_params mp = spark_model_default_params();
    mp.device             = device;
    mp.n_threads          = n_threads;
    spark_model * model   = nullptr;
    spark_cli::LoadProgress bar;  // on a terminal only
    bar.attach(mp);
    const auto         t0 = Clock::now();
    const spark_status st = spark_model_load(path.c_str(), mp, &model);
    r.load_s              = std::chrono::duration<double>(Clock::now() - t0).count();
    bar.finish();
    if (st != SPARK_OK) {
        error = std::string("cannot load: ") + spark_last_error();
        return false;
    }
    spark_model_info info{};
    spark_model_get_info(model, &info);
    spark_context * ctx    = nullptr;
    spark_sampler * greedy = nullptr;
    spark_batch     batch{};
    bool            ok     = false;
    spark_context_params cp = spark_context_default_params();
    cp.n_threads            = n_threads;
    if (spark_context_init(model, cp, &ctx) != SPARK_OK) {
        error = std::string("context: ") + spark_last_error();
    } else {
        batch              = spark_batch_init(1, 1);
        batch.n_tokens     = 1;
        batch.token[0]     = prompt_token(0, info.n_vocab);
        batch.pos[0]       = 0;
        batch.n_seq_id[0]  = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0]    = 1;
        greedy             = spark_sampler_init_greedy();
        spark_token t      = -1;
        if (spark_decode(ctx, &batch) != SPARK_OK) error = std::string("decode: ") + spark_last_error();
        else if (spark_sampler_sample(greedy, ctx, -1, &t) != SPARK_OK || t < 0) error = std::string("sample: ") + spark_last_error();
        else ok = true;  // the first token is out (sampling waits for the step)
        r.first_token_s = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    r.peak_rss = peak_rss_bytes();
    spark_sampler_free(greedy);
    if (batch.token) spark_batch_free(batch);
    spark_context_free(ctx);
    spark_model_free(model);
    return ok;
}

// --load: N timed starts of each model. Returns the exit status.
int run_load_bench(const std::vector<std::string> & models, const std::string & device, int32_t n_threads, int reps, bool cold, Output out) {
    const bool json = out == Output::Json, csv = out == Output::Csv;
    const spark_device_kind kind        = device == "cuda" ? SPARK_DEVICE_CUDA : SPARK_DEVICE_CPU;
    std::string             device_name = device;
    if (device == "cuda") {
        spark_device_info di{};
        if (spark_cuda_device_info(0, &di) == SPARK_OK) device_name = di.name;
    }
    const uint64_t rss_before = proc_status_bytes("VmRSS");
    bool           hwm_reset  = true, failed = false;
    std::vector<LoadRun> runs;
    if (csv) std::printf("device,model,run,cache,ok,cached_fraction,load_s,first_token_s,file_bytes,gbs,peak_rss_bytes\n");
    if (out == Output::Md)
        std::printf("| model | run | cache | cached %% | load s | first token s | GB read | GB/s | peak RSS GB |\n"
                    "|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
    for (const std::string & path : models) {
        ModelFiles  files;
        std::string error;
        if (!model_files(path, files, error)) {
            std::fprintf(stderr, "spark-bench: %s: %s\n", path.c_str(), error.c_str());
            if (out == Output::Md) std::printf("| %s | - | %s | | | | | | not run (see stderr) |\n", path.c_str(), cold ? "cold" : "warm");
            failed = true;
            continue;
        }
        for (int i = 1; i <= reps; ++i) {
            LoadRun r;
            r.model = path, r.run = i, r.cold = cold, r.file_bytes = files.weight_bytes;
            std::string evict_error;
            if (cold && !evict_from_page_cache(files.all, evict_error))
                std::fprintf(stderr, "spark-bench: %s: --cold: the page cache kept files (%s); as root: sync; echo 3 > /proc/sys/vm/drop_caches\n",
                             path.c_str(), evict_error.c_str());
            r.cached = resident_fraction(files.weights);
            if (cold)
                std::fprintf(stderr, "spark-bench: %s run %d: --cold: %s of the files' pages in the page cache after eviction\n", path.c_str(), i,
                             r.cached < 0 ? "unknown share (mincore failed)" : (std::to_string(int(std::lround(100 * r.cached))) + "%").c_str());
            hwm_reset = reset_peak_rss() && hwm_reset;
            r.ok      = time_load(path, kind, n_threads, r, error);
            runs.push_back(r);
            if (!r.ok) {
                std::fprintf(stderr, "spark-bench: %s run %d: %s\n", path.c_str(), i, error.c_str());
                if (out == Output::Md) std::printf("| %s | %d | %s | | | | | | failed (see stderr) |\n", path.c_str(), i, cold ? "cold" : "warm");
                failed = true;
                break;  // the next runs would fail the same way
            }
            if (csv) {
                std::printf("%s,%s,%d,%s,%s,%s,%.4f,%.4f,%llu,%.4f,%llu\n", csv_field(device_name).c_str(), csv_field(path).c_str(), i,
                            cold ? "cold" : "warm", r.ok ? "true" : "false", r.cached < 0 ? "" : fmt("%.4f", r.cached).c_str(), r.load_s,
                            r.first_token_s, (unsigned long long) r.file_bytes, r.load_s > 0 ? double(r.file_bytes) / 1e9 / r.load_s : 0.0,
                            (unsigned long long) r.peak_rss);
                std::fflush(stdout);
            }
            if (out == Output::Md) {
                char cached[16] = "?";
                if (r.cached >= 0) std::snprintf(cached, sizeof cached, "%.0f", 100 * r.cached);
                std::printf("| %s | %d | %s | %s | %.3f | %.3f | %.3f | %.2f | %.3f |\n", path.c_str(), i, cold ? "cold" : "warm", cached, r.load_s,
                            r.first_token_s, double(r.file_bytes) / 1e9, r.load_s > 0 ? double(r.file_bytes) / 1e9 / r.load_s : 0.0,
                            double(r.peak_rss) / 1e9);
                std::fflush(stdout);
            }
        }
    }
    if (json) {
        std::printf("{\"device\": \"%s\", \"rss_before_bytes\": %llu, \"peak_rss_per_run\": %s, \"load\": [\n", json_escape(device_name).c_str(),
                    (unsigned long long) rss_before, hwm_reset ? "true" : "false");
        for (size_t i = 0; i < runs.size(); ++i) {
            const LoadRun & r = runs[i];
            std::printf("  {\"model\": \"%s\", \"run\": %d, \"cold\": %s, \"ok\": %s, \"cached_fraction\": %s, \"load_s\": %.4f, \"first_token_s\": %.4f, "
                        "\"file_bytes\": %llu, \"gbs\": %.4f, \"peak_rss_bytes\": %llu}%s\n",
                        json_escape(r.model).c_str(), r.run, r.cold ? "true" : "false", r.ok ? "true" : "false",
                        r.cached < 0 ? "null" : std::to_string(r.cached).c_str(), r.load_s, r.first_token_s, (unsigned long long) r.file_bytes,
                        r.load_s > 0 ? double(r.file_bytes) / 1e9 / r.load_s : 0.0, (unsigned long long) r.peak_rss, i + 1 < runs.size() ? "," : "");
        }
        std::printf("]}\n");
    } else if (out == Output::Md) {
        std::printf("\ndevice: %s, build %s\n"
                    "load s: wall time of spark_model_load; first token s: from the same start until the greedy token of a 1-token prompt is out "
                    "(a context of %d tokens created, the prompt decoded); GB read: the model's weight files; GB/s: GB read / load s\n"
                    "cache: %s; cached %%: the files' pages in the page cache when the run began (mincore)\n"
                    "peak RSS GB: the process's resident-memory high-water mark %s (%.3f GB before the first load)\n",
                    device_name.c_str(), spark_build_info(), spark_context_default_params().n_ctx,
                    cold ? "cold: evicted before each run with posix_fadvise(DONTNEED) (a full cold start also needs, as root: sync; echo 3 > "
                           "/proc/sys/vm/drop_caches)"
                         : "warm: the page cache as it was (--cold evicts the files first)",
                    hwm_reset ? "during the run (VmHWM, reset before it)" : "since the process started (/proc/self/clear_refs could not reset it)",
                    double(rss_before) / 1e9);
    }
    return failed ? 1 : 0;
}

double step_bytes(const spark_model_info & i, double mean_depth) {
    return double(i.decode_weight_bytes) + double(i.kv_bytes_per_token) * mean_depth + 2.0 * double(i.recurrent_bytes);
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-bench: prefill (pp) and decode (tg) tokens/s, with the roofline fraction"};
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    spark_cli::add_version_flag(app, "spark-bench");
    const CLI::Range nonnegative(0, INT_MAX, "NONNEGATIVE"), positive(1, INT_MAX, "POSITIVE");  // ints: the message names the value
    std::vector<std::string> models;
    std::string synthetic, formats = "int4", depths_arg = "0", device = "auto", output = "md";
    std::string spec_arg, sim_arg, prompt_text, parallel_arg;
    int         n_prompt = 512, n_gen = 128, reps = 3, draft_max = 3;
    int32_t     n_threads = 0;
    bool        json = false, matrix = false, load = false, cold = false;
    spark_cli::SplitOptions devices_split;
    app.add_option("-m,--model", models, "model directory or spark file (repeatable)");
    app.add_option("--synthetic", synthetic, std::string("synthetic models of these shapes, comma separated: ") + spark_cli::kSyntheticShapes);
    app.add_option("--format", formats, "weight formats of the synthetic models, comma separated: bf16, f16, int4, nvfp4, fp8");
    app.add_option("-d,--depth", depths_arg, "context depths, comma separated");
    app.add_option("-p,--n-prompt", n_prompt, "prefill length (0: skip)")->check(nonnegative);
    app.add_option("-n,--n-gen", n_gen, "decode length (0: skip)")->check(nonnegative);
    app.add_option("-r,--repetitions", reps, "runs per figure (median)")->check(positive);
    app.add_option("--device", device, "cpu, cuda, or auto: cuda when a CUDA device is visible, else cpu")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    devices_split.add(app);
    app.add_option("-t,--threads", n_threads, "CPU threads: for loading (reading and staging the weights) and for the CPU backend's compute; 0: the library's default")
        ->check(nonnegative);
    CLI::Option * output_opt =
        app.add_option("-o,--output", output, "output format: md (a Markdown table), csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
    app.add_flag("--json", json, "the same as -o json");
    app.add_option("--parallel", parallel_arg,
                   "also batched decode of N streams (comma separated, e.g. 1,4,16,64): aggregate tokens/s of -n steps of N rows, one per sequence, "
                   "each at the depth (tg<n> xN rows)");
    app.add_flag("--context-matrix", matrix, "decode speed for generations of 20/150/400 tokens at depths 0/512/2K/8K/16K");
    app.add_option("--spec", spec_arg, "also speculative decoding: draft:PATH, eagle3:PATH, mtp or ngram");
    CLI::Option * draft_max_opt =
        app.add_option("--draft-max", draft_max, "--spec: tokens drafted per step (default 3, or the number of --spec-sim-accept values)")
            ->check(positive);
    app.add_option("--prompt", prompt_text, "--spec: measure on this user message (rendered with the chat template) instead of pseudo-random tokens");
    app.add_option("--spec-sim-accept", sim_arg, "--spec: simulated acceptance at draft positions 1, 2, ... (e.g. 0.84,0.53; benchmark only)");
    app.add_flag("--load", load,
                 "measure loading instead: -r times the time of spark_model_load and to the first token, GB/s of the model's files and the "
                 "peak resident memory (needs -m: synthetic models have no files and are refused)");
    app.add_flag("--cold", cold,
                 "--load: evict the model's files from the page cache before each run (posix_fadvise, no root; the share still cached is "
                 "printed; a full cold start also needs, as root, echo 3 > /proc/sys/vm/drop_caches)");
    app.footer("Exit status: 0 when every figure asked for ran, 1 when one could not (a model that does not load, --device cuda without a\n"
               "CUDA device, a failed run), 2 for bad options.");
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-bench")) return *stop;
    spark_cli::install_stderr_log();

    if (json && output_opt->count() > 0 && output != "json") {
        std::fprintf(stderr, "spark-bench: --json is -o json; it contradicts -o %s\n", output.c_str());
        return 2;
    }
    const Output out = json || output == "json" ? Output::Json : output == "csv" ? Output::Csv : Output::Md;
    json             = out == Output::Json;
    std::vector<int> depths;
    if (std::string err; !matrix && !parse_count_list("-d/--depth", depths_arg, depths, err)) {
        std::fprintf(stderr, "spark-bench: %s\n", err.c_str());
        return 2;
    }
    if (cold && !load) {
        std::fprintf(stderr, "spark-bench: --cold goes with --load\n");
        return 2;
    }
    if (device == "auto") device = spark_cuda_device_count() > 0 ? "cuda" : "cpu";
    if (load) {
        if (!synthetic.empty() || std::any_of(models.begin(), models.end(), [](const std::string & m) { return m.rfind("synthetic:", 0) == 0; })) {
            std::fprintf(stderr, "spark-bench: --load measures reading a model's files; a synthetic model has none (its weights are generated): give -m PATH\n");
            return 2;
        }
        for (const char * opt : {"--format", "--depth", "--n-prompt", "--n-gen", "--context-matrix", "--spec", "--draft-max", "--prompt", "--spec-sim-accept", "--parallel"})
            if (app.count(opt) > 0) {
                std::fprintf(stderr, "spark-bench: %s does not apply to --load (it measures loading and the first token)\n",
                             app.get_option(opt)->get_name(false, true).c_str());
                return 2;
            }
        if (models.empty()) {
            std::fprintf(stderr, "spark-bench: --load needs -m PATH\n");
            return 2;
        }
    }
    // Nothing can run on a device that is not there: say so once, before loading anything.
    if (device == "cuda" && spark_cuda_device_count() == 0) {
        std::fprintf(stderr, "spark-bench: --device cuda: no CUDA device is visible (%s); --device cpu runs on the CPU\n", spark_build_info());
        return 1;
    }
    if (load) return run_load_bench(models, device, n_threads, reps, cold, out);

    // --spec, --draft-max, --spec-sim-accept.
    spark_cli::SpecOption spec;
    std::vector<float>    sim_accept;
    if (!spec_arg.empty()) {
        std::string err;
        if (!spark_cli::parse_spec(spec_arg, spec, err)) {
            std::fprintf(stderr, "spark-bench: %s\n", err.c_str());
            return 2;
        }
    }
    if (!sim_arg.empty()) {
        if (spec_arg.empty()) {
            std::fprintf(stderr, "spark-bench: --spec-sim-accept needs --spec (the source whose work is measured)\n");
            return 2;
        }
        for (const std::string & v : split(sim_arg)) {
            size_t pos = 0;
            float  p   = -1;
            try {
                p = std::stof(v, &pos);
            } catch (const std::exception &) {
                pos = 0;
            }
            if (pos != v.size()) {
                std::fprintf(stderr, "spark-bench: --spec-sim-accept: '%s' is not a number\n", v.c_str());
                return 2;
            }
            sim_accept.push_back(p);
        }
        if (draft_max_opt->count() == 0) draft_max = int(sim_accept.size());
        if (int(sim_accept.size()) < draft_max) {
            std::fprintf(stderr, "spark-bench: --spec-sim-accept has %zu rates, --draft-max %d needs one per draft position\n", sim_accept.size(), draft_max);
            return 2;
        }
        sim_accept.resize(size_t(draft_max));
    }
    spark_spec_params spec_params = spark_cli::spec_params(spec, draft_max);
    spec_params.sim_accept        = sim_accept.empty() ? nullptr : sim_accept.data();
    const bool        simulated   = !sim_accept.empty();
    const std::string spec_label  = spec.name + ", k=" + std::to_string(draft_max) + (simulated ? ", simulated acceptance" : "");

    for (const std::string & s : split(synthetic))
        for (const std::string & f : split(formats)) models.push_back("synthetic:" + s + ":" + f);
    if (models.empty()) {
        std::fprintf(stderr, "spark-bench: nothing to run (give -m or --synthetic)\n");
        return 2;
    }
    if (matrix) depths = {0, 512, 2048, 8192, 16384};
    std::vector<int> parallel;
    if (std::string err; !parallel_arg.empty() && !parse_count_list("--parallel", parallel_arg, parallel, err)) {
        std::fprintf(stderr, "spark-bench: %s\n", err.c_str());
        return 2;
    }
    for (int n : parallel)
        if (n < 1 || n > 4096) {
            std::fprintf(stderr, "spark-bench: --parallel %d: give 1 to 4096 streams\n", n);
            return 2;
        }
    const std::vector<int> gens = matrix ? std::vector<int>{20, 150, 400} : std::vector<int>{n_gen};

    std::vector<Result> results;
    bool                failed    = false;  // something asked for did not run: exit status 1
    double              bandwidth = 0;
    std::string         device_name = device;
    if (device == "cuda") {
        spark_device_info di{};
        if (spark_cuda_device_info(0, &di) == SPARK_OK) device_name = di.name;
    }
    // With --spec the table has four more columns (empty in the pp/tg rows).
    const std::string no_spec_cells = spec_arg.empty() ? "" : " | | | |";
    if (out == Output::Md)
        std::printf("| model | format | test | depth | t/s | step MB | %% of copy BW |%s\n|---|---|---|---:|---:|---:|---:|%s\n",
                    spec_arg.empty() ? "" : " speedup | tok/step | verify k+1 / 1 row | acceptance by draft position |",
                    spec_arg.empty() ? "" : "---:|---:|---:|---|");
    // CSV: the fields of the JSON rows; with --spec the speculative ones too (empty in the pp/tg rows).
    if (out == Output::Csv)
        std::printf("device,model,format,test,depth,tps,tps_stdev,step_bytes,bw_fraction%s\n",
                    spec_arg.empty() ? "" : ",spec,n_draft_max,simulated,speedup,tokens_per_step,verify_cost_ratio,acceptance");
    std::fflush(stdout);
    auto csv_row = [&](const Result & r) {
        std::printf("%s,%s,%s,%s,%d,%.2f,%.2f,%.0f,%.4f", csv_field(device_name).c_str(), csv_field(r.model).c_str(), csv_field(r.format).c_str(),
                    csv_field(r.test).c_str(), r.depth, r.tps.median, r.tps.stdev, r.step_bytes, r.bw_fraction);
        if (r.spec) {
            std::string acceptance;  // per draft position, space separated; - where nothing was drafted
            for (size_t j = 0; j < r.acceptance.size(); ++j) acceptance += (j ? " " : "") + (r.acceptance[j] < 0 ? "-" : fmt("%.4f", r.acceptance[j]));
            std::printf(",%s,%d,%s,%.4f,%.4f,%.4f,%s", r.spec_kind.c_str(), r.n_draft_max, r.simulated ? "true" : "false", r.speedup,
                        r.tokens_per_step, r.verify_ratio, acceptance.c_str());
        } else if (!spec_arg.empty()) {
            std::printf(",,,,,,,");
        }
        std::printf("\n");
        std::fflush(stdout);
    };
    for (const std::string & path : models) {
        spark_model_params mp = spark_model_default_params();
        mp.device             = device == "cuda" ? SPARK_DEVICE_CUDA : SPARK_DEVICE_CPU;
        mp.n_threads          = n_threads;
        mp.load_tokenizer     = !prompt_text.empty();  // --prompt renders a chat prompt
        if (std::string err; !devices_split.apply(mp, err)) {
            std::fprintf(stderr, "spark-bench: %s\n", err.c_str());
            return 2;
        }
        spark_model * model   = nullptr;
        spark_cli::LoadProgress bar;  // on a terminal only
        bar.attach(mp);
        const auto         t0 = Clock::now();
        const spark_status st = spark_model_load(path.c_str(), mp, &model);
        const double   load_s = std::chrono::duration<double>(Clock::now() - t0).count();
        bar.finish();
        if (st != SPARK_OK) {
            std::fprintf(stderr, "spark-bench: %s: %s (%s)\n", path.c_str(), spark_last_error(), "skipped");
            if (out == Output::Md) std::printf("| %s | - | - | - | %s | | |%s\n", path.c_str(), "not run (see stderr)", no_spec_cells.c_str());
            failed = true;
            continue;
        }
        if (bandwidth == 0) spark_model_measure_bandwidth(model, &bandwidth);
        spark_model_info info{};
        spark_model_get_info(model, &info);
        std::fprintf(stderr, "spark-bench: %s: %.2f GB of weights, %.3f GB read per decode step at depth 0, loaded in %.1f s; copy bandwidth %.0f GB/s\n",
                     path.c_str(), double(info.weight_bytes) / 1e9, step_bytes(info, 0) / 1e9, load_s, bandwidth / 1e9);
        // A GPU sharing the host's memory reads weights where the file is mapped (SPARK_WEIGHTS_IN_PLACE).
        std::fprintf(stderr, "spark-bench: %s: weights %s\n", path.c_str(),
                     info.weight_bytes_in_place == 0 ? "copied to the device"
                                                     : (std::to_string(info.weight_bytes_in_place / 1000000) + " MB used in place from the mapped file, the rest copied").c_str());
        // A split model's bytes and share of the bandwidth are one rank's: each device reads its part.
        const std::string name   = (path.rfind("synthetic:", 0) == 0 ? path.substr(10, path.rfind(':') - 10) : path) + devices_split.label();
        const std::string format = path.rfind("synthetic:", 0) == 0 ? path.substr(path.rfind(':') + 1) : info.weight_format;
        try {
            const int max_depth = *std::max_element(depths.begin(), depths.end());
            const int max_gen   = *std::max_element(gens.begin(), gens.end());
            const int verify_rows = spec_arg.empty() ? 0 : draft_max + 1;  // the verify-cost step
            Bench     b(model, max_depth + std::max({n_prompt, max_gen + 1, verify_rows}) + 8, 512, n_threads);
            // The speculative loop: a prompt of depth + 1 tokens, max_gen tokens and the last step's
            // surplus (up to draft_max + 1).
            std::unique_ptr<SpecBench> sb;
            if (!spec_arg.empty() && max_gen > 0) {
                try {
                    sb = std::make_unique<SpecBench>(model, max_depth + 1 + max_gen + draft_max + 8 + 4096 * !prompt_text.empty(), n_threads, spec_params);
                    if (!prompt_text.empty()) sb->set_chat_prompt(model, prompt_text);
                } catch (const std::exception & e) {
                    std::fprintf(stderr, "spark-bench: %s: no speculative decoding (--spec %s): %s\n", path.c_str(), spec_arg.c_str(), e.what());
                    failed = true;
                    if (out == Output::Md)
                        std::printf("| %s | %s | spec (%s) | - | not run (see stderr) | | | | | | |\n", name.c_str(), format.c_str(), spec_label.c_str());
                }
            }
            for (int depth : depths) {
                b.prepare(depth);
                auto emit = [&](const std::string & test, const std::vector<double> & v, double bytes) {
                    Result r;
                    r.model = name, r.format = format, r.test = test, r.depth = depth, r.tps = stat_of(v), r.step_bytes = bytes;
                    if (bytes > 0 && bandwidth > 0) r.bw_fraction = bytes * r.tps.median / bandwidth;
                    results.push_back(r);
                    if (out == Output::Csv) csv_row(r);
                    if (out == Output::Md) {
                        std::printf("| %s | %s | %s | %d | %.1f ± %.1f | %s | %s |%s\n", r.model.c_str(), r.format.c_str(), r.test.c_str(), r.depth,
                                    r.tps.median, r.tps.stdev, bytes > 0 ? std::to_string(bytes / 1e6).substr(0, std::to_string(bytes / 1e6).find(".") + 2).c_str() : "",
                                    bytes > 0 ? (std::to_string(int(100 * r.bw_fraction + 0.5)) + "%").c_str() : "", no_spec_cells.c_str());
                        std::fflush(stdout);
                    }
                };
                // The verify cost at this depth: one step of k + 1 rows over one of 1 row.
                double verify_ratio = 0;
                if (sb) {
                    const int    iters = std::max(5, 3 * reps);
                    const double one   = b.step_seconds(1, iters);
                    verify_ratio       = one > 0 ? b.step_seconds(draft_max + 1, iters) / one : 0;
                }
                auto emit_spec = [&](int g, const std::vector<double> & v, double tg_tps, const spark_spec_stats & s) {
                    Result r;
                    r.model = name, r.format = format, r.test = "spec tg" + std::to_string(g) + " (" + spec_label + ")", r.depth = depth, r.tps = stat_of(v);
                    r.spec            = true;
                    r.simulated       = simulated;
                    r.spec_kind       = spec.name;
                    r.n_draft_max     = draft_max;
                    r.speedup         = tg_tps > 0 ? r.tps.median / tg_tps : 0;
                    r.tokens_per_step = spark_cli::tokens_per_step(s);
                    r.verify_ratio    = verify_ratio;
                    for (int i = 0; i < draft_max; ++i) r.acceptance.push_back(s.drafted_at[i] ? double(s.accepted_at[i]) / double(s.drafted_at[i]) : -1.0);
                    results.push_back(r);
                    std::fprintf(stderr, "spark-bench: %s depth %d, speculative (%s): %s\n", name.c_str(), depth, spec_label.c_str(),
                                 spark_cli::describe_spec_stats(s, draft_max).c_str());
                    if (out == Output::Csv) csv_row(r);
                    if (out == Output::Md) {
                        std::printf("| %s | %s | %s | %d | %.1f ± %.1f | | | %.2fx | %.2f | %.2f | %s |\n", r.model.c_str(), r.format.c_str(), r.test.c_str(),
                                    r.depth, r.tps.median, r.tps.stdev, r.speedup, r.tokens_per_step, r.verify_ratio,
                                    spark_cli::acceptance_by_position(s, draft_max).c_str());
                        std::fflush(stdout);
                    }
                };
                if (n_prompt > 0 && !matrix) {
                    std::vector<double> v;
                    b.prefill_tps(n_prompt);  // warm-up (captures nothing: prefill shapes vary)
                    for (int r = 0; r < reps; ++r) v.push_back(b.prefill_tps(n_prompt));
                    emit("pp" + std::to_string(n_prompt), v, 0);
                }
                for (int g : gens) {
                    if (g <= 0) continue;
                    std::vector<double> v;
                    b.decode_tps(std::min(g, 8));  // warm-up: the single-token step is captured
                    for (int r = 0; r < reps; ++r) v.push_back(b.decode_tps(g));
                    emit("tg" + std::to_string(g), v, step_bytes(b.info(), depth + g / 2.0));
                    if (!sb) continue;
                    const double     tg_tps = results.back().tps.median;
                    spark_spec_stats acc{}, warm{};
                    std::vector<double> vs;
                    sb->tps(depth, std::min(g, 8), warm);  // warm-up
                    for (int r = 0; r < reps; ++r) vs.push_back(sb->tps(depth, g, acc));
                    emit_spec(g, vs, tg_tps, acc);
                }
                for (int np : parallel) {
                    if (n_gen <= 0) break;
                    ParallelBench       pb(model, np, depth, n_gen, n_threads);
                    std::vector<double> v;
                    pb.tps(std::min(n_gen, 8));  // warm-up: the N-row step is captured
                    for (int r = 0; r < reps; ++r) v.push_back(pb.tps(n_gen));
                    emit("tg" + std::to_string(n_gen) + " x" + std::to_string(np) + " streams", v, 0);
                }
            }
        } catch (const std::exception & e) {
            std::fprintf(stderr, "spark-bench: %s: %s\n", path.c_str(), e.what());
            failed = true;
        }
        spark_model_free(model);
    }
    if (matrix && out == Output::Md) {
        // Depth x generation length, decode tokens/s (end-to-end style tables users publish).
        std::string last;
        for (const Result & r : results) {
            if (r.spec) continue;  // the speculative rows are in the table above
            const std::string id = r.model + " " + r.format;
            if (id != last) {
                std::printf("\n%s: decode tokens/s by context depth (rows) and generation length (columns)\n| depth |", id.c_str());
                for (int g : gens) std::printf(" %d |", g);
                std::printf("\n|---:|");
                for (size_t i = 0; i < gens.size(); ++i) std::printf("---:|");
                last = id;
                std::printf("\n");
            }
            if (r.test == "tg" + std::to_string(gens.front())) std::printf("| %d |", r.depth);
            std::printf(" %.1f |", r.tps.median);
            if (r.test == "tg" + std::to_string(gens.back())) std::printf("\n");
        }
    }
    if (json) {
        std::printf("{\"device\": \"%s\", \"copy_bandwidth_gbs\": %.1f, \"results\": [\n", json_escape(device_name).c_str(), bandwidth / 1e9);
        for (size_t i = 0; i < results.size(); ++i) {
            const Result & r = results[i];
            std::string extra;  // speculative rows
            if (r.spec) {
                char buf[256];
                std::snprintf(buf, sizeof buf, ", \"spec\": \"%s\", \"n_draft_max\": %d, \"simulated\": %s, \"speedup\": %.4f, \"tokens_per_step\": %.4f, "
                              "\"verify_cost_ratio\": %.4f, \"acceptance\": [",
                              r.spec_kind.c_str(), r.n_draft_max, r.simulated ? "true" : "false", r.speedup, r.tokens_per_step, r.verify_ratio);
                extra = buf;
                for (size_t j = 0; j < r.acceptance.size(); ++j) {
                    std::snprintf(buf, sizeof buf, "%s%.4f", j ? ", " : "", r.acceptance[j]);
                    extra += r.acceptance[j] < 0 ? std::string(j ? ", " : "") + "null" : std::string(buf);
                }
                extra += "]";
                if (r.simulated) {
                    extra += ", \"sim_accept\": [";
                    for (size_t j = 0; j < sim_accept.size(); ++j) {
                        std::snprintf(buf, sizeof buf, "%s%.4f", j ? ", " : "", double(sim_accept[j]));
                        extra += buf;
                    }
                    extra += "]";
                }
            }
            std::printf("  {\"model\": \"%s\", \"format\": \"%s\", \"test\": \"%s\", \"depth\": %d, \"tps\": %.2f, \"tps_stdev\": %.2f, "
                        "\"step_bytes\": %.0f, \"bw_fraction\": %.4f%s}%s\n",
                        json_escape(r.model).c_str(), json_escape(r.format).c_str(), json_escape(r.test).c_str(), r.depth, r.tps.median, r.tps.stdev,
                        r.step_bytes, r.bw_fraction,
                        extra.c_str(), i + 1 < results.size() ? "," : "");
        }
        std::printf("]}\n");
    } else if (out == Output::Md) {
        std::printf("\ndevice: %s, measured copy bandwidth %.0f GB/s (bytes read + written), build %s\n", device_name.c_str(), bandwidth / 1e9,
                    spark_build_info());
        if (!spec_arg.empty()) {
            std::printf("spec: greedy speculative decoding with --spec %s, up to %d drafts per step; speedup over tg of the same depth; tok/step: "
                        "tokens per verify step; verify k+1 / 1 row: time of a target step of %d rows over one of 1 row\n",
                        spec_arg.c_str(), draft_max, draft_max + 1);
            if (simulated)
                std::printf("SIMULATED acceptance (--spec-sim-accept %s): drafts accepted by chance at these per-position rates; the work per "
                            "step is real, the tokens are not the model's output\n",
                            sim_arg.c_str());
        }
    }
    return failed ? 1 : 0;
}
