/* spark-simple: the smallest complete use of the C API, in plain C.
 *
 *   spark-simple MODEL_PATH N_PREDICT TOKEN_ID [TOKEN_ID ...]
 *
 * Loads a model, decodes the prompt (given as token ids) in one batch, then prints the greedy
 * continuation, one token id per line. */
#include <spark/spark.h>

#include <stdio.h>
#include <stdlib.h>

static int report(const char * what, spark_status st) {
    fprintf(stderr, "spark-simple: %s failed: %s (%s)\n", what, spark_last_error(), spark_status_str(st));
    return 1;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL_PATH N_PREDICT TOKEN_ID [TOKEN_ID ...]\n", argv[0]);
        return 2;
    }
    const char * path      = argv[1];
    int          n_predict = atoi(argv[2]);
    int          n_prompt  = argc - 3;

    spark_model * model = NULL;
    spark_status  st    = spark_model_load(path, spark_model_default_params(), &model);
    if (st != SPARK_OK) return report("loading the model", st);

    spark_context_params cparams = spark_context_default_params();
    cparams.n_ctx                = n_prompt + n_predict + 1;
    spark_context * ctx          = NULL;
    st = spark_context_init(model, cparams, &ctx);
    if (st != SPARK_OK) {
        spark_model_free(model);
        return report("creating a context", st);
    }

    spark_batch batch = spark_batch_init(n_prompt, 1);
    for (int i = 0; i < n_prompt; ++i) {
        batch.token[i]     = (spark_token) atoi(argv[3 + i]);
        batch.pos[i]       = i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = (int8_t) (i == n_prompt - 1);
    }
    batch.n_tokens = n_prompt;

    spark_sampler * greedy = spark_sampler_init_greedy();
    int             rc     = 0;
    for (int i = 0; i < n_predict; ++i) {
        st = spark_decode(ctx, &batch);
        if (st != SPARK_OK) {
            rc = report("decoding", st);
            break;
        }
        spark_token next;
        st = spark_sampler_sample(greedy, ctx, -1, &next);
        if (st != SPARK_OK) {
            rc = report("sampling", st);
            break;
        }
        printf("%d\n", next);
        batch.n_tokens  = 1;
        batch.token[0]  = next;
        batch.pos[0]    = n_prompt + i;
        batch.logits[0] = 1;
    }

    spark_sampler_free(greedy);
    spark_batch_free(batch);
    spark_context_free(ctx);
    spark_model_free(model);
    return rc;
}
