// spark_state_seq_*: one sequence's memory saved to bytes or a file and loaded back
// (docs/FORMAT.md, "Sequence state"). The header says what the payload was made from; a state
// loads only where the model's fingerprint, the memory's shape and the format version agree, its
// size is exactly what that shape needs for its tokens, and its checksum holds: everything is
// checked before the sequence is touched, so a refused state changes nothing.
#include "common/error.h"
#include "common/hash.h"
#include "runtime/context.h"

#include <spark/spark.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

using namespace spark;

namespace {

constexpr char     kMagic[8] = {'S', 'P', 'K', 'S', 'E', 'Q', 'S', 'T'};
constexpr uint32_t kVersion  = 1;

// Little-endian on disk, as every machine spark runs on.
struct Header {
    char     magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint64_t model;  // Model::fingerprint()
    int32_t  n_tokens;
    int32_t  kv_layers, recurrent_layers;
    uint32_t kv_type;
    int64_t  kv_row;
    uint64_t conv_bytes, ssm_bytes;
    uint64_t payload_bytes;
    uint64_t checksum;  // Hash64 of the header (this field zero) and the payload
};
static_assert(sizeof(Header) == 80, "the header layout is the file format");

uint64_t checksum(Header h, const uint8_t * payload, size_t n) {
    h.checksum = 0;
    return Hash64().value(h).bytes(payload, n).digest();
}

Header make_header(Context & ctx, int32_t seq) {
    const Memory &   mem   = ctx.memory();
    const StateShape shape = mem.state_shape();
    Header           h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version          = kVersion;
    h.header_bytes     = sizeof(Header);
    h.model            = ctx.model().fingerprint();
    h.n_tokens         = mem.seq_length(seq);
    h.kv_layers        = shape.kv_layers;
    h.recurrent_layers = shape.recurrent_layers;
    h.kv_type          = shape.kv_type;
    h.kv_row           = shape.kv_row;
    h.conv_bytes       = shape.conv_bytes;
    h.ssm_bytes        = shape.ssm_bytes;
    h.payload_bytes    = mem.state_bytes(h.n_tokens);
    return h;
}

void check_seq(const Context & ctx, int32_t seq, const char * fn) {
    if (seq < 0 || seq >= ctx.memory().n_seq_max())
        fail(SPARK_ERR_INVALID_ARGUMENT, "%s: sequence id %d is outside [0, %d)", fn, seq, ctx.memory().n_seq_max());
    // A state holds one rank's cache; the other ranks of this process would not follow it. (A rank
    // of a group of processes saves and loads its own, as every process makes the same calls.)
    if (!ctx.model().peers.empty())
        fail(SPARK_ERR_UNSUPPORTED, "%s: the state of a model split over %d devices is not saved or loaded yet", fn, ctx.model().shard.size);
}

// Everything about a header except its checksum, against this context; the payload size it
// implies (from the context's own shape, never from the file's figures alone).
size_t check_header(Context & ctx, const Header & h, const std::string & what) {
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) fail(SPARK_ERR_INVALID_FORMAT, "%s: not a spark sequence state", what.c_str());
    if (h.version != kVersion || h.header_bytes != sizeof(Header))
        fail(SPARK_ERR_INVALID_FORMAT, "%s: sequence state format version %u; this spark reads version %u", what.c_str(), h.version, kVersion);
    if (h.model != ctx.model().fingerprint())
        fail(SPARK_ERR_INVALID_FORMAT, "%s: the state was saved from another model (fingerprint %016llx, this model %016llx)", what.c_str(),
             (unsigned long long) h.model, (unsigned long long) ctx.model().fingerprint());
    const StateShape shape = ctx.memory().state_shape();
    const StateShape saved{h.kv_layers, h.recurrent_layers, h.kv_type, h.kv_row, h.conv_bytes, h.ssm_bytes};
    if (!(saved == shape))
        fail(SPARK_ERR_INVALID_FORMAT, "%s: the state's memory layout (KV type %u, %d x %lld values per token) differs from this context's "
             "(KV type %u, %d x %lld): it was saved on another backend", what.c_str(), h.kv_type, h.kv_layers, (long long) h.kv_row,
             shape.kv_type, shape.kv_layers, (long long) shape.kv_row);
    if (h.n_tokens < 0 || h.n_tokens > ctx.memory().n_ctx())
        fail(SPARK_ERR_CONTEXT_FULL, "%s: the state holds %d tokens; the context holds at most %d (n_ctx)", what.c_str(), h.n_tokens,
             ctx.memory().n_ctx());
    const size_t payload = ctx.memory().state_bytes(h.n_tokens);
    if (h.payload_bytes != payload)
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %llu payload bytes declared, %zu expected for %d tokens", what.c_str(),
             (unsigned long long) h.payload_bytes, payload, h.n_tokens);
    return payload;
}

void refuse_while_speculating(const Context & ctx, const char * fn) {
    // The loop keeps its own record of each sequence's tokens (and a draft model its own cache).
    if (ctx.speculating) fail(SPARK_ERR_INVALID_ARGUMENT, "%s: a speculative loop is attached to this context (spark_spec_free it first)", fn);
}

void load(Context & ctx, int32_t seq, const Header & h, const uint8_t * payload, size_t n, const std::string & what) {
    if (checksum(h, payload, n) != h.checksum) fail(SPARK_ERR_INVALID_FORMAT, "%s: checksum mismatch (the state is corrupt)", what.c_str());
    ctx.memory().read_state(seq, h.n_tokens, payload);
}

struct File {
    std::FILE * f = nullptr;
    ~File() {
        if (f) std::fclose(f);
    }
};

}  // namespace

