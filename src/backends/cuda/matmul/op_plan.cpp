#include "backends/cuda/matmul/op_plan.h"

#include "backends/cuda/common/arch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/tuning.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace spark::cuda::mm {

size_t scratch_aligned(size_t bytes) { return (bytes + 255) & ~size_t(255); }

size_t ScratchPieces::bytes() const {
    return scratch_aligned(x_f32) + scratch_aligned(route) + scratch_aligned(x_f16) + scratch_aligned(inv_scale) +
           scratch_aligned(partial) + scratch_aligned(counters) + scratch_aligned(a4_codes) + scratch_aligned(a4_scales);
}

ScratchPtrs carve(const ScratchPieces & p, Scratch & s) {
    auto        take = [&](size_t bytes) { return bytes > 0 ? s.take(bytes) : nullptr; };
    ScratchPtrs c;
    c.x_f32     = static_cast<float *>(take(p.x_f32));
    c.route     = static_cast<int32_t *>(take(p.route));
    c.x_f16     = static_cast<uint16_t *>(take(p.x_f16));
    c.inv_scale = static_cast<float *>(take(p.inv_scale));
    c.partial   = static_cast<float *>(take(p.partial));
    c.counters  = static_cast<uint32_t *>(take(p.counters));
    c.a4_codes  = static_cast<uint8_t *>(take(p.a4_codes));
    c.a4_scales = static_cast<uint8_t *>(take(p.a4_scales));
    return c;
}

bool w4a4_takes(const DeviceWeight & w, int64_t rows, bool prompt_step, const DeviceProps & dev) {
    const int forced = overrides().w4a4;
    if (forced == 0 || overrides().path != ForcePath::Auto) return false;
    if (w.format != WeightFormat::NVFP4 || !(w.act_scale > 0.0f) || !dev.w4a4 || w.k % 64 != 0 || rows <= 0) return false;
    return forced == 1 || (prompt_step && rows > kGemvMaxRows);
}

size_t OpPlan::scratch_bytes() const {
    const size_t launches = std::max(launch[0].scratch.bytes(), unfused ? launch[1].scratch.bytes() : size_t(0));
    return scratch_aligned(ids_copy) + scratch_aligned(x_copy) + scratch_aligned(up_y) + launches;
}

DeviceWeight weight_shape(WeightFormat f, int64_t n, int64_t k, int32_t group) {
    DeviceWeight w;
    w.format = f;
    w.n      = n;
    w.k      = k;
    if (f == WeightFormat::INT4) {
        w.group_size = group;
        w.n_groups   = int32_t(ceil_div(k, group));
    }
    if (f == WeightFormat::FP8) w.block_n = w.block_k = 128;
    return w;
}

Dense half_of(const Dense & d, int i) {
    Dense h = d;
    h.nw    = 1;
    h.w[0]  = d.w[i];
    return h;
}

Moe half_of(const Moe & m, int i) {
    Moe h      = m;
    h.nw       = 1;
    h.table[0] = m.table[i];
    h.w0[0]    = m.w0[i];
    if (m.ids.held) h.ids.held = m.table[i];
    return h;
}

