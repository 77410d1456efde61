// spark-chat: talk to a model. Renders the model's chat template, streams the answer token by token,
// keeps the conversation (re-using the KV cache of the unchanged prefix), and has a few commands.
//
//   spark-chat [-m MODEL] [-p PROMPT | -f FILE] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//              [--repeat-penalty R] [--repeat-last-n N] [-s SEED] [-n N] [-c CTX] [-t THREADS]
//              [--device cpu|cuda] [-sys TEXT]
//              [--spec draft:PATH|eagle3:PATH|mtp|ngram [--draft-max N] [--draft-min N] [--draft-p-min P]]
//
// The options take llama.cpp's spellings (-s/--seed, -f/--file, -sys/--system-prompt, -c/--ctx-size,
// -t/--threads, -n/--n-predict, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n) next to
// spark-chat's own (--system, --max-tokens). The seed is random unless given (-1: random too); the
// timings line shows the one used, so `-s N` repeats a sampled answer. Values out of range are refused
// with a message naming the option (exit code 2, as for any other command-line error); -c beyond the
// model's context length and -t beyond the hardware threads are lowered to those, with a message.
// -n -1 generates until the answer ends or the context is full. --version prints the build.
//
// The default model: installed as <prefix>/bin/spark-chat, <prefix>/share/spark/models/
// spark-demo-coder-moe when it exists; otherwise the demo model of the source tree it was built from.
//
// --spec decodes speculatively (spark_spec_*): a draft model, an EAGLE3 head, the model's own MTP
// head or n-gram lookup proposes up to --draft-max tokens that the model checks in one step. The
// answer is the same (greedy: token for token; sampling: the same distribution); /stats and the
// timings line then also show how many drafts were accepted.
//
// With -p: one turn, only the answer on stdout (statistics on stderr). Without -p and with a pipe on
// stdin: every line is one user turn. Otherwise interactive, with line editing and history; a line
// ending in '\' continues on the next line, and a line of three double quotes starts / ends a
// multi-line block. Ctrl-C stops the current answer, not the program; at the prompt it drops what was
// typed, and at an empty prompt it shows how to leave: a second Ctrl-C there (or Ctrl-D, or /quit)
// ends the program (exit code 0).
//
// While the model loads, a progress bar on stderr when it is a terminal (tools/common/load_progress.h);
// Ctrl-C then cancels the load (exit code 130). The timings line ends with the load time
// (the wall time of spark_model_load).
#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include "default_model.h"
#include "load_progress.h"
#include "parse_args.h"
#include "log_stderr.h"
#include "spec_cli.h"
#include "split_cli.h"
#include "version.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <clocale>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#if SPARK_CHAT_HAS_LIBEDIT
#include <editline/readline.h>
#endif

namespace {

volatile std::sig_atomic_t g_interrupted = 0;  // Ctrl-C: stops an answer, a prompt's line, or the load

// Installed without SA_RESTART: a Ctrl-C at the prompt makes read() fail with EINTR, and the line
// readers below see the flag. What it means is decided where it is seen (an answer stops at its next
// token; a prompt drops its line or shows how to leave).
void on_sigint(int) { g_interrupted = 1; }

struct Options {
    spark_cli::SplitOptions split;  // --devices / --split
    std::string model;  // default_model()
    std::string prompt, prompt_file, system, device = "cpu";
    float       temp = 0.7f, top_p = 0.9f, min_p = 0.0f, repeat_penalty = 1.0f;
    int32_t     top_k = 20, n_predict = 512, n_ctx = 0, n_threads = 0, repeat_last_n = 64;
    int64_t     seed      = -1;  // -1: random
    uint32_t    seed_used = 0;   // the dist sampler's seed (shown in the timings line)
    std::string spec;  // --spec KIND[:PATH]; empty: plain decoding
    int32_t     draft_max = 3, draft_min = 0;
    float       draft_p_min = 0.0f;
};

struct Message {
    std::string role, content;
};

struct TurnStats {
    int32_t prompt_tokens = 0, prefill_tokens = 0, generated = 0;
    double  prefill_s = 0, decode_s = 0;
};

class Chat {
public:
    // With `spec` (owned by the caller) every turn decodes speculatively.
    Chat(spark_model * model, spark_context * ctx, const Options & o, spark_spec * spec = nullptr, const char * spec_name = "")
        : ctx_(ctx), opt_(o), spec_(spec), spec_name_(spec_name) {
        tok_  = spark_model_get_tokenizer(model);
        tmpl_ = spark_tokenizer_chat_template(tok_);
        if (!opt_.system.empty()) system_ = opt_.system;
        make_sampler();
    }
    ~Chat() { spark_sampler_free(smpl_); }

