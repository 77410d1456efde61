// Linear-attention ops of Qwen3-Next on CUDA (graph.h: Graph::conv1d_ssm, Graph::gated_delta):
// parameters and launchers (ssm.cu); kernels in ssm_kernels.cuh.
//
// Recurrent state (graph.h: "Recurrent state with rollback"): per sequence slot a ring of R states,
// entry p mod R holding the state after position p. A block reads pos0 (the sequence's first
// position in the step) from device memory at run time, since steps are captured into CUDA graphs
// and replayed with new positions. It starts from ring entry (pos0 - 1) mod R, or from zeros at
// pos0 == 0 (the ring's memory is not cleared), and writes the state after each of the last
// min(count, R) tokens to entry (pos0 + i) mod R. That write may overwrite the entry read at the
// start, so every read of the old state comes first. A decode step (count 1) reads one state and
// writes one, as with a single state per slot.
//
// conv1d_ssm: grid (channel blocks, sequences). Thread (c, y) computes the outputs of channel c for
// the sequence's tokens y, y + blockDim.y, ...; every output reads its K inputs directly (from x, or
// from the previous state for the first K-1 tokens), so the tokens are independent. After a block
// barrier (every thread has read the old state of its channel) the threads write the kept states
// (the K-1 inputs up to each kept token), token i by thread y = i mod blockDim.y. A (slot, channel)
// belongs to one block, so the in-place update needs no other synchronisation. Decode steps (one
// token per sequence) use 256 channels x 1 token per block, others 32 channels x 8 tokens. The
// input comes in up to three strided parts (Qwen3-Next: q, k and v read in place from the
// in_proj_qkvz output); a thread resolves its channel's address once.
//
// gated_delta: grid (n_v_heads * dv / 16, sequences), 128 threads. A block owns 16 columns of one
// head's state S (dk x dv, f32) in registers: warp w has columns 4w .. 4w+3 of the block, lane l
// column 4w + l % 4 and rows l / 4 + 8 r (r < dk / 8). The delta rule is independent per column:
// kv = S^T k and o = S^T q are column sums (reduced over the 8 lanes sharing a column by three
// shuffles), the update S += k delta^T touches the column only. (Qwen3-Next: 32 heads x 8 = 256
// blocks per sequence.) Tokens are processed in order inside the kernel with S kept on chip; k, q,
// v and the gates of 16 tokens at a time are staged in shared memory (q and k l2-normalised there,
// one warp per token, when the op asks for it). Each thread reads its
// elements of S once and writes them from registers after every kept token; no other thread touches
// them, so the ring needs no barrier.
//
// Before the wait (pdl.cuh). Both kernels read, before their PDL wait, what no kernel of the step
// writes before them: the weights (taps, A_log, dt_bias), the step's inputs (sequence ranges and
// positions, uploaded before the step's graph starts) and the ring entry of the state after
// position pos0 - 1, which only this layer's own kernel writes, in an earlier step (an earlier
// graph launch, complete before this one starts; read with ld.cg, as L1 is not coherent). So the
// gated delta's 2 MB of state a layer (Qwen3-Next) are on their way from DRAM while the conv runs.
// They still trigger the next kernel only after their wait (pdl.cuh).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace spark::cuda::ssm {

constexpr int kConvMaxK = 8;  // conv kernel sizes 2 .. kConvMaxK

constexpr int kConvMaxParts = 3;  // input parts (graph.h: Graph::conv1d_ssm)

// One part of the conv input: [len, groups, T] f32, channel (group, element) at x + group * nb1 +
// element * 4 + token * nb2. The parts' channels are concatenated.
struct ConvPart {
    const char * x = nullptr;
    int64_t      nb1 = 0, nb2 = 0;
    int          len = 0, groups = 1;
};

struct ConvParams {
    ConvPart        part[kConvMaxParts];
    int             n_parts = 1;
    const float *   w = nullptr;      // [C][K]
    float *         state = nullptr;   // [n_slots][R][K-1][C]
    const int32_t * ranges = nullptr;  // [S][3]: slot, first token, count
    const int32_t * pos = nullptr;     // [T] token positions (device memory)
    float *         out = nullptr;     // [C, T]
    int64_t         out_nb1 = 0;
    int             C = 0, K = 0, R = 1, n_slots = 0, n_seqs = 0;  // R: states per slot (ring)
};

constexpr int kGdnCols    = 16;  // state columns per block
constexpr int kGdnTok     = 16;  // tokens staged in shared memory at a time
constexpr int kGdnThreads = 128;

struct GdnParams {
    const char * q = nullptr;  // [dk, n_kh, T]
    int64_t      q_nb1 = 0, q_nb2 = 0;
    const char * k = nullptr;  // [dk, n_kh, T]
    int64_t      k_nb1 = 0, k_nb2 = 0;
    const char * v = nullptr;  // [dv, n_vh, T]
    int64_t      v_nb1 = 0, v_nb2 = 0;
    // a, b [r, groups, T] (r * groups = n_vh): value head h at (h % r, h / r), byte strides nbg
    // between groups and nbt between tokens.
    const char * a = nullptr;
    int64_t      a_nbg = 0, a_nbt = 0;
    const char * b = nullptr;
    int64_t      b_nbg = 0, b_nbt = 0;
    int          a_r = 1, b_r = 1;
    const float * A_log = nullptr;    // [n_vh]
    const float * dt_bias = nullptr;  // [n_vh]
    float *       state = nullptr;    // [n_slots][R][n_vh][dk][dv]
    const int32_t * ranges = nullptr;  // [S][3]
    const int32_t * pos = nullptr;     // [T] token positions (device memory)
    float *       out = nullptr;       // [dv, n_vh, T]
    int64_t       out_nb1 = 0, out_nb2 = 0;
    int           dk = 0, dv = 0, n_kh = 0, n_vh = 0, R = 1, n_slots = 0, n_seqs = 0;  // R: states per slot (ring)
    // q and k l2-normalised in the kernel, x / sqrt(sum(x^2) + qk_eps), q then times q_scale.
    bool          qk_l2norm = false;
    float         qk_eps = 0.0f, q_scale = 1.0f;
};

// Enqueue the kernels (ssm.cu). Throw spark::Error for unsupported shapes.
void launch_conv1d(const ConvParams & p, bool one_token_per_seq, cudaStream_t stream);
void launch_gated_delta(const GdnParams & p, cudaStream_t stream);

}  // namespace spark::cuda::ssm