namespace {

// ---- what the kernels need of the activations -------------------------------------------------------

// Whether every activation row starts 16-byte aligned (the GEMV reads its rows with 16-byte loads).
bool rows_aligned(const XRows & x, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
        if ((reinterpret_cast<uintptr_t>(x.base) + uintptr_t(row_offset(x, r))) % 16 != 0) return false;
    return true;
}

// Whether row r of the activations sits at x.base + r * x.nb1 for every r < rows (one row stride).
bool uniform_rows(const XRows & x, int64_t rows) {
    if (rows <= x.ne1) return true;
    if (x.nb2 != x.ne1 * x.nb1) return false;
    return rows <= x.ne1 * x.ne2 || x.nb3 == x.ne2 * x.nb2;
}

bool pairs_aligned(const XRows & x) { return reinterpret_cast<uintptr_t>(x.base) % 16 == 0 && x.nb1 % 16 == 0 && x.nb2 % 16 == 0; }

// The GEMV options of a set of weights (all of one format and K): the tensor-core decode where every
// weight takes it.
GemvOpts gemv_opts(const DeviceWeight * const * w, int count, const DeviceProps & dev) {
    GemvOpts o;
    o.mma = gemv_mma_enabled(dev.cc);
    for (int i = 0; i < count; ++i) o.mma = o.mma && gemv_mma_ok(*w[i]);
    if (dev.max_smem_per_block > 0) o.smem_optin = dev.max_smem_per_block;
    o.bw_per_us       = dev.bw_bytes_per_us;
    o.issue_per_sm_us = dev.issue_per_sm_us;
    return o;
}

// Split-K partial floats of a GEMV plan: [ksplit][nw][out_rows][n] (0 without a split).
size_t gemv_split_floats(const GemvPlan & p, int nw, int64_t out_rows, int64_t n) {
    return p.ksplit > 1 ? size_t(p.ksplit) * size_t(nw) * size_t(out_rows) * size_t(n) : 0;
}

// GEMM input staging: F16 activations [rows][k] and one f32 inverse row scale per row; the split-K
// partials and arrival counters of plan p.
ScratchPieces gemm_pieces(int64_t rows, int64_t k, const GemmPlan & p) {
    ScratchPieces s;
    s.x_f16     = size_t(rows * k) * 2;
    s.inv_scale = size_t(rows) * 4;
    s.partial   = size_t(p.partial_floats()) * 4;
    s.counters  = size_t(p.counters()) * 4;
    return s;
}

// ---- dense -------------------------------------------------------------------------------------

// Whether the chunked kernels take the weight(s): a gate/up pair alike in format and shape.
bool chunkable(const Dense & d) {
    const DeviceWeight & w0 = *d.w[0];
    return chunk_ok(w0) && (d.nw == 1 || (chunk_ok(*d.w[1]) && d.w[1]->format == w0.format && d.w[1]->n == w0.n && d.w[1]->k == w0.k));
}

// Every weight of the op takes W4A4 (a gate/up pair: both, each with its own activation scale).
bool w4a4(const Dense & d, const DeviceProps & dev) {
    return w4a4_takes(*d.w[0], d.rows, d.prompt, dev) && (d.nw == 1 || w4a4_takes(*d.w[1], d.rows, d.prompt, dev));
}

// A gate/up pair whose weights read the activations in their own (act-order) orders, or that takes
// W4A4 (one weight per GEMM launch): two launches.
bool must_unfuse(const Dense & d, const DeviceProps & dev) { return d.nw == 2 && (d.w[0]->perm || d.w[1]->perm || w4a4(d, dev)); }

Path choose(const Dense & d, const DeviceProps & dev) {
    const DeviceWeight & w0    = *d.w[0];
    const ForcePath      force = overrides().path;
    if (d.nw == 1 && w4a4(d, dev)) return Path::W4A4;
    if (!chunkable(d) || force == ForcePath::Generic) return Path::Generic;  // the generic kernel fuses too
    if (force == ForcePath::Gemv) return Path::Gemv;
    if (force == ForcePath::Gemm && w0.k % kGemmBK == 0) return Path::Gemm;
    if (d.rows <= kGemvMaxRows) return Path::Gemv;
    return w0.k % kGemmBK == 0 ? Path::Gemm : Path::Gemv;
}

LaunchPlan plan_dense_launch(const Dense & d, bool x_aligned, const DeviceProps & dev) {
    const DeviceWeight & w = *d.w[0];
    LaunchPlan           p;
    p.path = choose(d, dev);
    switch (p.path) {
        case Path::W4A4:
            // The activations as NVFP4 (rows with a uniform stride are read in place; others are
            // gathered into contiguous F32 rows first).
            p.scratch.a4_codes  = size_t(d.rows * w.k / 2);
            p.scratch.a4_scales = size_t(d.rows * w.k / 16);
            if (!d.stage_x && !uniform_rows(d.x, d.rows)) p.scratch.x_f32 = size_t(d.rows * w.k) * 4;  // (a copy is contiguous)
            break;
        case Path::Gemv: {
            // Row batches of 8 run one after the other on the stream and share the split-K buffers.
            GemvOpts o       = gemv_opts(d.w, d.nw, dev);
            o.norm_prologue  = d.norm_prologue;
            p.batch_rows[0]  = int(std::min<int64_t>(d.rows, kGemvMaxRows));
            p.batch_rows[1]  = d.rows > kGemvMaxRows ? int(d.rows % kGemvMaxRows) : 0;
            for (int b = 0; b < 2; ++b) {
                if (p.batch_rows[b] == 0) continue;
                p.gemv[b]         = plan_gemv(w.format, w.n, w.k, 1, p.batch_rows[b], d.nw, dev.sm_count, o);
                p.scratch.partial = std::max(p.scratch.partial, gemv_split_floats(p.gemv[b], d.nw, p.batch_rows[b], w.n) * 4);
                p.scratch.counters = std::max(p.scratch.counters, size_t(p.gemv[b].counters()) * 4);
            }
            if (w.perm || !x_aligned) p.scratch.x_f32 = size_t(d.rows * w.k) * 4;
            break;
        }
        case Path::Gemm:
            p.gemm    = plan_gemm(d.rows, ceil_div(w.n, int64_t(gemm_bn(d.nw == 2))), w.k, dev.sm_count);
            p.scratch = gemm_pieces(d.rows, w.k, p.gemm);
            break;
        case Path::Generic: break;
    }
    return p;
}

// ---- MATMUL_ID -----------------------------------------------------------------------------------

bool must_unfuse(const Moe & m) { return m.nw == 2 && m.perm; }

Path choose(const Moe & m) {
    const ForcePath force = overrides().path;
    if (!m.fast || force == ForcePath::Generic) return Path::Generic;
    const int64_t pairs   = m.pairs();
    const bool    gemm_ok = m.w0[0].k % kGemmBK == 0;
    if (force == ForcePath::Gemm && gemm_ok) return Path::Gemm;
    if (force == ForcePath::Gemv && pairs <= 65535) return Path::Gemv;
    if (m.n_tok <= kGemvMaxRows && pairs <= 65535) return Path::Gemv;
    if (gemm_ok) return Path::Gemm;
    return pairs <= 65535 ? Path::Gemv : Path::Generic;
}

LaunchPlan plan_moe_launch(const Moe & m, bool x_aligned, bool ids_early, bool x_early, const DeviceProps & dev) {
    const int64_t pairs = m.pairs(), N = m.w0[0].n, K = m.w0[0].k;
    LaunchPlan    p;
    p.path = choose(m);
    switch (p.path) {
        case Path::Gemv: {
            const DeviceWeight * w[1] = {&m.w0[0]};
            GemvOpts             o    = gemv_opts(w, 1, dev);
            o.mma                     = o.mma && m.mma;
            p.batch_rows[0]           = 1;
            p.gemv[0] = m.slot_w ? plan_experts_combine(N, K, m.ids.k_slots, m.n_tok, dev.sm_count) : plan_gemv(m.w0[0].format, N, K, pairs, 1, m.nw, dev.sm_count, o);
            if (m.perm || !x_aligned) p.scratch.x_f32 = size_t(pairs * K) * 4;
            p.scratch.partial  = gemv_split_floats(p.gemv[0], m.nw, pairs, N) * 4;
            p.scratch.counters = size_t(p.gemv[0].counters()) * 4;
            // A staging kernel (or a split's memset) would come between: then it waits as usual.
            // The FMA kernel keeps waiting first: the gate/up FMA GEMV before it lets it start only
            // after its own main loop, too late for the early loads to pay (H100, 30B-A3B fp8:
            // 347.9 against 350.2 t/s).
            const bool early = p.scratch.x_f32 == 0 && p.gemv[0].ksplit == 1 && p.gemv[0].mma;
            p.ids_early      = ids_early && early;
            p.x_early        = x_early && early && !m.slot_w;  // (the combine's form converts after its wait)
            break;
        }
        case Path::Gemm: {
            // Tiles of gemm_bm(mt) rows per expert: 128 when the experts average 64 rows or more.
            const int64_t active    = std::min<int64_t>(pairs, m.ids.n_experts);
            p.gemm.mt               = pairs / std::max<int64_t>(1, active) >= 64 ? 4 : 1;
            const int64_t max_tiles = pairs / gemm_bm(p.gemm.mt) + active + 1;
            p.gemm.grid             = dim3(unsigned(max_tiles), unsigned(ceil_div(N, gemm_bn(m.nw == 2))));
            p.scratch               = gemm_pieces(pairs, K, p.gemm);  // (no K split)
            p.scratch.route         = size_t(moe_route_ints(pairs, m.ids.n_experts, max_tiles)) * 4;
            break;
        }
        case Path::Generic:
        case Path::W4A4: break;  // (not for experts: choose(Moe) never takes it)
    }
    return p;
}

}  // namespace

