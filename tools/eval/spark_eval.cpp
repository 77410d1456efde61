// spark-eval: run a model over a prompt given as token ids and write what it computed, for checks
// against a reference (like llama.cpp's eval tools). Stable interface:
//
//   spark-eval --model PATH --tokens 1,2,3 --logits-out OUT.safetensors --greedy N [--device cpu|cuda]
//              [--spec draft:PATH|eagle3:PATH|mtp|ngram [--draft-max K]]
//
// OUT.safetensors holds `logits` (F32 [n_tokens, n_vocab], every prompt position) and `greedy`
// (I32 [N], the greedy continuation after the prompt). Exit code 0 on success, 2 for bad options (a
// value that is not a number, e.g. a token id), 1 for other errors; errors go to stderr.
// With --spec the greedy continuation comes from the speculative loop (spark_spec_*, in a context of
// its own; the logits are still the plain prompt decode's), so comparing it with a run without
// --spec checks that speculation changes no token; the acceptance figures go to stderr.
#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include "../common/parse_args.h"
#include "log_stderr.h"
#include "spec_cli.h"
#include "version.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// "1,2,3" (empty items skipped). Throws std::invalid_argument naming the bad item.
std::vector<int32_t> parse_ids(const std::string & s) {
    std::vector<int32_t> ids;
    std::stringstream    ss(s);
    std::string          item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        int32_t                      v   = 0;
        const char *                 end = item.data() + item.size();
        const std::from_chars_result r   = std::from_chars(item.data(), end, v);
        if (r.ec != std::errc() || r.ptr != end || v < 0)
            throw std::invalid_argument("'" + item + "' is not a token id (a non-negative integer" +
                                        (r.ec == std::errc::result_out_of_range ? " that fits in 32 bits)" : ")"));
        ids.push_back(v);
    }
    return ids;
}

// A minimal safetensors writer for the two outputs.
struct OutTensor {
    std::string          name, dtype;
    std::vector<int64_t> shape;
    std::string          bytes;
};

bool write_safetensors(const std::string & path, const std::vector<OutTensor> & tensors) {
    std::string header = "{";
    size_t      offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const OutTensor & t = tensors[i];
        if (i) header += ',';
        header += '"' + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
        for (size_t d = 0; d < t.shape.size(); ++d) {
            if (d) header += ',';
            header += std::to_string(t.shape[d]);
        }
        header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.bytes.size()) + "]}";
        offset += t.bytes.size();
    }
    header += "}";
    while (header.size() % 8) header += ' ';
    std::ofstream out(path, std::ios::binary);
    if (!out) return false;
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xFF));
    out << header;
    for (const OutTensor & t : tensors) out.write(t.bytes.data(), std::streamsize(t.bytes.size()));
    return bool(out);
}

int fail(const char * what, spark_status st) {
    std::fprintf(stderr, "spark-eval: %s: %s (%s)\n", what, spark_last_error(), spark_status_str(st));
    return 1;
}

