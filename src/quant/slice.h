// A part of a canonical weight (quant/qweight.h) for tensor parallelism (docs/DISTRIBUTED.md):
// rows [n0, n1) of a column-parallel projection (q, k, v, gate, up) or columns [k0, k1) of a
// row-parallel one (o, down), in the same canonical layout, its bytes copied into `owner` (which
// must outlive the result). What it dequantizes to is bit for bit that part of the whole weight:
// nothing is re-quantized. FP8 cut inside a scale block gets smaller blocks (copied scales). Where
// the layout cannot be cut there (an NVFP4 / INT4 packing unit across the cut) it throws
// SPARK_ERR_UNSUPPORTED saying why. INT4 columns cut inside
// a group keep their groups through an explicit g_idx, which every kernel reads (act-order).
#pragma once

#include "quant/qweight.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace spark {

using SliceOwner = std::vector<std::vector<uint8_t>>;

QWeight slice_rows(const QWeight & w, int64_t n0, int64_t n1, SliceOwner & owner);
// Several ranges of rows, concatenated in order (a Gated DeltaNet rank's parts of each key head's
// [q | k | v | z] rows).
using RowRange = std::pair<int64_t, int64_t>;
QWeight slice_rows(const QWeight & w, const std::vector<RowRange> & ranges, SliceOwner & owner);
QWeight slice_cols(const QWeight & w, int64_t k0, int64_t k1, SliceOwner & owner);

}  // namespace spark