OpPlan plan_dense(const Dense & d, const DeviceProps & dev) {
    const int64_t K = d.w[0]->k;
    OpPlan        p;
    p.x_copy = d.stage_x ? size_t(d.rows * K) * 4 : 0;
    // The launches read the copy when there is one: contiguous rows from a 256-byte aligned piece.
    const bool x_aligned = d.stage_x ? d.rows <= 1 || K % 4 == 0 : rows_aligned(d.x, d.rows);
    if (choose(d, dev) != Path::Generic && must_unfuse(d, dev)) {
        p.unfused = true;
        p.up_y    = size_t(d.rows * d.w[0]->n) * 4;
        for (int i = 0; i < 2; ++i) p.launch[i] = plan_dense_launch(half_of(d, i), x_aligned, dev);
        return p;
    }
    p.launch[0] = plan_dense_launch(d, x_aligned, dev);
    return p;
}

OpPlan plan_moe(const Moe & m, const DeviceProps & dev) {
    const int64_t pairs = m.pairs(), K = m.w0[0].k;
    OpPlan        p;
    p.ids_copy = m.ids_bytes;
    p.x_copy   = m.stage_x ? size_t(pairs * K) * 4 : 0;
    // The copy of the activations: rows of K floats from a 256-byte aligned piece.
    const bool x_aligned = m.stage_x ? K % 4 == 0 : pairs_aligned(m.x);
    const bool staged    = p.ids_copy != 0 || p.x_copy != 0;  // (a staging launch comes first)
    const bool ids_early = m.ids_early && !staged, x_early = m.x_early && !staged;
    if (choose(m) != Path::Generic && must_unfuse(m)) {
        p.unfused   = true;
        p.up_y      = size_t(pairs * m.w0[0].n) * 4;
        p.launch[0] = plan_moe_launch(half_of(m, 0), x_aligned, ids_early, x_early, dev);
        p.launch[1] = plan_moe_launch(half_of(m, 1), x_aligned, false, false, dev);  // (its launch follows the gate's)
        return p;
    }
    p.launch[0] = plan_moe_launch(m, x_aligned, ids_early, x_early, dev);
    return p;
}

