// spark-server: an OpenAI-compatible HTTP server on libspark's public C API.
//
//   spark-server -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel 4] [-c CTX] [--api-key KEY]
//
// Loads the model, then serves /v1/chat/completions, /v1/completions, /v1/models, /tokenize,
// /detokenize, /apply-template, /health, /metrics and a chat page at /. Up to --parallel requests decode together
// in one batch per step; more wait in a queue of --queue requests; beyond that a request is answered
// 503 with Retry-After. When it is ready it prints "spark-server: listening on http://HOST:PORT" on
// stderr (with --port 0 the port is the one the system picked). SIGINT / SIGTERM stop it: running
// requests end with an error, the process exits 0.
#include "api.h"
#include "engine.h"

#include <spark/spark.h>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "default_model.h"
#include "load_progress.h"
#include "log_stderr.h"
#include "parse_args.h"
#include "spec_cli.h"
#include "split_cli.h"
#include "version.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <pthread.h>
#include <sys/socket.h>
#include <sstream>
#include <string>
#include <thread>

namespace {

struct Options {
    spark_cli::SplitOptions split;  // --devices / --split
    std::string model = spark_cli::default_model();
    std::string host  = "127.0.0.1";
    int         port  = 8080;
    std::string api_key, device = "auto", alias, chat_template_file, chat_template_kwargs, spec;
    int32_t     draft_max = 3;
    int32_t     n_parallel = 4, n_ctx = 0, n_batch = 512, max_queue = 64, n_threads = 0;
    size_t      max_body_mb = 8;
    spark_server::SamplingParams sampling;
};

int fail(const std::string & msg) {
    std::fprintf(stderr, "spark-server: %s\n", msg.c_str());
    return 1;
}

}  // namespace

