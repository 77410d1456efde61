#include "converter.h"

#include "common/error.h"
#include "io/gguf_reader.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io/writer/gguf_writer.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "runtime/hparams.h"
#include "runtime/models/arch.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace spark::convert {

using json = nlohmann::json;
using io::TensorInfo;

namespace {

std::string read_optional(const std::string & path) { return io::file_exists(path) ? io::read_text_file(path) : std::string(); }

bool ends_with(const std::string & s, const std::string & suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files of a Hugging Face directory that the converter reads besides the tensors.
constexpr const char * kSideFiles[] = {"config.json",           "hf_quant_config.json",   "tokenizer.json",
                                       "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                                       "model.safetensors.index.json"};

// Refuses an output that is one of the input files, however it is spelled (relative, through
// "..", a symbolic or a hard link): same device and inode. Replacing it would destroy the
// checkpoint being converted (the output replaces its path only at the end, by rename).
void refuse_output_among_inputs(const std::string & output, const std::vector<std::string> & inputs) {
    struct stat out {};
    if (::stat(output.c_str(), &out) != 0) return;  // nothing there yet: it cannot be an input
    for (const std::string & in : inputs) {
        struct stat st {};
        if (::stat(in.c_str(), &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
            fail(SPARK_ERR_INVALID_ARGUMENT, "output '%s' is the input file '%s': converting onto it would destroy the checkpoint", output.c_str(),
                 in.c_str());
    }
}

// What one output tensor is made of.
struct Piece {
    const TensorInfo * source = nullptr;
    enum Role { Copy, Data, Scales, Zeros, GlobalScale } role = Copy;
};

class Converter {
public:
    explicit Converter(const Options & o) : opt_(o) {}

    Stats run() {
        if (!io::is_directory(opt_.input)) fail(SPARK_ERR_IO, "input '%s' is not a model directory", opt_.input.c_str());
        const std::string config_text = io::read_text_file(io::path_join(opt_.input, "config.json"));
        try {
            config_ = json::parse(config_text);
        } catch (const json::exception & e) {
            fail(SPARK_ERR_INVALID_FORMAT, "%s/config.json: %s", opt_.input.c_str(), e.what());
        }
        const HParams hp = parse_hparams(config_, io::path_join(opt_.input, "config.json"));
        src_             = io::SafetensorsSource::open_dir(opt_.input);
        std::vector<std::string> inputs = src_->file_paths();
        for (const char * side : kSideFiles) inputs.push_back(io::path_join(opt_.input, side));
        refuse_output_among_inputs(opt_.output, inputs);
        if (opt_.quantize != Quantize::None && config_.contains("quantization_config"))
            fail(SPARK_ERR_UNSUPPORTED, "--quantize needs a bf16/f16/f32 checkpoint; '%s' is already quantized (%s)", opt_.input.c_str(),
                 config_["quantization_config"].value("quant_method", "?").c_str());

        plan_tensors();
        if (opt_.quantize != Quantize::None) config_["quantization_config"] = quantization_config();

        io::GgufWriter w;
        const std::string arch = architecture_of(hp.arch).file_arch();  // llama.cpp's name (docs/FORMAT.md)
        w.set_string("general.architecture", arch);
        std::string name = opt_.input;
        while (!name.empty() && name.back() == '/') name.pop_back();
        w.set_string("general.name", name.substr(name.find_last_of('/') + 1));
        w.set_string("spark.hf_config_json", opt_.quantize == Quantize::None ? config_text : config_.dump(2));
        const std::string hf_quant = read_optional(io::path_join(opt_.input, "hf_quant_config.json"));
        if (!hf_quant.empty()) w.set_string("spark.hf_quant_config_json", hf_quant);
        if (config_.contains("quantization_config")) w.set_string("spark.quantization", provenance().dump());
        write_tokenizer(w);
        write_hparams(w, arch, hp);

        for (size_t i = 0; i < outputs_.size(); ++i) w.add_tensor(outputs_[i].name, outputs_[i].dtype, outputs_[i].shape, outputs_[i].nbytes);
        stats_.tensors_out = outputs_.size();
        uint64_t total_bytes = 0;
        for (const Out & o : outputs_) total_bytes += o.nbytes;
        if (opt_.progress_bytes) opt_.progress_bytes(0, total_bytes);
        w.write(opt_.output, [&](size_t index, const io::GgufWriter::Tensor & t, io::GgufWriter::Sink & sink) {
            if (opt_.cancel && opt_.cancel->load()) return false;
            write_piece(pieces_[index], t, sink);
            stats_.bytes_out += t.nbytes;
            if (opt_.progress) opt_.progress(index + 1, outputs_.size(), t.name);
            if (opt_.progress_bytes) opt_.progress_bytes(stats_.bytes_out, total_bytes);
            return true;
        }, opt_.overwrite);
        return stats_;
    }

private:
    // ---- which tensors are written, and how
    bool quantizable(const TensorInfo & t) const {
        if (opt_.quantize == Quantize::None || t.shape.size() != 2) return false;
        if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32) return false;
        const bool linear = ends_with(t.name, "_proj.weight") && (t.name.rfind("model.layers.", 0) == 0 || t.name.rfind("mtp.", 0) == 0);
        if (!linear && !(opt_.quantize_lm_head && t.name == "lm_head.weight")) return false;
        const int64_t n = t.shape[0], k = t.shape[1];
        switch (opt_.quantize) {
            case Quantize::NVFP4: return k % 16 == 0;
            case Quantize::INT4: return k % 8 == 0 && n % 8 == 0;
            default: return true;
        }
    }

    void add(std::string name, DType dtype, std::vector<int64_t> shape, const TensorInfo * src, Piece::Role role) {
        uint64_t bytes = dtype_size(dtype);
        for (int64_t d : shape) bytes *= uint64_t(d);
        outputs_.push_back({std::move(name), dtype, std::move(shape), bytes});
        pieces_.push_back({src, role});
    }

    void plan_tensors() {
        std::vector<const TensorInfo *> order;
        for (const TensorInfo & t : src_->tensors()) order.push_back(&t);
        std::sort(order.begin(), order.end(), [](const TensorInfo * a, const TensorInfo * b) { return a->name < b->name; });
        stats_.tensors_in = order.size();
        for (const TensorInfo * t : order) {
            if (!quantizable(*t)) {
                if (opt_.quantize != Quantize::None && ends_with(t->name, ".weight") && t->shape.size() == 2)
                    dense_modules_.push_back(t->name.substr(0, t->name.size() - 7));
                add(t->name, t->dtype, t->shape, t, Piece::Copy);
                continue;
            }
            ++stats_.quantized;
            const std::string m = t->name.substr(0, t->name.size() - 7);  // strip ".weight"
            const int64_t     n = t->shape[0], k = t->shape[1];
            switch (opt_.quantize) {
                case Quantize::NVFP4:  // ModelOpt's names
                    add(m + ".weight", DType::U8, {n, k / 2}, t, Piece::Data);
                    add(m + ".weight_scale", DType::F8_E4M3, {n, k / 16}, t, Piece::Scales);
                    add(m + ".weight_scale_2", DType::F32, {}, t, Piece::GlobalScale);
                    break;
                case Quantize::INT4: {  // AutoRound / GPTQ names, zeros stored as z ("auto_round")
                    const int64_t gs = opt_.group_size > 0 ? opt_.group_size : k;
                    const int64_t g  = (k + gs - 1) / gs;
                    add(m + ".qweight", DType::I32, {k / 8, n}, t, Piece::Data);
                    add(m + ".qzeros", DType::I32, {g, n / 8}, t, Piece::Zeros);
                    add(m + ".scales", DType::F16, {g, n}, t, Piece::Scales);
                    break;
                }
                case Quantize::FP8:
                    add(m + ".weight", DType::F8_E4M3, {n, k}, t, Piece::Data);
                    if (opt_.fp8_per_channel) add(m + ".weight_scale", DType::F32, {n, 1}, t, Piece::Scales);  // compressed-tensors
                    else add(m + ".weight_scale_inv", DType::F32, {(n + 127) / 128, (k + 127) / 128}, t, Piece::Scales);  // block FP8
                    break;
                case Quantize::None: break;
            }
        }
        stats_.kept_dense = dense_modules_.size();
    }

    json quantization_config() const {
        json producer = {{"name", "spark-convert"}, {"version", spark_version()}};
        switch (opt_.quantize) {
            case Quantize::NVFP4:
                return {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"kv_cache_quant_algo", nullptr},
                        {"exclude_modules", dense_modules_}, {"producer", producer}};
            case Quantize::INT4:
                return {{"quant_method", "auto-round"}, {"bits", 4}, {"group_size", opt_.group_size}, {"sym", !opt_.asymmetric},
                        {"data_type", "int"}, {"packing_format", "auto_round"}, {"producer", producer}};
            case Quantize::FP8:
                if (opt_.fp8_per_channel)
                    return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}, {"quantization_status", "compressed"},
                            {"config_groups", {{"group_0", {{"targets", {"Linear"}},
                                                            {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}}}}}}},
                            {"ignore", dense_modules_}, {"producer", producer}};
                return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}},
                        {"modules_to_not_convert", dense_modules_}, {"producer", producer}};
            case Quantize::None: break;
        }
        return nullptr;
    }

    json provenance() const {
        const json & q = config_["quantization_config"];
        json p = {{"quant_method", q.value("quant_method", "")}, {"quantization_config", q},
                  {"producer", {{"name", "spark-convert"}, {"version", spark_version()}}}};
        if (q.contains("packing_format")) p["packing_format"] = q["packing_format"];
        else if (q.contains("format")) p["packing_format"] = q["format"];
        return p;
    }

    void write_tokenizer(io::GgufWriter & w) const {
        const std::string tok = read_optional(io::path_join(opt_.input, "tokenizer.json"));
        if (tok.empty()) return;
        w.set_string("tokenizer.huggingface.json", tok);
        std::string tok_config = read_optional(io::path_join(opt_.input, "tokenizer_config.json"));
        std::string tmpl       = read_optional(io::path_join(opt_.input, "chat_template.jinja"));
        if (!tok_config.empty()) {
            try {
                json tc = json::parse(tok_config);
                if (tmpl.empty() && tc.contains("chat_template") && tc["chat_template"].is_string()) tmpl = tc["chat_template"].get<std::string>();
                if (!tmpl.empty() && !tc.contains("chat_template")) {  // keep the template with the config
                    tc["chat_template"] = tmpl;
                    tok_config          = tc.dump(2);
                }
            } catch (const json::exception & e) {
                fail(SPARK_ERR_INVALID_FORMAT, "%s/tokenizer_config.json: %s", opt_.input.c_str(), e.what());
            }
            w.set_string("spark.tokenizer_config_json", tok_config);
        }
        if (!tmpl.empty()) w.set_string("tokenizer.chat_template", tmpl);
        const std::string gen = read_optional(io::path_join(opt_.input, "generation_config.json"));
        if (!gen.empty()) w.set_string("spark.generation_config_json", gen);
    }

    static void write_hparams(io::GgufWriter & w, const std::string & a, const HParams & hp) {
        auto u32 = [&](const char * key, int64_t v) {
            if (v > 0) w.set_u32(a + "." + key, uint32_t(v));
        };
        u32("vocab_size", hp.n_vocab);
        u32("context_length", hp.n_ctx_train);
        u32("embedding_length", hp.n_embd);
        u32("block_count", hp.n_layer);
        u32("feed_forward_length", hp.n_ff);
        u32("attention.head_count", hp.n_head);
        u32("attention.head_count_kv", hp.n_head_kv);
        u32("attention.key_length", hp.head_dim);
        u32("attention.value_length", hp.head_dim);
        w.set_f32(a + ".attention.layer_norm_rms_epsilon", hp.rms_eps);
        w.set_f32(a + ".rope.freq_base", hp.rope_theta);
        u32("rope.dimension_count", hp.n_rot);
        u32("expert_count", hp.n_expert);
        u32("expert_used_count", hp.n_expert_used);
        u32("expert_feed_forward_length", hp.n_ff_expert);
        u32("expert_shared_feed_forward_length", hp.n_ff_shexp);
        architecture_of(hp.arch).file_hparams(hp, u32);  // its own keys
    }

    // ---- streaming the data
    void write_piece(const Piece & p, const io::GgufWriter::Tensor & t, io::GgufWriter::Sink & sink) {
        if (p.role == Piece::Copy) {
            sink.write(p.source->data, p.source->nbytes);
            return;
        }
        const QuantizedWeight & q = quantized(*p.source);
        const int64_t           n = p.source->shape[0];
        switch (p.role) {
            case Piece::Data: sink.write(q.data.data(), q.data.size()); break;
            case Piece::Scales:
                if (opt_.quantize == Quantize::FP8 && opt_.fp8_per_channel) SPARK_ASSERT(q.scales.size() == size_t(n) * 4);
                sink.write(q.scales.data(), q.scales.size());
                break;
            case Piece::Zeros:
                if (!q.zeros.empty()) {
                    sink.write(q.zeros.data(), q.zeros.size());
                } else {  // symmetric: every zero is 8, written explicitly as AutoRound does
                    std::vector<int32_t> eights(size_t(t.nbytes / 4), int32_t(0x88888888u));
                    sink.write(eights.data(), t.nbytes);
                }
                break;
            case Piece::GlobalScale: sink.write(&q.weight.global_scale, 4); break;
            case Piece::Copy: break;
        }
    }

    // The quantization of one source tensor, kept until the next source (its outputs are adjacent),
    // so memory stays at one tensor.
    const QuantizedWeight & quantized(const TensorInfo & src) {
        if (cached_source_ == &src) return *cached_;
        const int64_t n = src.shape[0], k = src.shape[1];
        std::vector<float> w(size_t(n * k));
        const WeightFormat f = src.dtype == DType::BF16 ? WeightFormat::BF16 : src.dtype == DType::F16 ? WeightFormat::F16 : WeightFormat::F32;
        if (reinterpret_cast<uintptr_t>(src.data) % dtype_size(src.dtype) == 0) {
            dense_to_f32(f, src.data, n * k, w.data());
        } else {
            std::vector<uint8_t> aligned(src.nbytes);
            std::memcpy(aligned.data(), src.data, src.nbytes);
            dense_to_f32(f, aligned.data(), n * k, w.data());
        }
        cached_.reset();
        switch (opt_.quantize) {
            case Quantize::NVFP4: cached_ = std::make_unique<QuantizedWeight>(quantize_nvfp4(w.data(), n, k)); break;
            case Quantize::INT4: {
                Int4QuantizeOptions o;
                o.group_size = opt_.group_size;
                o.scheme     = opt_.asymmetric ? Int4Scheme::Asymmetric : Int4Scheme::SymmetricGptq;
                cached_      = std::make_unique<QuantizedWeight>(quantize_int4(w.data(), n, k, o));
                break;
            }
            case Quantize::FP8:
                cached_ = std::make_unique<QuantizedWeight>(opt_.fp8_per_channel ? quantize_fp8(w.data(), n, k, 1, int32_t(k))
                                                                                 : quantize_fp8(w.data(), n, k, 128, 128));
                break;
            case Quantize::None: fail(SPARK_ERR_INTERNAL, "quantize without a format");
        }
        cached_source_ = &src;
        if (opt_.report) opt_.report(src.name, relative_error(w.data(), cached_->weight));
        return *cached_;
    }

    struct Out {
        std::string          name;
        DType                dtype;
        std::vector<int64_t> shape;
        uint64_t             nbytes;
    };

    const Options &                        opt_;
    json                                   config_;
    std::unique_ptr<io::SafetensorsSource> src_;
    std::vector<Out>                       outputs_;
    std::vector<Piece>                     pieces_;
    std::vector<std::string>               dense_modules_;
    Stats                                  stats_;
    const TensorInfo *                     cached_source_ = nullptr;
    std::unique_ptr<QuantizedWeight>       cached_;
};

}  // namespace

