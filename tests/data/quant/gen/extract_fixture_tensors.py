#!/usr/bin/env python3
"""Copy a few layer-0 tensors of the tiny Qwen3 fixture checkpoints into one small blob for test-quant.

Usage: extract_fixture_tensors.py [FIXTURES_MODELS_DIR] [OUT_DIR]
  defaults: /work/shared/fixtures/models  and the directory above this script.

Writes fixture_tensors.bin (raw little-endian tensor bytes, concatenated, each 64-byte aligned) and
fixture_tensors.txt (one line per tensor: "<model>/<tensor> <dtype> <offset> <nbytes> <dim0> [<dim1>...]").
Standard library only: the safetensors header is JSON after an 8-byte little-endian length.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/fixtures/models"
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(HERE)

L0 = "model.layers.0."
K = L0 + "self_attn.k_proj."   # [128, 128]: one INT4 group, one FP8 block
D = L0 + "mlp.down_proj."      # [128, 256]: two INT4 groups, FP8 blocks [1, 2]
WANTED = {
    "qwen3-bf16": [K + "weight", D + "weight"],
    "qwen3-nvfp4-modelopt": [K + s for s in ("weight", "weight_scale", "weight_scale_2")],
    "qwen3-nvfp4-ct": [K + s for s in ("weight_packed", "weight_scale", "weight_global_scale")],
    "qwen3-int4-autoround": [p + s for p in (K, D) for s in ("qweight", "qzeros", "scales", "g_idx")],
    "qwen3-int4-autoround-asym": [p + s for p in (K, D) for s in ("qweight", "qzeros", "scales", "g_idx")],
    "qwen3-fp8-block": [p + s for p in (K, D) for s in ("weight", "weight_scale_inv")],
    "qwen3-fp8-ct-channel": [K + s for s in ("weight", "weight_scale")],
}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def main():
    data = bytearray()
    lines = []
    for model, names in WANTED.items():
        header, body = read_safetensors(os.path.join(SRC, model, "model.safetensors"))
        for name in names:
            t = header[name]
            begin, end = t["data_offsets"]
            data += b"\0" * (-len(data) % 64)
            shape = t["shape"] or [1]  # 0-rank scalars as [1]
            lines.append(f"{model}/{name} {t['dtype']} {len(data)} {end - begin} " + " ".join(map(str, shape)))
            data += body[begin:end]
    with open(os.path.join(OUT, "fixture_tensors.bin"), "wb") as f:
        f.write(data)
    with open(os.path.join(OUT, "fixture_tensors.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} tensors, {len(data)} bytes")


if __name__ == "__main__":
    main()
