// The routing's host reference for the kernel labs (emu-elementwise's MOE_ROUTE cases, emu-gemv's
// routing inside the experts' GEMVs): the routing kernel's float arithmetic, so that its weights
// must come out bit-identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

// The kernel's arithmetic (float softmax sum: per lane in slot order, then the xor butterfly) and the
// CPU backend's selection rule; with this reference the weights must be bit-identical.
// Sigmoid scoring (MiniMax-M2): p = 1 / (1 + exp(-x)), chosen by p + bias, weighted by p.
inline void route_ref(const float * x, int E, int k, bool normalize, std::vector<float> & w, std::vector<int32_t> & ids, bool sigmoid = false,
                      const float * bias = nullptr) {
    std::vector<float> p(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    if (sigmoid) {
        for (int e = 0; e < E; ++e) {
            p[size_t(e)]      = 1.0f / (1.0f + std::exp(-x[e]));
            choice[size_t(e)] = p[size_t(e)] + (bias ? bias[e] : 0.0f);
        }
    } else {
        float m = -INFINITY;
        for (int e = 0; e < E; ++e)
            if (x[e] > m) m = x[e];
        bool any_nan = false;
        for (int e = 0; e < E; ++e) any_nan = any_nan || x[e] != x[e];
        if (any_nan) m = NAN;
        std::vector<float> ex(static_cast<size_t>(E));
        float              lane_s[32] = {};
        for (int e = 0; e < E; ++e) {
            ex[size_t(e)] = std::exp(x[e] - m);
            lane_s[e % 32] += ex[size_t(e)];
        }
        for (int o = 16; o > 0; o >>= 1) {
            float nxt[32];
            for (int l = 0; l < 32; ++l) nxt[l] = lane_s[l] + lane_s[l ^ o];
            std::memcpy(lane_s, nxt, sizeof nxt);
        }
        const float s = lane_s[0];
        for (int e = 0; e < E; ++e) choice[size_t(e)] = p[size_t(e)] = ex[size_t(e)] / s;
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int a) { return choice[size_t(a)] == choice[size_t(a)] ? choice[size_t(a)] : -INFINITY; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int c) { return key(a) > key(c) || (key(a) == key(c) && a < c); });
    float wsum = 0.0f;
    for (int j = 0; j < k; ++j) wsum += p[size_t(order[size_t(j)])];
    w.resize(size_t(k));
    ids.resize(size_t(k));
    for (int j = 0; j < k; ++j) {
        w[size_t(j)]   = normalize ? p[size_t(order[size_t(j)])] / wsum : p[size_t(order[size_t(j)])];
        ids[size_t(j)] = order[size_t(j)];
    }
}