Stats convert(const Options & options) { return Converter(options).run(); }

void print_info(const std::string & path, FILE * out) {
    auto f = io::GgufFile::open(path);
    std::fprintf(out, "%s: GGUF v%u, %s, alignment %u, %zu metadata keys, %zu tensors\n", path.c_str(), f->version(),
                 f->is_spark() ? ("spark format " + std::to_string(f->spark_format_version())).c_str() : "not a spark file", f->alignment(),
                 f->metadata().size(), f->tensors().size());
    std::fprintf(out, "\nmetadata:\n");
    for (const auto & [key, value] : f->metadata()) {
        std::string v = value.to_display_string();
        if (v.size() > 96) v = v.substr(0, 93) + "... (" + std::to_string(v.size()) + " chars)";
        for (char & c : v)
            if (c == '\n') c = ' ';
        std::fprintf(out, "  %-48s %s\n", key.c_str(), v.c_str());
    }
    std::fprintf(out, "\ntensors:\n  %-64s %-8s %-20s %12s\n", "name", "dtype", "shape", "bytes");
    uint64_t total = 0;
    for (const TensorInfo & t : f->tensors()) {
        std::fprintf(out, "  %-64s %-8s %-20s %12zu\n", t.name.c_str(), dtype_name(t.dtype), t.shape_str().c_str(), t.nbytes);
        total += t.nbytes;
    }
    std::fprintf(out, "\n  %zu tensors, %.2f MiB of tensor data\n", f->tensors().size(), double(total) / 1048576.0);
}

}  // namespace spark::convert
