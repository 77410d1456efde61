#include "runtime/weight_resolver.h"

#include "common/error.h"
#include "io/mapped_file.h"
#include "quant/formats.h"
#include "quant/repack.h"

#include <cmath>
#include <cstring>

namespace spark {

using io::TensorInfo;

namespace {

std::string shape_of(std::initializer_list<int64_t> s) {
    std::string r = "[";
    for (auto it = s.begin(); it != s.end(); ++it) r += (it == s.begin() ? "" : ", ") + std::to_string(*it);
    return r + "]";
}

bool shape_is(const TensorInfo & t, std::initializer_list<int64_t> s) {
    return t.shape.size() == s.size() && std::equal(t.shape.begin(), t.shape.end(), s.begin());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void expect_dtype(const TensorInfo & t, std::initializer_list<DType> allowed, const char * role) {
    for (DType d : allowed)
        if (t.dtype == d) return;
    fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s' (%s) has dtype %s, which is not valid for %s", t.name.c_str(),
         t.shape_str().c_str(), dtype_name(t.dtype), role);
}

void expect_shape(const TensorInfo & t, std::initializer_list<int64_t> s, const char * role) {
    if (!shape_is(t, s))
        fail(SPARK_ERR_SHAPE_MISMATCH, "tensor '%s' (%s) has shape %s, expected %s", t.name.c_str(), role,
             t.shape_str().c_str(), shape_of(s).c_str());
}

float to_f32(const TensorInfo & t, int64_t i) {
    switch (t.dtype) {
        case DType::F32: {
            float v;
            std::memcpy(&v, t.data + 4 * i, 4);
            return v;
        }
        case DType::F16: {
            uint16_t v;
            std::memcpy(&v, t.data + 2 * i, 2);
            return f16_to_f32(v);
        }
        case DType::BF16: {
            uint16_t v;
            std::memcpy(&v, t.data + 2 * i, 2);
            return bf16_to_f32(v);
        }
        default: fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s': dtype %s cannot be read as float", t.name.c_str(), dtype_name(t.dtype));
    }
}

}  // namespace

void * HostStore::alloc(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    blobs_.push_back(std::unique_ptr<uint8_t[]>(new uint8_t[std::max<size_t>(bytes, 1)]));
    bytes_ += bytes;
    return blobs_.back().get();
}

// Reads a tensor the resolver only inspects with a positioned read instead of through the mapping:
// faulting the mapping in maps whole neighbourhoods of the file (large page-cache folios), which for
// a MoE's ~100K small tensors made the process's resident set grow to the model's size.
std::vector<uint8_t> WeightResolver::read_small(const TensorInfo & t) const {
    std::vector<uint8_t> bytes(t.nbytes);
    for (const io::MappedFile * f : files_)
        if (f->contains(t.data)) {
            f->read_at(bytes.data(), size_t(t.data - f->data()), t.nbytes);
            return bytes;
        }
    std::memcpy(bytes.data(), t.data, t.nbytes);
    return bytes;
}

bool WeightResolver::has_module(const std::string & m) const {
    for (const char * s : {".weight", ".qweight", ".weight_packed"})
        if (src_.has(m + s)) return true;
    return false;
}

// The mapping is used in place when the data is aligned for its element type; otherwise copied.
const void * WeightResolver::aligned(const TensorInfo & t, size_t alignment) {
    if (reinterpret_cast<uintptr_t>(t.data) % alignment == 0) return t.data;
    void * p = store_.alloc(t.nbytes);
    std::memcpy(p, t.data, t.nbytes);
    return p;
}

float WeightResolver::scalar_f32(const TensorInfo & t) {
    if (t.numel() != 1) fail(SPARK_ERR_SHAPE_MISMATCH, "tensor '%s' should be a scalar but has shape %s", t.name.c_str(), t.shape_str().c_str());
    expect_dtype(t, {DType::F32, DType::BF16, DType::F16}, "a scale");
    return to_f32(t, 0);
}

// An NVFP4 checkpoint's activation scale (ModelOpt input_scale, compressed-tensors
// input_global_scale): a positive finite scalar, or the file is refused.
float WeightResolver::activation_scale(const TensorInfo & t) {
    const float v = scalar_f32(t);
    if (!(v > 0.0f) || !std::isfinite(v) || !std::isfinite(1.0f / v))
        fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s' (an activation scale) must be positive and finite, got %g", t.name.c_str(), double(v));
    return v;
}

QWeight WeightResolver::dense(const std::string & name, int64_t n, int64_t k) {
    const TensorInfo & t = src_.get(name);
    expect_dtype(t, {DType::F32, DType::F16, DType::BF16}, "a dense weight");
    expect_shape(t, {n, k}, "dense weight");
    QWeight w;
    w.format = t.dtype == DType::F32 ? WeightFormat::F32 : t.dtype == DType::F16 ? WeightFormat::F16 : WeightFormat::BF16;
    w.n      = n;
    w.k      = k;
    w.data   = aligned(t, dtype_size(t.dtype));
    return w;
}

std::vector<float> WeightResolver::f32(const std::string & name, std::initializer_list<int64_t> shape) {
    const TensorInfo & t = src_.get(name);
    int64_t            numel = 1;
    for (int64_t d : shape) numel *= d;
    if (t.numel() != numel) fail(SPARK_ERR_SHAPE_MISMATCH, "tensor '%s' has shape %s, expected %s", name.c_str(), t.shape_str().c_str(), shape_of(shape).c_str());
    std::vector<float> out(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) out[size_t(i)] = to_f32(t, i);
    return out;
}

QWeight WeightResolver::linear(const std::string & m, int64_t n, int64_t k) {
    // INT4: GPTQ / AutoRound / AWQ (qweight) or compressed-tensors pack-quantized (I32 weight_packed).
    if (src_.has(m + ".qweight")) return qc_.int4_is_awq() ? int4_awq(m, n, k) : int4_gptq(m, n, k);
    if (const TensorInfo * wp = src_.find(m + ".weight_packed")) {
        if (wp->dtype == DType::I32) return int4_ct_packed(m, n, k);
        // compressed-tensors NVFP4: the global scale is a divisor.
        const TensorInfo & packed = src_.get(m + ".weight_packed");
        const TensorInfo & gs     = src_.get(m + ".weight_global_scale");
        const float        div    = scalar_f32(gs);
        if (!(div > 0.0f)) fail(SPARK_ERR_INVALID_FORMAT, "tensor '%s' must be positive", gs.name.c_str());
        QWeight q = nvfp4(m, packed, src_.get(m + ".weight_scale"), 1.0f / div, n, k);
        // W4A4 checkpoints: the activations' global scale, a divisor as well.
        if (const TensorInfo * ig = src_.find(m + ".input_global_scale")) q.act_scale = 1.0f / activation_scale(*ig);
        return q;
    }
    const TensorInfo * w = src_.find(m + ".weight");
    if (!w) fail(SPARK_ERR_MISSING_TENSOR, "no weight for '%s' in %s (looked for .weight, .qweight, .weight_packed)", m.c_str(), src_.describe().c_str());
    switch (w->dtype) {
        case DType::F32:
        case DType::F16:
        case DType::BF16: return dense(m + ".weight", n, k);
        case DType::U8: {  // ModelOpt NVFP4: the global scale (weight_scale_2) is a multiplier
            const TensorInfo & packed = src_.get(m + ".weight");
            const TensorInfo & s2     = src_.get(m + ".weight_scale_2");
            QWeight            q      = nvfp4(m, packed, src_.get(m + ".weight_scale"), scalar_f32(s2), n, k);
            // W4A4 checkpoints (quant_algo NVFP4): the activations' global scale, a multiplier.
            if (const TensorInfo * is = src_.find(m + ".input_scale")) q.act_scale = activation_scale(*is);
            return q;
        }
        case DType::F8_E4M3: {
            const TensorInfo & wt = src_.get(m + ".weight");
            if (src_.has(m + ".weight_scale_inv")) return fp8(m, wt, src_.get(m + ".weight_scale_inv"), n, k);
            if (src_.has(m + ".weight_scale")) return fp8(m, wt, src_.get(m + ".weight_scale"), n, k);
            fail(SPARK_ERR_MISSING_TENSOR, "FP8 weight '%s' has no weight_scale_inv or weight_scale", wt.name.c_str());
        }
        default:
            fail(SPARK_ERR_UNSUPPORTED, "weight '%s' has dtype %s, which spark cannot run", w->name.c_str(), dtype_name(w->dtype));
    }
}

QWeight WeightResolver::nvfp4(const std::string & m, const TensorInfo & packed, const TensorInfo & scale, float global,
                              int64_t n, int64_t k) {
    if (k % 16) fail(SPARK_ERR_SHAPE_MISMATCH, "NVFP4 weight '%s': in_features %lld is not a multiple of 16", m.c_str(), (long long) k);
    expect_dtype(packed, {DType::U8}, "packed NVFP4 codes");
    expect_shape(packed, {n, k / 2}, "packed NVFP4 codes");
    expect_dtype(scale, {DType::F8_E4M3}, "NVFP4 block scales");
    expect_shape(scale, {n, k / 16}, "NVFP4 block scales");
    if (!(global > 0.0f) || !std::isfinite(global)) fail(SPARK_ERR_INVALID_FORMAT, "NVFP4 weight '%s': invalid global scale %g", m.c_str(), double(global));
    QWeight w;
    w.format       = WeightFormat::NVFP4;
    w.n            = n;
    w.k            = k;
    w.data         = packed.data;
    w.scales       = scale.data;
    w.global_scale = global;
    return w;
}

QWeight WeightResolver::int4_gptq(const std::string & m, int64_t n, int64_t k) {
    const int bits = qc_.bits_for(m);
    if (bits != 0 && bits != 4) fail(SPARK_ERR_UNSUPPORTED, "'%s' is %d-bit; spark runs 4-bit GPTQ/AutoRound weights", m.c_str(), bits);
    if (k % 8 || n % 8) fail(SPARK_ERR_SHAPE_MISMATCH, "INT4 weight '%s': [%lld, %lld] is not a multiple of 8", m.c_str(), (long long) n, (long long) k);
    const TensorInfo & qw = src_.get(m + ".qweight");
    expect_dtype(qw, {DType::I32}, "a GPTQ qweight");
    expect_shape(qw, {k / 8, n}, "GPTQ qweight [in/8, out]");
    const TensorInfo & sc = src_.get(m + ".scales");
    expect_dtype(sc, {DType::F16, DType::BF16}, "INT4 scales");
    if (sc.shape.size() != 2 || sc.shape[1] != n || sc.shape[0] < 1 || sc.shape[0] > k)
        fail(SPARK_ERR_SHAPE_MISMATCH, "INT4 scales '%s' has shape %s, expected [groups, %lld] for qweight %s", sc.name.c_str(),
             sc.shape_str().c_str(), (long long) n, qw.shape_str().c_str());
    const int64_t groups = sc.shape[0];
    int64_t       gs     = qc_.group_size_for(m);
    if (gs <= 0 || gs > k) gs = k;  // -1: one group per channel
    if (ceil_div(k, gs) != groups) {
        if (k % groups) fail(SPARK_ERR_SHAPE_MISMATCH, "INT4 weight '%s': %lld groups do not divide in_features %lld (group_size %lld)", m.c_str(), (long long) groups, (long long) k, (long long) gs);
        gs = k / groups;  // the tensors are the truth
    }
    QWeight w;
    w.format      = WeightFormat::INT4;
    w.n           = n;
    w.k           = k;
    w.data        = aligned(qw, 4);
    w.scales      = aligned(sc, 2);
    w.scale_type  = sc.dtype == DType::F16 ? ScaleType::F16 : ScaleType::BF16;
    w.group_size  = int32_t(gs);
    w.n_groups    = int32_t(groups);
    w.zero_offset = qc_.int4_zero_offset();
    if (src_.has(m + ".qzeros")) {
        const TensorInfo & qz = src_.get(m + ".qzeros");
        expect_dtype(qz, {DType::I32}, "GPTQ qzeros");
        expect_shape(qz, {groups, n / 8}, "GPTQ qzeros [groups, out/8]");
        // Symmetric checkpoints still store zero points (AutoRound and GPTQ write them always): when
        // every one is 8 after the offset, the weight is symmetric and runs as such — the same values,
        // without reading zero points in every decode step.
        const uint32_t              sym_word = 0x11111111u * uint32_t(8 - w.zero_offset);
        const std::vector<uint8_t>  zp      = read_small(qz);
        bool                         sym     = w.zero_offset >= 0 && w.zero_offset <= 8;
        for (size_t i = 0; sym && i < zp.size(); i += 4) {
            uint32_t word;
            std::memcpy(&word, zp.data() + i, 4);
            sym = word == sym_word;
        }
        if (sym) w.zero_offset = 0;
        else w.zeros = aligned(qz, 4);
    } else {
        w.zero_offset = 0;  // symmetric: implicit zero 8
    }
    if (src_.has(m + ".g_idx")) {
        const TensorInfo & gi = src_.get(m + ".g_idx");
        const std::vector<uint8_t> gidx = read_small(gi);
        expect_dtype(gi, {DType::I32}, "g_idx");
        expect_shape(gi, {k}, "g_idx [in]");
        bool trivial = true;
        for (int64_t i = 0; i < k; ++i) {
            int32_t g;
            std::memcpy(&g, gidx.data() + 4 * i, 4);
            if (g < 0 || g >= groups) fail(SPARK_ERR_INVALID_FORMAT, "'%s': g_idx[%lld] = %d is outside [0, %lld)", gi.name.c_str(), (long long) i, g, (long long) groups);
            trivial &= g == i / gs;
        }
        if (!trivial) w.g_idx = static_cast<const int32_t *>(aligned(gi, 4));  // act-order
    }
    return w;
}

QWeight WeightResolver::int4_awq(const std::string & m, int64_t n, int64_t k) {
    const int bits = qc_.bits_for(m);
    if (bits != 0 && bits != 4) fail(SPARK_ERR_UNSUPPORTED, "'%s' is %d-bit; spark runs 4-bit AWQ weights", m.c_str(), bits);
    if (k % 8 || n % 8) fail(SPARK_ERR_SHAPE_MISMATCH, "AWQ weight '%s': [%lld, %lld] is not a multiple of 8", m.c_str(), (long long) n, (long long) k);
    const TensorInfo & qw = src_.get(m + ".qweight");
    expect_dtype(qw, {DType::I32}, "an AWQ qweight");
    expect_shape(qw, {k, n / 8}, "AWQ qweight [in, out/8]");
    const TensorInfo & sc = src_.get(m + ".scales");
    expect_dtype(sc, {DType::F16, DType::BF16}, "AWQ scales");
    if (sc.shape.size() != 2 || sc.shape[1] != n || sc.shape[0] < 1 || k % sc.shape[0])
        fail(SPARK_ERR_SHAPE_MISMATCH, "AWQ scales '%s' has shape %s, expected [groups, %lld]", sc.name.c_str(), sc.shape_str().c_str(), (long long) n);
    const int64_t      groups = sc.shape[0];
    const TensorInfo & qz     = src_.get(m + ".qzeros");
    expect_dtype(qz, {DType::I32}, "AWQ qzeros");
    expect_shape(qz, {groups, n / 8}, "AWQ qzeros [groups, out/8]");
    QWeight w;
    w.format      = WeightFormat::INT4;
    w.n           = n;
    w.k           = k;
    w.group_size  = int32_t(k / groups);
    w.n_groups    = int32_t(groups);
    w.zero_offset = 0;
    w.scales      = aligned(sc, 2);
    w.scale_type  = sc.dtype == DType::F16 ? ScaleType::F16 : ScaleType::BF16;
    auto * qweight = static_cast<int32_t *>(store_.alloc(size_t(k / 8 * n) * 4));
    auto * qzeros  = static_cast<int32_t *>(store_.alloc(size_t(groups * n / 8) * 4));
    awq_qweight_to_gptq(static_cast<const int32_t *>(aligned(qw, 4)), k, n, qweight);
    awq_qzeros_to_gptq(static_cast<const int32_t *>(aligned(qz, 4)), groups, n, qzeros);
    w.data  = qweight;
    w.zeros = qzeros;
    return w;
}

QWeight WeightResolver::int4_ct_packed(const std::string & m, int64_t n, int64_t k) {
    if (qc_.bits != 0 && qc_.bits != 4) fail(SPARK_ERR_UNSUPPORTED, "'%s' is %d-bit; spark runs 4-bit pack-quantized weights", m.c_str(), qc_.bits);
    if (k % 8 || n % 8) fail(SPARK_ERR_SHAPE_MISMATCH, "pack-quantized weight '%s': [%lld, %lld] is not a multiple of 8", m.c_str(), (long long) n, (long long) k);
    const TensorInfo & wp = src_.get(m + ".weight_packed");
    expect_shape(wp, {n, k / 8}, "pack-quantized weight_packed [out, in/8]");
    const TensorInfo & sc = src_.get(m + ".weight_scale");
    expect_dtype(sc, {DType::F16, DType::BF16}, "pack-quantized scales");
    if (sc.shape.size() != 2 || sc.shape[0] != n || sc.shape[1] < 1 || k % sc.shape[1])
        fail(SPARK_ERR_SHAPE_MISMATCH, "pack-quantized scales '%s' has shape %s, expected [%lld, groups]", sc.name.c_str(), sc.shape_str().c_str(), (long long) n);
    const int64_t      groups = sc.shape[1];
    const TensorInfo * zp     = src_.find(m + ".weight_zero_point");
    if (zp) {
        expect_dtype(*zp, {DType::I32}, "pack-quantized zero points");
        expect_shape(*zp, {n / 8, groups}, "pack-quantized zero points [out/8, groups]");
    }
    QWeight w;
    w.format      = WeightFormat::INT4;
    w.n           = n;
    w.k           = k;
    w.group_size  = int32_t(k / groups);
    w.n_groups    = int32_t(groups);
    w.zero_offset = 0;
    w.scale_type  = sc.dtype == DType::F16 ? ScaleType::F16 : ScaleType::BF16;
    auto * qweight = static_cast<int32_t *>(store_.alloc(size_t(k / 8 * n) * 4));
    auto * scales  = static_cast<uint16_t *>(store_.alloc(size_t(groups * n) * 2));
    ct_weight_packed_to_gptq(static_cast<const int32_t *>(aligned(wp, 4)), n, k, qweight);
    transpose_u16(static_cast<const uint16_t *>(aligned(sc, 2)), n, groups, scales);
    if (zp) {
        auto * qzeros = static_cast<int32_t *>(store_.alloc(size_t(groups * n / 8) * 4));
        ct_zero_point_to_gptq(static_cast<const int32_t *>(aligned(*zp, 4)), n, groups, qzeros);
        w.zeros = qzeros;
    }
    w.data   = qweight;
    w.scales = scales;
    return w;
}

QWeight WeightResolver::fp8(const std::string & m, const TensorInfo & wt, const TensorInfo & sc, int64_t n, int64_t k) {
    expect_shape(wt, {n, k}, "FP8 weight");
    expect_dtype(sc, {DType::F32, DType::BF16, DType::F16}, "FP8 scales");
    int64_t bn = 0, bk = 0;
    // Collapse size-1 dims: ModelOpt FP8_PB_WO writes [N/128, 1, K/128, 1].
    std::vector<int64_t> s;
    for (int64_t d : sc.shape)
        if (d != 1) s.push_back(d);
    if (sc.numel() == 1) {
        bn = n, bk = k;  // per tensor
    } else if (s.size() == 1 && s[0] == n && (sc.shape.size() == 1 || (sc.shape.size() == 2 && sc.shape[1] == 1))) {
        bn = 1, bk = k;  // per output channel
    } else if (sc.shape.size() == 2 || sc.shape.size() == 4) {
        const int64_t rows = sc.shape[0], cols = sc.shape.size() == 2 ? sc.shape[1] : sc.shape[2];
        bn = qc_.fp8_block_n, bk = qc_.fp8_block_k;
        if (bn == 0) {  // no block size in the config: only the universal 128 x 128 can be assumed
            bn = bk = 128;
        }
        if (ceil_div(n, bn) != rows || ceil_div(k, bk) != cols)
            fail(SPARK_ERR_SHAPE_MISMATCH, "FP8 scales '%s' has shape %s, expected [%lld, %lld] for blocks of %lldx%lld over [%lld, %lld]",
                 sc.name.c_str(), sc.shape_str().c_str(), (long long) ceil_div(n, bn), (long long) ceil_div(k, bk), (long long) bn,
                 (long long) bk, (long long) n, (long long) k);
    } else {
        fail(SPARK_ERR_SHAPE_MISMATCH, "FP8 scales '%s' has an unrecognised shape %s for weight [%lld, %lld]", sc.name.c_str(),
             sc.shape_str().c_str(), (long long) n, (long long) k);
    }
    const int64_t cells  = ceil_div(n, bn) * ceil_div(k, bk);
    auto *        scales = static_cast<float *>(store_.alloc(size_t(cells) * 4));
    for (int64_t i = 0; i < cells; ++i) {
        scales[i] = to_f32(sc, i);
        if (!std::isfinite(scales[i])) fail(SPARK_ERR_INVALID_FORMAT, "FP8 scales '%s' contain a non-finite value", sc.name.c_str());
    }
    QWeight w;
    w.format  = WeightFormat::FP8;
    w.n       = n;
    w.k       = k;
    w.data    = wt.data;
    w.scales  = scales;
    w.block_n = int32_t(bn);
    w.block_k = int32_t(bk);
    return w;
}

}  // namespace spark