    void reset() {
        history_.clear();
        cached_.clear();
        spark_memory_clear(ctx_);
        spark_sampler_reset(smpl_);
    }
    void set_load_seconds(double s) { load_s_ = s; }
    void set_system(const std::string & s) {
        system_ = s;
        reset();
    }

    // One user turn: prints the answer to `out` as it is generated. Returns false on an error
    // (already reported on stderr); the turn is then not kept in the history.
    bool turn(const std::string & user, FILE * out) {
        history_.push_back({"user", user});
        std::vector<spark_token> prompt;
        if (!render(prompt)) {
            history_.pop_back();
            return false;
        }
        const int32_t n_ctx = spark_n_ctx(ctx_);
        if (int32_t(prompt.size()) >= n_ctx) {
            std::fprintf(stderr, "spark-chat: the conversation is %zu tokens but the context holds %d; use /reset or a larger -c\n",
                         prompt.size(), n_ctx);
            history_.pop_back();
            return false;
        }
        stats_ = TurnStats{};
        stats_.prompt_tokens = int32_t(prompt.size());
        if (!(spec_ ? begin_spec(prompt) : prefill(prompt))) {
            history_.pop_back();
            return false;
        }
        std::string answer = generate(out, n_ctx, int32_t(prompt.size()));
        history_.push_back({"assistant", answer});
        total_generated_ += stats_.generated;
        return true;
    }

    // The timings line; with sampling it names the seed (-s repeats the answer), greedy says so.
    void print_stats(FILE * f) const {
        const std::string sampling = opt_.temp > 0.0f ? "seed " + std::to_string(opt_.seed_used) : std::string("greedy");
        std::fprintf(f, "prompt %d tokens (%d new) in %.3f s = %.1f tok/s; answer %d tokens in %.3f s = %.1f tok/s; context %d/%d; %s; load %.2f s\n",
                     stats_.prompt_tokens, stats_.prefill_tokens, stats_.prefill_s,
                     stats_.prefill_s > 0 ? stats_.prefill_tokens / stats_.prefill_s : 0.0, stats_.generated, stats_.decode_s,
                     stats_.decode_s > 0 ? stats_.generated / stats_.decode_s : 0.0, spark_memory_seq_length(ctx_, 0), spark_n_ctx(ctx_),
                     sampling.c_str(), load_s_);
        if (spec_) {
            spark_spec_stats s{};
            spark_spec_get_stats(spec_, &s);  // this turn's: reset when it began
            std::fprintf(f, "speculative (%s, up to %d drafts): %s\n", spec_name_, opt_.draft_max,
                         spark_cli::describe_spec_stats(s, opt_.draft_max).c_str());
        }
    }

private:
    void make_sampler() {
        smpl_ = spark_sampler_chain_init(spark_sampler_chain_default_params());
        if (opt_.repeat_penalty != 1.0f && opt_.repeat_last_n != 0)
            spark_sampler_chain_add(smpl_, spark_sampler_init_penalties(opt_.repeat_last_n, opt_.repeat_penalty));  // -1: unbounded
        if (opt_.temp <= 0.0f) {
            spark_sampler_chain_add(smpl_, spark_sampler_init_greedy());
            return;
        }
        spark_sampler_chain_add(smpl_, spark_sampler_init_top_k(opt_.top_k));
        spark_sampler_chain_add(smpl_, spark_sampler_init_top_p(opt_.top_p, 1));
        spark_sampler_chain_add(smpl_, spark_sampler_init_min_p(opt_.min_p, 1));
        spark_sampler_chain_add(smpl_, spark_sampler_init_temp(opt_.temp));
        spark_sampler_chain_add(smpl_, spark_sampler_init_dist(opt_.seed_used));
    }

    std::string piece_text(spark_token t) const {
        if (t < 0) return {};
        char   buf[256];
        size_t len = 0;
        if (spark_token_to_piece(tok_, t, buf, sizeof buf, &len) != SPARK_OK) return {};
        return std::string(buf, len);
    }