int main(int argc, char ** argv) {
    Options   o;
    CLI::App  app{"spark-server: an OpenAI-compatible server (chat, completions, tool calls, streaming) with continuous batching"};
    app.option_defaults()->always_capture_default();
    auto & s = o.sampling;
    app.add_option("-m,--model", o.model, "model directory, spark file or GGUF (default: the bundled demo model)");
    app.add_option("--host", o.host, "address to listen on (0.0.0.0: every interface)");
    app.add_option("--port", o.port, "port (0: any free port, printed when ready)")->check(CLI::Range(0, 65535));
    app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on every endpoint but / and /health");
    app.add_option("--device", o.device, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    o.split.add(app);
    app.add_option("--parallel", o.n_parallel, "requests decoded together (slots)")->check(CLI::Range(1, 256));
    app.add_option("-c,--ctx-size", o.n_ctx, "KV-cache tokens of all slots together, split evenly (0: the model's context, at most 8192, per slot)")
        ->check(CLI::Range(0, 1 << 24));
    app.add_option("-b,--batch-size", o.n_batch, "tokens per decode step: the answering slots' rows plus prompt chunks")->check(CLI::Range(8, 8192));
    app.add_option("--queue", o.max_queue, "requests waiting for a slot; more are answered 503")->check(CLI::Range(0, 100000));
    app.add_option("-t,--threads", o.n_threads, "CPU threads (0: all)")->check(CLI::Range(0, 1024));
    app.add_option("--alias", o.alias, "the model name /v1/models reports (default: the model's file or directory name)");
    app.add_option("--chat-template-file", o.chat_template_file, "a Jinja chat template to use instead of the model's");
    app.add_option("--chat-template-kwargs", o.chat_template_kwargs, "JSON object of template variables for every request, e.g. '{\"enable_thinking\": false}'");
    app.add_option("--max-body-mb", o.max_body_mb, "largest request body in MB (larger: 413)")->check(CLI::Range(1, 1024));
    app.add_option("--temp", s.temperature, "default temperature (0: greedy)")->check(CLI::Range(0.0, 2.0));
    app.add_option("--top-k", s.top_k, "default top-k (0: off)")->check(CLI::Range(0, 1 << 30));
    app.add_option("--top-p", s.top_p, "default top-p")->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-p", s.min_p, "default min-p")->check(CLI::Range(0.0, 1.0));
    app.add_option("--repeat-penalty", s.repeat_penalty, "default repetition penalty (1: off)")->check(CLI::Range(0.0, 10.0));
    app.add_option("--repeat-last-n", s.repeat_last_n, "tokens the repetition penalty looks back (-1: all)")->check(CLI::Range(-1, 1 << 20));
    app.add_option("--presence-penalty", s.presence, "default presence penalty")->check(CLI::Range(-2.0, 2.0));
    app.add_option("--frequency-penalty", s.frequency, "default frequency penalty")->check(CLI::Range(-2.0, 2.0));
    app.add_option("--spec", o.spec, std::string("speculative decoding for every request: ") + spark_cli::kSpecSyntax +
                                         " (greedy answers unchanged; a prompt is then decoded in one piece)");
    app.add_option("--draft-max", o.draft_max, "--spec: tokens drafted per step")->check(CLI::Range(1, SPARK_SPEC_MAX_DRAFT));
    spark_cli::add_version_flag(app, "spark-server");
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-server")) return *stop;

    spark_cli::SpecOption spec_opt;
    if (std::string err; !o.spec.empty() && !spark_cli::parse_spec(o.spec, spec_opt, err)) {
        std::fprintf(stderr, "spark-server: %s\n", err.c_str());
        return 2;
    }
    nlohmann::json kwargs = nlohmann::json::object();
    if (!o.chat_template_kwargs.empty()) {
        try {
            kwargs = nlohmann::json::parse(o.chat_template_kwargs);
        } catch (const std::exception & e) {
            return fail(std::string("--chat-template-kwargs is not valid JSON: ") + e.what());
        }
        if (!kwargs.is_object()) return fail("--chat-template-kwargs must be a JSON object");
    }
    std::string chat_template;
    if (!o.chat_template_file.empty()) {
        std::ifstream in(o.chat_template_file, std::ios::binary);
        if (!in) return fail("cannot read --chat-template-file " + o.chat_template_file);
        std::ostringstream ss;
        ss << in.rdbuf();
        chat_template = ss.str();
    }

    // SIGINT / SIGTERM are taken by one thread (sigwait), so that no other thread is interrupted by
    // them; blocked before any thread starts.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client that goes away mid-write is a failed write, not the end of the server

    spark_cli::install_stderr_log();
    spark_model_params mp = spark_model_default_params();
    mp.device             = o.device == "cuda" ? SPARK_DEVICE_CUDA : o.device == "cpu" ? SPARK_DEVICE_CPU : SPARK_DEVICE_AUTO;
    mp.n_threads          = o.n_threads;
    if (std::string err; !o.split.apply(mp, err)) {
        std::fprintf(stderr, "spark-server: %s\n", err.c_str());
        return 2;
    }
    spark_cli::LoadProgress progress;
    progress.attach(mp);
    spark_model * model = nullptr;
    if (spark_model_load(o.model.c_str(), mp, &model) != SPARK_OK) {
        progress.finish();
        return fail("cannot load " + o.model + ": " + spark_last_error());
    }
    progress.finish();
    std::unique_ptr<spark_model, void (*)(spark_model *)> model_guard(model, spark_model_free);
    spark_model_info info{};
    spark_model_get_info(model, &info);
    const spark_tokenizer * tok = spark_model_get_tokenizer(model);
    if (!tok) return fail(o.model + " has no tokenizer");
    if (chat_template.empty() && spark_tokenizer_chat_template(tok)) chat_template = spark_tokenizer_chat_template(tok);

    const int32_t per_slot_default = std::min(info.n_ctx_train > 0 ? info.n_ctx_train : 8192, 8192);
    const int32_t n_ctx            = o.n_ctx > 0 ? o.n_ctx : per_slot_default * o.n_parallel;
    const int32_t n_ctx_slot       = n_ctx / o.n_parallel;
    if (n_ctx_slot < 16) return fail("-c/--ctx-size " + std::to_string(n_ctx) + " leaves " + std::to_string(n_ctx_slot) + " tokens per slot; give at least 16 per slot");
    if (info.n_ctx_train > 0 && n_ctx_slot > info.n_ctx_train)
        std::fprintf(stderr, "spark-server: %d tokens per slot is beyond the model's context length (%d)\n", n_ctx_slot, info.n_ctx_train);
    spark_context_params cp = spark_context_default_params();
    // A speculative step appends up to draft_max + 1 rows to a slot before it cuts the rejected
    // ones: room for that beyond the slots' shares.
    cp.n_ctx                = n_ctx_slot * o.n_parallel + (o.spec.empty() ? 0 : o.n_parallel * (o.draft_max + 2));
    cp.n_seq_max            = o.n_parallel;
    cp.n_batch              = o.n_batch;
    cp.n_threads            = o.n_threads;
    cp.n_snapshots          = info.n_layer_linear_attention > 0 ? 2 * o.n_parallel : 0;  // two per slot: prefix reuse (engine.h)
    spark_context * ctx     = nullptr;
    if (spark_context_init(model, cp, &ctx) != SPARK_OK)
        return fail("cannot create a context of " + std::to_string(cp.n_ctx) + " tokens: " + spark_last_error());
    std::unique_ptr<spark_context, void (*)(spark_context *)> ctx_guard(ctx, spark_context_free);
    spark_spec * spec = nullptr;
    if (!o.spec.empty()) {
        if (spark_spec_init(ctx, spark_cli::spec_params(spec_opt, o.draft_max), &spec) != SPARK_OK) return fail("--spec " + o.spec + ": " + spark_last_error());
    }
    std::unique_ptr<spark_spec, void (*)(spark_spec *)> spec_guard(spec, spark_spec_free);

    spark_server::ApiConfig cfg;
    cfg.model_id        = !o.alias.empty() ? o.alias : std::filesystem::path(o.model).filename().string();
    if (cfg.model_id.empty()) cfg.model_id = std::filesystem::path(o.model).parent_path().filename().string();
    cfg.api_key         = o.api_key;
    cfg.chat_template   = chat_template;
    cfg.template_kwargs = kwargs;
    cfg.sampling        = o.sampling;
    cfg.n_ctx_slot      = n_ctx_slot;
    cfg.max_body        = o.max_body_mb << 20;
    cfg.speculative     = spec != nullptr;

    spark_server::EngineOptions eo;
    eo.n_parallel = o.n_parallel;
    eo.n_ctx_slot = n_ctx_slot;
    eo.n_batch    = o.n_batch;
    eo.max_queue  = o.max_queue;
    eo.spec       = spec;
    auto engine   = std::make_unique<spark_server::Engine>(model, ctx, eo);

    httplib::Server server;
    // One thread per connection that can be busy at once: every slot, every queued request, and a
    // few for the small endpoints, so that an overloaded server still answers 503 at once.
    const size_t http_threads = size_t(o.n_parallel) + size_t(o.max_queue) + 8;
    server.new_task_queue     = [http_threads] { return new httplib::ThreadPool(http_threads); };
    // cpp-httplib listens with a backlog of 5, compiled into the library: as many clients as there
    // are threads connecting at once overflow it while the accept loop waits for a core (a loaded
    // machine), and Linux then resets connections (SYN cookies). The listening socket is kept as the
    // library makes it and listen() called again with room for every thread (Linux takes a second
    // listen() as the new backlog).
    int listen_fd = -1;
    server.set_socket_options([&listen_fd](socket_t sock) {
        httplib::default_socket_options(sock);
        listen_fd = int(sock);
    });
    spark_server::mount_api(server, *engine, model, cfg);

    const int port = o.port == 0 ? server.bind_to_any_port(o.host) : (server.bind_to_port(o.host, o.port) ? o.port : -1);
    if (port < 0) return fail("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (address in use or not available)");
    if (listen_fd >= 0 && ::listen(listen_fd, int(std::min<size_t>(http_threads * 2, 4096))) != 0)
        std::fprintf(stderr, "spark-server: warning: could not enlarge the listen backlog (%s)\n", std::strerror(errno));

    std::thread signal_thread([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        std::fprintf(stderr, "spark-server: stopping (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        engine->shutdown();  // running requests end now, so their connections close
        server.stop();
    });
    std::fprintf(stderr, "spark-server: %s (%s, %s), %d slots of %d tokens, device %s%s\n", cfg.model_id.c_str(), info.architecture,
                 info.weight_format, o.n_parallel, n_ctx_slot, o.device.c_str(), o.spec.empty() ? "" : (", speculative: " + o.spec).c_str());
    std::fprintf(stderr, "spark-server: listening on http://%s:%d\n", o.host.c_str(), port);
    const bool ok = server.listen_after_bind();
    if (signal_thread.joinable()) {
        pthread_kill(signal_thread.native_handle(), SIGTERM);  // listen ended by itself: let the thread go
        signal_thread.join();
    }
    engine.reset();
    return ok ? 0 : 1;
}
