#include "graph/graph.h"

#include "common/error.h"

#include <algorithm>
#include <atomic>

namespace spark {

const char * op_name(Op op) {
    static const char * names[] = {
        "NONE",    "VIEW",        "CONT",      "CONCAT",    "GET_ROWS",    "MATMUL",     "MATMUL_ID", "ADD",
        "MUL",     "SCALE",       "RMS_NORM",  "L2_NORM",     "ROPE",       "SWIGLU",    "MUL_SIGMOID",
        "ATTENTION", "MOE_ROUTE", "MOE_COMBINE", "CONV1D_SSM", "GATED_DELTA", "ARGMAX", "SUM_SQR", "ALL_REDUCE",
    };
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(Op::COUNT));
    return op < Op::COUNT ? names[size_t(op)] : "?";
}

uint64_t Graph::next_uid() {
    static std::atomic<uint64_t> counter{1};
    return counter++;
}

size_t Tensor::nbytes() const {
    size_t bytes = dtype_size(type);
    for (int i = 0; i < kMaxDims; ++i) bytes += size_t(ne[i] - 1) * nb[i];
    return nelements() == 0 ? 0 : bytes;
}

bool Tensor::is_contiguous() const {
    size_t expect = dtype_size(type);
    for (int i = 0; i < kMaxDims; ++i) {
        if (ne[i] != 1 && nb[i] != expect) return false;
        expect *= size_t(ne[i]);
    }
    return true;
}

Tensor * Graph::new_tensor(DType type, const int64_t * ne, int n_dims, Op op) {
    SPARK_ASSERT(n_dims >= 1 && n_dims <= kMaxDims);
    Tensor & t = tensors_.emplace_back();
    t.type     = type;
    t.op       = op;
    t.id       = int32_t(tensors_.size() - 1);
    for (int i = 0; i < n_dims; ++i) {
        SPARK_ASSERT(ne[i] >= 0);
        t.ne[i] = ne[i];
    }
    t.nb[0] = dtype_size(type);
    for (int i = 1; i < kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * size_t(t.ne[i - 1]);
    if (op != Op::NONE) nodes_.push_back(&t);
    return &t;
}

Tensor * Graph::new_op(Op op, DType type, const Tensor * shape_like) {
    return new_tensor(type, shape_like->ne, kMaxDims, op);
}

Tensor * Graph::input(DType type, std::initializer_list<int64_t> ne, const std::string & name) {
    Tensor * t = new_tensor(type, ne.begin(), int(ne.size()), Op::NONE);
    t->flags |= TENSOR_INPUT;
    t->name = name;
    return t;
}

Tensor * Graph::external(DType type, std::initializer_list<int64_t> ne, void * data, const std::string & name) {
    Tensor * t = new_tensor(type, ne.begin(), int(ne.size()), Op::NONE);
    t->flags |= TENSOR_EXTERNAL;
    t->data = data;
    t->name = name;
    return t;
}

Tensor * Graph::named(Tensor * t, const std::string & name, int layer) {
    t->name = layer >= 0 ? name + "-" + std::to_string(layer) : name;
    return t;
}

Tensor * Graph::get_rows(const QWeight & w, Tensor * ids) {
    SPARK_ASSERT(ids->type == DType::I32 && ids->ne[1] == 1);
    SPARK_ASSERT(w.format == WeightFormat::F32 || w.format == WeightFormat::F16 || w.format == WeightFormat::BF16);
    int64_t  ne[2] = {w.k, ids->ne[0]};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::GET_ROWS);
    t->weight      = &w;
    t->src[1]      = ids;
    return t;
}

Tensor * Graph::get_rows(Tensor * src, Tensor * ids) {
    SPARK_ASSERT(ids->type == DType::I32 && ids->ne[1] == 1 && (src->type == DType::F32 || src->type == DType::I32));
    SPARK_ASSERT(src->ne[2] == 1 && src->ne[3] == 1);
    int64_t  ne[2] = {src->ne[0], ids->ne[0]};
    Tensor * t     = new_tensor(src->type, ne, 2, Op::GET_ROWS);
    t->src[0]      = src;
    t->src[1]      = ids;
    return t;
}