    bool render(std::vector<spark_token> & tokens) {
        std::vector<spark_chat_message> msgs;
        if (!system_.empty()) msgs.push_back({"system", system_.c_str(), nullptr, nullptr, nullptr});
        for (const Message & m : history_) msgs.push_back({m.role.c_str(), m.content.c_str(), nullptr, nullptr, nullptr});
        const std::string bos = piece_text(spark_tokenizer_bos(tok_)), eos = piece_text(spark_tokenizer_eos(tok_));
        std::string text(4096, '\0');
        size_t      len = 0;
        spark_status st;
        while ((st = spark_chat_apply_template(tmpl_, msgs.data(), msgs.size(), true, nullptr, nullptr, bos.c_str(), eos.c_str(),
                                               text.data(), text.size(), &len)) == SPARK_ERR_BUFFER_TOO_SMALL)
            text.resize(len + 1);
        if (st != SPARK_OK) {
            std::fprintf(stderr, "spark-chat: cannot render the chat template: %s\n", spark_last_error());
            return false;
        }
        text.resize(len);
        int32_t n = 0;
        tokens.resize(text.size() + 16);
        while ((st = spark_tokenize(tok_, text.data(), text.size(), true, tokens.data(), int32_t(tokens.size()), &n)) == SPARK_ERR_BUFFER_TOO_SMALL)
            tokens.resize(size_t(n));
        if (st != SPARK_OK) {
            std::fprintf(stderr, "spark-chat: cannot tokenize the conversation: %s\n", spark_last_error());
            return false;
        }
        tokens.resize(size_t(n));
        return true;
    }

    // Speculative turns: the loop keeps the longest prefix its sequence shares with the prompt (the
    // earlier turns) and decodes the rest; cached_ stays empty, the loop does the bookkeeping.
    bool begin_spec(const std::vector<spark_token> & prompt) {
        spark_spec_reset_stats(spec_);  // /stats and the timings line show this turn's acceptance
        const auto t0 = std::chrono::steady_clock::now();
        if (spark_spec_begin(spec_, 0, prompt.data(), int32_t(prompt.size())) != SPARK_OK) {
            std::fprintf(stderr, "spark-chat: decoding the prompt failed: %s\n", spark_last_error());
            return false;
        }
        stats_.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        spark_spec_stats s{};
        spark_spec_get_stats(spec_, &s);
        stats_.prefill_tokens = int32_t(s.n_prompt);
        return true;
    }

    // Decodes what the KV cache does not hold yet (the cache keeps the longest common prefix).
    bool prefill(const std::vector<spark_token> & prompt) {
        size_t keep = 0;
        while (keep < cached_.size() && keep < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
        if (keep == prompt.size()) --keep;  // the last token must be decoded for its logits
        if (keep < cached_.size() && spark_memory_seq_rm(ctx_, 0, int32_t(keep), -1) != SPARK_OK) {
            // Recurrent models cannot drop a partial tail: start over.
            spark_memory_clear(ctx_);
            keep = 0;
        }
        cached_.resize(keep);
        const auto  t0    = std::chrono::steady_clock::now();
        const int32_t chunk = 512;
        spark_batch batch = spark_batch_init(chunk, 1);
        bool        ok    = true;
        for (size_t i = keep; i < prompt.size() && ok; i += size_t(chunk)) {
            const int32_t n = int32_t(std::min(prompt.size() - i, size_t(chunk)));
            for (int32_t j = 0; j < n; ++j) {
                batch.token[j]     = prompt[i + size_t(j)];
                batch.pos[j]       = int32_t(i) + j;
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = 0;
                batch.logits[j]    = i + size_t(j) + 1 == prompt.size();
            }
            batch.n_tokens = n;
            if (spark_decode(ctx_, &batch) != SPARK_OK) {
                std::fprintf(stderr, "spark-chat: decoding the prompt failed: %s\n", spark_last_error());
                ok = false;
                break;
            }
            cached_.insert(cached_.end(), prompt.begin() + long(i), prompt.begin() + long(i) + n);
        }
        spark_batch_free(batch);
        stats_.prefill_tokens = int32_t(prompt.size() - keep);
        stats_.prefill_s      = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!ok) {
            spark_memory_clear(ctx_);
            cached_.clear();
        }
        return ok;
    }

