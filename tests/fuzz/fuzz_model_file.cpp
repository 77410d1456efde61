// A spark file (GGUF) -> everything spark_model_load does with it: the GGUF reader, the config
// documents it carries, the tokenizer, the weights of each format, the model's memory; then a
// context and one decode step (docs/RELIABILITY.md, "Model files").
#include "fuzz_util.h"
#include "io/gguf_reader.h"

#include <spark/spark.h>

namespace {

// A status and the message that goes with it: every failure must explain itself.
void check_failure(spark_status st) {
    if (st != SPARK_OK && spark_last_error()[0] == '\0') __builtin_trap();
}

void load_and_run(const std::string & path) {
    spark_model_params mp = spark_model_default_params();
    mp.n_threads          = 1;
    spark_model * model   = nullptr;
    const spark_status st = spark_model_load(path.c_str(), mp, &model);
    check_failure(st);
    if (st != SPARK_OK) return;
    spark_context_params cp = spark_context_default_params();
    cp.n_ctx                = 64;
    cp.n_batch              = 8;
    cp.n_threads            = 1;
    spark_context * ctx     = nullptr;
    const spark_status cst  = spark_context_init(model, cp, &ctx);
    check_failure(cst);
    spark_model_info info{};
    if (cst == SPARK_OK && spark_model_get_info(model, &info) == SPARK_OK) {
        // Two rows of one sequence: the first and the last token of the vocabulary.
        spark_token  tokens[2] = {0, info.n_vocab - 1};
        spark_pos    pos[2]    = {0, 1};
        int32_t      n_seq[2]  = {1, 1};
        spark_seq_id seq0      = 0;
        spark_seq_id * seqs[2] = {&seq0, &seq0};
        const spark_batch batch{2, tokens, pos, n_seq, seqs, nullptr};
        check_failure(spark_decode(ctx, &batch));
    }
    spark_context_free(ctx);
    spark_model_free(model);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const auto path = fuzz::scratch_dir() / "model.spark";
    fuzz::write_file(path, std::string_view(reinterpret_cast<const char *>(data), size));
    // The reader alone, with everything it exposes.
    fuzz::expect_spark_errors_only([&] {
        const auto f = spark::io::GgufFile::open(path.string());
        for (const auto & [key, value] : f->metadata()) (void) value.to_display_string();
        for (const spark::io::TensorInfo & t : f->tensors())
            if (t.nbytes > 0 && (t.data[0] ^ t.data[t.nbytes - 1]) == 0x5a) asm volatile("");
    });
    load_and_run(path.string());
    return 0;
}
