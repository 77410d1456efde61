/*
 * spark: an embeddable LLM inference runtime for NVIDIA GPUs (and an exact CPU reference).
 *
 * This is the whole public C API. It is valid C99 and C++ (tests/c/test-c.c compiles it as C).
 *
 * Contract
 *   - Every fallible call returns a spark_status (SPARK_OK == 0; errors are negative). On error the
 *     thread-local message from spark_last_error() says what went wrong; output parameters are left
 *     untouched unless stated otherwise. No call aborts or throws into the host process on bad input.
 *   - Handles are opaque. A spark_model holds immutable weights and may be shared by many contexts
 *     (and threads); a spark_context holds per-stream state (KV cache, recurrent state, logits) and
 *     must be used by one thread at a time. Tokenizers are immutable after load and thread-safe.
 *   - Every params struct has a spark_*_default_params() function: copy the defaults, then override.
 *   - The structs the library fills (spark_*_info, spark_spec_stats, spark_perf_context_data) end in
 *     reserved space: later versions add fields there without changing the struct's size.
 *   - The library prints nothing; its messages go to the callback set with spark_log_set.
 *
 * Minimal use (error handling elided):
 *
 *     spark_model * model;
 *     spark_model_load("path/to/hf-dir-or-file.spark", spark_model_default_params(), &model);
 *     spark_context * ctx;
 *     spark_context_init(model, spark_context_default_params(), &ctx);
 *     spark_batch batch = spark_batch_init(n_prompt, 1);
 *     ... fill batch.token/pos/seq_id/logits, batch.n_tokens = n_prompt ...
 *     spark_decode(ctx, &batch);
 *     const float * logits = spark_get_logits_ith(ctx, n_prompt - 1);
 *     spark_batch_free(batch); spark_context_free(ctx); spark_model_free(model);
 */
#ifndef SPARK_H
#define SPARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && !defined(SPARK_STATIC)
#    if defined(SPARK_BUILD)
#        define SPARK_API __declspec(dllexport)
#    else
#        define SPARK_API __declspec(dllimport)
#    endif
#elif defined(__GNUC__)
#    define SPARK_API __attribute__((visibility("default")))
#else
#    define SPARK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SPARK_VERSION_MAJOR 0
#define SPARK_VERSION_MINOR 1
#define SPARK_VERSION_PATCH 0

typedef int32_t spark_token;
typedef int32_t spark_pos;
typedef int32_t spark_seq_id;

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef enum spark_status {
    SPARK_OK                     = 0,
    SPARK_ERR_INVALID_ARGUMENT   = -1,  /* a NULL handle, an out-of-range parameter                  */
    SPARK_ERR_IO                 = -2,  /* a file or directory is missing or cannot be read/written  */
    SPARK_ERR_INVALID_FORMAT     = -3,  /* a file is corrupt, truncated or hostile (bad header, JSON) */
    SPARK_ERR_UNSUPPORTED        = -4,  /* unknown architecture, dtype, quantization, or GPU         */
    SPARK_ERR_MISSING_TENSOR     = -5,  /* a tensor the architecture needs is not in the checkpoint  */
    SPARK_ERR_SHAPE_MISMATCH     = -6,  /* a tensor's shape or dtype disagrees with config.json      */
    SPARK_ERR_CONTEXT_FULL       = -7,  /* the KV cache has no room for the batch (context overflow) */
    SPARK_ERR_INVALID_TOKEN      = -8,  /* a token id outside [0, n_vocab)                           */
    SPARK_ERR_INVALID_BATCH      = -9,  /* inconsistent batch: positions, sequence ids, sizes        */
    SPARK_ERR_OUT_OF_MEMORY      = -10, /* host or device allocation failed                          */
    SPARK_ERR_DEVICE             = -11, /* a CUDA error; the context should be freed                 */
    SPARK_ERR_BUFFER_TOO_SMALL   = -12, /* an output buffer is too small; the needed size is returned */
    SPARK_ERR_INVALID_TEXT       = -13, /* text is not valid UTF-8                                   */
    SPARK_ERR_TEMPLATE           = -14, /* a chat template uses an unsupported construct or fails    */
    SPARK_ERR_ABORTED            = -15, /* the operation was cancelled by the caller                 */
    SPARK_ERR_INTERNAL           = -16  /* a bug in spark; please report it with the message        */
} spark_status;

/* A short constant name for a status ("SPARK_ERR_IO", ...). Never NULL. */
SPARK_API const char * spark_status_str(spark_status status);

/* The outcome of the most recent fallible call on this thread: its error message, or "" if it
 * succeeded (every call that returns a spark_status sets it). Valid until the next spark call on
 * this thread. */
SPARK_API const char * spark_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Library                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Version string "MAJOR.MINOR.PATCH". */
SPARK_API const char * spark_version(void);

/* Optional: initializes global state (thread pool defaults, CUDA probing is lazy). Safe to call
 * more than once. Always SPARK_OK today; kept for forward compatibility. */
SPARK_API spark_status spark_init(void);

/* Where the library's messages go: nothing is printed unless a callback is set. Messages come from
 * any thread; the callback is called under a lock (one message at a time). The profiling knobs
 * (docs/ENVIRONMENT.md) report through it at SPARK_LOG_INFO. NULL removes the callback. */
typedef enum spark_log_level {
    SPARK_LOG_ERROR = 0,
    SPARK_LOG_WARN  = 1,
    SPARK_LOG_INFO  = 2,
    SPARK_LOG_DEBUG = 3
} spark_log_level;
typedef void (*spark_log_callback)(spark_log_level level, const char * text, void * user_data);
SPARK_API void spark_log_set(spark_log_callback callback, void * user_data);

/* A human-readable description of the build: version, the commit built, compiled backends, CUDA archs. */
SPARK_API const char * spark_build_info(void);

/* ------------------------------------------------------------------------------------------ */
/* Devices                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef enum spark_device_kind {
    SPARK_DEVICE_CPU  = 0,
    SPARK_DEVICE_CUDA = 1,
    SPARK_DEVICE_AUTO = 2   /* CUDA device 0 when usable, else CPU */
} spark_device_kind;