    std::string generate(FILE * out, int32_t n_ctx, int32_t n_prompt) {
        std::string          answer;
        spark_detok_stream * stream = spark_detok_stream_init(tok_, true);
        char                 buf[1024];
        const auto           t0 = std::chrono::steady_clock::now();
        // Streams one answer token; false when the answer ends there: at an end-of-generation token
        // (not printed), Ctrl-C (also one pressed while the prompt was decoded: the caller clears the
        // flag before the turn), -n tokens (-1: no limit) or a full context (one position is kept free).
        const std::function<bool(spark_token)> emit = [&](spark_token t) {
            if (spark_tokenizer_is_eog(tok_, t)) return false;
            size_t len = 0;
            if (spark_detok_stream_push(stream, t, buf, sizeof buf, &len) == SPARK_OK && len) {
                std::fwrite(buf, 1, len, out);
                std::fflush(out);
                answer.append(buf, len);
            }
            ++stats_.generated;
            if (g_interrupted) return false;
            if (n_prompt + stats_.generated >= n_ctx) {
                std::fprintf(stderr, "\nspark-chat: context full (%d tokens); use /reset or a larger -c\n", n_ctx);
                return false;
            }
            return opt_.n_predict < 0 || stats_.generated < opt_.n_predict;
        };
        if (spec_) generate_spec(emit);
        else generate_plain(emit);
        size_t len = 0;
        if (spark_detok_stream_flush(stream, buf, sizeof buf, &len) == SPARK_OK && len) {
            std::fwrite(buf, 1, len, out);
            answer.append(buf, len);
        }
        if (g_interrupted) std::fprintf(stderr, "\n[interrupted]");
        std::fputc('\n', out);
        std::fflush(out);
        stats_.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        spark_detok_stream_free(stream);
        return answer;
    }

    // One token per step: sample from the last logits, decode it.
    void generate_plain(const std::function<bool(spark_token)> & emit) {
        spark_batch batch = spark_batch_init(1, 1);
        for (;;) {
            spark_token t;
            if (spark_sampler_sample(smpl_, ctx_, -1, &t) != SPARK_OK) {
                std::fprintf(stderr, "\nspark-chat: sampling failed: %s\n", spark_last_error());
                break;
            }
            if (!emit(t)) break;
            batch.n_tokens     = 1;
            batch.token[0]     = t;
            batch.pos[0]       = int32_t(cached_.size());
            batch.n_seq_id[0]  = 1;
            batch.seq_id[0][0] = 0;
            batch.logits[0]    = 1;
            if (spark_decode(ctx_, &batch) != SPARK_OK) {
                std::fprintf(stderr, "\nspark-chat: decoding failed: %s\n", spark_last_error());
                break;
            }
            cached_.push_back(t);
        }
        spark_batch_free(batch);
    }

    // 1 .. draft_max + 2 tokens per step. Tokens of the last step after the answer ends are not
    // printed (nor kept in the history); they stay in the loop's cache until the next turn's
    // spark_spec_begin cuts them. (A repetition penalty has seen them: the loop's sampler did.)
    void generate_spec(const std::function<bool(spark_token)> & emit) {
        spark_token  toks[SPARK_SPEC_MAX_DRAFT + 2];
        spark_seq_id seq = 0;
        for (;;) {
            int32_t n = 0;
            if (spark_spec_step(spec_, 1, &seq, &smpl_, toks, SPARK_SPEC_MAX_DRAFT + 2, &n) != SPARK_OK) {
                std::fprintf(stderr, "\nspark-chat: decoding failed: %s\n", spark_last_error());
                return;
            }
            for (int32_t i = 0; i < n; ++i)
                if (!emit(toks[i])) return;
        }
    }

