// Programmatic dependent launch (PDL, sm_90+): the device half of the launch helpers of launch.h, and
// the one place its PTX (griddepcontrol) lives.
//
// Every kernel the ops launch goes through launch() (launch.h) with
// cudaLaunchAttributeProgrammaticStreamSerialization, so it may be scheduled while the kernel before
// it in the stream is still running:
//   wait()               blocks until the previous kernel has completed and its writes are visible.
//                        It must come before the first global read of anything an earlier kernel
//                        wrote and before the first global write (an earlier kernel may still read
//                        the buffer), and every thread must execute it before it exits: a grid
//                        that completes without waiting could complete before its predecessor,
//                        and the kernel after it would then not be ordered after that predecessor.
//   launch_dependents()  this block no longer holds back the next kernel: once every block of this
//                        grid has called it (or exited), the next kernel's blocks may start and run
//                        their prologue (weight loads) while this one works. It says nothing about
//                        memory, so it may come before wait(): a kernel then lets the next one start
//                        while it still waits itself, and kernels launch several deep. The MMA
//                        GEMV calls it once its first weight loads are issued, the small kernels
//                        at their start; the FMA GEMV after its main loop, the recurrent (SSM)
//                        kernels after their wait and the attention decode kernel once its first
//                        K/V tiles are requested, where the kernels launched early behind them cost
//                        more than they gained (measured in docs/PERF.md; for the attention, the
//                        next GEMV's early weight loads queued its chain of round trips).
// Reading weights (written at load time) before wait() is what makes PDL pay: the loads are in
// flight while the previous kernel drains.
//   One more read may precede wait(): data written before a kernel that calls launch_dependents()
// only after its own wait(), by this kernel or one launched before it (once that kernel triggers,
// every kernel before it has completed, and each later one starts only after the one before it
// triggered: so this kernel cannot start before those writes are complete and visible in L2; read
// with ld.cg, as L1 is not coherent). The dispatch keeps the latest such launch as the barrier
// (FusionPass::launched). The expert GEMV of a MoE down projection reads its expert ids (from the
// router, two launches back; the gate/up GEMV waits for them before it triggers) this way and
// requests its weights before the gate/up GEMV ends (GemvArgs::ids_early); the gate/up GEMV
// converts its activations (from the norm before the router GEMV, whose FMA kernel triggers after
// its main loop) while the routing kernel still chooses the experts (GemvArgs::x_early). And data that only earlier steps
// wrote (earlier graph launches, complete before this step's first kernel; ld.cg): the step's
// inputs and the linear-attention state (ssm.h, "Before the wait").
//
// Both are no-ops below sm_90 and for a kernel launched without the attribute (plain stream order).
// The CPU warp emulator shadows this header with a model that checks both rules
// (dev/emu/backends/cuda/common/pdl.cuh).
#pragma once

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/step_trace.cuh"

#include <cuda_runtime.h>

namespace spark::cuda::pdl {

__device__ __forceinline__ void wait() {
#if defined(SPARK_STEP_TRACE)  // (-DSPARK_STEP_TRACE=ON builds: step_trace.cuh)
    const uint64_t arrive_ns = trace::now_ns();
#endif
#if SPARK_ARCH_HOPPER_PLUS
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(SPARK_STEP_TRACE)
    trace::record_wait(arrive_ns);
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if SPARK_ARCH_HOPPER_PLUS
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace spark::cuda::pdl