/* How a model is split over several devices (docs/DISTRIBUTED.md). */
typedef enum spark_split_mode {
    SPARK_SPLIT_NONE   = 0,  /* the whole model on one device */
    SPARK_SPLIT_TENSOR = 1,  /* tensor parallelism: attention heads, MLP and expert widths split over the ranks */
    SPARK_SPLIT_EXPERT = 2   /* as TENSOR, but the routed experts whole, a range of them per rank */
} spark_split_mode;

typedef struct spark_device_info {
    char     name[128];           /* "NVIDIA H100 80GB HBM3", "CPU" */
    int32_t  compute_capability;  /* major*10 + minor for CUDA (90 = sm_90); 0 for the CPU */
    int32_t  multiprocessors;
    uint64_t total_memory;        /* bytes */
    uint64_t free_memory;         /* bytes, at query time */
    char     kernel_paths[512];   /* per weight format, the kernel paths this device uses for decode /
                                     prefill, e.g. "bf16=gemv-fma/gemm-f16 int4=gemv-mma/gemm-f16" */
    uint64_t reserved[8];         /* zero: room for fields of later versions (same struct size) */
} spark_device_info;

/* Number of usable CUDA devices (0 when spark was built without CUDA or no driver is present). */
SPARK_API int32_t spark_cuda_device_count(void);

/* Describes CUDA device `index`. SPARK_ERR_UNSUPPORTED when the build has no CUDA backend or the
 * device's compute capability is below 8.0; SPARK_ERR_INVALID_ARGUMENT for a bad index. */
SPARK_API spark_status spark_cuda_device_info(int32_t index, spark_device_info * out);

/* ------------------------------------------------------------------------------------------ */
/* Model                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct spark_model     spark_model;
typedef struct spark_context   spark_context;
typedef struct spark_tokenizer spark_tokenizer;

/* Called during loading with progress in [0, 1]; return false to cancel (load then fails with
 * SPARK_ERR_ABORTED). */
typedef bool (*spark_progress_callback)(float progress, void * user_data);

/* Called during loading with the bytes of weights moved into the backend so far out of
 * `bytes_total`; return false to cancel (load then fails with SPARK_ERR_ABORTED). Called on the
 * thread that called spark_model_load: first with (0, 0) once the files are open, before any
 * weight is read (the total is not known yet), then with (0, total) once every tensor is sized, often while the weights stream to a GPU
 * (the CPU backend maps the file and has nothing to move), last with bytes_done == bytes_total.
 * spark_progress_callback is called at the same moments, first, with bytes_done / bytes_total (0
 * while the total is 0); when it cancels, this one is not called for that report. */
typedef bool (*spark_load_progress_callback)(uint64_t bytes_done, uint64_t bytes_total, void * user_data);

typedef struct spark_model_params {
    spark_device_kind       device;        /* default SPARK_DEVICE_CPU */
    int32_t                 device_index;  /* CUDA device ordinal, default 0 */
    int32_t                 n_threads;     /* CPU threads used while loading; <= 0: the hardware threads, at most 16 */
    spark_progress_callback progress_callback;
    void *                  progress_callback_user_data;
    bool                    load_tokenizer;   /* default true: load tokenizer.json if present */
    spark_load_progress_callback load_progress;  /* default NULL */
    void *                       load_progress_user_data;
    /* Several devices of this process: the model split (split_mode, default SPARK_SPLIT_TENSOR)
     * over n_devices ranks (0 or 1, the default: the whole model on device_index), rank r on CUDA
     * device devices[r] (default r), their partial results summed through NCCL. On the CPU the
     * ranks are threads (the split's arithmetic, for tests). A model that cannot be split so
     * (heads or widths that n_devices does not divide) is refused with the reason. */
    int32_t          n_devices;
    int32_t          devices[8];
    spark_split_mode split_mode;
    /* Several processes (hosts): this process is rank dist_rank of dist_size (> 1), each with one
     * CUDA device (device_index), split as split_mode and joined by NCCL. dist_id: the group's id,
     * made once by rank 0 with spark_dist_unique_id and passed by the host application to every
     * rank (the tools use a TCP rendezvous: --dist-addr). Every rank loads the same model with the
     * same split and then makes the same spark_decode calls in the same order. 0 or 1: one process. */
    int32_t          dist_rank;
    int32_t          dist_size;
    uint8_t          dist_id[128];
} spark_model_params;

/* A new group id for spark_model_params.dist_id (rank 0 makes it; NCCL's unique id).
 * SPARK_ERR_UNSUPPORTED in a build without CUDA or where NCCL (libnccl.so.2) is not found. */
SPARK_API spark_status spark_dist_unique_id(uint8_t out[128]);

SPARK_API spark_model_params spark_model_default_params(void);

/* Loads a model from
 *   - a Hugging Face directory: config.json + model.safetensors, or a sharded
 *     model.safetensors.index.json; optional tokenizer.json / tokenizer_config.json /
 *     generation_config.json / hf_quant_config.json, or
 *   - a spark file (GGUF v3 container written by spark-convert), or
 *   - "synthetic:<shape>:<format>": the exact shapes of a published model with random weights made
 *     by the backend, no file and no tokenizer (benchmarks, e.g. spark-bench --synthetic). Shapes:
 *     qwen3-8b, qwen3-30b-a3b, qwen3-next-80b-a3b; formats: bf16 (the default when ":<format>" is
 *     left out), f16, int4 (g128), nvfp4, fp8 (128x128 blocks); embeddings, lm_head and MoE routers
 *     stay bf16, as in the checkpoints people download.
 * Returns:
 *   SPARK_OK                  *out is the model
 *   SPARK_ERR_IO              path missing/unreadable
 *   SPARK_ERR_INVALID_FORMAT  corrupt config.json, safetensors or spark header (truncation, offsets
 *                             outside the file, overlapping tensors, dtype/shape/byte-size mismatch)
 *   SPARK_ERR_UNSUPPORTED     unknown architecture, dtype or quantization; unusable device
 *   SPARK_ERR_MISSING_TENSOR  a required tensor is absent
 *   SPARK_ERR_SHAPE_MISMATCH  a tensor disagrees with the hyper-parameters
 *   SPARK_ERR_OUT_OF_MEMORY   not enough host or device memory
 *   SPARK_ERR_ABORTED         the progress callback returned false
 * On error *out is untouched and nothing is leaked. */
