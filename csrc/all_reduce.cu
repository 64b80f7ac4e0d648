// One-shot push all-reduce (sum) between 2..8 ranks whose GPUs reach each other's memory
// (CUDA IPC peer-to-peer), in one kernel launch with no barrier kernel and no host involvement,
// so a captured launch serves every replay of a CUDA graph (and every round of a WHILE node).
// Host side: dlrt/distributed/p2p.py (P2PAllReduce), which builds this file on first use with
// NVRTC, else nvcc (dlrt/kernels/cubin.py). NVLink multicast is never used (no multimem, no
// cuMulticast*).
//
// The symmetric buffer every rank owns (cudaMalloc'd, exported with cudaIpcGetMemHandle and
// opened by every peer), byte offsets from its base:
//
//   data   [2 parities][world][max_ctas][sub_bytes]   slot (parity, rank r): r's partials
//   flags  [world][DLRT_AR_MAX_CTAS] uint32 at flags_off  flag (r, c): the last call r's CTA c
//                                                       signalled to this rank
//   seq    [DLRT_AR_MAX_CTAS] uint32 at seq_off (only read by the owner): the calls CTA c made
//
// CTA c always works in sub-region c of a slot (whatever the grid of the call), so CTA index c
// runs its own protocol, independent of the other CTAs: its own region, flags and counter. All
// ranks make the same calls with the same sizes (so the same grid), so every rank's seq[c]
// stays equal. A call of CTA c:
//
//   s = seq[c] + 1, parity p = s & 1
//   push:   its chunk of the input into slot (p, my rank), sub-region c, of EVERY rank's buffer
//           (its own included)
//   signal: every thread fences at system scope, the CTA synchronises, and lane r of warp 0
//           stores flag (my rank, c) = s into rank r's buffer with st.release.sys
//   wait:   lane r of warp 0 polls flag (r, c) of its own buffer with ld.acquire.sys until it
//           is s or later (s + 1 when peer r has already gone on to its next call), then the CTA
//           synchronises
//   sum:    the world partials of its own buffer, IN RANK ORDER 0, 1, ..., world-1, in fp32,
//           cast to the dtype (round to nearest even): every rank gets the same bits
//   seq[c] = s
//
// Why parity double buffering makes reuse safe. Rank A writes slot (p, A) of rank B's buffer
// in call k (of CTA c) and again in call k+2, and B reads that slot in call k. A starts call
// k+2 only after its call k+1 finished (stream order), and A's call k+1 finishes only after it
// saw B's flag for k+1; B stores that flag only in its call k+1, which starts after B's call k
// (stream order), reads included, finished. Call k+1 writes the other parity, so it never
// touches what B may still be reading in call k. The same chain bounds the flags: while a rank
// waits for s, a peer's flag is s-1, s or s+1, never s+2 (which needs this rank's flag s+1), so
// "flag - s >= 0" (as signed 32-bit, wrapping) means "peer signalled s". Buffers start zeroed:
// flags 0 = "call 0 done", seq 0.
//
// A peer that never arrives ends in an error, not a hang: after timeout_ns of polling
// (%globaltimer) the kernel prints what it waited for and traps (the launch fails, the context
// is lost).
//
// Memory ordering (PTX memory model): pushed data is stored with weak stores; each thread's
// fence.sc.sys (__threadfence_system) orders them before the CTA barrier, and the barrier
// before lane r's st.release.sys of the flag, so the data is in causality order before the
// flag. The waiter's ld.acquire.sys of the flag, then the CTA barrier, order the flag before
// every thread's loads of the partials; those are ld.global.cg (L2, where peers' NVLink stores
// land), never a stale L1 line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#else
// NVRTC has no libc headers: what this file takes from them (printf is built in)
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#endif

#define DLRT_AR_MAX_WORLD 8
#define DLRT_AR_MAX_CTAS 128
#define DLRT_AR_THREADS 512