extern "C" {

SPARK_API size_t spark_state_seq_size(const spark_context * ctx, spark_seq_id seq) {
    if (!ctx || seq < 0 || seq >= ctx->impl->memory().n_seq_max()) return 0;
    return sizeof(Header) + ctx->impl->memory().state_bytes(ctx->impl->memory().seq_length(seq));
}

SPARK_API spark_status spark_state_seq_save(spark_context * ctx, spark_seq_id seq, void * buf, size_t size, size_t * written) {
    return api_guard([&] {
        if (!ctx || !buf) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_state_seq_save: NULL argument");
        check_seq(*ctx->impl, seq, "spark_state_seq_save");
        BackendLock lock(*ctx->impl->model().backend);
        Header h = make_header(*ctx->impl, seq);
        if (size < sizeof(Header) + h.payload_bytes)
            fail(SPARK_ERR_INVALID_ARGUMENT, "spark_state_seq_save: the buffer holds %zu bytes; the state needs %llu (spark_state_seq_size)", size,
                 (unsigned long long) (sizeof(Header) + h.payload_bytes));
        auto * out = static_cast<uint8_t *>(buf);
        ctx->impl->memory().write_state(seq, out + sizeof(Header));
        h.checksum = checksum(h, out + sizeof(Header), h.payload_bytes);
        std::memcpy(out, &h, sizeof h);
        if (written) *written = sizeof(Header) + h.payload_bytes;
    });
}

SPARK_API spark_status spark_state_seq_load(spark_context * ctx, spark_seq_id seq, const void * buf, size_t size) {
    return api_guard([&] {
        if (!ctx || (!buf && size)) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_state_seq_load: NULL argument");
        check_seq(*ctx->impl, seq, "spark_state_seq_load");
        refuse_while_speculating(*ctx->impl, "spark_state_seq_load");
        BackendLock lock(*ctx->impl->model().backend);
        if (size < sizeof(Header)) fail(SPARK_ERR_INVALID_FORMAT, "sequence state: %zu bytes, shorter than its header", size);
        Header h;
        std::memcpy(&h, buf, sizeof h);
        const size_t payload = check_header(*ctx->impl, h, "sequence state");
        if (size != sizeof(Header) + payload)
            fail(SPARK_ERR_INVALID_FORMAT, "sequence state: %zu bytes, expected %zu", size, sizeof(Header) + payload);
        load(*ctx->impl, seq, h, static_cast<const uint8_t *>(buf) + sizeof(Header), payload, "sequence state");
    });
}

SPARK_API spark_status spark_state_seq_save_file(spark_context * ctx, spark_seq_id seq, const char * path) {
    return api_guard([&] {
        if (!ctx || !path) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_state_seq_save_file: NULL argument");
        check_seq(*ctx->impl, seq, "spark_state_seq_save_file");
        std::vector<uint8_t> bytes(spark_state_seq_size(ctx, seq));
        size_t               n  = 0;
        const spark_status   st = spark_state_seq_save(ctx, seq, bytes.data(), bytes.size(), &n);
        if (st != SPARK_OK) fail(st, "%s", spark_last_error());
        // A temporary next to the target, renamed into place: a reader never sees half a state and
        // a failure leaves any earlier file as it was.
        const std::string tmp = std::string(path) + ".tmp-" + std::to_string(::getpid());
        {
            File out{std::fopen(tmp.c_str(), "wb")};
            if (!out.f) fail(SPARK_ERR_IO, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
            const bool ok = std::fwrite(bytes.data(), 1, n, out.f) == n && std::fflush(out.f) == 0;
            const int  err = errno;
            if (!ok || std::fclose(out.f) != 0) {
                out.f = nullptr;
                std::remove(tmp.c_str());
                fail(SPARK_ERR_IO, "%s: write failed: %s", tmp.c_str(), std::strerror(ok ? errno : err));
            }
            out.f = nullptr;
        }
        if (std::rename(tmp.c_str(), path) != 0) {
            const int err = errno;
            std::remove(tmp.c_str());
            fail(SPARK_ERR_IO, "%s: cannot rename the temporary into place: %s", path, std::strerror(err));
        }
    });
}

SPARK_API spark_status spark_state_seq_load_file(spark_context * ctx, spark_seq_id seq, const char * path) {
    return api_guard([&] {
        if (!ctx || !path) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_state_seq_load_file: NULL argument");
        check_seq(*ctx->impl, seq, "spark_state_seq_load_file");
        refuse_while_speculating(*ctx->impl, "spark_state_seq_load_file");
        File in{std::fopen(path, "rb")};
        if (!in.f) fail(SPARK_ERR_IO, "%s: cannot open: %s", path, std::strerror(errno));
        Header h;
        if (std::fread(&h, 1, sizeof h, in.f) != sizeof h) fail(SPARK_ERR_INVALID_FORMAT, "%s: shorter than a sequence state header", path);
        BackendLock  lock(*ctx->impl->model().backend);
        // Only the size this context's shape implies is read, so a lying header cannot make the
        // allocation larger than the sequence could hold.
        const size_t         payload = check_header(*ctx->impl, h, path);
        std::vector<uint8_t> bytes(payload);
        if (std::fread(bytes.data(), 1, payload, in.f) != payload) fail(SPARK_ERR_INVALID_FORMAT, "%s: truncated (%zu payload bytes expected)", path, payload);
        if (std::fgetc(in.f) != EOF) fail(SPARK_ERR_INVALID_FORMAT, "%s: trailing bytes after the state", path);
        load(*ctx->impl, seq, h, bytes.data(), payload, path);
    });
}

}  // extern "C"