SPARK_API spark_status spark_model_load(const char * path, spark_model_params params, spark_model ** out);

/* Frees the model. All contexts created from it must be freed first. NULL is allowed. */
SPARK_API void spark_model_free(spark_model * model);

typedef enum spark_layer_type {
    SPARK_LAYER_ATTENTION        = 0,  /* full softmax attention with a KV cache */
    SPARK_LAYER_LINEAR_ATTENTION = 1   /* Gated DeltaNet: recurrent + conv state */
} spark_layer_type;

typedef struct spark_model_info {
    char     architecture[64];     /* config.json's model_type: "qwen3", "qwen3_moe", "qwen3_next", "minimax_m2" */
    char     weight_format[64];    /* dominant Linear weight format: "bf16", "nvfp4", "int4", "fp8", "mixed" */
    int32_t  n_vocab;
    int32_t  n_embd;               /* hidden size */
    int32_t  n_layer;
    int32_t  n_head;
    int32_t  n_head_kv;
    int32_t  head_dim;
    int32_t  n_ctx_train;          /* max_position_embeddings */
    int32_t  n_expert;             /* 0 for dense models */
    int32_t  n_expert_used;
    int32_t  n_layer_attention;         /* layers with a KV cache */
    int32_t  n_layer_linear_attention;  /* Gated DeltaNet layers */
    int64_t  n_params;             /* logical parameter count */
    uint64_t weight_bytes;         /* bytes the weights occupy on the model's device */
    uint64_t weight_bytes_embedding;   /* of which: token embedding */
    uint64_t weight_bytes_attention;   /* attention + linear-attention projections and norms */
    uint64_t weight_bytes_ffn;         /* dense MLPs, routers, experts, shared experts */
    uint64_t weight_bytes_output;      /* final norm + lm_head (0 extra when tied) */
    /* Roofline figures of one single-token decode step: */
    uint64_t decode_weight_bytes;      /* weight bytes the step reads: every dense weight, the top-k
                                          routed experts of each MoE layer, one embedding row, lm_head */
    uint64_t kv_bytes_per_token;       /* KV-cache bytes per cached token (read once per step) */
    uint64_t recurrent_bytes;          /* linear-attention state of one sequence (read and written
                                          once per step) */
    uint64_t weight_bytes_in_place;    /* of weight_bytes: used by the GPU where the checkpoint file is
                                          mapped instead of copied (a GPU that shares the host's memory,
                                          e.g. DGX Spark; SPARK_WEIGHTS_IN_PLACE); 0 elsewhere */
    int32_t  n_devices;           /* ranks the model is split over (1: whole); the head counts above are
                                     the whole model's, the byte counts one rank's (rank 0) */
    int32_t  split_mode;          /* a spark_split_mode */
    uint64_t reserved[6];         /* zero: room for fields of later versions (same struct size) */
} spark_model_info;

SPARK_API spark_status spark_model_get_info(const spark_model * model, spark_model_info * out);

/* Measures the copy bandwidth of the model's device (bytes read + written per second, a
 * device-to-device copy of 512 MiB; the CPU backend reports a host memcpy), for roofline reports.
 * Takes tens of milliseconds. */
SPARK_API spark_status spark_model_measure_bandwidth(const spark_model * model, double * bytes_per_second);

/* Layer type of layer `il` (SPARK_LAYER_ATTENTION for all layers of dense/MoE models); -1 for a bad
 * index or handle. */
SPARK_API int32_t spark_model_layer_type(const spark_model * model, int32_t il);

/* The model's tokenizer, or NULL when the checkpoint has none. Owned by the model. */
SPARK_API const spark_tokenizer * spark_model_get_tokenizer(const spark_model * model);

/* A metadata string of the model ("general.architecture", "spark.quantization", ...); NULL if absent.
 * Owned by the model. */
SPARK_API const char * spark_model_meta(const spark_model * model, const char * key);

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct spark_context_params {
    int32_t n_ctx;        /* KV cache capacity in tokens, summed over sequences; default 4096;
                             0 = the model's n_ctx_train */
    int32_t n_batch;      /* max tokens processed per internal step; default 512 */
    int32_t n_seq_max;    /* max distinct sequence ids (0 .. n_seq_max-1); default 1 */
    int32_t n_threads;    /* CPU threads for decoding; <= 0: all hardware threads */
    int32_t n_snapshots;  /* recurrent-state snapshots kept per context (for rollback); default 2 */
    int32_t n_rollback;   /* linear-attention layers keep their states after each of the last
                             n_rollback positions, so that up to n_rollback trailing tokens can be
                             removed exactly and without recompute (speculative decoding needs its
                             draft length; spark_spec_init raises it). 0 .. 64; default 0. Costs
                             n_rollback extra recurrent states per sequence; nothing for
                             attention-only models, which can always drop a tail. */
} spark_context_params;

SPARK_API spark_context_params spark_context_default_params(void);

/* Creates a context (KV cache, recurrent state, compute buffers) for `model`.
 * Returns SPARK_OK, SPARK_ERR_INVALID_ARGUMENT (bad params), SPARK_ERR_OUT_OF_MEMORY. */
SPARK_API spark_status spark_context_init(spark_model * model, spark_context_params params, spark_context ** out);

SPARK_API void spark_context_free(spark_context * ctx);

SPARK_API int32_t spark_n_ctx(const spark_context * ctx);
SPARK_API const spark_model * spark_context_get_model(const spark_context * ctx);

/* ------------------------------------------------------------------------------------------ */
/* Batch and decode                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Tokens to process in one spark_decode call. Row i is token[i] at position pos[i] in sequence
 * seq_id[i][0]; logits[i] != 0 requests its output logits. A row belongs to exactly one sequence:
 * n_seq_id[i] must be 1 (the array form keeps llama.cpp's batch layout; a token shared by several
 * sequences is refused with SPARK_ERR_INVALID_BATCH; spark_memory_seq_cp shares a prefix instead).
 * Within one sequence, positions must continue that sequence: the first token of sequence s in the
 * batch has position == the number of tokens s already holds, the next one +1, and so on. */