namespace {

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes of T
template <typename T> union Pack {
  static constexpr int N = 16 / sizeof(T);
  uint4 u;
  T e[N];
};

// Every rank's buffer, in rank order: eight named pointers, not an array, so that picking one
// by a runtime rank is a chain of selects in registers (an array indexed by a runtime value
// would live in local memory).
struct Bufs {
  char *b0, *b1, *b2, *b3, *b4, *b5, *b6, *b7;
  __device__ __forceinline__ char* operator[](int i) const {
    char* p = b0;
    p = i == 1 ? b1 : p;
    p = i == 2 ? b2 : p;
    p = i == 3 ? b3 : p;
    p = i == 4 ? b4 : p;
    p = i == 5 ? b5 : p;
    p = i == 6 ? b6 : p;
    p = i == 7 ? b7 : p;
    return p;
  }
};

template <typename T>
__device__ __forceinline__ void all_reduce(const T* __restrict__ in, T* __restrict__ out,
                                           long long n, long long chunk,
                                           const Bufs& bufs, int rank,
                                           int world, long long slot_bytes, long long sub_bytes,
                                           long long flags_off, long long seq_off,
                                           unsigned long long timeout_ns) {
  constexpr int V = Pack<T>::N;
  __shared__ uint32_t s_seq;
  const int c = blockIdx.x;
  char* const own = bufs[rank];
  uint32_t* const seq = reinterpret_cast<uint32_t*>(own + seq_off);
  if (threadIdx.x == 0) s_seq = seq[c] + 1u;
  __syncthreads();
  const uint32_t s = s_seq;
  const long long parity = s & 1u;

  const long long begin = static_cast<long long>(c) * chunk;
  long long len = n - begin < chunk ? n - begin : chunk;
  if (len < 0) len = 0;  // (the host never launches an empty CTA; it would still take part)
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) & 15u) == 0;
  const long long nvec = aligned ? len / V : 0;  // chunk is a multiple of V: 16-byte aligned
  const T* src = in + begin;
  const long long region = static_cast<long long>(c) * sub_bytes;
  const long long mine = (parity * world + rank) * slot_bytes + region;

  // push: my chunk into slot (parity, my rank), sub-region c, of every rank's buffer
  for (long long i = threadIdx.x; i < nvec; i += blockDim.x) {
    const uint4 v = reinterpret_cast<const uint4*>(src)[i];
#pragma unroll
    for (int r = 0; r < DLRT_AR_MAX_WORLD; ++r) {
      if (r < world) __stcg(reinterpret_cast<uint4*>(bufs[r] + mine) + i, v);
    }
  }
  for (long long i = nvec * V + threadIdx.x; i < len; i += blockDim.x) {
    const T v = src[i];
#pragma unroll
    for (int r = 0; r < DLRT_AR_MAX_WORLD; ++r) {
      if (r < world) reinterpret_cast<T*>(bufs[r] + mine)[i] = v;
    }
  }

  // signal: flag (my rank, c) = s in every rank's buffer, after all of this CTA's pushes
  __threadfence_system();
  __syncthreads();
  const int lane = threadIdx.x;
  if (lane < world) {
    uint32_t* flag = reinterpret_cast<uint32_t*>(bufs[lane] + flags_off) +
                     rank * DLRT_AR_MAX_CTAS + c;
    st_release_sys(flag, s);
  }

  // wait: flag (r, c) of my own buffer has reached s, for every rank r
  if (lane < world) {
    const uint32_t* flag = reinterpret_cast<const uint32_t*>(own + flags_off) +
                           lane * DLRT_AR_MAX_CTAS + c;
    const uint64_t start = global_ns();
    uint32_t polls = 0;
    uint32_t seen;
    while (static_cast<int>((seen = ld_acquire_sys(flag)) - s) < 0) {
      if ((++polls & 255u) == 0 && global_ns() - start > timeout_ns) {
        printf("dlrt all-reduce: rank %d CTA %d waited %llu ns for rank %d's call %u "
               "(its flag is at %u); trapping\n",
               rank, c, static_cast<unsigned long long>(global_ns() - start), lane, s, seen);
        __trap();
      }
    }
  }
  __syncthreads();

  // sum the partials of my own buffer in rank order, in fp32
  const char* const slots = own + parity * world * slot_bytes + region;
  for (long long i = threadIdx.x; i < nvec; i += blockDim.x) {
    float acc[V];
    Pack<T> p;
    p.u = __ldcg(reinterpret_cast<const uint4*>(slots) + i);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = to_float(p.e[j]);
#pragma unroll
    for (int r = 1; r < DLRT_AR_MAX_WORLD; ++r) {
      if (r < world) {
        p.u = __ldcg(reinterpret_cast<const uint4*>(slots + r * slot_bytes) + i);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += to_float(p.e[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) p.e[j] = from_float<T>(acc[j]);
    reinterpret_cast<uint4*>(out + begin)[i] = p.u;
  }
  for (long long i = nvec * V + threadIdx.x; i < len; i += blockDim.x) {
    float acc = to_float(__ldcg(reinterpret_cast<const T*>(slots) + i));
#pragma unroll
    for (int r = 1; r < DLRT_AR_MAX_WORLD; ++r) {
      if (r < world) {
        acc += to_float(__ldcg(reinterpret_cast<const T*>(slots + r * slot_bytes) + i));
      }
    }
    out[begin + i] = from_float<T>(acc);
  }

  if (threadIdx.x == 0) seq[c] = s;
}

}  // namespace

// in, out: n elements (out may not alias in); chunk: elements per CTA, a multiple of 16 bytes;
// b0..b7: every rank's buffer in rank order (this rank's own pointer at [rank], unused ones
// null); slot_bytes, sub_bytes, flags_off, seq_off: the layout above; timeout_ns: how long a
// CTA waits for a peer before it traps.
#define DLRT_AR_KERNEL(NAME, T)                                                               \
  extern "C" __global__ void __launch_bounds__(DLRT_AR_THREADS)                              \
      NAME(const T* in, T* out, long long n, long long chunk, char* b0, char* b1, char* b2,   \
           char* b3, char* b4, char* b5, char* b6, char* b7, int rank, int world,             \
           long long slot_bytes, long long sub_bytes, long long flags_off, long long seq_off, \
           unsigned long long timeout_ns) {                                                  \
    const Bufs bufs{b0, b1, b2, b3, b4, b5, b6, b7};                                         \
    all_reduce<T>(in, out, n, chunk, bufs, rank, world, slot_bytes, sub_bytes, flags_off,     \
                  seq_off, timeout_ns);                                                       \
  }

DLRT_AR_KERNEL(dlrt_all_reduce_bf16, __nv_bfloat16)
DLRT_AR_KERNEL(dlrt_all_reduce_fp16, __half)
DLRT_AR_KERNEL(dlrt_all_reduce_fp32, float)
