// Weight-streaming GEMV for a few rows: y[M, N] = x[M, K] @ w[N, K]^T, bf16 in and out, fp32
// accumulation. Each warp owns R rows of w; lane l reads 16-byte vectors l, l + 32, ... of
// each row (K % 256 == 0), U vectors per row in flight, the next batch loaded before the
// current one is multiplied (double-buffered registers). x (M rows) is read through L1 and
// shared by the warp's R rows. One warp-shuffle reduction per (row, x row) at the end.
#include <cuda_bf16.h>
#include <stdint.h>

template <int M, int R, int U>
__device__ __forceinline__ void load_batch(uint4 (&buf)[U][R], const uint4* const (&rows)[R],
                                           int v, int nvec) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int c = v + u * 32;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c < nvec) buf[u][r] = __ldcs(rows[r] + c);
      else buf[u][r] = make_uint4(0, 0, 0, 0);
    }
  }
}

__device__ __forceinline__ void unpack(uint32_t word, float& lo, float& hi) {
  lo = __uint_as_float(word << 16);
  hi = __uint_as_float(word & 0xffff0000u);
}

template <int M, int R, int U>
__device__ __forceinline__ void gemv(const __nv_bfloat16* __restrict__ x,
                                     const __nv_bfloat16* __restrict__ w,
                                     __nv_bfloat16* __restrict__ y, int N, int K, int warps) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n0 = (blockIdx.x * warps + warp) * R;
  const int nvec = K / 8;
  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int n = min(n0 + r, N - 1);
    rows[r] = reinterpret_cast<const uint4*>(w + (size_t)n * K);
  }
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  uint4 cur[U][R], nxt[U][R];
  load_batch<M, R, U>(cur, rows, lane, nvec);
  for (int v = lane; v < nvec; v += 32 * U) {
    load_batch<M, R, U>(nxt, rows, v + 32 * U, nvec);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int c = v + u * 32;
      if (c < nvec) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          uint4 a = __ldg(xv + (size_t)m * nvec + c);
          float xf[8];
          unpack(a.x, xf[0], xf[1]); unpack(a.y, xf[2], xf[3]);
          unpack(a.z, xf[4], xf[5]); unpack(a.w, xf[6], xf[7]);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float wf[8];
            unpack(cur[u][r].x, wf[0], wf[1]); unpack(cur[u][r].y, wf[2], wf[3]);
            unpack(cur[u][r].z, wf[4], wf[5]); unpack(cur[u][r].w, wf[6], wf[7]);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) cur[u][r] = nxt[u][r];
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      acc[r][m] = s;
    }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (n0 + r < N)
#pragma unroll
        for (int m = 0; m < M; ++m) y[(size_t)m * N + n0 + r] = __float2bfloat16(acc[r][m]);
  }
}

#define GEMV(W, R, U)                                                                      \
  extern "C" __global__ void __launch_bounds__(W * 32)                                     \
      gemv_w##W##_r##R##_u##U(const __nv_bfloat16* x, const __nv_bfloat16* w,             \
                              __nv_bfloat16* y, int N, int K) {                            \
    gemv<4, R, U>(x, w, y, N, K, W);                                                       \
  }

GEMV(4, 1, 4)
GEMV(4, 1, 8)
GEMV(4, 2, 2)
GEMV(4, 2, 4)
GEMV(4, 4, 2)
GEMV(8, 2, 2)
GEMV(8, 2, 4)
GEMV(8, 4, 2)
GEMV(2, 4, 4)