    spark_context *          ctx_;
    const Options &          opt_;
    spark_spec *             spec_      = nullptr;
    const char *             spec_name_ = "";
    const spark_tokenizer *  tok_  = nullptr;
    const char *             tmpl_ = nullptr;
    spark_sampler *          smpl_ = nullptr;
    std::string              system_;
    std::vector<Message>     history_;
    std::vector<spark_token> cached_;  // tokens held by the KV cache (sequence 0); empty with --spec
    TurnStats                stats_;
    int64_t                  total_generated_ = 0;
    double                   load_s_          = 0;  // the wall time of spark_model_load
};

enum class Read { line, end, interrupted };  // a line; end of input (Ctrl-D); Ctrl-C while waiting

// Lines of stdin read with read() (not std::cin, which retries a read a signal interrupted): a Ctrl-C
// while it waits gives Read::interrupted. For a pipe, and for a terminal without libedit (whose
// driver drops the typed line on Ctrl-C).
class StdinLines {
public:
    Read next(std::string & line) {
        line.clear();
        for (;;) {
            const size_t nl = buf_.find('\n', pos_);
            if (nl != std::string::npos) {
                line.assign(buf_, pos_, nl - pos_);
                pos_ = nl + 1;
                return Read::line;
            }
            if (eof_) {
                if (pos_ == buf_.size()) return Read::end;
                line.assign(buf_, pos_, std::string::npos);  // a last line without '\n'
                pos_ = buf_.size();
                return Read::line;
            }
            if (g_interrupted) return Read::interrupted;
            buf_.erase(0, pos_);
            pos_ = 0;
            char          chunk[4096];
            const ssize_t n = read(STDIN_FILENO, chunk, sizeof chunk);
            if (n > 0) buf_.append(chunk, size_t(n));
            else if (n == 0 || errno != EINTR) eof_ = true;  // end of input, or a read error ends it too
        }
    }

private:
    std::string buf_;
    size_t      pos_ = 0;
    bool        eof_ = false;
};

#if SPARK_CHAT_HAS_LIBEDIT
int g_keys = 0;  // characters read since the prompt was shown (read_line: was anything typed before a Ctrl-C)

// libedit reads the keys through this (rl_getc_function): one character per call, as a wide character
// (decoded by the locale, as libedit's own reader does; invalid bytes are dropped); -1 (end of input)
// once a Ctrl-C is seen, so that readline() returns and read_line tells it from Ctrl-D by the flag.
// (libedit's own reader retries after the first interrupted read: the Ctrl-C would do nothing.)
int getc_interruptible(FILE * f) {
    std::mbstate_t state{};
    for (;;) {
        if (g_interrupted) return -1;
        char          c;
        const ssize_t n = read(fileno(f), &c, 1);
        if (n < 0 && errno == EINTR) continue;  // the flag says whether it was Ctrl-C
        if (n != 1) return -1;
        wchar_t      wc;
        const size_t r = std::mbrtowc(&wc, &c, 1, &state);
        if (r == size_t(-2)) continue;  // more bytes of this character
        if (r == size_t(-1)) {
            state = {};
            continue;
        }
        ++g_keys;
        return r == 0 ? 0 : int(wc);
    }
}
#endif

// One line. On Ctrl-C (Read::interrupted), `typed` says whether anything had been typed on it.
Read read_line(const char * prompt, std::string & line, bool interactive, StdinLines & in, bool & typed) {
    typed = false;
#if SPARK_CHAT_HAS_LIBEDIT
    if (interactive) {
        g_keys   = 0;
        char * s = readline(prompt);
        if (g_interrupted) {
            line.clear();
            typed = g_keys > 0;  // readline() does not give the partial line back: any key counts
            std::free(s);
            std::fputs("^C\n", stdout);  // the terminal is in raw mode: nothing echoed the key
            std::fflush(stdout);
            return Read::interrupted;
        }
        if (!s) return Read::end;
        line = s;
        if (!line.empty()) add_history(s);
        std::free(s);
        return Read::line;
    }
#endif
    if (interactive) {
        std::fputs(prompt, stdout);
        std::fflush(stdout);
    }
    const Read r = in.next(line);
    if (r == Read::interrupted && interactive) {
        std::fputc('\n', stdout);  // after the ^C the terminal echoed
        std::fflush(stdout);
    }
    return r;
}

// A user message, possibly over several lines ('\' continuation or a """ block). On Ctrl-C, `typed`
// says whether any of it had been typed (which is then dropped) or the prompt was empty.
Read read_message(std::string & msg, bool interactive, StdinLines & in, bool & typed) {
    msg.clear();
    typed = false;
    std::string line;
    bool        block = false;
    for (;;) {
        const char * prompt = msg.empty() && !block ? "> " : ". ";
        bool         typed_line = false;
        const Read   r          = read_line(prompt, line, interactive, in, typed_line);
        if (r == Read::interrupted) {
            typed = block || !msg.empty() || typed_line;
            msg.clear();
            return r;
        }
        if (r == Read::end) return msg.empty() ? Read::end : Read::line;
        if (line == "\"\"\"") {
            if (block) return Read::line;
            block = true;
            continue;
        }
        if (block) {
            msg += line + "\n";
            continue;
        }
        if (!line.empty() && line.back() == '\\') {
            msg += line.substr(0, line.size() - 1) + "\n";
            continue;
        }
        msg += line;
        return Read::line;
    }
}

const char * kHelp =
    "commands:\n"
    "  /reset          forget the conversation\n"
    "  /system TEXT    set the system prompt (and reset)\n"
    "  /stats          timings of the last answer (and draft acceptance with --spec)\n"
    "  /help           this text\n"
    "  /quit           leave (or Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "a line ending in '\\' continues on the next line; a line of \"\"\" starts/ends a multi-line block;\n"
    "Ctrl-C stops the current answer, and at the prompt drops what was typed.\n";

// Shown at a Ctrl-C at an empty prompt; a second one there leaves.
const char * kLeaveHint = "(Ctrl-C stops an answer; to leave, press Ctrl-C again, press Ctrl-D or type /quit)\n";

// A value out of range: "spark-chat: -c/--ctx-size -5: WHY" on stderr, exit code 2 (CLI11's own
// errors, e.g. a value that is not a number, exit with 2 too).
int refuse(const CLI::Option * opt, const std::string & why) {
    std::string names = opt->get_name(false, true);  // "-c,--ctx-size"
    std::replace(names.begin(), names.end(), ',', '/');
    const std::string value = opt->results().empty() ? std::string() : opt->results().back();
    std::fprintf(stderr, "spark-chat: %s %s: %s\n", names.c_str(), value.c_str(), why.c_str());
    return 2;
}

}  // namespace