bool multi_path(int64_t rows, Path & path) {
    path                  = rows > kGemvMaxRows ? Path::Gemm : Path::Gemv;
    const ForcePath force = overrides().path;
    return force == ForcePath::Auto || force == (path == Path::Gemm ? ForcePath::Gemm : ForcePath::Gemv);
}

LaunchPlan plan_multi(const Multi & m, const DeviceProps & dev) {
    const DeviceWeight & w0 = *m.w[0];
    LaunchPlan           p;
    if (!multi_path(m.rows, p.path)) fail(SPARK_ERR_INTERNAL, "matmul_multi: no one launch for the forced path");
    if (p.path == Path::Gemm) {
        int64_t tiles = 0;
        for (int i = 0; i < m.count; ++i) tiles += ceil_div(m.w[i]->n, int64_t(gemm_bn(false)));
        p.gemm    = plan_gemm(m.rows, tiles, w0.k, dev.sm_count);
        p.scratch = gemm_pieces(m.rows, w0.k, p.gemm);
        return p;
    }
    int64_t ns[kGemvMaxMats] = {};
    int64_t ntot             = 0;
    for (int i = 0; i < m.count; ++i) ntot += ns[i] = m.w[i]->n;
    GemvOpts o      = gemv_opts(m.w, m.count, dev);
    o.n_mats        = m.count;
    o.mat_n         = ns;
    o.norm_prologue = m.norm_prologue;
    p.batch_rows[0] = int(m.rows);
    p.gemv[0]       = plan_gemv(w0.format, ntot, w0.k, 1, int(m.rows), 1, dev.sm_count, o);
    if (!rows_aligned(m.x, m.rows)) p.scratch.x_f32 = size_t(m.rows * w0.k) * 4;
    p.scratch.partial  = gemv_split_floats(p.gemv[0], 1, m.rows, ntot) * 4;
    p.scratch.counters = size_t(p.gemv[0].counters()) * 4;
    return p;
}

