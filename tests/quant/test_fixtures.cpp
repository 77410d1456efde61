// Real checkpoint tensors (tests/data/quant, copied from ../shared/fixtures): the quantized fixtures
// were made from the bf16 fixture weights, so decoding them must land within each format's rounding
// error of the bf16 values, and spark's quantizers must reproduce them.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "quant/dequant.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "quant_reference.h"

using namespace spark;
using namespace spark::test;

namespace {

struct Tensor {
    std::string          dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;  // owned copy, aligned by std::vector's allocator

    template <typename T> const T * as() const { return reinterpret_cast<const T *>(bytes.data()); }
    int64_t dim(int i) const { return shape[size_t(i)]; }
};

const std::map<std::string, Tensor> & fixtures() {
    static const std::map<std::string, Tensor> all = [] {
        std::map<std::string, Tensor> m;
        const std::string             dir = std::string(SPARK_TEST_DATA) + "/quant/";
        std::ifstream                 manifest(dir + "fixture_tensors.txt");
        std::ifstream                 blob(dir + "fixture_tensors.bin", std::ios::binary);
        REQUIRE(manifest.good());
        REQUIRE(blob.good());
        const std::string data((std::istreambuf_iterator<char>(blob)), std::istreambuf_iterator<char>());
        std::string line;
        while (std::getline(manifest, line)) {
            std::istringstream in(line);
            std::string        name;
            Tensor             t;
            size_t             offset = 0, size = 0;
            in >> name >> t.dtype >> offset >> size;
            for (int64_t d; in >> d;) t.shape.push_back(d);
            REQUIRE(offset + size <= data.size());
            t.bytes.assign(data.begin() + std::ptrdiff_t(offset), data.begin() + std::ptrdiff_t(offset + size));
            m.emplace(name, std::move(t));
        }
        return m;
    }();
    return all;
}

const Tensor & tensor(const std::string & name) {
    const auto it = fixtures().find(name);
    REQUIRE_MESSAGE(it != fixtures().end(), name);
    return it->second;
}

const std::string kProj    = "model.layers.0.self_attn.k_proj.";
const std::string downProj = "model.layers.0.mlp.down_proj.";

std::vector<float> bf16_weight(const std::string & proj) {
    const Tensor &     t = tensor("qwen3-bf16/" + proj + "weight");
    std::vector<float> w(size_t(t.dim(0) * t.dim(1)));
    for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(t.as<uint16_t>()[i]);
    return w;
}

std::vector<float> dequant(const QWeight & q) {
    std::vector<float> out(size_t(q.n * q.k));
    dequantize_rows(q, 0, q.n, out.data());
    return out;
}

QWeight nvfp4_weight(const Tensor & packed, const Tensor & scales, float global) {
    QWeight w;
    w.format       = WeightFormat::NVFP4;
    w.n            = packed.dim(0);
    w.k            = packed.dim(1) * 2;
    w.data         = packed.bytes.data();
    w.scales       = scales.bytes.data();
    w.global_scale = global;
    return w;
}

// Elements farther from the bf16 original than S_blk = f32(block_scale) * global: no more than the
// widest E2M1 half-gap (1) plus saturation after a block scale rounded down by up to 2^-4 (0.375).
int64_t nvfp4_out_of_bound(const QWeight & q, const std::vector<float> & ref) {
    const std::vector<float> deq = dequant(q);
    int64_t                  bad = 0;
    for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k = 0; k < q.k; ++k) {
            const float s = e4m3_to_f32(static_cast<const uint8_t *>(q.scales)[n * (q.k / 16) + k / 16]) * q.global_scale;
            if (std::fabs(deq[size_t(n * q.k + k)] - ref[size_t(n * q.k + k)]) > s) ++bad;
        }
    return bad;
}

