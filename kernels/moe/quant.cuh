// Block-scaled FP8 quantization on the device, bit for bit the host's
// reference (shmem/src/quant.rs, whose module docs define it): groups of
// kQuantGroup consecutive elements, one f32 scale a group (amax / 448, or
// 1 where that is zero), each element `x / scale` in e4m3, rounded to
// nearest even and saturated to ±448; a NaN quotient is code 0x7f.
//
// The reference's arithmetic, exactly: amax is a maximum (exact, NaNs
// ignored as `fmaxf` ignores them), both divisions are IEEE divisions
// rounded to nearest (`__fdiv_rn`, whatever the compiler's flags), and the
// conversion is the hardware's round-to-nearest-even with `__NV_SATFINITE`.
#pragma once
#include <cuda_fp8.h>
#include <cstdint>
#include "core/elem.cuh"

namespace shmem {
namespace k {

constexpr int kQuantGroup = 128;
constexpr float kE4m3Max = 448.0f;

// The value of an element of the types quantization reads, exactly.
template <typename T> __device__ __forceinline__ float quant_in(T x) { return static_cast<float>(to_acc(x)); }

// The code of `x` in a group of scale `scale`.
__device__ __forceinline__ uint8_t quantize_one(float x, float scale) {
    const float y = __fdiv_rn(x, scale);
    if (isnan(y)) return 0x7f;
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
}

// The value code `q` of a group of scale `scale` stands for, in `T`
// (one f32 multiplication, then rounded to T).
template <typename T> __device__ __forceinline__ T dequantize_one(uint8_t q, float scale) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
    return from_acc<T>(static_cast<typename Acc<T>::type>(__fmul_rn(__half2float(__half(h)), scale)));
}

// The scale of a group whose elements a warp holds, from each lane's
// amax of its share (the whole warp): the group's amax / 448, or 1 where
// that is zero.
__device__ __forceinline__ float warp_group_scale(float amax) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = __fdiv_rn(amax, kE4m3Max);
    return scale == 0.0f ? 1.0f : scale;
}

// Most groups a warp of `quantize_groups` has in flight.
constexpr int kQuantBatch = 4;

// Groups g0, g0 + step, … below g1 of the `len` elements at `x`, by a
// whole warp: lane l takes elements l, l + 32, l + 64 and l + 96 of each,
// the loads of up to kQuantBatch groups in flight together. Each group's
// codes go into every one of the `n` code rows `q[k]` (at the group's
// elements) and its scale into every `scales[k]` (at the group's index).
template <typename T>
__device__ __forceinline__ void quantize_groups(const T *x, int64_t len, int64_t g0, int64_t g1, int64_t step,
                                                uint8_t *const *q, float *const *scales, int n) {
    const int lane = threadIdx.x % 32;
    constexpr int kPer = kQuantGroup / 32;
    for (int64_t g = g0; g < g1; g += step * kQuantBatch) {
        float v[kQuantBatch][kPer];
#pragma unroll
        for (int b = 0; b < kQuantBatch; b++)
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                const int64_t i = (g + b * step) * kQuantGroup + lane + 32 * j;
                v[b][j] = g + b * step < g1 && i < len ? quant_in(x[i]) : 0.0f;
            }
#pragma unroll
        for (int b = 0; b < kQuantBatch; b++) {
            const int64_t gb = g + b * step;
            if (gb >= g1) break;  // the same on every lane
            float amax = 0.0f;
#pragma unroll
            for (int j = 0; j < kPer; j++) amax = fmaxf(amax, fabsf(v[b][j]));
            const float scale = warp_group_scale(amax);
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                const int64_t i = gb * kQuantGroup + lane + 32 * j;
                if (i >= len) continue;
                const uint8_t code = quantize_one(v[b][j], scale);
                for (int k = 0; k < n; k++) q[k][i] = code;
            }
            if (lane == 0)
                for (int k = 0; k < n; k++) scales[k][gb] = scale;
        }
    }
}

}  // namespace k
}  // namespace shmem
