// Phase stamps, for finding where a kernel's time goes. Only in a
// profiling build: `SHMEM_KERNEL_PHASES=1` at build time (build.rs) defines
// SHMEM_PHASES; without it every call here compiles to nothing.
//
// Thread 0 of block 0 (or of the block SHMEM_KERNEL_PHASE_BLOCK names
// at build time) reads %globaltimer (32 ns steps on H100/H200) when
// the kernel starts (`phase_begin`) and at each named point (`phase_mark`,
// also inside helpers). On every kPhaseEvery-th launch (per source file)
// it prints, after the kernel's last stamp (`phase_end`), one line a
// phase: the kernel, the sample, the phase and its nanoseconds; first the
// gap since the end of the stamped kernel before it in the same file
// (negative where programmatic dependent launch overlapped them) as block
// 0 saw it, then the same from the end of that kernel's last block
// (`gap_last`; every block's thread 0 stamps its end), last the SM's
// clock over the kernel. What one thread sees: a
// phase that ends in a block barrier includes the wait for the block's
// slowest warp. A profiling build's operations are slower as a whole (the
// stamps, the count, the printing): compare its stamps with stamps only.
#pragma once
#include <cstdint>
#include <cstdio>

namespace shmem {
namespace k {

#ifdef SHMEM_PHASES
constexpr int kPhaseMax = 24;
// Prime, so that every kernel of a sequence that repeats (a dispatch's
// route, gather, route, gather) is sampled in turn.
constexpr unsigned long long kPhaseEvery = 61;
// Per source file (static), so that each .cu counts its own launches.
static __device__ unsigned long long phase_launches;
static __device__ unsigned long long phase_last_end;
// The latest end of any block of the stamped kernels in this file (each
// block's thread 0 at `phase_end`), and its value when this kernel's
// block 0 began: the end of the kernel before's last block (unless a
// block of this kernel ended before block 0 began).
static __device__ unsigned long long phase_any_end;
// The stamper's state: in shared memory, so that a mark costs little and
// helpers can mark without being handed anything.
struct PhaseState {
    const char *kernel;
    const char *names[kPhaseMax];
    uint64_t at[kPhaseMax + 1];
    long long clock0;  // clock64 at the start: the SM's clock over the kernel
    uint64_t any_end;  // `phase_any_end` at the start
    int n;
};
static __shared__ PhaseState phase_state;

__device__ __forceinline__ uint64_t phase_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The stamping block: 0 unless the build says (SHMEM_KERNEL_PHASE_BLOCK).
#ifndef SHMEM_PHASE_BLOCK
#define SHMEM_PHASE_BLOCK 0
#endif
__device__ __forceinline__ bool phase_stamper() { return blockIdx.x == SHMEM_PHASE_BLOCK && threadIdx.x == 0; }
__device__ __forceinline__ void phase_begin(const char *kernel) {
    if (!phase_stamper()) return;
    PhaseState &p = phase_state;
    p.at[0] = phase_now();
    p.clock0 = clock64();
    p.any_end = *static_cast<volatile unsigned long long *>(&phase_any_end);
    p.kernel = kernel;
    p.n = 0;
}
__device__ __forceinline__ void phase_mark(const char *name) {
    if (!phase_stamper()) return;
    PhaseState &p = phase_state;
    // Also bounds a mark in a kernel that never began (a helper shared
    // with an unstamped kernel, e.g. the two-kernel MoE form's), whose
    // state is whatever the shared memory held: it stays inside it.
    if (static_cast<unsigned>(p.n) >= static_cast<unsigned>(kPhaseMax)) return;
    p.names[p.n] = name;
    p.at[++p.n] = phase_now();
}
// After the kernel's last mark (by every thread; one prints).
__device__ __forceinline__ void phase_end() {
    if (threadIdx.x == 0) atomicMax(&phase_any_end, static_cast<unsigned long long>(phase_now()));
    if (!phase_stamper()) return;
    const PhaseState &p = phase_state;
    const uint64_t done = p.at[p.n], before = phase_last_end;
    const long long cycles = clock64() - p.clock0;
    phase_last_end = done;
    // Counted here, after the last mark, so that the atomic's round trip
    // is in no phase.
    const unsigned long long sample = atomicAdd(&phase_launches, 1ull) + 1;
    if (sample % kPhaseEvery != 0) return;
    printf("phase %s %llu gap %lld\n", p.kernel, sample, static_cast<long long>(p.at[0] - before));
    // The same from the end of the kernel before's last block.
    printf("phase %s %llu gap_last %lld\n", p.kernel, sample, static_cast<long long>(p.at[0] - p.any_end));
    for (int i = 0; i < p.n; i++)
        printf("phase %s %llu %s %llu\n", p.kernel, sample, p.names[i],
               static_cast<unsigned long long>(p.at[i + 1] - p.at[i]));
    printf("phase %s %llu total %llu\n", p.kernel, sample, static_cast<unsigned long long>(done - p.at[0]));
    printf("phase %s %llu mhz %llu\n", p.kernel, sample,
           static_cast<unsigned long long>(done > p.at[0] ? 1000 * cycles / (done - p.at[0]) : 0));
}
// Waits (the stamper only) until `v` is in: a mark after it stamps when
// the loads it came from were in.
__device__ __forceinline__ void phase_wait(uint64_t v) {
    if (phase_stamper()) asm volatile("" ::"l"(v));
}
#else
__device__ __forceinline__ void phase_wait(uint64_t) {}
__device__ __forceinline__ void phase_begin(const char *) {}
__device__ __forceinline__ void phase_mark(const char *) {}
__device__ __forceinline__ void phase_end() {}
#endif

}  // namespace k
}  // namespace shmem