Tensor * Graph::matmul(Tensor * x, const QWeight & w) {
    SPARK_ASSERT(x->type == DType::F32);
    if (x->ne[0] != w.k) fail(SPARK_ERR_SHAPE_MISMATCH, "matmul: input has %lld columns, weight expects %lld", (long long) x->ne[0], (long long) w.k);
    int64_t  ne[4] = {w.n, x->ne[1], x->ne[2], x->ne[3]};
    Tensor * t     = new_tensor(DType::F32, ne, 4, Op::MATMUL);
    t->src[0]      = x;
    t->weight      = &w;
    return t;
}

Tensor * Graph::matmul_id(Tensor * x, const QWeight * experts, int32_t n_experts, Tensor * ids) {
    SPARK_ASSERT(x->type == DType::F32 && ids->type == DType::I32 && n_experts > 0);
    // The shape of any expert this rank holds (expert parallelism leaves the others empty).
    const QWeight * held = std::find_if(experts, experts + n_experts, [](const QWeight & w) { return w.n > 0; });
    SPARK_ASSERT(held != experts + n_experts);
    SPARK_ASSERT(x->ne[0] == held->k && x->ne[2] == ids->ne[1]);
    SPARK_ASSERT(x->ne[1] == 1 || x->ne[1] == ids->ne[0]);
    int64_t  ne[3] = {held->n, ids->ne[0], ids->ne[1]};
    Tensor * t     = new_tensor(DType::F32, ne, 3, Op::MATMUL_ID);
    t->src[0]      = x;
    t->src[1]      = ids;
    t->experts     = experts;
    t->n_experts   = n_experts;
    return t;
}

Tensor * Graph::unary(Op op, Tensor * a) {
    SPARK_ASSERT(a->type == DType::F32);
    Tensor * t = new_op(op, DType::F32, a);
    t->src[0]  = a;
    return t;
}

Tensor * Graph::binary(Op op, Tensor * a, Tensor * b) {
    SPARK_ASSERT(a->type == DType::F32 && b->type == DType::F32);
    SPARK_ASSERT(a->ne[0] == b->ne[0] || (op == Op::MUL_SIGMOID && b->ne[0] == 1));
    SPARK_ASSERT(b->nrows() == 1 || b->nrows() == a->nrows());
    Tensor * t = new_op(op, DType::F32, a);
    t->src[0]  = a;
    t->src[1]  = b;
    return t;
}

Tensor * Graph::add(Tensor * a, Tensor * b) { return binary(Op::ADD, a, b); }
Tensor * Graph::mul(Tensor * a, Tensor * b) { return binary(Op::MUL, a, b); }
Tensor * Graph::swiglu(Tensor * gate, Tensor * up) {
    SPARK_ASSERT(gate->nrows() == up->nrows());
    return binary(Op::SWIGLU, gate, up);
}
Tensor * Graph::mul_sigmoid(Tensor * a, Tensor * gate) { return binary(Op::MUL_SIGMOID, a, gate); }

Tensor * Graph::scale(Tensor * a, float s) {
    Tensor * t = unary(Op::SCALE, a);
    t->fp[0]   = s;
    return t;
}

Tensor * Graph::rms_norm(Tensor * x, Tensor * w, float eps, bool zero_centered) {
    Tensor * t = unary(Op::RMS_NORM, x);
    if (w) {
        SPARK_ASSERT(w->type == DType::F32 && w->ne[0] == x->ne[0] && w->nrows() == 1);
        t->src[1] = w;
    }
    t->fp[0] = eps;
    t->ip[0] = zero_centered ? 1 : 0;
    return t;
}

Tensor * Graph::all_reduce(Tensor * x) {
    SPARK_ASSERT(x->is_contiguous());
    return unary(Op::ALL_REDUCE, x);
}

