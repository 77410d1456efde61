#include "runtime/shard.h"

#include "common/error.h"

namespace spark {

const char * split_mode_name(SplitMode m) {
    switch (m) {
        case SplitMode::None: return "none";
        case SplitMode::Tensor: return "tensor";
        case SplitMode::Expert: return "expert";
    }
    return "?";
}

Range Shard::units(int64_t n, const char * what) const {
    if (size <= 1) return {0, n};
    if (n >= size && n % size == 0) return {rank * (n / size), (rank + 1) * (n / size)};
    if (n > 0 && n < size && size % n == 0) {
        const int64_t u = int64_t(rank) * n / size;
        return {u, u + 1};
    }
    fail(SPARK_ERR_UNSUPPORTED, "cannot split the model over %d ranks: its %s (%lld) are not a multiple of %d nor a divisor of it", size, what,
         (long long) n, size);
}

Range Shard::experts(int64_t n_expert) const {
    if (mode != SplitMode::Expert || size <= 1) return {0, n_expert};
    if (n_expert % size != 0)
        fail(SPARK_ERR_UNSUPPORTED, "cannot split the model's %lld routed experts over %d ranks: not a multiple", (long long) n_expert, size);
    return {rank * (n_expert / size), (rank + 1) * (n_expert / size)};
}

HParams shard_hparams(const HParams & full, const Shard & s) {
    HParams hp = full;
    if (!s.split()) return hp;
    // Every rank computes whole query heads, whole MLP columns: these must divide.
    auto divided = [&](int64_t n, const char * what) {
        if (n % s.size != 0)
            fail(SPARK_ERR_UNSUPPORTED, "cannot split the model over %d ranks: its %s (%lld) are not a multiple of %d", s.size, what, (long long) n, s.size);
        return n / s.size;
    };
    hp.n_head    = divided(full.n_head, "attention heads");
    hp.n_head_kv = s.units(full.n_head_kv, "key-value heads").size();  // replicas where fewer than ranks
    if (full.n_ff > 0) hp.n_ff = divided(full.n_ff, "MLP columns (intermediate_size)");
    if (full.n_ff_shexp > 0) hp.n_ff_shexp = divided(full.n_ff_shexp, "shared expert columns");
    if (full.n_expert > 0) {
        if (s.mode == SplitMode::Expert) (void) s.experts(full.n_expert);
        else hp.n_ff_expert = divided(full.n_ff_expert, "expert columns (moe_intermediate_size)");
    }
    if (full.ssm_n_v_heads > 0) {
        hp.ssm_n_k_heads = s.units(full.ssm_n_k_heads, "linear-attention key heads").size();
        hp.ssm_n_v_heads = s.units(full.ssm_n_v_heads, "linear-attention value heads").size();
    }
    return hp;
}

}  // namespace spark
