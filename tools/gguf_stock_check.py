#!/usr/bin/env python3
"""Open a spark file with the stock `gguf` package (gguf-py, llama.cpp's GGUF library) and list it.

Proves that stock GGUF tooling reads spark files: prints every metadata key with its type and value,
then the tensor table as gguf-py sees it (ggml type, GGUF dims, bytes, offset) next to what spark
means by it (registered dtype and PyTorch shape, docs/FORMAT.md). Exits non-zero when gguf-py cannot
open the file or when the spark tables disagree with the tensor infos.

    python3 -m venv /tmp/ggufvenv && /tmp/ggufvenv/bin/pip install gguf numpy
    /tmp/ggufvenv/bin/python tools/gguf_stock_check.py model.spark [--all-tensors]
"""

import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType

# docs/FORMAT.md "dtype registry": spark id -> (name, bytes per element).
SPARK_DTYPES = {
    1: ("F32", 4), 2: ("F16", 2), 3: ("BF16", 2), 4: ("F64", 8), 5: ("I8", 1), 6: ("U8", 1),
    7: ("I16", 2), 8: ("U16", 2), 9: ("I32", 4), 10: ("U32", 4), 11: ("I64", 8), 12: ("U64", 8),
    13: ("BOOL", 1), 14: ("F8_E4M3", 1), 15: ("F8_E5M2", 1),
}
GGML_I8 = 24


def value_text(field, max_chars=72):
    types = field.types
    if not types:
        return "?"
    if types[0] == GGUFValueType.ARRAY:
        items = field.contents()
        shown = ", ".join(repr(x)[:24] for x in items[:8])
        more = f", ... ({len(items)} items)" if len(items) > 8 else ""
        return f"[{shown}{more}]"
    value = field.contents()
    if types[0] == GGUFValueType.STRING:
        text = repr(value)
        return text if len(text) <= max_chars else f"{text[:max_chars]}... ({len(value.encode())} bytes)"
    return repr(value)


def type_text(field):
    return "[" + "/".join(t.name for t in field.types[1:]) + "]" if field.types[0] == GGUFValueType.ARRAY else field.types[0].name


def spark_shapes(reader, n_tensors):
    """spark.tensor_shapes records [index, rank, dims...] -> {index: shape}."""
    field = reader.get_field("spark.tensor_shapes")
    shapes = {}
    if field is None:
        return shapes
    values = [int(v) for v in field.contents()]
    k = 0
    while k < len(values):
        index, rank = values[k], values[k + 1]
        if not 0 <= index < n_tensors:
            raise ValueError(f"spark.tensor_shapes: tensor index {index} out of range")
        shapes[index] = values[k + 2:k + 2 + rank]
        k += 2 + rank
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--all-tensors", action="store_true", help="list every tensor (default: the first 40)")
    args = ap.parse_args()

    reader = GGUFReader(args.path)  # raises on anything gguf-py cannot read
    print(f"gguf-py opened {args.path}: {len(reader.fields)} fields, {len(reader.tensors)} tensors, "
          f"alignment {reader.alignment}, data at {reader.data_offset}")
    print("\nmetadata:")
    for name, field in reader.fields.items():
        print(f"  {name:40s} {type_text(field):10s} {value_text(field)}")

    problems = []
    dtype_field = reader.get_field("spark.tensor_dtypes")
    dtype_ids = [int(v) for v in dtype_field.contents()] if dtype_field is not None else None
    if dtype_ids is not None and len(dtype_ids) != len(reader.tensors):
        problems.append(f"spark.tensor_dtypes has {len(dtype_ids)} entries for {len(reader.tensors)} tensors")
        dtype_ids = None
    shapes = spark_shapes(reader, len(reader.tensors)) if dtype_ids is not None else {}

    print(f"\ntensors ({len(reader.tensors)}):")
    print(f"  {'name':40s} {'ggml':5s} {'GGUF ne':18s} {'bytes':>10s} {'offset':>12s}  spark dtype / PyTorch shape")
    for i, t in enumerate(reader.tensors):
        ne = [int(d) for d in t.shape]
        spark = ""
        if dtype_ids is not None:
            name, size = SPARK_DTYPES.get(dtype_ids[i], (f"?{dtype_ids[i]}", 1))
            if i in shapes:
                shape = shapes[i]
            else:
                shape = list(reversed(ne))
                if int(t.tensor_type) == GGML_I8 and size > 1:
                    shape[-1] //= size
            numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if numel * size != t.n_bytes:
                problems.append(f"{t.name}: {name} {shape} is {numel * size} bytes, the tensor info says {t.n_bytes}")
            spark = f"{name} {shape}"
        if (t.data_offset % reader.alignment) != 0:
            problems.append(f"{t.name}: data at {t.data_offset} is not {reader.alignment}-byte aligned")
        if args.all_tensors or i < 40:
            print(f"  {t.name:40s} {t.tensor_type.name:5s} {str(ne):18s} {t.n_bytes:>10d} {t.data_offset:>12d}  {spark}")
    if not args.all_tensors and len(reader.tensors) > 40:
        print(f"  ... ({len(reader.tensors) - 40} more; --all-tensors lists them)")

    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("\nok" if not problems else f"\n{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