Tensor * Graph::sum_sqr(Tensor * x, float scale) {
    SPARK_ASSERT(x->type == DType::F32 && x->nb[0] == 4);
    const int64_t ne[2] = {1, x->nrows()};
    Tensor *      t     = new_tensor(DType::F32, ne, 2, Op::SUM_SQR);
    t->src[0]           = x;
    t->fp[0]            = scale;
    return t;
}

Tensor * Graph::rms_norm_split(Tensor * x, Tensor * w, Tensor * sums, int64_t width, float eps, bool zero_centered) {
    SPARK_ASSERT(sums->type == DType::F32 && sums->ne[0] == 1 && sums->nrows() == x->nrows() && width >= x->ne[0]);
    Tensor * t = rms_norm(x, w, eps, zero_centered);
    t->src[3]  = sums;
    t->fp[1]   = float(width);
    return t;
}

Tensor * Graph::rms_norm_gated(Tensor * x, Tensor * w, Tensor * gate, float eps) {
    SPARK_ASSERT(gate->type == DType::F32 && gate->nb[0] == 4 && gate->ne[0] == x->ne[0] && gate->nrows() == x->nrows());
    Tensor * t = rms_norm(x, w, eps, false);
    t->src[2]  = gate;
    return t;
}

Tensor * Graph::l2_norm(Tensor * x, float eps) {
    Tensor * t = unary(Op::L2_NORM, x);
    t->fp[0]   = eps;
    return t;
}

Tensor * Graph::rope(Tensor * x, Tensor * pos, int32_t n_rot, float theta) {
    SPARK_ASSERT(pos->type == DType::I32 && pos->ne[0] == x->ne[2]);
    SPARK_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= x->ne[0]);
    Tensor * t = unary(Op::ROPE, x);
    t->src[1]  = pos;
    t->ip[0]   = n_rot;
    t->fp[0]   = theta;
    return t;
}

Tensor * Graph::argmax(Tensor * x) {
    SPARK_ASSERT(x->type == DType::F32);
    int64_t  ne[1] = {x->nrows()};
    Tensor * t     = new_tensor(DType::I32, ne, 1, Op::ARGMAX);
    t->src[0]      = x;
    return t;
}

Tensor * Graph::attention(Tensor * q, Tensor * k, Tensor * v, Tensor * k_cache, Tensor * v_cache,
                          const StepInputs & step, float scale) {
    SPARK_ASSERT(q->type == DType::F32 && k->type == DType::F32 && v->type == DType::F32);
    const int64_t hd = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2], n_kv = k->ne[1];
    SPARK_ASSERT(k->ne[0] == hd && v->ne[0] == hd && v->ne[1] == n_kv && k->ne[2] == n_tok && v->ne[2] == n_tok);
    SPARK_ASSERT(n_head % n_kv == 0);
    SPARK_ASSERT(k_cache->ne[0] == hd * n_kv && v_cache->ne[0] == hd * n_kv);
    int64_t  ne[2] = {hd * n_head, n_tok};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::ATTENTION);
    t->src[0] = q;
    t->src[1] = k;
    t->src[2] = v;
    t->src[3] = k_cache;
    t->src[4] = v_cache;
    t->src[5] = step.pos;
    t->src[6] = step.seq;
    t->src[7] = step.block_table;
    t->fp[0]  = scale;
    return t;
}

Tensor * Graph::moe_route(Tensor * logits, int32_t k, bool normalize, RouterScore score, Tensor * choice_bias, bool shared_slot) {
    SPARK_ASSERT(logits->type == DType::F32 && k > 0 && k <= logits->ne[0]);
    SPARK_ASSERT(!choice_bias || (score == RouterScore::Sigmoid && choice_bias->type == DType::F32 && choice_bias->ne[0] == logits->ne[0] &&
                                  choice_bias->nrows() == 1));
    int64_t  ne[2] = {2 * int64_t(k) + (shared_slot ? 1 : 0), logits->nrows()};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::MOE_ROUTE);
    t->src[0]      = logits;
    t->src[1]      = choice_bias;
    t->ip[0]       = k;
    t->ip[1]       = normalize ? 1 : 0;
    t->ip[2]       = int32_t(score);
    t->ip[3]       = shared_slot ? 1 : 0;
    return t;
}