QWeight int4_weight(const std::string & model, const std::string & proj, bool with_g_idx) {
    const Tensor & qweight = tensor(model + "/" + proj + "qweight");
    const Tensor & qzeros  = tensor(model + "/" + proj + "qzeros");
    const Tensor & scales  = tensor(model + "/" + proj + "scales");
    QWeight        w;
    w.format      = WeightFormat::INT4;
    w.k           = qweight.dim(0) * 8;
    w.n           = qweight.dim(1);
    w.data        = qweight.bytes.data();
    w.scales      = scales.bytes.data();
    w.zeros       = qzeros.bytes.data();
    w.g_idx       = with_g_idx ? tensor(model + "/" + proj + "g_idx").as<int32_t>() : nullptr;
    w.group_size  = 128;  // config.json: group_size 128
    w.n_groups    = int32_t(scales.dim(0));
    w.zero_offset = 1;  // packing_format auto_round:auto_gptq stores z - 1
    w.scale_type  = ScaleType::F16;
    return w;
}

// Elements farther from the original than half a quantization step, plus the f16 rounding of the
// scale over up to 16 steps at the range ends.
int64_t int4_out_of_bound(const QWeight & q, const std::vector<float> & ref) {
    const std::vector<float> deq = dequant(q);
    int64_t                  bad = 0;
    for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k = 0; k < q.k; ++k) {
            const float s = f16_to_f32(static_cast<const uint16_t *>(q.scales)[(k / q.group_size) * q.n + n]);
            if (std::fabs(deq[size_t(n * q.k + k)] - ref[size_t(n * q.k + k)]) > (0.5f + 16 * std::ldexp(1.0f, -11)) * s)
                ++bad;
        }
    return bad;
}

QWeight fp8_weight(const Tensor & weight, const Tensor & scale, int32_t block_n, int32_t block_k) {
    QWeight w;
    w.format  = WeightFormat::FP8;
    w.n       = weight.dim(0);
    w.k       = weight.dim(1);
    w.data    = weight.bytes.data();
    w.scales  = scale.bytes.data();
    w.block_n = block_n;
    w.block_k = block_k;
    return w;
}

// Half an E4M3 step (2^-4 relative; 2^-10 * scale among subnormals), with room for the f32 roundings.
int64_t fp8_out_of_bound(const QWeight & q, const std::vector<float> & ref) {
    const std::vector<float> deq      = dequant(q);
    const int64_t            k_blocks = (q.k + q.block_k - 1) / q.block_k;
    int64_t                  bad      = 0;
    for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k = 0; k < q.k; ++k) {
            const float s = static_cast<const float *>(q.scales)[(n / q.block_n) * k_blocks + k / q.block_k];
            const float x = ref[size_t(n * q.k + k)];
            if (std::fabs(deq[size_t(n * q.k + k)] - x) > std::max(std::fabs(x) * 0.0626f, std::ldexp(s, -10) * 1.001f))
                ++bad;
        }
    return bad;
}

}  // namespace

TEST_CASE("fixture NVFP4 (ModelOpt) decodes to within NVFP4 rounding of the bf16 weights") {
    const std::string  m   = "qwen3-nvfp4-modelopt/" + kProj;
    const Tensor &     p   = tensor(m + "weight");
    const Tensor &     s   = tensor(m + "weight_scale");
    const float        g   = tensor(m + "weight_scale_2").as<float>()[0];
    const std::vector<float> ref = bf16_weight(kProj);
    const QWeight      q   = nvfp4_weight(p, s, g);
    CHECK(nvfp4_out_of_bound(q, ref) == 0);
    CHECK(relative_error(ref.data(), q) < 0.15);

    // The nibble order matters: decoding with the nibbles of each byte swapped is far off.
    Tensor swapped = p;
    for (auto & b : swapped.bytes) b = uint8_t((b >> 4) | (b << 4));
    CHECK(nvfp4_out_of_bound(nvfp4_weight(swapped, s, g), ref) > q.n * q.k / 4);
}