typedef struct spark_batch {
    int32_t         n_tokens;
    spark_token *   token;
    spark_pos *     pos;
    int32_t *       n_seq_id;
    spark_seq_id ** seq_id;
    int8_t *        logits;
} spark_batch;

/* Allocates a batch for up to n_tokens rows with room for n_seq_max sequence ids each (1 is all
 * spark_decode accepts). n_tokens of the result is 0. Free with spark_batch_free. On allocation
 * failure all pointers are NULL. */
SPARK_API spark_batch spark_batch_init(int32_t n_tokens, int32_t n_seq_max);
SPARK_API void        spark_batch_free(spark_batch batch);

/* Runs the model over the batch, appending to the KV cache / recurrent state. A NULL batch.logits
 * requests the logits of the last row only.
 * Returns:
 *   SPARK_OK                  logits of the requested rows are available
 *   SPARK_ERR_INVALID_ARGUMENT NULL ctx/batch or n_tokens <= 0
 *   SPARK_ERR_INVALID_TOKEN   a token id outside [0, n_vocab)
 *   SPARK_ERR_INVALID_BATCH   bad sequence id, n_seq_id != 1, positions that do not continue
 *                             their sequence
 *   SPARK_ERR_CONTEXT_FULL    the KV cache cannot hold the batch
 *   SPARK_ERR_OUT_OF_MEMORY / SPARK_ERR_DEVICE
 *   SPARK_ERR_ABORTED         the abort callback stopped it
 * On a validation error (SPARK_ERR_INVALID_*, SPARK_ERR_CONTEXT_FULL) the memory is left exactly as
 * before the call. A decode that fails or is aborted after some of its internal steps (n_batch
 * tokens each) completed keeps those steps and leaves no trace of the failing one (KV cache and
 * recurrent state as before it); after SPARK_ERR_DEVICE the context should be freed. */
SPARK_API spark_status spark_decode(spark_context * ctx, const spark_batch * batch);

/* Called before every internal step of a decode (every n_batch tokens) and, on the CPU, between the
 * operations of a step; returning true stops the decode with SPARK_ERR_ABORTED. The steps completed
 * before are kept (spark_memory_seq_length tells how far each sequence got); the interrupted step
 * leaves the memory exactly as before it. Called on the decoding thread. NULL removes it. */
typedef bool (*spark_abort_callback)(void * user_data);
SPARK_API void spark_context_set_abort_callback(spark_context * ctx, spark_abort_callback callback, void * user_data);

/* Logits of the rows requested in the last spark_decode, in batch order: [n_outputs][n_vocab].
 * NULL if the last decode failed or requested none. Valid until the next decode. */
SPARK_API const float * spark_get_logits(spark_context * ctx);

/* Logits of batch row i of the last decode (negative i counts from the last requested row:
 * -1 = last). NULL if row i did not request logits. */
SPARK_API const float * spark_get_logits_ith(spark_context * ctx, int32_t i);

/* Number of rows with logits in the last decode. */
SPARK_API int32_t spark_n_outputs(const spark_context * ctx);

/* ------------------------------------------------------------------------------------------ */
/* Memory: KV cache and recurrent state behind one sequence interface                         */
/* ------------------------------------------------------------------------------------------ */

/* Clears every sequence. */
SPARK_API void spark_memory_clear(spark_context * ctx);

/* Removes positions [p0, p1) of sequence seq_id (seq_id < 0: every sequence; p1 < 0: to the end).
 * Only removal of a tail (p1 < 0 or p1 past the end) is supported, since positions are contiguous.
 * For recurrent (linear-attention) layers a tail can be removed entirely (p0 == 0), or back to one
 * of the last n_rollback positions appended since the sequence was last cut, restored or copied
 * (spark_memory_seq_can_rm tells); otherwise go back to a snapshot (spark_memory_seq_restore).
 * Snapshots of the sequence taken above p0 become invalid.
 * Returns SPARK_OK, SPARK_ERR_INVALID_ARGUMENT (bad seq id), SPARK_ERR_UNSUPPORTED (a middle
 * range, or a tail the recurrent state cannot go back over); on error nothing changed. */
SPARK_API spark_status spark_memory_seq_rm(spark_context * ctx, spark_seq_id seq_id, spark_pos p0, spark_pos p1);

/* Whether spark_memory_seq_rm(ctx, seq_id, p0, p1) would succeed, without changing anything. */
SPARK_API bool spark_memory_seq_can_rm(const spark_context * ctx, spark_seq_id seq_id, spark_pos p0, spark_pos p1);

/* Copies sequence src into dst (dst is cleared first; its snapshots become invalid). */
SPARK_API spark_status spark_memory_seq_cp(spark_context * ctx, spark_seq_id src, spark_seq_id dst);

/* Number of tokens sequence seq_id holds (its next position); -1 for a bad id. */
SPARK_API spark_pos spark_memory_seq_length(const spark_context * ctx, spark_seq_id seq_id);

/* Saves the state of sequence seq_id (its length and recurrent state) into a snapshot slot; the
 * slot id is written to *out_snapshot. SPARK_ERR_OUT_OF_MEMORY when all n_snapshots slots are used. */
SPARK_API spark_status spark_memory_seq_snapshot(spark_context * ctx, spark_seq_id seq_id, int32_t * out_snapshot);

/* Restores sequence seq_id to a snapshot taken from it: tokens appended since are removed and the
 * recurrent state is restored exactly. The snapshot stays valid (restore again or free it).
 * A snapshot becomes invalid when its sequence is truncated below it, cleared, overwritten by
 * spark_memory_seq_cp or restored to an earlier snapshot; restoring it then fails with
 * SPARK_ERR_INVALID_ARGUMENT and a message saying why (as for a bad id). */
SPARK_API spark_status spark_memory_seq_restore(spark_context * ctx, spark_seq_id seq_id, int32_t snapshot);

SPARK_API void spark_memory_snapshot_free(spark_context * ctx, int32_t snapshot);

typedef struct spark_memory_info {
    uint64_t kv_bytes;          /* KV cache (attention layers) */
    uint64_t recurrent_bytes;   /* conv + delta-rule state (linear-attention layers) */
    uint64_t snapshot_bytes;    /* snapshot slots */
    uint64_t compute_bytes;     /* planned intermediate buffers (high-water mark so far) */
    int32_t  kv_cells_total;    /* token capacity */
    int32_t  kv_cells_used;
    uint64_t reserved[8];         /* zero: room for fields of later versions (same struct size) */
} spark_memory_info;