Tensor * Graph::moe_weights(Tensor * route) {
    SPARK_ASSERT(route->op == Op::MOE_ROUTE);
    const int64_t k = route->ip[0];
    return view(route, {k, route->ne[1]}, {4, route->nb[1]}, 0);
}

Tensor * Graph::moe_ids(Tensor * route) {
    SPARK_ASSERT(route->op == Op::MOE_ROUTE);
    const int64_t k = route->ip[0];
    Tensor *      t = view(route, {k + route->ip[3], route->ne[1]}, {4, route->nb[1]}, size_t(k) * 4);
    t->type         = DType::I32;  // same 4-byte cells, reinterpreted
    return t;
}

Tensor * Graph::moe_combine(Tensor * y, Tensor * weights, Tensor * shared, Tensor * shared_gate) {
    SPARK_ASSERT(y->type == DType::F32 && weights->ne[0] == y->ne[1] && weights->ne[1] == y->ne[2]);
    SPARK_ASSERT(!shared == !shared_gate);
    if (shared) {
        SPARK_ASSERT(shared->type == DType::F32 && shared->ne[0] == y->ne[0] && shared->nrows() == y->ne[2]);
        SPARK_ASSERT(shared_gate->type == DType::F32 && shared_gate->ne[0] == 1 && shared_gate->nrows() == y->ne[2]);
    }
    int64_t  ne[2] = {y->ne[0], y->ne[2]};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::MOE_COMBINE);
    t->src[0]      = y;
    t->src[1]      = weights;
    t->src[2]      = shared;
    t->src[3]      = shared_gate;
    return t;
}

Tensor * Graph::conv1d_ssm(Tensor * x, Tensor * w, Tensor * state, const StepInputs & step) {
    SPARK_ASSERT(x->type == DType::F32 && x->nrows() == x->ne[1]);
    return conv1d_ssm({view(x, {x->ne[0], 1, x->ne[1]}, {x->nb[0], x->nb[1], x->nb[1]}, 0)}, w, state, step);
}

Tensor * Graph::conv1d_ssm(std::initializer_list<Tensor *> parts, Tensor * w, Tensor * state, const StepInputs & step) {
    SPARK_ASSERT(parts.size() >= 1 && parts.size() <= 3);
    Tensor * const * p = parts.begin();
    const int64_t n_tok = p[0]->ne[2];
    int64_t       channels = 0;
    for (Tensor * x : parts) {  // [len, groups, T], rows of len floats contiguous
        SPARK_ASSERT(x->type == DType::F32 && x->nb[0] == 4 && x->ne[2] == n_tok && x->ne[3] == 1);
        channels += x->ne[0] * x->ne[1];
    }
    const int64_t kernel = w->ne[0];
    SPARK_ASSERT(w->type == DType::F32 && w->ne[1] == channels && kernel >= 2);
    SPARK_ASSERT(state->ne[0] == (kernel - 1) * channels && state->ne[1] >= 1 && state->ne[3] == 1);
    int64_t  ne[2] = {channels, n_tok};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::CONV1D_SSM);
    for (size_t i = 0; i < parts.size(); ++i) t->src[kConvPartSrc[i]] = p[i];
    t->src[1]      = w;
    t->src[2]      = state;
    t->src[5]      = step.pos;
    t->src[6]      = step.seq;
    t->src[7]      = step.seq_ranges;
    t->ip[0]       = int32_t(parts.size());
    return t;
}