int main(int argc, char ** argv) {
    // llama.cpp's -sys: CLI11 takes one-letter short names only, so it is renamed before parsing.
    std::vector<char *> args(argv, argv + argc);
    static char         system_prompt[] = "--system-prompt";
    for (size_t i = 1; i < args.size(); ++i)
        if (std::strcmp(args[i], "-sys") == 0) args[i] = system_prompt;

    Options o;
    o.model = spark_cli::default_model();
    CLI::App app{"spark-chat: chat with a model (Hugging Face directory or spark file)"};
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    spark_cli::add_version_flag(app, "spark-chat");
    app.add_option("-m,--model", o.model, "model directory or spark file (default: the demo model)");
    CLI::Option * prompt_opt = app.add_option("-p,--prompt", o.prompt, "one user message: print the answer and exit");
    CLI::Option * file_opt   = app.add_option("-f,--file", o.prompt_file, "as -p, the message read from a file")->check(CLI::ExistingFile);
    file_opt->excludes(prompt_opt);
    app.add_option("--system,--system-prompt", o.system, "system prompt (also -sys)");
    CLI::Option * temp_opt    = app.add_option("--temp", o.temp, "temperature (0: greedy)");
    CLI::Option * top_k_opt   = app.add_option("--top-k", o.top_k, "top-k (0: off)");
    CLI::Option * top_p_opt   = app.add_option("--top-p", o.top_p, "top-p (1: off)");
    CLI::Option * min_p_opt   = app.add_option("--min-p", o.min_p, "min-p (0: off)");
    CLI::Option * penalty_opt = app.add_option("--repeat-penalty", o.repeat_penalty, "repetition penalty (1: off)");
    CLI::Option * last_n_opt  = app.add_option("--repeat-last-n", o.repeat_last_n, "tokens the repetition penalty looks back on (0: off, -1: all)");
    CLI::Option * seed_opt    = app.add_option("-s,--seed", o.seed, "random seed (-1: random; the timings line shows the seed used)");
    CLI::Option * n_opt       = app.add_option("-n,--max-tokens,--n-predict,--predict", o.n_predict, "maximum tokens per answer (-1: until the answer ends or the context is full)");
    CLI::Option * ctx_opt     = app.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens (0: the model's, at most 32768)");
    CLI::Option * threads_opt = app.add_option("-t,--threads", o.n_threads, "CPU threads (0 or -1: all)");
    app.add_option("--device", o.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    o.split.add(app);
    app.add_option("--spec", o.spec, "speculative decoding: draft:PATH (a draft model), eagle3:PATH (an EAGLE3 head), mtp (the model's MTP head) or ngram");
    app.add_option("--draft-max", o.draft_max, "--spec: tokens drafted per step (1 .. 16)");
    app.add_option("--draft-min", o.draft_min, "--spec: drafts shorter than this are not verified (0: all are)");
    app.add_option("--draft-p-min", o.draft_p_min, "--spec: model drafters stop at a token they give less probability (0: off)");
    if (const auto stop = spark_cli::parse_args(app, int(args.size()), args.data(), "spark-chat")) return *stop;
    spark_cli::install_stderr_log();

    // Values out of range: refused before the model loads.
    if (!(o.temp >= 0.0f)) return refuse(temp_opt, "the temperature must be >= 0 (0: greedy)");
    if (o.top_k < 0) return refuse(top_k_opt, "top-k must be >= 0 (0: off)");
    if (!(o.top_p >= 0.0f && o.top_p <= 1.0f)) return refuse(top_p_opt, "top-p must be between 0 and 1 (1: off)");
    if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) return refuse(min_p_opt, "min-p must be between 0 and 1 (0: off)");
    if (!(o.repeat_penalty > 0.0f && std::isfinite(o.repeat_penalty))) return refuse(penalty_opt, "the repetition penalty must be > 0 (1: off)");
    if (o.repeat_last_n < -1) return refuse(last_n_opt, "must be >= 0 tokens, or -1 (all)");
    if (o.seed < -1 || o.seed > int64_t(UINT32_MAX)) return refuse(seed_opt, "the seed must be between 0 and 4294967295 (-1: random)");
    if (o.n_predict == 0) return refuse(n_opt, "nothing to generate; give the most tokens an answer may have, or -1 for no limit");
    if (o.n_predict < -1) return refuse(n_opt, "must be a number of tokens > 0, or -1 (until the answer ends or the context is full)");
    if (o.n_ctx < 0) return refuse(ctx_opt, "the context size must not be negative (0: the model's context length)");
    if (o.n_threads < -1) return refuse(threads_opt, "must be a number of threads > 0 (0 or -1: all)");
    const unsigned hw_threads = std::thread::hardware_concurrency();
    if (hw_threads > 0 && o.n_threads > int32_t(hw_threads)) {
        std::fprintf(stderr, "spark-chat: -t/--threads %d: this machine has %u hardware threads; using %u\n", o.n_threads, hw_threads, hw_threads);
        o.n_threads = int32_t(hw_threads);
    }
    if (!o.prompt_file.empty()) {
        std::ifstream      in(o.prompt_file, std::ios::binary);
        std::ostringstream text;
        text << in.rdbuf();
        if (!in) return refuse(file_opt, std::string("cannot read it: ") + std::strerror(errno));
        o.prompt = text.str();
        if (!o.prompt.empty() && o.prompt.back() == '\n') o.prompt.pop_back();  // as llama.cpp's -f
        if (!o.prompt.empty() && o.prompt.back() == '\r') o.prompt.pop_back();
        if (o.prompt.empty()) return refuse(file_opt, "the file is empty: nothing to ask");
    }
    if (o.seed >= 0) {
        o.seed_used = uint32_t(o.seed);
    } else {
        try {
            o.seed_used = std::random_device{}();
        } catch (const std::exception &) {  // no entropy source: the clock
            o.seed_used = uint32_t(std::chrono::steady_clock::now().time_since_epoch().count());
        }
    }

    spark_cli::SpecOption spec_opt;
    if (!o.spec.empty()) {
        std::string err;
        if (!spark_cli::parse_spec(o.spec, spec_opt, err)) {
            std::fprintf(stderr, "spark-chat: %s\n", err.c_str());
            return 1;
        }
    }

    // Ctrl-C cancels the load (the progress callback stops it) and later stops an answer; in between
    // (context, --spec set-up) it ends the program as it always did.
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);

    spark_model_params mp = spark_model_default_params();
    mp.device             = o.device == "cuda" ? SPARK_DEVICE_CUDA : o.device == "auto" ? SPARK_DEVICE_AUTO : SPARK_DEVICE_CPU;
    mp.n_threads          = o.n_threads;
    if (std::string err; !o.split.apply(mp, err)) {
        std::fprintf(stderr, "spark-chat: %s\n", err.c_str());
        return 2;
    }
    spark_model * model   = nullptr;
    double        load_s  = 0;
    {
        spark_cli::LoadProgress bar(isatty(STDERR_FILENO) != 0, &g_interrupted);  // a bar only on a terminal
        bar.attach(mp);
        const auto         t0 = std::chrono::steady_clock::now();
        const spark_status st = spark_model_load(o.model.c_str(), mp, &model);
        load_s                = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        bar.finish();
        std::signal(SIGINT, SIG_DFL);
        // Ctrl-C after the last progress call: the load went through, but the user asked to stop.
        if (g_interrupted || st == SPARK_ERR_ABORTED) {
            std::fprintf(stderr, "spark-chat: loading cancelled (Ctrl-C)\n");
            spark_model_free(model);
            return 130;
        }
        if (st != SPARK_OK) {
            std::fprintf(stderr, "spark-chat: cannot load the model '%s': %s\n", o.model.c_str(), spark_last_error());
            return 1;
        }
    }
    const spark_tokenizer * tok = spark_model_get_tokenizer(model);
    if (!tok) {
        std::fprintf(stderr, "spark-chat: '%s' has no tokenizer (tokenizer.json); spark-chat needs one\n", o.model.c_str());
        spark_model_free(model);
        return 1;
    }
    if (!spark_tokenizer_chat_template(tok)) {
        std::fprintf(stderr, "spark-chat: '%s' has no chat template (tokenizer_config.json chat_template); spark-chat needs one\n", o.model.c_str());
        spark_model_free(model);
        return 1;
    }
    spark_model_info info{};
    spark_model_get_info(model, &info);
    if (info.n_ctx_train > 0 && o.n_ctx > info.n_ctx_train) {
        std::fprintf(stderr, "spark-chat: -c/--ctx-size %d: the model's context length is %d tokens; using %d\n", o.n_ctx, info.n_ctx_train,
                     info.n_ctx_train);
        o.n_ctx = info.n_ctx_train;
    }
    spark_context_params cp = spark_context_default_params();
    cp.n_ctx                = o.n_ctx > 0 ? o.n_ctx : std::min(info.n_ctx_train, 32768);
    cp.n_threads            = o.n_threads;
    spark_context * ctx     = nullptr;
    if (spark_context_init(model, cp, &ctx) != SPARK_OK) {
        std::fprintf(stderr, "spark-chat: cannot create a context of %d tokens: %s\n", cp.n_ctx, spark_last_error());
        spark_model_free(model);
        return 1;
    }

    spark_spec * spec = nullptr;
    if (!o.spec.empty()) {
        spark_spec_params sp = spark_cli::spec_params(spec_opt, o.draft_max);
        sp.n_draft_min       = o.draft_min;
        sp.p_min             = o.draft_p_min;
        if (spark_spec_init(ctx, sp, &spec) != SPARK_OK) {
            std::fprintf(stderr, "spark-chat: cannot start speculative decoding (--spec %s): %s\n", o.spec.c_str(), spark_last_error());
            spark_context_free(ctx);
            spark_model_free(model);
            return 1;
        }
    }

    g_interrupted = 0;
    sigaction(SIGINT, &sa, nullptr);
#if SPARK_CHAT_HAS_LIBEDIT
    rl_catch_signals = 0;
    rl_getc_function = getc_interruptible;  // before the first readline(), which installs it
    if (o.prompt.empty() && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO))
        std::setlocale(LC_CTYPE, "");  // libedit: the terminal's characters (UTF-8), not only ASCII
