#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers (tests/fuzz/corpus/<name>/ for fuzz_<name>) from the test data.

    python3 tests/fuzz/make_corpus.py BUILD_DIR     (BUILD_DIR holds tools/convert/spark-convert)

The test data is too large to seed fuzzers with (a fixture checkpoint is ~1 MB, the Qwen3
tokenizer 11 MB), so the seeds are small derivatives that keep their structure: checkpoints shrunk
4x in every width (same tensor names, dtypes and layer kinds, random weights), converted into
spark files by spark-convert in each format; the demo tokenizer cut to its first 320 ids, with the
variants of tests/data/tokenizers/variant_golden.jsonl applied; the fixtures' config.json files.
Deterministic: running it again gives the same files. Only the Python standard library.
"""
import copy
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "BOOL": 1, "F64": 8, "I16": 2}


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_bytes(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] in file order."""
    header, offset, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def random_bytes(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def bf16_weights(rng, count, scale=0.05):
    """bf16 values ~ uniform(-scale, scale): the top halves of float32s."""
    out = bytearray()
    for _ in range(count):
        out += struct.pack("<f", rng.uniform(-scale, scale))[2:4]
    return bytes(out)


# ---- checkpoints ---------------------------------------------------------------------------------

SHRINK = 4  # widths of 64 and more (hidden, heads x head_dim, vocab, ...) are divided by this
EXPERTS = 4  # of the fixtures' 8
WIDTH_KEYS = ["hidden_size", "intermediate_size", "head_dim", "vocab_size", "moe_intermediate_size", "shared_expert_intermediate_size",
              "linear_key_head_dim", "linear_value_head_dim"]


def tiny_checkpoint(fixture, out_dir, rng):
    """The fixture's checkpoint with every width / SHRINK and EXPERTS experts: the same tensors,
    dtypes and layer kinds, small enough to seed a fuzzer."""
    src = os.path.join(DATA, "models", fixture)
    config = json.load(open(os.path.join(src, "config.json")))
    for key in WIDTH_KEYS:
        if config.get(key):
            config[key] //= SHRINK
    for key in ["num_experts", "num_local_experts"]:
        if key in config:
            config[key] = EXPERTS
    header = read_header(os.path.join(src, "model.safetensors"))
    tensors = []
    for name in sorted(k for k in header if k != "__metadata__"):
        if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) >= EXPERTS:
            continue
        t = header[name]
        shape = [d // SHRINK if d >= 64 else d for d in t["shape"]]
        if name.endswith("mlp.gate.weight"):  # the router: one row per expert
            shape[0] = EXPERTS
        count = 1
        for d in shape:
            count *= d
        norm = name.endswith("norm.weight")
        data = bf16_weights(rng, count, 1.0 if norm else 0.05)
        tensors.append((name, t["dtype"], shape, data))
    os.makedirs(out_dir, exist_ok=True)
    write(os.path.join(out_dir, "config.json"), json.dumps(config, indent=1))
    write(os.path.join(out_dir, "model.safetensors"), safetensors_bytes(tensors, {"format": "pt"}))
    return config


def model_file_corpus(convert, tokenizer_dir):
    rng = random.Random(1)
    out = os.path.join(OUT, "model_file")
    formats = {"bf16": [], "nvfp4": ["--quantize", "nvfp4"], "int4-g32": ["--quantize", "int4", "--group-size", "32"],
               "int4-asym": ["--quantize", "int4", "--group-size", "32", "--asym"], "fp8-block": ["--quantize", "fp8"],
               "fp8-channel": ["--quantize", "fp8", "--fp8-per-channel"]}
    with tempfile.TemporaryDirectory() as tmp:
        for fixture in ["qwen3-bf16", "qwen3_moe-bf16", "qwen3_next-bf16"]:
            ckpt = os.path.join(tmp, fixture)
            tiny_checkpoint(fixture, ckpt, rng)
            if fixture == "qwen3-bf16":  # one seed carries a tokenizer (shrunk with the vocabulary)
                for f in os.listdir(tokenizer_dir):
                    shutil.copy(os.path.join(tokenizer_dir, f), ckpt)
            arch = fixture.split("-")[0]
            for fmt, args in formats.items():
                if arch != "qwen3" and fmt == "int4-asym":
                    continue
                target = os.path.join(out, f"{arch}-{fmt}.spark")
                if os.path.exists(target):
                    os.remove(target)
                subprocess.run([convert, ckpt, "-o", target, "-q"] + args, check=True, stderr=subprocess.DEVNULL)


def safetensors_corpus():
    rng = random.Random(2)
    out = os.path.join(OUT, "safetensors")
    # One tensor of every dtype the reader knows, with metadata.
    tensors = []
    for dtype, size in DTYPE_SIZE.items():
        shape = [2, 3] if dtype != "BOOL" else [5]
        n = size
        for d in shape:
            n *= d
        tensors.append((f"t.{dtype.lower()}", dtype, shape, random_bytes(rng, n)))
    tensors.append(("scalar", "F32", [], random_bytes(rng, 4)))
    tensors.append(("empty", "BF16", [0, 4], b""))
    write(os.path.join(out, "dtypes.safetensors"), safetensors_bytes(tensors, {"format": "pt", "producer": "x"}))
    write(os.path.join(out, "empty.safetensors"), safetensors_bytes([]))
    # The header of a real checkpoint (shrunk): many tensors, real names.
    with tempfile.TemporaryDirectory() as tmp:
        tiny_checkpoint("qwen3-bf16", tmp, rng)
        small = open(os.path.join(tmp, "model.safetensors"), "rb").read()
    write(os.path.join(out, "qwen3-tiny.safetensors"), small)
    # Quantized layouts: the fixtures' headers with 1 byte per element (names, dtypes, packing).
    for fixture in ["qwen3-nvfp4-modelopt", "qwen3-int4-autoround", "qwen3-fp8-block"]:
        header = read_header(os.path.join(DATA, "models", fixture, "model.safetensors"))
        names = sorted(k for k in header if k != "__metadata__" and ".layers.1." not in k)[:24]
        tensors = []
        for name in names:
            t = header[name]
            shape = [max(1, d // 16) if d >= 16 else d for d in t["shape"]]
            n = DTYPE_SIZE[t["dtype"]]
            for d in shape:
                n *= d
            tensors.append((name, t["dtype"], shape, random_bytes(rng, n)))
        write(os.path.join(out, f"{fixture}.safetensors"), safetensors_bytes(tensors, header.get("__metadata__")))
    # Sharded: the index (up to a NUL) and the shard model-00001-of-00002.safetensors.
    shard = safetensors_bytes([("a", "F32", [2], random_bytes(rng, 8)), ("b", "I64", [1], random_bytes(rng, 8))])
    index = {"metadata": {"total_size": 16}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}
    write(os.path.join(out, "sharded.bin"), json.dumps(index).encode() + b"\0" + shard)
    index["weight_map"]["c"] = "model-00002-of-00002.safetensors"
    write(os.path.join(out, "sharded-missing-shard.bin"), json.dumps(index).encode() + b"\0" + shard)


def config_corpus():
    out = os.path.join(OUT, "config")
    for fixture in sorted(os.listdir(os.path.join(DATA, "models"))):
        path = os.path.join(DATA, "models", fixture, "config.json")
        if os.path.exists(path):
            shutil.copy(path, os.path.join(out, fixture + ".json"))
        hf = os.path.join(DATA, "models", fixture, "hf_quant_config.json")
        if os.path.exists(hf):
            shutil.copy(hf, os.path.join(out, fixture + ".hf_quant_config.json"))
    # Published shapes (as in tests/models/test_hostile_files.cpp): the largest widths spark runs.
    write(os.path.join(out, "qwen3-next-80b-a3b.json"), json.dumps({
        "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "num_nextn_predict_layers": 1, "eos_token_id": [151645, 151643], "bos_token_id": 151643}))
    write(os.path.join(out, "minimax-m2.json"), json.dumps({
        "model_type": "minimax_m2", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
        "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 196608, "rms_norm_eps": 1e-6,
        "rope_theta": 5000000, "rotary_dim": 64, "num_local_experts": 256, "num_experts_per_tok": 8, "scoring_func": "sigmoid",
        "use_qk_norm": True, "qk_norm_type": "per_layer", "shared_intermediate_size": 0, "attn_type_list": [1] * 62,
        "eos_token_id": 200020, "bos_token_id": 200034}))


# ---- tokenizers ----------------------------------------------------------------------------------

KEEP_IDS = 320  # the 256 byte symbols and the first merges


def tiny_tokenizer():
    t = json.load(open(os.path.join(DATA, "tokenizers", "demo", "tokenizer.json")))
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < KEEP_IDS}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    t["model"]["vocab"], t["model"]["merges"] = vocab, merges
    for i, tok in enumerate(t["added_tokens"]):
        tok["id"] = KEEP_IDS + i
    config = json.load(open(os.path.join(DATA, "tokenizers", "demo", "tokenizer_config.json")))
    generation = json.load(open(os.path.join(DATA, "tokenizers", "demo", "generation_config.json")))
    generation["bos_token_id"], generation["eos_token_id"] = KEEP_IDS, [KEEP_IDS + 2, KEEP_IDS]
    return t, config, generation


def json_patch(doc, patch):
    doc = copy.deepcopy(doc)
    for op in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(index, op["value"])
            elif op["op"] == "replace":
                parent[index] = op["value"]
            else:
                del parent[index]
        elif op["op"] == "remove":
            del parent[last]
        else:
            parent[last] = op["value"]
    return doc


def tokenizer_corpus():
    out = os.path.join(OUT, "tokenizer")
    t, config, generation = tiny_tokenizer()
    texts = ["Hello world, it's 2024!\n\tdef f(x): return x**2  # ok", "<|im_start|>user\nhi<|im_end|>", "caf\u00e9 \u4e2d\u6587 \U0001F642  "]

    def seed(name, tok, text, cfg=None, gen=None):
        parts = [json.dumps(tok, ensure_ascii=False), text]
        if cfg is not None or gen is not None:
            parts += [json.dumps(cfg) if cfg is not None else "", json.dumps(gen) if gen is not None else ""]
        write(os.path.join(out, name + ".bin"), "\0".join(parts).encode())

    seed("demo-tiny", t, texts[0], config, generation)
    seed("demo-tiny-special", t, texts[1], config, generation)
    seed("demo-tiny-unicode", t, texts[2])
    for line in open(os.path.join(DATA, "tokenizers", "variant_golden.jsonl")):
        v = json.loads(line)
        if v["variant"] == "string_merges":  # the patch lists the full merges of the demo vocabulary
            continue
        try:
            patched = json_patch(t, v["patch"])
        except (KeyError, IndexError):
            continue
        seed("variant-" + v["variant"], patched, v["cases"][0]["text"] if v["cases"] else texts[0])
    # Model options the demo does not use: unk, byte fallback, subword prefix / suffix.
    u = copy.deepcopy(t)
    u["model"].update({"unk_token": "a", "fuse_unk": True, "byte_fallback": True, "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"})
    u["pre_tokenizer"], u["decoder"] = {"type": "Digits", "individual_digits": False}, None
    seed("model-options", u, "abc 123 \u00e9")
    # The tiny tokenizer of tests/tokenizer/test_hostile_tokenizer.cpp.
    seed("tiny", {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3}, "merges": ["a b"]},
                  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, "decoder": {"type": "ByteLevel"},
                  "added_tokens": [{"id": 4, "content": "<s>", "special": True}]}, "ab ba <s> abab")
    return t, config, generation


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit(__doc__)
    convert = os.path.join(sys.argv[1], "tools", "convert", "spark-convert")
    for name in ["config", "safetensors", "tokenizer", "model_file"]:  # (corpus/jinja is not made here: kept)
        shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)
        os.makedirs(os.path.join(OUT, name))
    config_corpus()
    safetensors_corpus()
    t, config, generation = tokenizer_corpus()
    with tempfile.TemporaryDirectory() as tok_dir:
        # The tiny checkpoint's vocabulary is 128: its tokenizer keeps the ids below that.
        t = copy.deepcopy(t)
        t["model"]["vocab"] = {k: v for k, v in t["model"]["vocab"].items() if v < 120}
        t["model"]["merges"] = [m for m in t["model"]["merges"] if all(x in t["model"]["vocab"] for x in (m[0], m[1], m[0] + m[1]))]
        for i, tok in enumerate(t["added_tokens"]):
            tok["id"] = 120 + i
        generation["bos_token_id"], generation["eos_token_id"] = 120, [122, 120]
        write(os.path.join(tok_dir, "tokenizer.json"), json.dumps(t, ensure_ascii=False))
        write(os.path.join(tok_dir, "tokenizer_config.json"), json.dumps(config))
        write(os.path.join(tok_dir, "generation_config.json"), json.dumps(generation))
        model_file_corpus(convert, tok_dir)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"{OUT}: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