SPARK_API spark_status spark_memory_get_info(const spark_context * ctx, spark_memory_info * out);

/* Saved state of one sequence: its KV cache and recurrent state (what a prompt cache or a "resume
 * conversation" keeps), in a versioned, checksummed format (docs/FORMAT.md, "Sequence state").
 * A state loads only into a context of the same model (the same weights, checked by a fingerprint)
 * on a backend with the same KV-cache type, with room for its tokens; anything else is refused with
 * SPARK_ERR_INVALID_FORMAT and a message saying why, and the sequence is left as it was. Loading
 * replaces the sequence's contents (snapshots of it become invalid); after it the sequence can be
 * extended (a model with linear-attention layers cannot cut it back below its loaded length except
 * to 0). Refused while a speculative loop is attached. The tokens themselves are not part of the
 * state: the host keeps them. */
/* Bytes spark_state_seq_save writes for `seq` now (0 for a bad handle or id). */
SPARK_API size_t spark_state_seq_size(const spark_context * ctx, spark_seq_id seq);
/* Writes the state of `seq` into buf (SPARK_ERR_INVALID_ARGUMENT when `size` is too small);
 * *written (optional) receives the bytes used. */
SPARK_API spark_status spark_state_seq_save(spark_context * ctx, spark_seq_id seq, void * buf, size_t size, size_t * written);
SPARK_API spark_status spark_state_seq_load(spark_context * ctx, spark_seq_id seq, const void * buf, size_t size);
/* The same through a file (written to a temporary name and renamed into place). */
SPARK_API spark_status spark_state_seq_save_file(spark_context * ctx, spark_seq_id seq, const char * path);
SPARK_API spark_status spark_state_seq_load_file(spark_context * ctx, spark_seq_id seq, const char * path);

/* Counters of a context since its creation or the last reset. A step is one forward pass (a
 * spark_decode runs ceil(n_tokens / n_batch) of them; the speculative loop runs its own). Times
 * are wall-clock, each step until its results are ready; the speculative loop's steps are counted
 * but timed in spark_spec_stats instead. */
typedef struct spark_perf_context_data {
    int64_t  n_decode;          /* successful spark_decode calls */
    int64_t  n_steps;           /* steps run (all callers) */
    int64_t  n_tokens;          /* tokens those steps processed */
    int64_t  n_prompt_tokens;   /* spark_decode tokens in steps with several tokens of one sequence */
    double   t_prompt_ms;       /* ... and the time of those steps */
    int64_t  n_gen_tokens;      /* spark_decode tokens in steps of one token per sequence */
    double   t_gen_ms;          /* ... and the time of those steps */
    int64_t  n_failed;          /* steps that failed or were aborted (they left no trace) */
    uint64_t reserved[8];       /* zero: room for fields of later versions */
} spark_perf_context_data;

SPARK_API spark_status spark_perf_context(const spark_context * ctx, spark_perf_context_data * out);
SPARK_API void         spark_perf_context_reset(spark_context * ctx);

/* ------------------------------------------------------------------------------------------ */
/* Sampling                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* A sampler chain transforms the logits of one row in order and ends by picking a token. A chain
 * with no picking stage ends with greedy choice; a chain with spark_sampler_init_dist picks a
 * random token from the remaining distribution. Samplers added to a chain are owned by it.
 *
 *     spark_sampler * s = spark_sampler_chain_init(spark_sampler_chain_default_params());
 *     spark_sampler_chain_add(s, spark_sampler_init_penalties(64, 1.1f));
 *     spark_sampler_chain_add(s, spark_sampler_init_top_k(40));
 *     spark_sampler_chain_add(s, spark_sampler_init_top_p(0.95f, 1));
 *     spark_sampler_chain_add(s, spark_sampler_init_temp(0.8f));
 *     spark_sampler_chain_add(s, spark_sampler_init_dist(1234));
 *     spark_token t;
 *     spark_sampler_sample(s, ctx, -1, &t);   (also records t for the penalties)
 */
typedef struct spark_sampler spark_sampler;

typedef struct spark_sampler_chain_params {
    bool no_perf;   /* reserved */
} spark_sampler_chain_params;

SPARK_API spark_sampler_chain_params spark_sampler_chain_default_params(void);

SPARK_API spark_sampler * spark_sampler_chain_init(spark_sampler_chain_params params);
/* Adds `smpl` (ownership moves to the chain). SPARK_ERR_INVALID_ARGUMENT for NULLs. */
SPARK_API spark_status    spark_sampler_chain_add(spark_sampler * chain, spark_sampler * smpl);
SPARK_API int32_t         spark_sampler_chain_n(const spark_sampler * chain);

SPARK_API spark_sampler * spark_sampler_init_greedy(void);
SPARK_API spark_sampler * spark_sampler_init_dist(uint32_t seed);          /* seeded random pick */
SPARK_API spark_sampler * spark_sampler_init_temp(float t);                /* t <= 0: greedy */
SPARK_API spark_sampler * spark_sampler_init_top_k(int32_t k);             /* k <= 0: no-op */
SPARK_API spark_sampler * spark_sampler_init_top_p(float p, size_t min_keep);
SPARK_API spark_sampler * spark_sampler_init_min_p(float p, size_t min_keep);
/* Repetition penalty over the last `last_n` accepted tokens (HF semantics: logit > 0 is divided,
 * logit < 0 multiplied by `penalty`). */
SPARK_API spark_sampler * spark_sampler_init_penalties(int32_t last_n, float penalty);
/* OpenAI's presence and frequency penalties over the tokens the chain accepted (sampled, or
 * recorded with spark_sampler_accept): logit -= presence * (count > 0) + frequency * count.
 * NULL for a non-finite value. */
SPARK_API spark_sampler * spark_sampler_init_presence_frequency(float presence, float frequency);
/* Adds biases[i] to the logit of tokens[i] (OpenAI's logit_bias; -INFINITY bans a token; a token
 * listed twice gets the sum). Token ids outside the vocabulary are ignored. NULL for n < 0, NULL
 * arrays with n > 0, a NaN or +infinite bias. */