Tensor * Graph::gated_delta(Tensor * q, Tensor * k, Tensor * v, Tensor * a, Tensor * b, Tensor * A_log,
                            Tensor * dt_bias, Tensor * state, const StepInputs & step, QkNorm qk) {
    const int64_t dk = q->ne[0], n_kh = q->ne[1], n_tok = q->ne[2];
    const int64_t dv = v->ne[0], n_vh = v->ne[1];
    SPARK_ASSERT(k->ne[0] == dk && k->ne[1] == n_kh && k->ne[2] == n_tok && v->ne[2] == n_tok);
    SPARK_ASSERT(n_kh > 0 && n_vh % n_kh == 0);
    // a and b: [n_vh, T] become [n_vh, 1, T] views, so the op always sees [r, groups, T] with
    // value head h at (h % r, h / r).
    auto grouped = [&](Tensor * g) {
        SPARK_ASSERT(g->type == DType::F32 && g->nb[0] == 4 && g->ne[3] == 1);
        if (g->ne[0] == n_vh && g->ne[1] == n_tok && g->ne[2] == 1) return view(g, {n_vh, 1, n_tok}, {g->nb[0], g->nb[1], g->nb[1]}, 0);
        SPARK_ASSERT(g->ne[0] * g->ne[1] == n_vh && g->ne[2] == n_tok);
        return g;
    };
    a = grouped(a);
    b = grouped(b);
    SPARK_ASSERT(A_log->ne[0] == n_vh && dt_bias->ne[0] == n_vh);
    SPARK_ASSERT(state->ne[0] == dk * dv * n_vh && state->ne[1] >= 1 && state->ne[3] == 1);
    int64_t  ne[3] = {dv, n_vh, n_tok};
    Tensor * t     = new_tensor(DType::F32, ne, 3, Op::GATED_DELTA);
    t->src[0] = q;
    t->src[1] = k;
    t->src[2] = v;
    t->src[3] = a;
    t->src[4] = b;
    t->src[5] = A_log;
    t->src[6] = dt_bias;
    t->src[7] = state;
    t->src[8] = step.seq_ranges;
    t->src[9] = step.pos;
    t->ip[0]  = qk.l2_norm ? 1 : 0;
    t->fp[0]  = qk.eps;
    t->fp[1]  = qk.q_scale;
    return t;
}

Tensor * Graph::reshape(Tensor * x, std::initializer_list<int64_t> ne) {
    if (!x->is_contiguous()) fail(SPARK_ERR_INTERNAL, "reshape of a non-contiguous tensor '%s'", x->name.c_str());
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    SPARK_ASSERT(n == x->nelements() && ne.size() <= size_t(kMaxDims));
    Tensor * base = x->view_src ? x->view_src : x;
    Tensor * t    = new_tensor(x->type, ne.begin(), int(ne.size()), Op::VIEW);
    t->view_src   = base;
    t->view_offs  = x->view_src ? x->view_offs : 0;
    t->src[0]     = x;
    return t;
}

Tensor * Graph::view(Tensor * x, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset) {
    SPARK_ASSERT(ne.size() == nb.size() && ne.size() >= 1 && ne.size() <= size_t(kMaxDims));
    Tensor * base = x->view_src ? x->view_src : x;
    Tensor * t    = new_tensor(x->type, ne.begin(), int(ne.size()), Op::VIEW);
    size_t   i    = 0;
    for (size_t s : nb) t->nb[i++] = s;
    for (; i < size_t(kMaxDims); ++i) t->nb[i] = t->nb[i - 1] * size_t(t->ne[i - 1]);
    t->view_src  = base;
    t->view_offs = (x->view_src ? x->view_offs : 0) + offset;
    t->src[0]    = x;
    SPARK_ASSERT(t->view_offs + t->nbytes() <= base->nbytes());
    return t;
}

Tensor * Graph::concat(Tensor * a, Tensor * b, Tensor * c) {
    SPARK_ASSERT(a->type == DType::F32 && b->type == DType::F32 && a->nrows() == b->nrows());
    SPARK_ASSERT(!c || (c->type == DType::F32 && c->nrows() == a->nrows()));
    int64_t  ne[2] = {a->ne[0] + b->ne[0] + (c ? c->ne[0] : 0), a->nrows()};
    Tensor * t     = new_tensor(DType::F32, ne, 2, Op::CONCAT);
    t->src[0]      = a;
    t->src[1]      = b;
    t->src[2]      = c;
    return t;
}

Tensor * Graph::cont(Tensor * x) {
    Tensor * t = new_tensor(x->type, x->ne, kMaxDims, Op::CONT);
    t->src[0]  = x;
    return t;
}

}  // namespace spark
