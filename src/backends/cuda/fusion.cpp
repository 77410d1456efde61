#include "backends/cuda/fusion.h"

#include <algorithm>

namespace spark::cuda {

FusionPass::FusionPass(const Graph & graph, const OpContext & ctx)
    : nodes_(graph.nodes()), ctx_(ctx), uses_(graph.tensors().size(), 0), pos_(graph.tensors().size(), -1),
      skip_(graph.tensors().size(), false) {
    for (const Tensor * n : nodes_)
        for (const Tensor * s : n->src)
            if (s) ++uses_[size_t(s->id)];
    for (size_t i = 0; i < nodes_.size(); ++i) pos_[size_t(nodes_[i]->id)] = int(i);
    // Mark the matmuls a fused SWIGLU computes itself.
    for (const Tensor * n : nodes_)
        if (n->op == Op::SWIGLU && fusable_swiglu(*n)) skip_[size_t(n->src[0]->id)] = skip_[size_t(n->src[1]->id)] = true;
}

bool FusionPass::next(FusedLaunch & l) {
    for (; i_ < nodes_.size(); ++i_) {
        const Tensor * n = nodes_[i_];
        if (skip_[size_t(n->id)]) continue;
        if (n->op == Op::VIEW || n->op == Op::NONE) continue;  // (launch nothing)
        last_     = n;
        l         = FusedLaunch{};
        l.nodes[0] = n;
        if (n->op == Op::SWIGLU && fusable_swiglu(*n)) {
            l.kind  = FusedLaunch::Kind::MatmulSwiglu;
            l.label = "MATMUL+SWIGLU";
            ++i_;
            return true;
        }
        // MATMULs over the same activations with only views between them (q/k/v; in_proj_qkvz
        // + in_proj_ba): one multi-weight GEMV launch where the matmul layer supports it.
        if (n->op == Op::MATMUL) {
            const Tensor * group[FusedLaunch::kMaxMatmuls];
            const int      count = matmul_group(i_, group);
            if (count > 1 && matmul_multi_supported(group, count, ctx_)) {
                static const char * const kLabels[] = {"", "", "MATMUL x2", "MATMUL x3", "MATMUL x4"};
                l.kind  = FusedLaunch::Kind::MatmulMulti;
                l.count = count;
                l.label = kLabels[count];
                for (int j = 0; j < count; ++j) l.nodes[j] = group[j];
                for (int j = 1; j < count; ++j) skip_[size_t(group[j]->id)] = true;  // (computed by this launch)
                ++i_;
                return true;
            }
        }
        // The experts' down projection, the combine of it, the residual add, the next norm and the
        // matmuls of that norm: the down projection's blocks combine their rows' slots and write the
        // norm's half (no combine launch), the GEMV applies the 1 / rms.
        if (n->op == Op::MATMUL_ID && uses_[size_t(n->id)] == 1 && !(n->flags & TENSOR_OUTPUT)) {
            const size_t   jc = next_launching(i_ + 1);
            const Tensor * c  = jc < nodes_.size() ? nodes_[jc] : nullptr;
            const Tensor * add_norm[2];
            const Tensor * mms[FusedLaunch::kMaxMatmuls];
            int            m = 0;
            if (c && c->op == Op::MOE_COMBINE && c->src[0] == n && !skip_[size_t(c->id)]) m = norm_after_at(jc, add_norm, mms);
            if (m && !add_norm_matmul_supported(*add_norm[0], *add_norm[1], mms, m, ctx_) &&
                experts_norm_matmul_supported(*n, *c, *add_norm[0], *add_norm[1], mms, m, ctx_)) {
                static const char * const kLabels[] = {"", "MATMUL_ID+MOE_COMBINE+ADD+RMS_NORM+MATMUL", "MATMUL_ID+MOE_COMBINE+ADD+RMS_NORM+MATMUL x2",
                                                       "MATMUL_ID+MOE_COMBINE+ADD+RMS_NORM+MATMUL x3", "MATMUL_ID+MOE_COMBINE+ADD+RMS_NORM+MATMUL x4"};
                l.kind     = FusedLaunch::Kind::ExpertsNormMatmul;
                l.count    = 4 + m;
                l.nodes[1] = c;
                l.nodes[2] = add_norm[0];
                l.nodes[3] = add_norm[1];
                l.label    = kLabels[m];
                skip_[size_t(c->id)] = skip_[size_t(add_norm[0]->id)] = skip_[size_t(add_norm[1]->id)] = true;  // (computed by this launch)
                for (int j = 0; j < m; ++j) {
                    l.nodes[4 + j]            = mms[j];
                    skip_[size_t(mms[j]->id)] = true;
                }
                ++i_;
                return true;
            }
        }
        // The MoE combine (or a layer's down / o projection), the residual add of its output, the next
        // norm of that sum and the matmuls of that norm: the producer writes the norm's weighted row
        // and sums of squares, the GEMV applies the 1 / rms (no launch between them).
        {
            const Tensor * add_norm[2];
            const Tensor * mms[FusedLaunch::kMaxMatmuls];
            if (const int m = producer_norm_matmul_at(i_, add_norm, mms)) {
                static const char * const kCombine[] = {"", "MOE_COMBINE+ADD+RMS_NORM+MATMUL", "MOE_COMBINE+ADD+RMS_NORM+MATMUL x2",
                                                        "MOE_COMBINE+ADD+RMS_NORM+MATMUL x3", "MOE_COMBINE+ADD+RMS_NORM+MATMUL x4"};
                static const char * const kMatmul[] = {"", "MATMUL+ADD+RMS_NORM+MATMUL", "MATMUL+ADD+RMS_NORM+MATMUL x2",
                                                       "MATMUL+ADD+RMS_NORM+MATMUL x3", "MATMUL+ADD+RMS_NORM+MATMUL x4"};
                const bool comb = n->op == Op::MOE_COMBINE;
                l.kind     = comb ? FusedLaunch::Kind::CombineNormMatmul : FusedLaunch::Kind::MatmulNormMatmul;
                l.count    = 3 + m;
                l.nodes[1] = add_norm[0];
                l.nodes[2] = add_norm[1];
                l.label    = comb ? kCombine[m] : kMatmul[m];
                skip_[size_t(add_norm[0]->id)] = skip_[size_t(add_norm[1]->id)] = true;  // (computed by this launch)
                for (int j = 0; j < m; ++j) {
                    l.nodes[3 + j]            = mms[j];
                    skip_[size_t(mms[j]->id)] = true;
                }
                ++i_;
                return true;
            }
        }
        // Residual add, the next layer's norm of that sum and the matmuls of that norm: one GEMV
        // whose blocks compute the norm themselves.
        const Tensor * after[FusedLaunch::kMaxMatmuls];
        if (const int m = add_norm_matmul_at(i_, after)) {
            static const char * const kLabels[] = {"", "ADD+RMS_NORM+MATMUL", "ADD+RMS_NORM+MATMUL x2", "ADD+RMS_NORM+MATMUL x3",
                                                   "ADD+RMS_NORM+MATMUL x4"};
            l.kind     = FusedLaunch::Kind::AddNormMatmul;
            l.count    = 2 + m;
            l.nodes[1] = nodes_[i_ + 1];
            l.label    = kLabels[m];
            for (int j = 0; j < m; ++j) {
                l.nodes[2 + j]             = after[j];
                skip_[size_t(after[j]->id)] = true;  // (computed by this launch)
            }
            i_ += 2;
            return true;
        }
        // Residual add followed by the next layer's norm of that sum: one kernel (not a norm of rows
        // split over ranks, whose sums of squares are an input: the fused kernel sums its own rows).
        if (n->op == Op::ADD && i_ + 1 < nodes_.size() && nodes_[i_ + 1]->op == Op::RMS_NORM && nodes_[i_ + 1]->src[0] == n &&
            !nodes_[i_ + 1]->src[3]) {
            l.kind     = FusedLaunch::Kind::AddRmsNorm;
            l.count    = 2;
            l.nodes[1] = nodes_[i_ + 1];
            l.label    = "ADD+RMS_NORM";
            i_ += 2;
            return true;
        }
        // Per-head q/k RMSNorm directly followed by its RoPE: one kernel (the norm's output is
        // read by nothing else, so it never needs to exist); the q pair directly followed by the
        // k pair: one launch for both.
        if (norm_rope_at(i_)) {
            const bool pair = norm_rope_at(i_ + 2);
            // The pair and the attention that reads both rotations (views between launch nothing).
            if (const Tensor * at = pair ? attention_after_pair(i_) : nullptr) {
                l.kind  = FusedLaunch::Kind::AttentionNormRope;
                l.count = 5;
                for (int j = 1; j < 4; ++j) l.nodes[j] = nodes_[i_ + size_t(j)];
                l.nodes[4]                = at;
                l.label                   = "ATTENTION+RMS_NORM+ROPE x2";
                skip_[size_t(at->id)]     = true;  // (computed by this launch)
                i_ += 4;
                return true;
            }
            l.kind          = pair ? FusedLaunch::Kind::RmsNormRopePair : FusedLaunch::Kind::RmsNormRope;
            l.count         = pair ? 4 : 2;
            for (int j = 1; j < l.count; ++j) l.nodes[j] = nodes_[i_ + size_t(j)];
            l.label = pair ? "RMS_NORM+ROPE x2" : "RMS_NORM+ROPE";
            i_ += size_t(l.count);
            return true;
        }
        // RMS_NORM of whole rows whose heads only a ROPE reads (MiniMax-M2's q / k norms), and the
        // k pair after it: one launch at the q norm (views between launch nothing; the k norm's
        // input exists already, written by the q/k/v matmuls before).
        if (const size_t rq = whole_norm_rope_at(i_)) {
            l.kind     = FusedLaunch::Kind::WholeNormRope;
            l.count    = 2;
            l.nodes[1] = nodes_[rq];
            l.label    = "RMS_NORM+ROPE (rows)";
            skip_[size_t(nodes_[rq]->id)] = true;  // (computed by this launch)
            const size_t nk = next_launching(rq + 1);
            if (const size_t rk = whole_norm_rope_at(nk)) {
                l.count    = 4;
                l.nodes[2] = nodes_[nk];
                l.nodes[3] = nodes_[rk];
                l.label    = "RMS_NORM+ROPE (rows) x2";
                skip_[size_t(nodes_[nk]->id)] = skip_[size_t(nodes_[rk]->id)] = true;
            }
            ++i_;
            return true;
        }
        ++i_;
        return true;
    }
    return false;
}

// nodes[i] is an ADD whose sum nodes[i + 1] normalises (RMS_NORM of whole rows, no gate), and the
// next launching node starts a group of MATMULs of that norm (as MatmulMulti takes them) that are
// its only readers, and the matmul layer takes the three as one GEMV (add_norm_matmul_supported):
// those MATMULs in `after`, their count; else 0.
int FusionPass::add_norm_matmul_at(size_t i, const Tensor ** after) const {
    if (i + 1 >= nodes_.size()) return 0;
    const Tensor * add  = nodes_[i];
    const Tensor * norm = nodes_[i + 1];
    if (add->op != Op::ADD || norm->op != Op::RMS_NORM || norm->src[0] != add || norm->src[2] || norm->src[3]) return 0;
    const size_t j = next_launching(i + 2);
    if (j >= nodes_.size() || nodes_[j]->op != Op::MATMUL || nodes_[j]->src[0] != norm || skip_[size_t(nodes_[j]->id)]) return 0;
    const int count = matmul_group(j, after);
    if (uses_[size_t(norm->id)] != count) return 0;
    return add_norm_matmul_supported(*add, *norm, after, count, ctx_) ? count : 0;
}

// nodes[i] is a MOE_COMBINE (or a MATMUL) with the nodes of norm_after_at after it, and the matmul
// layer takes them as op_combine_norm_matmul's (op_matmul_norm_matmul's) launches but not as the
// norm prologue (add_norm_matmul_supported): as norm_after_at; else 0.
int FusionPass::producer_norm_matmul_at(size_t i, const Tensor ** add_norm, const Tensor ** after) const {
    const Tensor * comb = nodes_[i];
    if (comb->op != Op::MOE_COMBINE && comb->op != Op::MATMUL) return 0;
    const int count = norm_after_at(i, add_norm, after);
    if (count == 0) return 0;
    // Where the norm's matmuls take the norm prologue (blocks of 64 rows or more: Qwen3-Next), that
    // launch at the ADD: it measured 3% faster there than the combine's norm half with the matmuls'
    // plain plan (docs/PERF.md, "The combine writes the norm's half").
    if (add_norm_matmul_supported(*add_norm[0], *add_norm[1], after, count, ctx_)) return 0;
    return (comb->op == Op::MOE_COMBINE ? combine_norm_matmul_supported(*comb, *add_norm[0], *add_norm[1], after, count, ctx_)
                                        : matmul_norm_matmul_supported(*comb, *add_norm[0], *add_norm[1], after, count, ctx_))
               ? count
               : 0;
}

// nodes[i] read only by the next launching node, an ADD (of it and another row), whose sum the next
// launching node after it normalises (RMS_NORM of whole rows, no gate), and the next launching node
// after that starts a group of MATMULs of that norm that are its only readers: the ADD and the norm
// in add_norm, those MATMULs in `after`, their count; else 0 (the structure alone).
int FusionPass::norm_after_at(size_t i, const Tensor ** add_norm, const Tensor ** after) const {
    const Tensor * comb = nodes_[i];
    if (uses_[size_t(comb->id)] != 1 || (comb->flags & TENSOR_OUTPUT)) return 0;
    const size_t ja = next_launching(i + 1);
    if (ja >= nodes_.size()) return 0;
    const Tensor * add = nodes_[ja];
    if (add->op != Op::ADD || (add->src[0] != comb && add->src[1] != comb) || skip_[size_t(add->id)]) return 0;
    const size_t jn = next_launching(ja + 1);
    if (jn >= nodes_.size()) return 0;
    const Tensor * norm = nodes_[jn];
    if (norm->op != Op::RMS_NORM || norm->src[0] != add || norm->src[2] || norm->src[3] || skip_[size_t(norm->id)]) return 0;
    const size_t j = next_launching(jn + 1);
    // (not the matmuls of a fused gate/up + SwiGLU: as consumer of a dense layer's o projection it
    // measured 1% slower on Qwen3-8B INT4, docs/PERF.md)
    if (j >= nodes_.size() || nodes_[j]->op != Op::MATMUL || nodes_[j]->src[0] != norm || skip_[size_t(nodes_[j]->id)]) return 0;
    const int count = matmul_group(j, after);
    if (uses_[size_t(norm->id)] != count) return 0;
    add_norm[0] = add;
    add_norm[1] = norm;
    return count;
}

size_t FusionPass::last_position(const FusedLaunch & l) const {
    int last = -1;
    for (int j = 0; j < l.count; ++j) last = std::max(last, pos_[size_t(l.nodes[j]->id)]);
    return size_t(std::max(last, 0));
}

std::vector<int> launch_last_nodes(const Graph & graph, const OpContext & ctx) {
    std::vector<int> last(graph.nodes().size(), -1);
    FusionPass       pass(graph, ctx);
    std::vector<int> pos(graph.tensors().size(), -1);
    for (size_t i = 0; i < graph.nodes().size(); ++i) pos[size_t(graph.nodes()[i]->id)] = int(i);
    for (FusedLaunch l; pass.next(l);) {
        using K = FusedLaunch::Kind;
        if (l.kind != K::AddNormMatmul && l.kind != K::CombineNormMatmul && l.kind != K::MatmulNormMatmul && l.kind != K::ExpertsNormMatmul &&
            l.kind != K::RmsNormRopePair &&
            l.kind != K::AttentionNormRope && l.kind != K::WholeNormRope)
            continue;
        const int end = int(pass.last_position(l));
        for (int j = 0; j < l.count; ++j) last[size_t(pos[size_t(l.nodes[j]->id)])] = end;
    }
    return last;
}

// The first node at or after i that launches something (not a view, not NONE); nodes_.size() if none.
size_t FusionPass::next_launching(size_t i) const {
    while (i < nodes_.size() && (nodes_[i]->op == Op::VIEW || nodes_[i]->op == Op::NONE)) ++i;
    return i;
}

// nodes[i] is an RMS_NORM of whole rows (no sums of squares given, src3; no gate, src2) whose only
// reader is a view whose only reader is the next launching node, a ROPE: that ROPE's position, else 0.
size_t FusionPass::whole_norm_rope_at(size_t i) const {
    if (i >= nodes_.size()) return 0;
    const Tensor * n = nodes_[i];
    if (n->op != Op::RMS_NORM || n->src[2] || n->src[3] || uses_[size_t(n->id)] != 1 || (n->flags & TENSOR_OUTPUT)) return 0;
    const size_t j = next_launching(i + 1);
    if (j >= nodes_.size()) return 0;
    const Tensor * r     = nodes_[j];
    const Tensor * heads = r->src[0];
    if (r->op != Op::ROPE || !heads || heads->op != Op::VIEW || heads->src[0] != n || uses_[size_t(heads->id)] != 1 ||
        (heads->flags & TENSOR_OUTPUT) || skip_[size_t(r->id)])
        return 0;
    return j;
}

void FusionPass::launched(bool waits_first) {
    if (waits_first) barrier_ = last_;
}

// Source `src` of the launch's MATMUL_ID (1: the ids, 0: the activations), through views.
bool FusionPass::moe_source_before_barrier(const FusedLaunch & l, int src) const {
    const Tensor * n  = l.nodes[0];
    const Tensor * mm = n->op == Op::SWIGLU ? n->src[0] : n;
    if (!mm || mm->op != Op::MATMUL_ID || !barrier_ || barrier_ == n) return false;
    const Tensor * t = mm->src[src];
    while (t && t->op == Op::VIEW) t = t->src[0];
    if (!t || pos_[size_t(t->id)] < 0 || skip_[size_t(t->id)]) return false;  // (an input of the graph: no launch)
    return pos_[size_t(t->id)] < pos_[size_t(barrier_->id)];
}

bool FusionPass::ids_written_before_barrier(const FusedLaunch & l) const { return moe_source_before_barrier(l, 1); }
bool FusionPass::x_written_before_barrier(const FusedLaunch & l) const { return moe_source_before_barrier(l, 0); }

// A SWIGLU of two matmuls over the same input, read by nothing else (MATMUL_IDs: expert sets of
// one format and shape, held alike where expert parallelism leaves some empty).
bool FusionPass::fusable_swiglu(const Tensor & sw) const {
    const Tensor * g = sw.src[0];
    const Tensor * u = sw.src[1];
    if (sw.op != Op::SWIGLU || !g || !u || g->op != u->op) return false;
    if (g->op != Op::MATMUL && g->op != Op::MATMUL_ID) return false;
    if (g->src[0] != u->src[0] || g->src[1] != u->src[1]) return false;
    if (uses_[size_t(g->id)] != 1 || uses_[size_t(u->id)] != 1) return false;
    if (g->flags & TENSOR_OUTPUT || u->flags & TENSOR_OUTPUT) return false;
    if (g->op == Op::MATMUL) {
        const QWeight & wg = *g->weight, & wu = *u->weight;
        return wg.format == wu.format && wg.n == wu.n && wg.k == wu.k;
    }
    if (g->n_experts != u->n_experts) return false;
    const QWeight * wg = first_held_expert(g->experts, g->n_experts);
    const QWeight * wu = first_held_expert(u->experts, u->n_experts);
    if (!wg || !wu || wg->format != wu->format || wg->n != wu->n || wg->k != wu->k) return false;
    for (int32_t e = 0; e < g->n_experts; ++e)
        if (expert_held(g->experts[e]) != expert_held(u->experts[e])) return false;
    return true;
}

// nodes[i] is an RMS_NORM (of whole rows: no sums of squares given, src3) whose only reader is the
// ROPE at nodes[i + 1].
bool FusionPass::norm_rope_at(size_t i) const {
    if (i + 1 >= nodes_.size()) return false;
    const Tensor * n = nodes_[i];
    return n->op == Op::RMS_NORM && !n->src[3] && nodes_[i + 1]->op == Op::ROPE && nodes_[i + 1]->src[0] == n &&
           uses_[size_t(n->id)] == 1 && !(n->flags & TENSOR_OUTPUT);
}

// The ATTENTION that follows the q / k norm + RoPE pair at nodes[i .. i + 3] (only views between),
// reads the two rotations as its q and k and is their only reader; else nullptr.
const Tensor * FusionPass::attention_after_pair(size_t i) const {
    const Tensor * rq = nodes_[i + 1];
    const Tensor * rk = nodes_[i + 3];
    for (size_t j = i + 4; j < nodes_.size(); ++j) {
        const Tensor * n = nodes_[j];
        if (n->op == Op::VIEW || n->op == Op::NONE) continue;
        const bool reads_both = n->op == Op::ATTENTION && n->src[0] == rq && n->src[1] == rk;
        if (!reads_both || uses_[size_t(rq->id)] != 1 || uses_[size_t(rk->id)] != 1 || (rq->flags & TENSOR_OUTPUT) ||
            (rk->flags & TENSOR_OUTPUT))
            return nullptr;
        return n;
    }
    return nullptr;
}

// The MATMUL at nodes[first] and the following MATMULs on the same input, up to the first node
// that is neither such a matmul nor a view (views launch nothing and allocate nothing, so every
// output already exists and the input is still live when the group runs at `first`).
int FusionPass::matmul_group(size_t first, const Tensor ** group) const {
    const Tensor * x     = nodes_[first]->src[0];
    int            count = 0;
    for (size_t j = first; j < nodes_.size() && count < FusedLaunch::kMaxMatmuls; ++j) {
        const Tensor * n = nodes_[j];
        if (n->op == Op::VIEW || n->op == Op::NONE) continue;
        if (n->op != Op::MATMUL || n->src[0] != x || skip_[size_t(n->id)]) break;
        group[count++] = n;
    }
    return count;
}

}  // namespace spark::cuda