SPARK_API spark_sampler * spark_sampler_init_logit_bias(int32_t n, const spark_token * tokens, const float * biases);

/* Samples from the logits of row `idx` of the last decode (as spark_get_logits_ith) and accepts
 * the token. SPARK_ERR_INVALID_ARGUMENT when that row has no logits. */
SPARK_API spark_status spark_sampler_sample(spark_sampler * smpl, spark_context * ctx, int32_t idx, spark_token * out);

/* Samples from a caller-provided logits array of n_vocab floats (not modified) and accepts the token. */
SPARK_API spark_status spark_sampler_sample_logits(spark_sampler * smpl, const float * logits, int32_t n_vocab, spark_token * out);

/* A copy of a sampler or chain with its state (penalty history, random state). NULL on failure. */
SPARK_API spark_sampler * spark_sampler_clone(const spark_sampler * smpl);

/* The distribution the chain would draw its next token from, given n_vocab logits: its stages
 * applied up to the picking stage, as probabilities over the whole vocabulary (0 for removed
 * tokens); a greedy pick is a point mass. Changes no state. */
SPARK_API spark_status spark_sampler_probs(spark_sampler * smpl, const float * logits, int32_t n_vocab, float * probs);

/* Verifies drafted tokens as speculative decoding does, for hosts that run their own loop (the
 * equivalent of llama.cpp's sample-and-accept-n). Rows idxs[0 .. n_draft] of the last decode hold
 * the target's logits after the last accepted token (idxs[0]) and after each draft (idxs[i + 1]).
 * For i = 0 .. n_draft-1, with p the chain's distribution at row idxs[i] (as spark_sampler_probs),
 * draft[i] is accepted with probability min(1, p(d) / q(d)) where q is draft_probs[i] (the drafter's
 * distribution, n_vocab floats) or, with draft_probs NULL, a point mass at draft[i] (drafts chosen
 * deterministically: greedy drafters, n-gram lookup); on rejection a token is drawn from the
 * normalised max(0, p - q) and verification stops; when every draft was accepted one more token
 * is drawn from row idxs[n_draft] (rejection sampling: the tokens are distributed exactly as
 * sampling the target alone would give). A pure greedy chain needs no logits on the host: it
 * accepts exactly the drafts equal to the target's argmax. Every emitted token is accepted into the
 * chain. Writes the accepted drafts and the final token to out (n_draft + 1 capacity) and their
 * count to *n_out (1 .. n_draft + 1). SPARK_ERR_INVALID_ARGUMENT for a row without logits,
 * SPARK_ERR_INVALID_TOKEN for a draft outside the vocabulary; on error nothing changed. */
SPARK_API spark_status spark_sampler_verify(spark_sampler * smpl, spark_context * ctx, const int32_t * idxs, const spark_token * draft,
                                            int32_t n_draft, const float * draft_probs, spark_token * out, int32_t * n_out);

/* Records a token (e.g. prompt tokens) in the penalty history without sampling. */
SPARK_API void spark_sampler_accept(spark_sampler * smpl, spark_token token);
/* Clears histories and re-seeds random state to its initial seed. */
SPARK_API void spark_sampler_reset(spark_sampler * smpl);
SPARK_API void spark_sampler_free(spark_sampler * smpl);

/* ------------------------------------------------------------------------------------------ */
/* Speculative decoding                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The owned loop. A draft source proposes up to n_draft_max tokens per sequence; the target checks
 * them all in one decode step; a prefix is accepted and the rest is cut from the memory without
 * recompute. Greedy output is token for token what greedy decoding without speculation prints;
 * sampled output has the target's distribution under the same sampler chain (rejection sampling,
 * spark_sampler_verify). Sources:
 *   SPARK_SPEC_DRAFT_MODEL  a smaller model with the same vocabulary (path: directory or spark file),
 *                           run on the target's device
 *   SPARK_SPEC_EAGLE3       an EAGLE3 head (path: a LlamaForCausalLMEagle3 directory) reading the
 *                           target's hidden states
 *   SPARK_SPEC_MTP          the target's own multi-token-prediction head (Qwen3-Next checkpoints
 *                           that keep their mtp.* tensors)
 *   SPARK_SPEC_NGRAM        prompt lookup: the continuation of the latest earlier occurrence of the
 *                           last n tokens (no weights)
 * Model-based drafts stay on the device: a step synchronises with the host once.
 *
 *     spark_spec_params sp = spark_spec_default_params();
 *     sp.kind = SPARK_SPEC_MTP;
 *     spark_spec * spec;
 *     spark_spec_init(ctx, sp, &spec);
 *     spark_spec_begin(spec, 0, prompt, n_prompt);
 *     spark_token toks[SPARK_SPEC_MAX_DRAFT + 2]; int32_t n;
 *     while (... spark_spec_step(spec, 1, &seq, &smpl, toks, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK ...) { use toks[0 .. n-1] }
 *     spark_spec_free(spec);
 */
#define SPARK_SPEC_MAX_DRAFT 16

typedef enum spark_spec_kind {
    SPARK_SPEC_DRAFT_MODEL = 1,
    SPARK_SPEC_EAGLE3      = 2,
    SPARK_SPEC_MTP         = 3,
    SPARK_SPEC_NGRAM       = 4
} spark_spec_kind;

typedef struct spark_spec_params {
    spark_spec_kind kind;         /* default SPARK_SPEC_NGRAM */
    const char *    path;         /* DRAFT_MODEL: the draft model; EAGLE3: the head's directory */
    int32_t         n_draft_max;  /* tokens drafted per step, 1 .. SPARK_SPEC_MAX_DRAFT; default 3 */
    int32_t         n_draft_min;  /* fewer drafts than this are not verified (a plain step); default 0 */
    float           p_min;        /* model drafters stop at a token they give less probability than
                                     this (costs a host round trip per draft token); 0 = off, default */
    int32_t         ngram_min;    /* NGRAM: shortest match tried; default 1 */
    int32_t         ngram_max;    /* NGRAM: longest match tried (first); default 4 */
    /* Benchmarks only (spark-bench --spec-sim-accept): when non-NULL, the acceptance rule is
     * replaced by chance, draft position i (0-based) being accepted with probability sim_accept[i]
     * overall (as vLLM reports per-position acceptance; non-increasing), and short drafts are padded
     * to n_draft_max. The work per step is real (drafting, verifying, cutting), the tokens are not
     * the model's output. n_draft_max entries; NULL (default) for real decoding. */
    const float *   sim_accept;
    uint32_t        sim_seed;     /* random seed of sim_accept */
} spark_spec_params;

