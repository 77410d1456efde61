// The --spec option of spark-chat, spark-eval and spark-bench (KIND[:PATH]) and the acceptance
// figures they print from spark_spec_get_stats. Header-only: each program links only libspark.
#pragma once

#include <spark/spark.h>

#include <cstdio>
#include <string>

namespace spark_cli {

struct SpecOption {
    spark_spec_kind kind = SPARK_SPEC_NGRAM;
    std::string     name;  // "draft", "eagle3", "mtp", "ngram"
    std::string     path;  // the draft model or the EAGLE3 head
};

inline const char * kSpecSyntax = "draft:PATH, eagle3:PATH, mtp or ngram";

// Parses "draft:PATH", "eagle3:PATH", "mtp" or "ngram" (only the first ':' separates, so a PATH may
// hold colons, e.g. draft:synthetic:tiny-qwen3:bf16). False with a message in `error` otherwise.
inline bool parse_spec(const std::string & arg, SpecOption & out, std::string & error) {
    const size_t      colon = arg.find(':');
    const std::string kind  = arg.substr(0, colon);
    const std::string path  = colon == std::string::npos ? "" : arg.substr(colon + 1);
    if (kind == "draft" || kind == "eagle3") {
        if (path.empty()) {
            error = "--spec " + kind + " needs a path (" + kind + ":PATH)";
            return false;
        }
        out = {kind == "draft" ? SPARK_SPEC_DRAFT_MODEL : SPARK_SPEC_EAGLE3, kind, path};
        return true;
    }
    if (kind == "mtp" || kind == "ngram") {
        if (colon != std::string::npos) {
            error = "--spec " + kind + " takes no path (got '" + arg + "')";
            return false;
        }
        out = {kind == "mtp" ? SPARK_SPEC_MTP : SPARK_SPEC_NGRAM, kind, ""};
        return true;
    }
    error = "--spec '" + arg + "': expected " + kSpecSyntax;
    return false;
}

// The library's parameters for this option and draft length (the path stays owned by `opt`).
inline spark_spec_params spec_params(const SpecOption & opt, int32_t n_draft_max) {
    spark_spec_params p = spark_spec_default_params();
    p.kind              = opt.kind;
    p.path              = opt.path.empty() ? nullptr : opt.path.c_str();
    p.n_draft_max       = n_draft_max;
    return p;
}

// Tokens one verify step yields: its accepted drafts plus the target's own token (the first token
// of an answer, from the prompt's logits, is not a step's).
inline double tokens_per_step(const spark_spec_stats & s) {
    return s.n_steps > 0 ? double(s.n_accepted + s.n_steps) / double(s.n_steps) : 0.0;
}

// Acceptance at draft positions 1 .. k, e.g. "0.91 0.80 0.64" ("-" where nothing was drafted).
inline std::string acceptance_by_position(const spark_spec_stats & s, int32_t k, const char * sep = " ") {
    std::string out;
    for (int32_t i = 0; i < k && i < SPARK_SPEC_MAX_DRAFT; ++i) {
        char buf[32];
        if (s.drafted_at[i] > 0) std::snprintf(buf, sizeof buf, "%.2f", double(s.accepted_at[i]) / double(s.drafted_at[i]));
        else std::snprintf(buf, sizeof buf, "-");
        out += (i ? sep : "") + std::string(buf);
    }
    return out;
}

// One line: steps, drafted, accepted, tokens per step, acceptance per draft position.
inline std::string describe_spec_stats(const spark_spec_stats & s, int32_t k) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%lld verify steps, %lld drafted, %lld accepted (%.0f%%), %.2f tokens/step, acceptance by draft position: %s",
                  (long long) s.n_steps, (long long) s.n_drafted, (long long) s.n_accepted,
                  s.n_drafted > 0 ? 100.0 * double(s.n_accepted) / double(s.n_drafted) : 0.0, tokens_per_step(s),
                  acceptance_by_position(s, k).c_str());
    return buf;
}

}  // namespace spark_cli