TEST_CASE("fixture NVFP4: compressed-tensors divisor and ModelOpt multiplier give the same weights") {
    const std::string mo = "qwen3-nvfp4-modelopt/" + kProj, ct = "qwen3-nvfp4-ct/" + kProj;
    const float       weight_scale_2      = tensor(mo + "weight_scale_2").as<float>()[0];
    const float       weight_global_scale = tensor(ct + "weight_global_scale").as<float>()[0];
    // Same producer arithmetic on both sides: amax / 2688 (ModelOpt) and 2688 / amax (CT).
    CHECK(1.0f / weight_global_scale == weight_scale_2);
    const QWeight ct_q = nvfp4_weight(tensor(ct + "weight_packed"), tensor(ct + "weight_scale"), 1.0f / weight_global_scale);
    const QWeight mo_q = nvfp4_weight(tensor(mo + "weight"), tensor(mo + "weight_scale"), weight_scale_2);
    CHECK(dequant(ct_q) == dequant(mo_q));
    CHECK(nvfp4_out_of_bound(ct_q, bf16_weight(kProj)) == 0);
    // CT's own order, f32(scale) / weight_global_scale, differs from the multiplier form by at most
    // the rounding of the reciprocal.
    const std::vector<float> deq = dequant(ct_q);
    for (int64_t n = 0; n < ct_q.n; ++n)
        for (int64_t k = 0; k < ct_q.k; ++k) {
            const uint8_t b    = static_cast<const uint8_t *>(ct_q.data)[n * (ct_q.k / 2) + k / 2];
            const uint8_t code = k % 2 ? b >> 4 : b & 0xF;
            const float   sc   = e4m3_to_f32(static_cast<const uint8_t *>(ct_q.scales)[n * (ct_q.k / 16) + k / 16]);
            const float   want = e2m1_to_f32(code) * (sc / weight_global_scale);
            CHECK(std::fabs(deq[size_t(n * ct_q.k + k)] - want) <= std::fabs(want) * 3 * std::ldexp(1.0f, -24));
        }
}

TEST_CASE("fixture NVFP4: quantize_nvfp4 reproduces the ModelOpt checkpoint") {
    const std::string        m = "qwen3-nvfp4-modelopt/" + kProj;
    const std::vector<float> w = bf16_weight(kProj);
    const QuantizedWeight    q = quantize_nvfp4(w.data(), 128, 128);
    const float              g = tensor(m + "weight_scale_2").as<float>()[0];
    CHECK(q.weight.global_scale == g);
    // Block scales agree except where amax_blk / (6 * global) is exactly halfway between two E4M3
    // values in float32: ModelOpt (float32, RNE) rounds those to the even code; this fixture's
    // generator evaluated the quotient in float64, which lands just below the tie. Codes agree
    // wherever the block scales do.
    const uint8_t * fixture_scales = tensor(m + "weight_scale").as<uint8_t>();
    const uint8_t * fixture_codes  = tensor(m + "weight").as<uint8_t>();
    int64_t         ties = 0, other_scale_diff = 0, code_diff = 0;
    for (int64_t n = 0; n < 128; ++n)
        for (int64_t b = 0; b < 8; ++b) {
            const int64_t i = n * 8 + b;
            if (q.scales[size_t(i)] != fixture_scales[i]) {
                float amax = 0;
                for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(w[size_t(n * 128 + b * 16 + j)]));
                const float   quotient = amax / (6.0f * g);
                const uint8_t c        = f32_to_e4m3(quotient);
                const bool    is_tie   = quotient == (e4m3_to_f32(c) + e4m3_to_f32(uint8_t(c - 1))) / 2 ||
                                    quotient == (e4m3_to_f32(c) + e4m3_to_f32(uint8_t(c + 1))) / 2;
                (is_tie ? ties : other_scale_diff)++;
                continue;
            }
            for (int j = 0; j < 8; ++j)
                if (q.data[size_t(n * 64 + b * 8 + j)] != fixture_codes[n * 64 + b * 8 + j]) ++code_diff;
        }
    CHECK(other_scale_diff == 0);
    CHECK(code_diff == 0);
    CHECK(ties < 32);  // a handful of the 1024 blocks (bf16 amaxes make exact ties common enough)
}

TEST_CASE("fixture INT4 AutoRound (auto_round:auto_gptq, v1 zeros) decodes to within half a step") {
    for (const std::string model : {"qwen3-int4-autoround", "qwen3-int4-autoround-asym"})
        for (const std::string & proj : {kProj, downProj}) {
            CAPTURE(model);
            CAPTURE(proj);
            const std::vector<float> ref = bf16_weight(proj);
            const QWeight            q   = int4_weight(model, proj, true);
            CHECK(q.n_groups == q.k / 128);
            CHECK(int4_out_of_bound(q, ref) == 0);
            CHECK(relative_error(ref.data(), q) < 0.15);
            // The stored g_idx is the trivial k / 128: the same weights as without it.
            CHECK(dequant(q) == dequant(int4_weight(model, proj, false)));
            // Without the v1 offset every weight is one step off.
            QWeight v2_misread     = q;
            v2_misread.zero_offset = 0;
            CHECK(int4_out_of_bound(v2_misread, ref) > q.n * q.k / 2);
        }
}