typedef struct spark_spec spark_spec;

typedef struct spark_spec_stats {
    int64_t n_steps;      /* verify steps (per sequence) */
    int64_t n_drafted;    /* drafts verified */
    int64_t n_accepted;   /* drafts accepted */
    int64_t n_emitted;    /* tokens returned by spark_spec_step (accepted drafts + one per step + first tokens) */
    int64_t n_prompt;     /* prompt tokens decoded by spark_spec_begin */
    int64_t drafted_at[SPARK_SPEC_MAX_DRAFT];   /* drafts verified at draft position i */
    int64_t accepted_at[SPARK_SPEC_MAX_DRAFT];  /* ... and accepted: acceptance at i = accepted_at[i] / drafted_at[i] */
    double  t_prefill_s;  /* host time in spark_spec_begin */
    double  t_draft_s;    /* host time drafting (device work may run on into verify) */
    double  t_verify_s;   /* host time in the target's verify steps, until their results are back */
    double  t_accept_s;   /* host time deciding and cutting */
    uint64_t reserved[8];         /* zero: room for fields of later versions (same struct size) */
} spark_spec_stats;

SPARK_API spark_spec_params spark_spec_default_params(void);

/* Attaches a speculative loop to `target` (one loop per context: a second is refused; every
 * sequence of the context can use it). Loads the draft model or head. Raises the context's n_rollback to n_draft_max and makes
 * its decode steps output the hidden states the source reads (until spark_spec_free).
 * Returns SPARK_OK, SPARK_ERR_INVALID_ARGUMENT (bad params; n_draft_max + 1 larger than n_ctx or
 * n_batch; a draft model whose vocabulary or tokenizer differs from the target's; an EAGLE3 head
 * whose vocabulary, hidden size or aux layers do not fit the target), SPARK_ERR_UNSUPPORTED (MTP on a
 * model without an MTP head), the errors of spark_model_load for the draft or head,
 * SPARK_ERR_OUT_OF_MEMORY. On error nothing changed. */
SPARK_API spark_status spark_spec_init(spark_context * target, spark_spec_params params, spark_spec ** out);

/* Sets sequence `seq` to `prompt` (n_prompt tokens) and decodes what the target does not hold yet:
 * the longest prefix shared with what the sequence holds is kept (a chat's earlier turns), so a
 * conversation passes its whole rendering each turn. A model with linear-attention layers, whose
 * recurrent state cannot be cut back to any position, keeps the prefix up to the latest snapshot the
 * host took of the sequence (spark_memory_seq_snapshot) inside it, or decodes the prompt from the
 * start when there is none; the snapshot is restored, not freed. The next spark_spec_step starts
 * the answer.
 * Returns SPARK_OK, SPARK_ERR_INVALID_ARGUMENT, SPARK_ERR_INVALID_TOKEN, SPARK_ERR_CONTEXT_FULL
 * (nothing changed); after SPARK_ERR_DEVICE the sequence is empty. */
SPARK_API spark_status spark_spec_begin(spark_spec * spec, spark_seq_id seq, const spark_token * prompt, int32_t n_prompt);

/* One speculative step of each listed sequence (all verified in one target step; samplers[i] is
 * seqs[i]'s sampler chain): writes 1 .. n_draft_max + 2 new tokens of sequence i to
 * out[i * capacity ...] and their count to n_out[i] (the first step after spark_spec_begin also
 * returns the first answer token). Tokens after an end-of-generation token are not returned (it is
 * the last one). Near the end of the context fewer drafts are verified.
 * Returns SPARK_OK, SPARK_ERR_INVALID_ARGUMENT (a sequence listed twice, not begun, or changed
 * behind the loop's back), SPARK_ERR_BUFFER_TOO_SMALL (capacity < n_draft_max + 2),
 * SPARK_ERR_CONTEXT_FULL (no room for one more token); on these nothing changed. */
SPARK_API spark_status spark_spec_step(spark_spec * spec, int32_t n_seqs, const spark_seq_id * seqs, spark_sampler ** samplers,
                                       spark_token * out, int32_t capacity, int32_t * n_out);

SPARK_API spark_status spark_spec_get_stats(const spark_spec * spec, spark_spec_stats * out);
SPARK_API void         spark_spec_reset_stats(spark_spec * spec);
/* Frees the loop (and its draft model or head). The target context stays usable. NULL allowed. */
SPARK_API void         spark_spec_free(spark_spec * spec);

/* Pieces for hosts that run their own loop: hidden states and on-device greedy tokens of a decode,
 * spark_sampler_verify, spark_sampler_probs / clone, spark_memory_seq_can_rm. */

/* From now on every decode of ctx also outputs, for each row with logits, the hidden states of the
 * listed layers concatenated in that order: id i >= 0 is the output of layer i,
 * SPARK_HIDDEN_FINAL_NORM the final normed hidden state (what lm_head reads, an MTP head's input).
 * n_layers = 0 turns it off. SPARK_ERR_INVALID_ARGUMENT for a layer the model does not have, or
 * while a speculative loop is attached to ctx (it sets them itself). */
#define SPARK_HIDDEN_FINAL_NORM (-1)
SPARK_API spark_status spark_set_hidden_outputs(spark_context * ctx, const int32_t * layers, int32_t n_layers);
/* Floats per row of spark_get_hidden_ith (0 when off). */
SPARK_API int32_t      spark_n_hidden(const spark_context * ctx);
/* The hidden states of batch row i of the last decode (as spark_get_logits_ith); NULL when off or
 * when row i has no logits. Valid until the next decode. */
SPARK_API const float * spark_get_hidden_ith(spark_context * ctx, int32_t i);
/* The greedy token (argmax of the logits, computed on the device: no logits are copied) of batch
 * row i of the last decode; -1 when row i has no logits. */