// The first n greedy tokens after `prompt` through the speculative loop, in a fresh context (the
// last step's surplus dropped). Prints the acceptance figures. 0 on success, else 1 (reported).
int spec_greedy(spark_model * model, const std::vector<int32_t> & prompt, int n, int32_t n_threads, const spark_cli::SpecOption & so,
                int32_t draft_max, std::string & greedy) {
    spark_context_params cp = spark_context_default_params();
    cp.n_ctx                = int32_t(prompt.size()) + n + draft_max + 1;  // room for a last step's drafts
    cp.n_batch              = std::max(int32_t(prompt.size()), draft_max + 1);  // a verify step is draft_max + 1 rows
    cp.n_threads            = n_threads;
    spark_context * ctx     = nullptr;
    if (spark_status st = spark_context_init(model, cp, &ctx); st != SPARK_OK) return fail("creating the speculative context", st);
    const spark_spec_params sp = spark_cli::spec_params(so, draft_max);
    spark_spec *    spec = nullptr;
    spark_sampler * smpl = spark_sampler_init_greedy();
    int             rc   = 0;
    spark_status    st   = spark_spec_init(ctx, sp, &spec);
    if (st != SPARK_OK) rc = fail("speculative decoding", st);
    else if ((st = spark_spec_begin(spec, 0, prompt.data(), int32_t(prompt.size()))) != SPARK_OK) rc = fail("decoding the prompt (speculative)", st);
    // End-of-generation tokens do not stop it: like the plain loop, it continues to n tokens.
    for (int have = 0; rc == 0 && have < n;) {
        spark_token  out[SPARK_SPEC_MAX_DRAFT + 2];
        int32_t      n_out = 0;
        spark_seq_id seq   = 0;
        if ((st = spark_spec_step(spec, 1, &seq, &smpl, out, SPARK_SPEC_MAX_DRAFT + 2, &n_out)) != SPARK_OK) {
            rc = fail("speculative step", st);
            break;
        }
        for (int32_t i = 0; i < n_out && have < n; ++i, ++have) greedy.append(reinterpret_cast<const char *>(&out[i]), sizeof out[i]);
    }
    if (rc == 0) {
        spark_spec_stats s{};
        spark_spec_get_stats(spec, &s);
        std::fprintf(stderr, "spark-eval: speculative (%s, up to %d drafts): %s\n", so.name.c_str(), draft_max,
                     spark_cli::describe_spec_stats(s, draft_max).c_str());
    }
    spark_sampler_free(smpl);
    spark_spec_free(spec);
    spark_context_free(ctx);
    return rc;
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-eval: logits and greedy continuation of a prompt, for checks against a reference"};
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    spark_cli::add_version_flag(app, "spark-eval");
    std::string model_path, tokens_arg, out_path, device = "cpu";
    std::string spec_arg;
    int         n_greedy = 0, n_threads = 0, draft_max = 3;
    app.add_option("-m,--model", model_path, "Hugging Face directory or spark file")->required();
    app.add_option("--tokens", tokens_arg, "prompt token ids, comma separated")->required();
    app.add_option("--logits-out", out_path, "output .safetensors (logits, greedy)")->required();
    app.add_option("--greedy", n_greedy, "tokens of greedy continuation")->check(CLI::Range(0, 1 << 20));
    app.add_option("--device", device, "cpu, cuda, or auto: cuda when a usable CUDA device is there, else cpu")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("-t,--threads", n_threads, "CPU threads (0: all)")->check(CLI::Range(0, INT_MAX, "NONNEGATIVE"));
    app.add_option("--spec", spec_arg, "greedy continuation by speculative decoding: draft:PATH, eagle3:PATH, mtp or ngram");
    app.add_option("--draft-max", draft_max, "--spec: tokens drafted per step")->check(CLI::Range(1, SPARK_SPEC_MAX_DRAFT));
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-eval")) return *stop;
    spark_cli::install_stderr_log();

    spark_cli::SpecOption spec;
    if (!spec_arg.empty()) {
        std::string err;
        if (!spark_cli::parse_spec(spec_arg, spec, err)) {
            std::fprintf(stderr, "spark-eval: %s\n", err.c_str());
            return 1;
        }
    }

    std::vector<int32_t> prompt;
    try {
        prompt = parse_ids(tokens_arg);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "spark-eval: --tokens: %s\n", e.what());
        return 2;
    }
    if (prompt.empty()) {
        std::fprintf(stderr, "spark-eval: --tokens is empty\n");
        return 2;
    }

    spark_model_params mp = spark_model_default_params();
    mp.device             = device == "cuda" ? SPARK_DEVICE_CUDA : device == "auto" ? SPARK_DEVICE_AUTO : SPARK_DEVICE_CPU;
    mp.n_threads          = n_threads;
    mp.load_tokenizer     = false;
    spark_model * model   = nullptr;
    if (spark_status st = spark_model_load(model_path.c_str(), mp, &model); st != SPARK_OK) return fail("loading the model", st);
    spark_model_info info{};
    spark_model_get_info(model, &info);

    spark_context_params cp = spark_context_default_params();
    cp.n_ctx                = int32_t(prompt.size()) + n_greedy + 1;
    cp.n_batch              = int32_t(prompt.size());
    cp.n_threads            = n_threads;
    spark_context * ctx     = nullptr;
    if (spark_status st = spark_context_init(model, cp, &ctx); st != SPARK_OK) {
        spark_model_free(model);
        return fail("creating the context", st);
    }

    int          rc    = 0;
    spark_batch  batch = spark_batch_init(int32_t(prompt.size()), 1);
    OutTensor    logits{"logits", "F32", {int64_t(prompt.size()), info.n_vocab}, {}};
    OutTensor    greedy{"greedy", "I32", {n_greedy}, {}};
    for (size_t i = 0; i < prompt.size(); ++i) {
        batch.token[i]     = prompt[i];
        batch.pos[i]       = int32_t(i);
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = 1;
    }
    batch.n_tokens = int32_t(prompt.size());
    spark_status st = spark_decode(ctx, &batch);
    if (st != SPARK_OK) {
        rc = fail("decoding the prompt", st);
    } else {
        const float * all = spark_get_logits(ctx);
        logits.bytes.assign(reinterpret_cast<const char *>(all), prompt.size() * size_t(info.n_vocab) * sizeof(float));
        if (!spec_arg.empty()) rc = spec_greedy(model, prompt, n_greedy, n_threads, spec, draft_max, greedy.bytes);
        spark_sampler * smpl = spark_sampler_init_greedy();
        spark_pos       pos  = int32_t(prompt.size());
        for (int i = 0; i < n_greedy && rc == 0 && spec_arg.empty(); ++i) {
            spark_token t;
            st = spark_sampler_sample(smpl, ctx, -1, &t);
            if (st != SPARK_OK) {
                rc = fail("sampling", st);
                break;
            }
            greedy.bytes.append(reinterpret_cast<const char *>(&t), sizeof t);
            if (i + 1 == n_greedy) break;
            batch.n_tokens  = 1;
            batch.token[0]  = t;
            batch.pos[0]    = pos++;
            batch.logits[0] = 1;
            if ((st = spark_decode(ctx, &batch)) != SPARK_OK) rc = fail("decoding", st);
        }
        spark_sampler_free(smpl);
    }
    if (rc == 0 && !write_safetensors(out_path, {logits, greedy})) {
        std::fprintf(stderr, "spark-eval: cannot write '%s'\n", out_path.c_str());
        rc = 1;
    }
    if (rc == 0) std::fprintf(stderr, "spark-eval: %s, %zu prompt tokens, %d greedy tokens -> %s\n", info.architecture, prompt.size(), n_greedy, out_path.c_str());
    spark_batch_free(batch);
    spark_context_free(ctx);
    spark_model_free(model);
    return rc;
}