const char * path_name(const LaunchPlan & p) {
    switch (p.path) {
        case Path::Gemv: return p.gemv[0].mma ? "gemv-mma" : "gemv-fma";
        case Path::Gemm: return "gemm-f16";
        case Path::Generic: return "generic";
        case Path::W4A4: return "w4a4";
    }
    return "?";
}

}  // namespace spark::cuda::mm

namespace spark::cuda {

namespace {

using namespace mm;

std::string op_path_name(const OpPlan & p) {
    if (!p.unfused) return path_name(p.launch[0]);
    return std::string(path_name(p.launch[0])) + "+" + path_name(p.launch[1]);  // gate, then up
}

// Shapes of the representative problems: Qwen3-8B (hidden 4096, kv 1024) for the dense matmuls,
// Qwen3-30B-A3B's experts (128 of [768, 2048], top 8) for MATMUL_ID; a decode step (one row) and a
// prefill chunk (512 rows).
constexpr int64_t kHidden = 4096, kKv = 1024, kExpertN = 768, kExpertK = 2048, kExperts = 128, kTopK = 8;
constexpr int64_t kDecodeRows = 1, kPrefillRows = 512;

XRows rows_of(int64_t rows, int64_t k) {
    XRows x;
    x.ne1 = rows;
    x.nb1 = k * 4;
    x.nb2 = x.nb3 = rows * k * 4;
    return x;
}

std::string dense_path(const DeviceWeight * w, int nw, int64_t rows, const DeviceProps & dev) {
    Dense d;
    d.w[0]   = w;
    d.w[1]   = w;
    d.nw     = nw;
    d.rows   = rows;
    d.prompt = rows > kDecodeRows;  // the prefill chunk of a prompt
    d.x    = rows_of(rows, w->k);
    return op_path_name(plan_dense(d, dev));
}

std::string moe_path(const DeviceWeight & w, int64_t tokens, const DeviceProps & dev) {
    Moe m;
    m.w0[0]         = w;
    m.mma           = gemv_mma_ok(w);
    m.fast          = chunk_ok(w);
    m.ids.k_slots   = int32_t(kTopK);
    m.ids.n_experts = int32_t(kExperts);
    m.n_tok         = tokens;
    m.x.nb2         = w.k * 4;  // one input row per token, shared by its slots (nb1 = 0)
    m.x.k_slots     = m.ids.k_slots;
    const OpPlan p  = plan_moe(m, dev);
    return (p.launch[0].path == Path::Gemm ? "grouped-" : "") + op_path_name(p);
}

std::string multi_path_name(WeightFormat f, int64_t rows, const DeviceProps & dev) {
    Path path;
    if (!multi_path(rows, path)) return "separate";
    const DeviceWeight q = weight_shape(f, kHidden, kHidden), kv = weight_shape(f, kKv, kHidden);
    Multi              m;
    m.w[0]  = &q;
    m.w[1]  = &kv;
    m.w[2]  = &kv;
    m.count = 3;
    m.rows  = rows;
    m.x     = rows_of(rows, kHidden);
    return path_name(plan_multi(m, dev));
}

// "a/b" for a decode and a prefill path; variants that differ are listed by their label.
std::string variants(const std::vector<std::pair<std::string, std::string>> & named) {
    bool same = true;
    for (const auto & v : named) same = same && v.second == named[0].second;
    if (same) return named[0].second;
    std::string s;
    for (const auto & v : named) s += (s.empty() ? "" : ",") + v.second + "(" + v.first + ")";
    return s;
}

}  // namespace

std::string kernel_paths(const DeviceProps & dev) {
    if (!cc_supported(dev.cc)) return "unsupported (compute capability below 8.0)";
    struct Format {
        const char *              key;
        WeightFormat              f;
        std::vector<const char *> labels;  // INT4: the group sizes checkpoints use; NVFP4: with or without activation scales
        std::vector<int32_t>      groups;
        std::vector<bool>         act_scaled;
    };
    const Format formats[] = {
        {"f32", WeightFormat::F32, {""}, {0}, {false}},   {"f16", WeightFormat::F16, {""}, {0}, {false}},
        {"bf16", WeightFormat::BF16, {""}, {0}, {false}}, {"nvfp4", WeightFormat::NVFP4, {"w4a16", "act-scaled"}, {0, 0}, {false, true}},
        {"int4", WeightFormat::INT4, {"g128", "g32"}, {128, 32}, {false, false}}, {"fp8", WeightFormat::FP8, {""}, {0}, {false}},
    };
    std::string out;
    for (const Format & fmt : formats) {
        std::vector<std::pair<std::string, std::string>> decode, prefill;
        for (size_t i = 0; i < fmt.groups.size(); ++i) {
            DeviceWeight w = weight_shape(fmt.f, kHidden, kHidden, fmt.groups[i]);
            if (fmt.act_scaled[i]) w.act_scale = 1.0f;
            decode.emplace_back(fmt.labels[i], dense_path(&w, 1, kDecodeRows, dev));
            prefill.emplace_back(fmt.labels[i], dense_path(&w, 1, kPrefillRows, dev));
        }
        out += std::string(out.empty() ? "" : " ") + fmt.key + "=" + variants(decode) + "/" + variants(prefill);
    }
    // The fused and grouped launches, for INT4 g128 weights.
    const DeviceWeight expert = weight_shape(WeightFormat::INT4, kExpertN, kExpertK), gate = weight_shape(WeightFormat::INT4, 3 * kHidden, kHidden);
    out += " moe:int4=" + moe_path(expert, kDecodeRows, dev) + "/" + moe_path(expert, kPrefillRows, dev);
    out += " swiglu:int4=" + dense_path(&gate, 2, kDecodeRows, dev) + "/" + dense_path(&gate, 2, kPrefillRows, dev);
    out += " multi:int4=" + multi_path_name(WeightFormat::INT4, kDecodeRows, dev) + "/" + multi_path_name(WeightFormat::INT4, kPrefillRows, dev);
    return out;
}

}  // namespace spark::cuda