TEST_CASE("fixture INT4: quantize_int4 reproduces the AutoRound checkpoints bit for bit") {
    struct Case {
        std::string model;
        Int4Scheme  scheme;
    };
    for (const Case & c : {Case{"qwen3-int4-autoround", Int4Scheme::SymmetricGptq},
                           Case{"qwen3-int4-autoround-asym", Int4Scheme::Asymmetric}})
        for (const std::string & proj : {kProj, downProj}) {
            CAPTURE(c.model);
            CAPTURE(proj);
            const std::vector<float> w       = bf16_weight(proj);
            const Tensor &           qweight = tensor(c.model + "/" + proj + "qweight");
            const Tensor &           qzeros  = tensor(c.model + "/" + proj + "qzeros");
            const Tensor &           scales  = tensor(c.model + "/" + proj + "scales");
            const int64_t            n = qweight.dim(1), k = qweight.dim(0) * 8;
            const QuantizedWeight    q = quantize_int4(w.data(), n, k, {128, c.scheme, ScaleType::F16});
            CHECK(q.data == qweight.bytes);
            CHECK(q.scales == scales.bytes);
            // Fixture zeros are stored z - 1 (auto_round:auto_gptq); spark's are z (or implicit 8).
            int64_t wrong_zero = 0;
            for (int64_t g = 0; g < q.weight.n_groups; ++g)
                for (int64_t col = 0; col < n; ++col) {
                    const uint32_t stored = int4_get(qzeros.as<uint32_t>()[g * (n / 8) + col / 8], int(col % 8));
                    const uint32_t ours   = q.weight.zeros ? int4_get(reinterpret_cast<const uint32_t *>(
                                                                        q.zeros.data())[g * (n / 8) + col / 8],
                                                                    int(col % 8))
                                                           : 8u;
                    if (stored + 1 != ours) ++wrong_zero;
                }
            CHECK(wrong_zero == 0);
        }
}

TEST_CASE("fixture FP8 block (weight_scale_inv) and channel (compressed-tensors) decode and reproduce") {
    struct Case {
        std::string model, proj, scale_name;
        bool        per_channel;
    };
    for (const Case & c : {Case{"qwen3-fp8-block", kProj, "weight_scale_inv", false},
                           Case{"qwen3-fp8-block", downProj, "weight_scale_inv", false},
                           Case{"qwen3-fp8-ct-channel", kProj, "weight_scale", true}}) {
        CAPTURE(c.model);
        CAPTURE(c.proj);
        const Tensor &           weight = tensor(c.model + "/" + c.proj + "weight");
        const Tensor &           scale  = tensor(c.model + "/" + c.proj + c.scale_name);
        const std::vector<float> ref    = bf16_weight(c.proj);
        const int64_t            n = weight.dim(0), k = weight.dim(1);
        const int32_t            bn = c.per_channel ? 1 : 128, bk = c.per_channel ? int32_t(k) : 128;
        // weight_scale_inv [ceil(N/128)][ceil(K/128)] multiplies (DeepSeek-V3 kernel.py); the
        // channel scale [N][1] is the same thing with (1, K) blocks.
        CHECK(scale.dim(0) == (n + bn - 1) / bn);
        CHECK(scale.dim(1) == (k + bk - 1) / bk);
        const QWeight q = fp8_weight(weight, scale, bn, bk);
        CHECK(fp8_out_of_bound(q, ref) == 0);
        CHECK(relative_error(ref.data(), q) < 0.05);
        const QuantizedWeight ours = quantize_fp8(ref.data(), n, k, bn, bk);
        CHECK(ours.data == weight.bytes);
        CHECK(ours.scales == scale.bytes);
    }
}