#endif

    int rc = 0;
    {
        Chat chat(model, ctx, o, spec, spec_opt.name.c_str());
        chat.set_load_seconds(load_s);
        if (!o.prompt.empty()) {
            rc = chat.turn(o.prompt, stdout) ? 0 : 1;
            if (rc == 0) chat.print_stats(stderr);
        } else {
            const bool interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
            if (interactive)
                std::fprintf(stderr, "spark-chat: %s (%s, %s, %.1fM parameters) on %s%s. /help for commands.\n", o.model.c_str(),
                             info.architecture, info.weight_format, double(info.n_params) / 1e6, o.device.c_str(),
                             spec ? (", speculative: " + o.spec + ", up to " + std::to_string(o.draft_max) + " drafts").c_str() : "");
            StdinLines  in;
            std::string msg;
            bool        leave_next = false;  // the last input was a Ctrl-C at an empty prompt: another one leaves
            for (;;) {
                g_interrupted = 0;  // from here on a Ctrl-C is the prompt's, then the turn's (also while its prompt decodes)
                bool       typed = false;
                const Read r     = read_message(msg, interactive, in, typed);
                if (r == Read::end) {
                    if (interactive) std::fputc('\n', stdout);  // Ctrl-D: the shell's prompt on a line of its own
                    break;
                }
                if (r == Read::interrupted) {
                    if (typed) {  // what was typed is dropped; a fresh prompt
                        leave_next = false;
                        continue;
                    }
                    if (leave_next) break;
                    std::fputs(kLeaveHint, stderr);
                    leave_next = true;
                    continue;
                }
                leave_next = false;
                if (msg.empty()) continue;
                if (msg == "/quit" || msg == "/exit") break;
                if (msg == "/help") {
                    std::fputs(kHelp, stderr);
                } else if (msg == "/reset") {
                    chat.reset();
                    std::fprintf(stderr, "(conversation reset)\n");
                } else if (msg.rfind("/system", 0) == 0) {
                    chat.set_system(msg.size() > 8 ? msg.substr(8) : "");
                    std::fprintf(stderr, "(system prompt set; conversation reset)\n");
                } else if (msg == "/stats") {
                    chat.print_stats(stderr);
                } else if (msg[0] == '/') {
                    std::fprintf(stderr, "unknown command %s; /help lists them\n", msg.c_str());
                } else if (!chat.turn(msg, stdout)) {
                    rc = interactive ? 0 : 1;
                }
            }
        }
    }
    spark_spec_free(spec);
    spark_context_free(ctx);
    spark_model_free(model);
    return rc;
}
