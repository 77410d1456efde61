// One rank's part of a model split over a group of ranks (docs/DISTRIBUTED.md). A rank's model is
// the same architecture with smaller hyper-parameters (shard_hparams): its KV cache, graph shapes
// and kernel plans follow from them. Column-parallel weights (q / k / v, gate / up) keep the rank's
// rows, row-parallel ones (o, down, out_proj) its columns, and one all-reduce per block sums the
// ranks' partial outputs.
#pragma once

#include "runtime/hparams.h"

#include <cstdint>
#include <utility>

namespace spark {

class Communicator;

enum class SplitMode : uint8_t {
    None,
    Tensor,  // heads and MLP / expert widths split over the ranks
    Expert,  // attention and dense MLPs as Tensor; routed experts whole, a range of them per rank
};

const char * split_mode_name(SplitMode m);

// [begin, end) of a dimension.
struct Range {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
    bool    operator==(const Range &) const = default;
};

struct Shard {
    int            rank = 0, size = 1;
    SplitMode      mode = SplitMode::None;
    Communicator * comm = nullptr;  // this rank's communicator (owned by the group)
    HParams        full;            // the whole model's hyper-parameters

    bool split() const { return size > 1; }
    // The units (heads, channels) of `n` equal ones this rank keeps: n / size of them; where
    // n < size (a model's 2 KV heads over 4 ranks) each rank keeps a replica of unit
    // rank * n / size. Throws SPARK_ERR_UNSUPPORTED naming `what` when neither divides.
    Range units(int64_t n, const char * what) const;
    // Whether this rank holds a replica of its unit that another rank also holds and is not the
    // first holder (its output must not be counted twice in a row-parallel sum).
    bool  duplicate_unit(int64_t n) const { return n < size && rank % (size / n) != 0; }
    // The routed experts this rank holds: all of them (Tensor), a contiguous range (Expert).
    Range experts(int64_t n_expert) const;
    // A row-parallel projection's input columns: the part of n_units * width columns this rank's
    // units cover.
    Range columns(int64_t n_units, int64_t width, const char * what) const {
        const Range u = units(n_units, what);
        return {u.begin * width, u.end * width};
    }
};

// The rank's hyper-parameters: head counts, MLP and expert widths, linear-attention heads divided
// as Shard::units divides them. Throws SPARK_ERR_UNSUPPORTED naming the field that cannot be split
// (the rank count must divide it, or it must divide the rank count where replicas are allowed).
HParams shard_hparams(const HParams & full, const Shard & shard);

}  // namespace spark