SPARK_API spark_token  spark_get_argmax_ith(spark_context * ctx, int32_t i);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Loads a tokenizer from a tokenizer.json file, a model directory (tokenizer.json plus optional
 * tokenizer_config.json / generation_config.json for the chat template and end-of-turn tokens), or
 * a spark file. Returns SPARK_OK, SPARK_ERR_IO, SPARK_ERR_INVALID_FORMAT (corrupt or truncated JSON,
 * missing vocab/merges), SPARK_ERR_UNSUPPORTED (a tokenizer model type other than BPE). */
SPARK_API spark_status spark_tokenizer_load(const char * path, spark_tokenizer ** out);
/* Frees a tokenizer from spark_tokenizer_load (never the one owned by a model). NULL allowed. */
SPARK_API void         spark_tokenizer_free(spark_tokenizer * tok);

SPARK_API int32_t spark_tokenizer_n_vocab(const spark_tokenizer * tok);
/* Special tokens; -1 when absent. eos is the tokenizer_config.json eos_token. */
SPARK_API spark_token spark_tokenizer_bos(const spark_tokenizer * tok);
SPARK_API spark_token spark_tokenizer_eos(const spark_tokenizer * tok);
/* True for tokens that end a turn: eos, tokens listed as eos_token_id in generation_config.json. */
SPARK_API bool spark_tokenizer_is_eog(const spark_tokenizer * tok, spark_token token);
/* True for added tokens marked special. */
SPARK_API bool spark_tokenizer_is_special(const spark_tokenizer * tok, spark_token token);
/* Token id of an exact token string (e.g. "<|im_end|>"), or -1. */
SPARK_API spark_token spark_tokenizer_find(const spark_tokenizer * tok, const char * text);

/* Encodes `len` bytes of UTF-8 text. With parse_special, added/special tokens in the text are
 * matched (as Hugging Face tokenizers does) and never split; without it special tokens are plain
 * text (non-special added tokens such as <think> are still matched, as in Hugging Face). No BOS/EOS
 * is added (the tokenizer's post-processor is not applied).
 * Writes up to `capacity` ids to `tokens` and the total count to *n_tokens.
 * Returns SPARK_OK, SPARK_ERR_INVALID_TEXT (invalid UTF-8), SPARK_ERR_BUFFER_TOO_SMALL (*n_tokens
 * holds the needed capacity). */
SPARK_API spark_status spark_tokenize(const spark_tokenizer * tok, const char * text, size_t len, bool parse_special,
                                      spark_token * tokens, int32_t capacity, int32_t * n_tokens);

/* The raw bytes of one token (byte-level decoded; may be a partial UTF-8 sequence). Writes at most
 * `capacity` bytes (no terminator) and the full length to *len. SPARK_ERR_BUFFER_TOO_SMALL when it
 * did not fit, SPARK_ERR_INVALID_TOKEN for a bad id. */
SPARK_API spark_status spark_token_to_piece(const spark_tokenizer * tok, spark_token token, char * buf, size_t capacity, size_t * len);

/* Decodes tokens to UTF-8 text as Hugging Face `decode` does (invalid byte sequences become U+FFFD).
 * skip_special drops special tokens. Same buffer protocol as spark_token_to_piece. */
SPARK_API spark_status spark_detokenize(const spark_tokenizer * tok, const spark_token * tokens, int32_t n_tokens,
                                        bool skip_special, char * buf, size_t capacity, size_t * len);

/* Streaming detokenizer: push tokens one at a time; each push returns only complete UTF-8
 * characters (never half of one), holding back an incomplete tail until it completes. */
typedef struct spark_detok_stream spark_detok_stream;
SPARK_API spark_detok_stream * spark_detok_stream_init(const spark_tokenizer * tok, bool skip_special);
/* Writes the text made complete by `token` to buf (up to capacity; full length in *len). On
 * SPARK_ERR_BUFFER_TOO_SMALL the stream is unchanged, so the push can be retried with a larger buffer. */
SPARK_API spark_status spark_detok_stream_push(spark_detok_stream * s, spark_token token, char * buf, size_t capacity, size_t * len);
/* Returns what is held back (an incomplete tail becomes U+FFFD) and resets the stream. */
SPARK_API spark_status spark_detok_stream_flush(spark_detok_stream * s, char * buf, size_t capacity, size_t * len);
SPARK_API void         spark_detok_stream_free(spark_detok_stream * s);

/* ------------------------------------------------------------------------------------------ */
/* Chat templates                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct spark_chat_message {
    const char * role;               /* "system", "user", "assistant", "tool" */
    const char * content;            /* may be NULL (rendered as none) */
    const char * reasoning_content;  /* optional, NULL if absent */
    const char * tool_calls_json;    /* optional JSON array of tool calls, NULL if absent */
    const char * name;               /* optional (tool name for role "tool"), NULL if absent */
} spark_chat_message;

/* The chat template of a tokenizer (from tokenizer_config.json or the spark file), or NULL. */
SPARK_API const char * spark_tokenizer_chat_template(const spark_tokenizer * tok);

/* Renders a Jinja chat template the way transformers' apply_chat_template does.
 *   tmpl                  template source (e.g. spark_tokenizer_chat_template(tok))
 *   tools_json            optional JSON array of tool definitions (NULL: no tools)
 *   extra_context_json    optional JSON object of extra variables (e.g. {"enable_thinking": false})
 *   bos_token/eos_token   strings exposed to the template (may be NULL)
 * Same buffer protocol as spark_token_to_piece (the output is not NUL-terminated unless it fits
 * with one spare byte, in which case a terminator is written).
 * Returns SPARK_OK, SPARK_ERR_TEMPLATE (syntax error, unsupported construct, raise_exception; the
 * message says which and where), SPARK_ERR_INVALID_FORMAT (bad JSON arguments),
 * SPARK_ERR_BUFFER_TOO_SMALL. */
SPARK_API spark_status spark_chat_apply_template(const char * tmpl, const spark_chat_message * messages, size_t n_messages,
                                                 bool add_generation_prompt, const char * tools_json,
                                                 const char * extra_context_json, const char * bos_token,
                                                 const char * eos_token, char * buf, size_t capacity, size_t * len);

#ifdef __cplusplus
}
#endif

#endif /* SPARK_H */
