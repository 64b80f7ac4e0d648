// The persistent round: one resident CTA per SM runs every task of a block round of a dense
// SDAR model, in the order of its queue (`dlrt/runtime/persistent/plan.py`: task kinds,
// counters, queues; the host encodes the plan and fills `Params`,
// `dlrt/runtime/persistent/kernel.py`). Dependencies are counters in global memory: thread 0
// spins until each counter the task waits for reaches its count (acquire), the CTA runs the
// task, and thread 0 adds one to each counter the task signals (after a fence: release). The
// attention split whose add completes its head's count then merges the head's splits and adds
// one to the layer's merged counter, so a layer is five dependent steps (qkv, attention, o,
// gate_up, down).
// Data written by other CTAs in this round (activations, the block's K/V) is read with
// ld.global.cg (L2, never a stale L1 line); weights with the read-only path. The last CTA to
// finish zeroes the counters for the next round. When a task is picked, one thread asks L2
// for the first bytes of the next projection's weight rows in the queue (they do not depend
// on the inputs); a wait past `wait_limit_ns` prints what it waited for and traps.
//
// Numerics follow `dlrt/runtime/persistent/interpret.py` (the layer path on the reference
// ops): RMSNorm statistics in fp32, the normalised value rounded to T before the weight
// multiply (rounded again); each projection output rounded to T, the residual add in T;
// SiLU(gate) rounded, times up rounded; q/k RMSNorm and neox RoPE as `rope_rotate`; attention
// split over the context with fp32 online-softmax states merged per KV head.
// Element type T: __nv_bfloat16 or float (the fp32 kernel serves the CPU-equivalent tests).
// Built on first use with NVRTC, else nvcc (sm_90; CUDA >= 12.4).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#ifndef __CUDACC_RTC__
#include <stdint.h>
#include <cstdio>
#else
// NVRTC has no libc headers: what this file takes from them (printf is built in)
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_B = 16;     // block rows
constexpr int MAX_DL = 8;     // head_dim / 32 (head_dim <= 256)

// a loop over a lane's head dims (lane + 32 i, i < nd) unrolled, so per-lane arrays stay in
// registers
#define FOR_DL(i) _Pragma("unroll") for (int i = 0; i < MAX_DL; ++i) if (i < nd)

enum Kind { QKV = 0, ATTN = 1, O_PROJ = 2, GATE_UP = 3, DOWN = 4, LM_HEAD = 5 };

struct Params {
  // the plan
  const int* task;       // [T, 8]: kind, layer, lo, hi, head, split, weight index, then
                         // (attn: the counter the head's merge adds to, by the last split)
  const int* wait_off;   // [T + 1]
  const int* waits;      // [NW, 2]: counter, count
  const int* sig_off;    // [T + 1]
  const int* sigs;       // [NS]
  const int* queue_off;  // [W + 1]
  const int* queue;      // [T]
  int* counters;         // [C + 1]: the plan's counters, then the finished-CTA count
  int num_counters;
  // sizes
  int B, H, Hq, Hkv, D, I, V, L, splits, chunk_block, rot_half, full_rope, page_size;
  float eps;
  float scale;  // the softmax scale, head_dim ** -0.5 as the host computes it
  // weights (element type T): the plan's weight list; per-layer norm weights
  const void* const* weights;
  const void* const* in_norm;
  const void* const* post_norm;
  const void* const* q_norm;
  const void* const* k_norm;
  const void* final_norm;
  // the KV cache of each layer [pages, page_size, Hkv, D] and the request's lengths
  void* const* k_cache;
  void* const* v_cache;
  const int* page_table;
  const int* lens;  // (start, kv_len)
  const float* cos;  // [B, rot_half]
  const float* sin;
  // activations (T) and split states (fp32)
  void* stream;    // [B, H]
  void* qkv;       // [B, (Hq + 2 Hkv) D]
  void* attn_out;  // [B, Hq D]
  void* act;       // [B, I]
  void* logits;    // [B, V]
  float* part_ml;  // [Hkv, splits, B G, 2]
  float* part_o;   // [Hkv, splits, B G, D]
  long long* timeline;  // nullptr, or [T, 4] ns: task picked, its waits done, its work done,
                        // and the time its CTA waited for weight pages within the work
  long long prefetch_bytes;  // weight bytes of a task prefetched into L2 before its waits
  // A round takes milliseconds: a dependency that has not arrived after this long never will
  // (a CTA not resident, a plan fault), and the kernel traps instead of hanging the device
  // (0: wait for ever, e.g. under a debugger)
  long long wait_limit_ns;
  // the weight page ring (sm_90): `pages` pages of PAGE_BYTES at byte `page_offset` of the
  // dynamic shared memory; 0 pages: the projections read their weights from global memory
  int pages;
  int page_offset;
  // FP8 projections: per weight of `weights`, its block scales (float32, one per 128 columns
  // of a scale row; nullptr for a T weight) and (is e4m3, weight rows per scale row: 128 for
  // 128 x 128 blocks, 1 for a scale row per weight row)
  const float* const* scales;
  const int* wmeta;
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
// x rounded to T and back: the value torch holds after an op in T
template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f(from_f<T>(x)); }

// loads of data another CTA wrote this round: L2 only
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float ldcg(const __nv_bfloat16* p) {
  unsigned short v = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return __bfloat162float(__ushort_as_bfloat16(v));
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 bytes of weights as floats
template <typename T> struct Vec;
// (weights: the read-only path; shared: the staged inputs)
template <> struct Vec<float> {
  static constexpr int N = 4;
  __device__ static void unpack(int4 v, float* out) {
    out[0] = __int_as_float(v.x); out[1] = __int_as_float(v.y);
    out[2] = __int_as_float(v.z); out[3] = __int_as_float(v.w);
  }
  __device__ static void load(const float* p, float* out) {
    unpack(__ldg(reinterpret_cast<const int4*>(p)), out);
  }
  __device__ static void load_shared(const float* p, float* out) {
    unpack(*reinterpret_cast<const int4*>(p), out);
  }
  __device__ static int4 pack(const float* v) {
    return make_int4(__float_as_int(v[0]), __float_as_int(v[1]), __float_as_int(v[2]),
                     __float_as_int(v[3]));
  }
};
template <> struct Vec<__nv_bfloat16> {
  static constexpr int N = 8;
  __device__ static void unpack(int4 v, float* out) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x; out[2 * i + 1] = f.y;
    }
  }
  __device__ static void load(const __nv_bfloat16* p, float* out) {
    unpack(__ldg(reinterpret_cast<const int4*>(p)), out);
  }
  __device__ static void load_shared(const __nv_bfloat16* p, float* out) {
    unpack(*reinterpret_cast<const int4*>(p), out);
  }
  __device__ static int4 pack(const float* v) {  // v already holds bf16 values: exact
    int4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return r;
  }
};

// The input rows of a projection into shared memory (T): norm_w == nullptr: x as it is; else
// RMSNorm(x) * norm_w with the reference's roundings. The rows are
// copied with 16-byte L2 loads, STAGE_UNROLL of them in flight per thread (K * sizeof(T) is a
// multiple of 16, `check_supported`); the norm's statistics and scaling then read shared
// memory.
constexpr int STAGE_UNROLL = 8;
template <typename T>
__device__ void stage_input(const Params& p, const T* x, int K, const T* norm_w, T* xs) {
  __shared__ float rstd[MAX_B];
  constexpr int N = Vec<T>::N;
  const int pieces = p.B * K / N;
  const int4* src = reinterpret_cast<const int4*>(x);
  int4* dst = reinterpret_cast<int4*>(xs);
  for (int i0 = threadIdx.x; i0 < pieces; i0 += THREADS * STAGE_UNROLL) {
    int4 v[STAGE_UNROLL];
#pragma unroll
    for (int u = 0; u < STAGE_UNROLL; ++u)
      if (i0 + u * THREADS < pieces) v[u] = __ldcg(src + i0 + u * THREADS);
#pragma unroll
    for (int u = 0; u < STAGE_UNROLL; ++u)
      if (i0 + u * THREADS < pieces) dst[i0 + u * THREADS] = v[u];
  }
  __syncthreads();
  if (norm_w == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row_pieces = K / N;
  for (int b = warp; b < p.B; b += WARPS) {
    float s = 0.f;
    for (int i = lane; i < row_pieces; i += 32) {
      float v[N];
      Vec<T>::unpack(dst[b * row_pieces + i], v);
#pragma unroll
      for (int j = 0; j < N; ++j) s += v[j] * v[j];
    }
    s = warp_sum(s);
    if (lane == 0) rstd[b] = rsqrtf(s / K + p.eps);
  }
  __syncthreads();
  const int4* wn = reinterpret_cast<const int4*>(norm_w);
  for (int i = threadIdx.x; i < pieces; i += THREADS) {
    const int b = i / row_pieces;
    float v[N], w[N];
    Vec<T>::unpack(dst[i], v);
    Vec<T>::unpack(__ldg(wn + i % row_pieces), w);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = rnd<T>(w[j] * rnd<T>(v[j] * rstd[b]));
    dst[i] = Vec<T>::pack(v);
  }
  __syncthreads();
}

// acc[r][b] = sum_k w_r[k] * xs[b, k] for two weight rows (one row: passed twice) and
// the staged input rows (warp-wide; every lane gets the sums). The loops run over BT rows
// without a guard: rows b >= B read row 0 again (`x_rows`), and their sums are never stored.
// Each staged input value read from shared memory serves both weight rows. The main loop
// takes UNROLL 16-byte weight loads per row and lane at once (fewer for larger BT, whose
// products per load are more), with no branch between the loads and their products; a tail
// loop takes the last K % (32 N UNROLL).
template <int BT>
__device__ __forceinline__ void x_rows(int B, int K, int (&xoff)[BT]) {
#pragma unroll
  for (int b = 0; b < BT; ++b) xoff[b] = b < B ? b * K : 0;
}

// A projection's weights as the kernel reads them: T, or e4m3 codes with a float32 scale per
// 128 columns of the row (the weight is code * scale rounded to T, as the layer path's
// dequantised weight). One 16-byte load holds N weights.
enum WType { W_T = 0, W_E4M3 = 1 };
template <typename T, int WT> struct WVec;
template <typename T> struct WVec<T, W_T> {
  static constexpr int N = Vec<T>::N, ITEM = sizeof(T);
  __device__ static void unpack(int4 raw, const float*, int, float* out) {
    Vec<T>::unpack(raw, out);
  }
};
template <typename T> struct WVec<T, W_E4M3> {
  static constexpr int N = 16, ITEM = 1;
  // the 16 codes of columns k..k+15 (one 128-column scale block) times the block's scale
  __device__ static void unpack(int4 raw, const float* scale_row, int k, float* out) {
    const float scale = __ldg(scale_row + k / 128);
    const __nv_fp8x2_storage_t* c = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(c[i], __NV_E4M3);  // exact
      const float2 f = __half22float2(__half2(h));
      out[2 * i] = rnd<T>(f.x * scale);
      out[2 * i + 1] = rnd<T>(f.y * scale);
    }
  }
};

// A weight row: its bytes and, for e4m3, its scale row.
struct WRow {
  const unsigned char* w;
  const float* s;
};

template <typename T, int BT, int WT>
__device__ __forceinline__ void dot_step(const int4 (&raw)[2], const WRow (&rows)[2], const T* xs,
                                         const int (&xoff)[BT], int k, float (&acc)[2][BT]) {
  constexpr int NW = WVec<T, WT>::N, NX = Vec<T>::N;
  float wv[2][NW];
  WVec<T, WT>::unpack(raw[0], rows[0].s, k, wv[0]);
  WVec<T, WT>::unpack(raw[1], rows[1].s, k, wv[1]);
#pragma unroll
  for (int b = 0; b < BT; ++b) {
#pragma unroll
    for (int c = 0; c < NW / NX; ++c) {
      // 16 bytes per lane; consecutive lanes 16 x NW / NX bytes apart (e4m3: 2-way bank
      // conflicts in bf16, 4-way in fp32)
      float xv[NX];
      Vec<T>::load_shared(xs + xoff[b] + k + c * NX, xv);
#pragma unroll
      for (int j = 0; j < NX; ++j) {
        acc[0][b] = fmaf(wv[0][c * NX + j], xv[j], acc[0][b]);
        acc[1][b] = fmaf(wv[1][c * NX + j], xv[j], acc[1][b]);
      }
    }
  }
}

template <typename T, int BT, int WT>
__device__ __forceinline__ void rows_dot(const WRow (&rows)[2], const T* xs,
                                         const int (&xoff)[BT], int K, float (&acc)[2][BT]) {
  constexpr int N = WVec<T, WT>::N, ITEM = WVec<T, WT>::ITEM;
  constexpr int UNROLL = BT <= 4 ? 8 : BT <= 8 ? 4 : 2, STEP = 32 * N * UNROLL;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int b = 0; b < BT; ++b) acc[0][b] = acc[1][b] = 0.f;
  int k0 = 0;
  for (; k0 + STEP <= K; k0 += STEP) {
    int4 raw[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const size_t off = (size_t)(k0 + (u * 32 + lane) * N) * ITEM;
      raw[u][0] = __ldg(reinterpret_cast<const int4*>(rows[0].w + off));
      raw[u][1] = __ldg(reinterpret_cast<const int4*>(rows[1].w + off));
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      dot_step<T, BT, WT>(raw[u], rows, xs, xoff, k0 + (u * 32 + lane) * N, acc);
  }
  for (int k = k0 + lane * N; k < K; k += 32 * N) {
    const int4 raw[2] = {__ldg(reinterpret_cast<const int4*>(rows[0].w + (size_t)k * ITEM)),
                         __ldg(reinterpret_cast<const int4*>(rows[1].w + (size_t)k * ITEM))};
    dot_step<T, BT, WT>(raw, rows, xs, xoff, k, acc);
  }
#pragma unroll
  for (int b = 0; b < BT; ++b) {
    acc[0][b] = warp_sum(acc[0][b]);
    acc[1][b] = warp_sum(acc[1][b]);
  }
}

// The epilogue of output row r of a projection: y[b] (fp32 sums) rounded to T, then stored
// (qkv, logits), added to the residual stream (o_proj, down) or, with the up row's sums u[b],
// SiLU(gate) * up into the activation (gate_up). Every lane of the warp calls it (each holds
// all the sums); lane b < B stores block row b, so the stream's reads are in flight together.
template <typename T, int BT>
__device__ __forceinline__ void store_row(const Params& p, int kind, int r, const float (&y)[BT],
                                          const float (&u)[BT]) {
  const int b = threadIdx.x % 32;
  if (b >= p.B) return;
  float yb = y[0], ub = u[0];
#pragma unroll
  for (int i = 1; i < BT; ++i) {
    if (b == i) { yb = y[i]; ub = u[i]; }
  }
  const float v = rnd<T>(yb);
  switch (kind) {
    case QKV:
      static_cast<T*>(p.qkv)[(size_t)b * (p.Hq + 2 * p.Hkv) * p.D + r] = from_f<T>(v);
      break;
    case O_PROJ:
    case DOWN: {
      T* s = static_cast<T*>(p.stream) + (size_t)b * p.H + r;
      *s = from_f<T>(v + ldcg(s));
      break;
    }
    case GATE_UP: {
      const float silu = rnd<T>(v / (1.f + expf(-v)));
      static_cast<T*>(p.act)[(size_t)b * p.I + r] = from_f<T>(silu * rnd<T>(ub));
      break;
    }
    case LM_HEAD:
      static_cast<T*>(p.logits)[(size_t)b * p.V + r] = from_f<T>(v);
      break;
  }
}

// ---- The weight page ring (sm_90) --------------------------------------------------------
// Weights do not depend on activations, so thread 0 streams the projections' weights into a
// ring of shared-memory pages with bulk copies (cp.async.bulk, completion counted in bytes on
// one mbarrier per page), in the order the CTA will use them, up to `pages` pages ahead:
// while the CTA waits on a dependency or runs an attention task, the next projection's first
// pages are already arriving. A page holds PAGE_ROWS weight rows (gate_up: 8 gate rows and
// the matching 8 up rows) by KC columns; a task's rows go in groups of PAGE_ROWS, each group
// in K slices of KC. The CTA consumes pages in the same order; after every warp has used a
// page (a CTA barrier), thread 0 refills its slot with the next page to come.
constexpr int PAGE_ROWS = 16;
constexpr int PAGE_BYTES = 32768;
constexpr int MAX_PAGES = 6;

[[maybe_unused]] __device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// the next page thread 0 will issue: queue entry, row group, K slice; and the pages issued
struct PageCursor {
  int qi, grp, ks, issued;
};

// the rows of a projection task's page group: rows a warp-pair group covers
__device__ __forceinline__ int group_rows(int kind) { return kind == GATE_UP ? 8 : PAGE_ROWS; }

// a projection's K (its input row length) and the bytes of one weight element (e4m3 or T)
__device__ __forceinline__ int task_k(const Params& p, int kind) {
  return kind == O_PROJ ? p.Hq * p.D : kind == DOWN ? p.I : p.H;
}
template <typename T>
__device__ __forceinline__ int weight_item(const Params& p, int widx) {
  return p.wmeta[2 * widx] ? 1 : (int)sizeof(T);
}

template <typename T>
__device__ void ring_wait(const Params& p, unsigned long long* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  const long long t0 = now_ns();
  for (int spin = 0;; ++spin) {
    unsigned ok;
    asm volatile("{\n .reg .pred done;\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 done, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, done;\n}"
                 : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    if (ok) return;
    if ((spin & 255) == 255 && p.wait_limit_ns > 0 && now_ns() - t0 > p.wait_limit_ns) {
      if (threadIdx.x == 0)
        printf("dlrt_persistent_round: CTA %d waited for a weight page\n", (int)blockIdx.x);
      __trap();
    }
  }
#endif
}

// Thread 0: issue the page at `cur` (if the CTA has one left) into slot cur.issued % pages.
template <typename T>
__device__ void ring_issue(const Params& p, PageCursor& cur, unsigned char* ring,
                           unsigned long long* bars) {
#if __CUDA_ARCH__ >= 900
  const int end = p.queue_off[blockIdx.x + 1];
  // attention tasks have no pages, nor would an empty tile (the consumer's groups loop is
  // empty too)
  while (cur.qi < end && (p.task[8 * p.queue[cur.qi]] == ATTN ||
                          p.task[8 * p.queue[cur.qi] + 3] <= p.task[8 * p.queue[cur.qi] + 2]))
    ++cur.qi;
  if (cur.qi >= end) return;
  const int* d = p.task + 8 * p.queue[cur.qi];
  const int kind = d[0], lo = d[2], hi = d[3], K = task_k(p, kind);
  const int item = weight_item<T>(p, d[6]);
  const int KC = PAGE_BYTES / (PAGE_ROWS * item);
  const int gr = group_rows(kind), groups = (hi - lo + gr - 1) / gr;
  const int kslices = (K + KC - 1) / KC;
  const unsigned char* w = static_cast<const unsigned char*>(p.weights[d[6]]);
  const int slot = cur.issued % p.pages;
  unsigned char* page = ring + (size_t)slot * PAGE_BYTES;
  const int k0 = cur.ks * KC, kw = min(KC, K - k0);
  const int first = lo + cur.grp * gr, valid = min(gr, hi - first);
  const int copies = kind == GATE_UP ? 2 * valid : valid;
  const unsigned bytes = (unsigned)(kw * item);
  unsigned long long* bar = bars + slot;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_u32(bar)), "r"(bytes * copies) : "memory");
  for (int i = 0; i < copies; ++i) {
    // page row i: gate_up rows 0..7 the gate rows, 8..15 the up rows (I + r)
    const int r = kind == GATE_UP ? (i < valid ? first + i : p.I + first + i - valid)
                                  : first + i;
    const int prow = kind == GATE_UP && i >= valid ? 8 + i - valid : i;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];"
                 :: "r"(smem_u32(page + (size_t)prow * KC * item)),
                    "l"(w + ((size_t)r * K + k0) * item), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
  }
  ++cur.issued;
  if (++cur.ks == kslices) {
    cur.ks = 0;
    if (++cur.grp == groups) { cur.grp = 0; ++cur.qi; }
  }
#endif
}

// A projection task from the page ring: per row group, the warp's two rows (gate_up: its gate
// row and up row) over each K slice's page, then the group's epilogue.
template <typename T, int BT, int WT>
__device__ long long gemv_pages(const Params& p, int kind, int lo, int hi, const T* xs, int K,
                                const WRow& base, int scale_rows, PageCursor& cur,
                                int& consumed, unsigned char* ring, unsigned long long* bars) {
  long long page_wait = 0;  // ns waited for pages (stamped rounds only)
  constexpr int N = WVec<T, WT>::N, ITEM = WVec<T, WT>::ITEM;
  constexpr int KC = PAGE_BYTES / (PAGE_ROWS * ITEM);
  const int KB = (K + 127) / 128;  // scale blocks a scale row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = group_rows(kind), groups = (hi - lo + gr - 1) / gr;
  const int kslices = (K + KC - 1) / KC;
  int xoff[BT];
  x_rows<BT>(p.B, K, xoff);
  for (int grp = 0; grp < groups; ++grp) {
    const int first = lo + grp * gr, valid = min(gr, hi - first);
    // this warp's page rows and output rows
    const int i0 = kind == GATE_UP ? warp : 2 * warp;
    const int i1 = kind == GATE_UP ? 8 + warp : 2 * warp + 1;
    const bool has0 = kind == GATE_UP ? warp < valid : i0 < valid;
    const bool has1 = kind == GATE_UP ? has0 : i1 < valid;
    // the weight rows' scale rows (e4m3)
    const int r0 = kind == GATE_UP ? first + warp : first + i0;
    const int r1 = kind == GATE_UP ? p.I + first + warp : has1 ? first + i1 : r0;
    WRow rows[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
    if (WT == W_E4M3) {
      rows[0].s = base.s + (size_t)(r0 / scale_rows) * KB;
      rows[1].s = base.s + (size_t)(r1 / scale_rows) * KB;
    }
    float acc[2][BT];
#pragma unroll
    for (int b = 0; b < BT; ++b) acc[0][b] = acc[1][b] = 0.f;
    for (int ks = 0; ks < kslices; ++ks) {
      const int slot = consumed % p.pages;
      const long long w0 = p.timeline != nullptr ? now_ns() : 0;
      ring_wait<T>(p, bars + slot, (unsigned)(consumed / p.pages) & 1u);
      if (p.timeline != nullptr) page_wait += now_ns() - w0;
      const unsigned char* page = ring + (size_t)slot * PAGE_BYTES;
      const int k0 = ks * KC, kw = min(KC, K - k0);
      if (has0) {
        const unsigned char* p0 = page + (size_t)i0 * KC * ITEM;
        const unsigned char* p1 = has1 ? page + (size_t)i1 * KC * ITEM : p0;
#pragma unroll 4
        for (int c = lane * N; c < kw; c += 32 * N) {
          const int4 raw[2] = {*reinterpret_cast<const int4*>(p0 + (size_t)c * ITEM),
                               *reinterpret_cast<const int4*>(p1 + (size_t)c * ITEM)};
          dot_step<T, BT, WT>(raw, rows, xs, xoff, k0 + c, acc);
        }
      }
      __syncthreads();  // every warp is done with the slot
      if (threadIdx.x == 0) {
#if __CUDA_ARCH__ >= 900
        // the slot's reads (generic proxy) before the bulk copies' writes (async proxy)
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
        ring_issue<T>(p, cur, ring, bars);
      }
      ++consumed;
    }
    if (has0) {
#pragma unroll
      for (int b = 0; b < BT; ++b) {
        acc[0][b] = warp_sum(acc[0][b]);
        acc[1][b] = warp_sum(acc[1][b]);
      }
      if (kind == GATE_UP) {
        store_row<T, BT>(p, kind, first + warp, acc[0], acc[1]);
      } else {
        store_row<T, BT>(p, kind, first + i0, acc[0], acc[0]);
        if (has1) store_row<T, BT>(p, kind, first + i1, acc[1], acc[1]);
      }
    }
  }
  return page_wait;
}

// A projection task's rows from global memory (no page ring), weight type WT.
template <typename T, int BT, int WT>
__device__ void gemv_rows(const Params& p, int kind, int lo, int hi, const T* xs, int K,
                          const WRow& base, int scale_rows) {
  constexpr int ITEM = WVec<T, WT>::ITEM;
  const int warp = threadIdx.x / 32, KB = (K + 127) / 128;
  int xoff[BT];
  x_rows<BT>(p.B, K, xoff);
  const auto row = [&](int r) {
    WRow x{base.w + (size_t)r * K * ITEM, nullptr};
    if (WT == W_E4M3) x.s = base.s + (size_t)(r / scale_rows) * KB;
    return x;
  };
  float acc[2][BT];
  if (kind == GATE_UP) {  // a warp takes gate row r with up row I + r
    for (int r = lo + warp; r < hi; r += WARPS) {
      const WRow rows[2] = {row(r), row(p.I + r)};
      rows_dot<T, BT, WT>(rows, xs, xoff, K, acc);
      store_row<T, BT>(p, kind, r, acc[0], acc[1]);
    }
    return;
  }
  for (int r = lo + 2 * warp; r < hi; r += 2 * WARPS) {  // else rows r and r + 1
    const bool two = r + 1 < hi;
    const WRow rows[2] = {row(r), row(two ? r + 1 : r)};
    rows_dot<T, BT, WT>(rows, xs, xoff, K, acc);
    store_row<T, BT>(p, kind, r, acc[0], acc[0]);
    if (two) store_row<T, BT>(p, kind, r + 1, acc[1], acc[1]);
  }
}

// A projection task; returns the ns its thread waited for weight pages (0 without the ring).
template <typename T, int BT>
__device__ long long gemv_task(const Params& p, int kind, int layer, int lo, int hi, int widx,
                               T* xs, PageCursor& cur, int& consumed, unsigned char* ring,
                               unsigned long long* bars) {
  const int K = task_k(p, kind);
  const T* x = static_cast<const T*>(p.stream);
  const T* norm_w = nullptr;
  if (kind == QKV) norm_w = static_cast<const T*>(p.in_norm[layer]);
  if (kind == GATE_UP) norm_w = static_cast<const T*>(p.post_norm[layer]);
  if (kind == LM_HEAD) norm_w = static_cast<const T*>(p.final_norm);
  if (kind == O_PROJ) x = static_cast<const T*>(p.attn_out);
  if (kind == DOWN) x = static_cast<const T*>(p.act);
  stage_input<T>(p, x, K, norm_w, xs);
  const WRow base{static_cast<const unsigned char*>(p.weights[widx]), p.scales[widx]};
  const bool e4m3 = p.wmeta[2 * widx] != 0;
  const int scale_rows = p.wmeta[2 * widx + 1];
  if (p.pages > 0) {
    return e4m3 ? gemv_pages<T, BT, W_E4M3>(p, kind, lo, hi, xs, K, base, scale_rows, cur,
                                            consumed, ring, bars)
                : gemv_pages<T, BT, W_T>(p, kind, lo, hi, xs, K, base, scale_rows, cur,
                                         consumed, ring, bars);
  }
  if (e4m3) gemv_rows<T, BT, W_E4M3>(p, kind, lo, hi, xs, K, base, scale_rows);
  else gemv_rows<T, BT, W_T>(p, kind, lo, hi, xs, K, base, scale_rows);
  return 0;
}

// q/k RMSNorm over D and neox RoPE of one head vector (lane holds dims lane + 32 i)
template <typename T>
__device__ void norm_rope(const Params& p, float* v, const T* norm_w, int b) {
  const int lane = threadIdx.x % 32, nd = p.D / 32;
  float s = 0.f;
  FOR_DL(i) s += v[i] * v[i];
  float r = rsqrtf(warp_sum(s) / p.D + p.eps);
  FOR_DL(i) v[i] = rnd<T>(to_f(norm_w[lane + 32 * i]) * rnd<T>(v[i] * r));
  // neox: dims d < R/2 pair with d + R/2; dims >= R pass through
  __shared__ float buf[WARPS][256];
  float* row = buf[threadIdx.x / 32];
  FOR_DL(i) row[lane + 32 * i] = v[i];
  __syncwarp();
  const int half = p.rot_half;
  FOR_DL(i) {
    int d = lane + 32 * i;
    if (d >= 2 * half) continue;
    int f = d % half;
    float c = p.cos[b * half + f], sn = p.sin[b * half + f];
    float other = d < half ? -row[d + half] : row[d - half];
    // products and sum rounded one by one, as torch's elementwise ops (no FMA contraction)
    if (p.full_rope) {
      v[i] = rnd<T>(__fadd_rn(__fmul_rn(row[d], c), __fmul_rn(other, sn)));
    } else {
      c = rnd<T>(c); sn = rnd<T>(sn);
      v[i] = rnd<T>(__fadd_rn(rnd<T>(__fmul_rn(row[d], c)), rnd<T>(__fmul_rn(other, sn))));
    }
  }
  __syncwarp();
}

// q/k RMSNorm and RoPE of KV head g's rows of the block, read from the qkv projection: the
// rotated queries into qs [B G, D] (fp32 holding T values), the block's K and V rows into kb,
// vb [B, D] (T); with write_cache, K and V also into the cache at the block's positions.
template <typename T>
__device__ void block_rope(const Params& p, int layer, int g, bool write_cache, float* qs,
                           T* kb, T* vb) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nd = p.D / 32;
  const int G = p.Hq / p.Hkv, n = (p.Hq + 2 * p.Hkv) * p.D;
  const T* qkv = static_cast<const T*>(p.qkv);
  const int start = p.lens[0];
  // per block row: G query heads, then k, then v
  for (int item = warp; item < p.B * (G + 2); item += WARPS) {
    int b = item / (G + 2), h = item % (G + 2);
    int col = h < G ? (g * G + h) * p.D : h == G ? (p.Hq + g) * p.D : (p.Hq + p.Hkv + g) * p.D;
    float v[MAX_DL];
    FOR_DL(i) v[i] = ldcg(qkv + (size_t)b * n + col + lane + 32 * i);
    if (h < G) {
      norm_rope<T>(p, v, static_cast<const T*>(p.q_norm[layer]), b);
      float* q = qs + (size_t)(b * G + h) * p.D;
      FOR_DL(i) q[lane + 32 * i] = v[i];
    } else {
      if (h == G) norm_rope<T>(p, v, static_cast<const T*>(p.k_norm[layer]), b);
      T* own = (h == G ? kb : vb) + (size_t)b * p.D;
      FOR_DL(i) own[lane + 32 * i] = from_f<T>(v[i]);
      if (write_cache) {
        int pos = start + b;
        long slot = (long)p.page_table[pos / p.page_size] * p.page_size + pos % p.page_size;
        T* cache = static_cast<T*>(h == G ? p.k_cache[layer] : p.v_cache[layer]);
        T* dst = cache + (slot * p.Hkv + g) * p.D;
        FOR_DL(i) dst[lane + 32 * i] = from_f<T>(v[i]);
      }
    }
  }
}

// One (KV head, context split): first the head's RoPE (`block_rope`; split 0 writes the
// block's K/V into the cache), then the keys of the split in chunks of CH, each chunk's K and
// V rows loaded once into shared memory (the block's own positions from the task's rows, the
// rest from the cache) and used by every query row of the head's group (a warp per row: lane j
// scores key j of the chunk, then each lane updates its head dims); the rows' online-softmax
// states (max, sum, unnormalised output) live in shared memory.
constexpr int CH = 32;
template <typename T>
__device__ void attn_task(const Params& p, int layer, int g, int split, unsigned char* smem) {
  constexpr int VE = 16 / sizeof(T);  // elements per 16-byte piece
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nd = p.D / 32, D = p.D;
  const int G = p.Hq / p.Hkv, rows = p.B * G, DP = D + VE;  // padded rows: no bank conflicts
  const int start = p.lens[0], kv_len = p.lens[1];
  int span = (kv_len + p.splits - 1) / p.splits;
  span = span < 1 ? 1 : span;
  const int lo = split * span, hi = min(lo + span, kv_len);
  T* ks = reinterpret_cast<T*>(smem);  // [CH, DP]
  T* vs = ks + CH * DP;                // [CH, DP]
  float* qs = reinterpret_cast<float*>(vs + CH * DP);  // [rows, D]
  float* as = qs + rows * D;           // [rows, D]: sum_j p_j v_j
  float* ms = as + rows * D;           // [rows]: running max
  float* ls = ms + rows;               // [rows]: sum_j p_j
  // [B, D] each: the block's K and V rows, from the next 16-byte boundary (D * sizeof(T) is a
  // multiple of 16, so vb is aligned too)
  T* kb = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(ls + rows) + 15) & ~uintptr_t(15));
  T* vb = kb + p.B * D;
  block_rope<T>(p, layer, g, split == 0, qs, kb, vb);
  for (int i = threadIdx.x; i < rows * D; i += THREADS) as[i] = 0.f;
  for (int r = threadIdx.x; r < rows; r += THREADS) { ms[r] = -INFINITY; ls[r] = 0.f; }
  const T* kc = static_cast<const T*>(p.k_cache[layer]);
  const T* vc = static_cast<const T*>(p.v_cache[layer]);
  const int pieces = D / VE;
  for (int c0 = lo; c0 < hi; c0 += CH) {
    const int n = min(CH, hi - c0);
    __syncthreads();  // the previous chunk's rows are read; the states are set up
    for (int i = threadIdx.x; i < 2 * n * pieces; i += THREADS) {
      const int v = i >= n * pieces, rem = i - v * n * pieces;
      const int j = rem / pieces, pc = rem % pieces, pos = c0 + j;
      int4 piece;
      if (pos >= start && pos < start + p.B) {  // the block's own row, this task's copy
        piece = *reinterpret_cast<const int4*>((v ? vb : kb) + (pos - start) * D + pc * VE);
      } else {
        const long slot =
            (long)p.page_table[pos / p.page_size] * p.page_size + pos % p.page_size;
        const T* src = (v ? vc : kc) + (slot * p.Hkv + g) * D + pc * VE;
        piece = __ldcg(reinterpret_cast<const int4*>(src));
      }
      *reinterpret_cast<int4*>((v ? vs : ks) + j * DP + pc * VE) = piece;
    }
    __syncthreads();
    for (int row = warp; row < rows; row += WARPS) {
      const int b = row / G;
      float s = -INFINITY;
      const int j = c0 + lane;
      if (lane < n && (p.chunk_block == 0 || j < start ||
                       (j - start) / p.chunk_block <= b / p.chunk_block)) {
        const float* qr = qs + row * D;
        const T* kr = ks + lane * DP;
        float acc = 0.f;
        for (int d = 0; d < D; d += VE) {
          float kv[VE];
          Vec<T>::load_shared(kr + d, kv);
#pragma unroll
          for (int e = 0; e < VE; ++e) acc = fmaf(qr[d + e], kv[e], acc);
        }
        s = acc * p.scale;
      }
      const float m_old = ms[row];
      float m_new = s;
      for (int o = 16; o > 0; o >>= 1) m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, o));
      m_new = fmaxf(m_new, m_old);
      if (m_new == -INFINITY) continue;  // no visible key yet (warp-uniform)
      const float e = s == -INFINITY ? 0.f : expf(s - m_new);
      const float alpha = expf(m_old - m_new);  // 0 when m_old is -inf
      const float sum = warp_sum(e);
      float* ar = as + row * D;
      float a[MAX_DL];
      FOR_DL(i) a[i] = ar[lane + 32 * i] * alpha;
      for (int k = 0; k < n; ++k) {
        const float pk = __shfl_sync(0xffffffffu, e, k);  // one shuffle per key
        const T* vr = vs + k * DP + lane;
        FOR_DL(i) a[i] = fmaf(pk, to_f(vr[32 * i]), a[i]);
      }
      FOR_DL(i) ar[lane + 32 * i] = a[i];
      __syncwarp();
      if (lane == 0) { ms[row] = m_new; ls[row] = ls[row] * alpha + sum; }
    }
  }
  __syncthreads();
  const size_t base = ((size_t)g * p.splits + split) * rows;
  for (int i = threadIdx.x; i < rows * D; i += THREADS) p.part_o[base * D + i] = as[i];
  for (int r = threadIdx.x; r < rows; r += THREADS) {
    p.part_ml[2 * (base + r)] = ms[r];
    p.part_ml[2 * (base + r) + 1] = ls[r];
  }
}

template <typename T>
__device__ void merge_task(const Params& p, int g) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nd = p.D / 32;
  const int G = p.Hq / p.Hkv, rows = p.B * G;
  for (int row = warp; row < rows; row += WARPS) {
    int b = row / G, h = row % G;
    float m_all = -INFINITY;
    for (int s = 0; s < p.splits; ++s)
      m_all = fmaxf(m_all, ldcg(p.part_ml + 2 * (((size_t)g * p.splits + s) * rows + row)));
    float den = 0.f, num[MAX_DL];
    FOR_DL(i) num[i] = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      size_t idx = ((size_t)g * p.splits + s) * rows + row;
      float m = ldcg(p.part_ml + 2 * idx);
      if (m == -INFINITY) continue;
      float w = expf(m - m_all);
      den += w * ldcg(p.part_ml + 2 * idx + 1);
      FOR_DL(i) num[i] += w * ldcg(p.part_o + idx * p.D + lane + 32 * i);
    }
    T* out = static_cast<T*>(p.attn_out) + (size_t)b * p.Hq * p.D + (g * G + h) * p.D;
    FOR_DL(i) out[lane + 32 * i] = from_f<T>(num[i] / den);
  }
}

// Weights do not depend on activations: when a CTA picks a task it asks L2 for the first
// `prefetch_bytes` of the weight rows of the next projection in its queue (and of the task's
// own, for the first), so HBM streams while the CTA waits and works. gate_up: half from the
// gate rows, half from the up rows. One thread; bulk prefetches of at most 64 KiB, 16-byte
// multiples.
__device__ __forceinline__ void prefetch_l2(const void* ptr, long long bytes) {
#if __CUDA_ARCH__ >= 900  // the bulk prefetch is sm_90's; before it, no prefetch
  const char* p = static_cast<const char*>(ptr);
  for (long long off = 0; off + 16 <= bytes; off += 65536) {
    const unsigned n = (unsigned)min(bytes - off, 65536LL) & ~15u;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                 :: "l"(__cvta_generic_to_global(p + off)), "r"(n) : "memory");
  }
#endif
}

constexpr int PREFETCH_LOOKAHEAD = 8;  // queue entries searched for the next projection
template <typename T>
__device__ void prefetch_task(const Params& p, const int* d) {
  const int kind = d[0], lo = d[2], hi = d[3], widx = d[6];
  if (widx < 0 || p.prefetch_bytes <= 0) return;
  const size_t row = (size_t)task_k(p, kind) * weight_item<T>(p, widx);
  const unsigned char* w = static_cast<const unsigned char*>(p.weights[widx]);
  const long long tile = (long long)(hi - lo) * row;
  if (kind == GATE_UP) {
    const long long each = min(tile, p.prefetch_bytes / 2);
    prefetch_l2(w + lo * row, each);
    prefetch_l2(w + (p.I + lo) * row, each);
  } else {
    prefetch_l2(w + lo * row, min(tile, p.prefetch_bytes));
  }
}

template <typename T, int BT>
__device__ void round_kernel(const Params* pp) {
  // the parameters copied once into shared memory: reads of them are not global loads
  // repeated around every store through a T* (which might alias them)
  __shared__ __align__(16) unsigned char params[sizeof(Params)];
  static_assert(sizeof(Params) % 4 == 0 && sizeof(Params) / 4 <= THREADS, "Params size");
  if (threadIdx.x < sizeof(Params) / 4)
    reinterpret_cast<int*>(params)[threadIdx.x] = reinterpret_cast<const int*>(pp)[threadIdx.x];
  __syncthreads();
  const Params& p = *reinterpret_cast<const Params*>(params);
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  __shared__ int s_task[8];
  __shared__ int s_last;  // this attention split completed its head: it merges
  __shared__ __align__(8) unsigned long long bars[MAX_PAGES];  // the page ring's mbarriers
  unsigned char* ring = smem + p.page_offset;
  PageCursor cur{p.queue_off[blockIdx.x], 0, 0, 0};  // (thread 0's)
  int consumed = 0;                                    // (every thread's)
#if __CUDA_ARCH__ >= 900
  if (p.pages > 0 && threadIdx.x == 0) {
    for (int i = 0; i < p.pages; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(bars + i)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int i = 0; i < p.pages; ++i) ring_issue<T>(p, cur, ring, bars);
  }
#else
  if (p.pages > 0) __trap();  // no bulk copies before sm_90: the host never asks for pages
#endif
  __syncthreads();
  const int cta = blockIdx.x, q_end = p.queue_off[cta + 1];
  int ahead = p.queue_off[cta] - 1;  // (thread 0) the last queue entry prefetched
  for (int qi = p.queue_off[cta]; qi < q_end; ++qi) {
    const int t = p.queue[qi];
    if (threadIdx.x == 0) {
      if (p.timeline != nullptr) p.timeline[4 * t] = now_ns();
      // this task's weights (if not asked for already), then the next projection's in the
      // queue: its weights stream into L2 during this task's waits and work
      if (ahead < qi) prefetch_task<T>(p, p.task + 8 * t);
      ahead = max(ahead, qi);
      for (int j = ahead + 1; j < q_end && j <= qi + PREFETCH_LOOKAHEAD; ++j) {
        if (p.task[8 * p.queue[j] + 6] >= 0) {
          prefetch_task<T>(p, p.task + 8 * p.queue[j]);
          ahead = j;
          break;
        }
      }
      for (int i = p.wait_off[t]; i < p.wait_off[t + 1]; ++i) {
        const int* c = p.counters + p.waits[2 * i];
        const int need = p.waits[2 * i + 1];
        const long long t0 = now_ns();
        int seen;
        while ((seen = ld_acquire(c)) < need) {
          __nanosleep(64);
          const long long waited = now_ns() - t0;
          if (p.wait_limit_ns > 0 && waited > p.wait_limit_ns) {  // fail, never hang
            printf("dlrt_persistent_round: CTA %d waited %lld ns on counter %d for task %d "
                   "(count %d of %d)\n", cta, waited, p.waits[2 * i], t, seen, need);
            __trap();
          }
        }
      }
      for (int i = 0; i < 8; ++i) s_task[i] = p.task[8 * t + i];
      if (p.timeline != nullptr) p.timeline[4 * t + 1] = now_ns();
    }
    __syncthreads();
    const int kind = s_task[0], layer = s_task[1], lo = s_task[2], hi = s_task[3];
    const int head = s_task[4], split = s_task[5], widx = s_task[6], then = s_task[7];
    long long page_wait = 0;
    if (kind == ATTN) attn_task<T>(p, layer, head, split, smem);
    else page_wait = gemv_task<T, BT>(p, kind, layer, lo, hi, widx, xs, cur, consumed, ring, bars);
    __syncthreads();  // every thread's stores are issued before the signal
    if (threadIdx.x == 0) {
      __threadfence();
      s_last = 0;
      for (int i = p.sig_off[t]; i < p.sig_off[t + 1]; ++i) {
        const int old = atomicAdd(p.counters + p.sigs[i], 1);
        // an attention split that completes its head's count merges the head's splits
        if (i == p.sig_off[t] && then >= 0 && old == p.splits - 1) s_last = 1;
      }
    }
    __syncthreads();
    if (s_last) {
      __threadfence();  // the other splits' states, released before their adds
      merge_task<T>(p, head);
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(p.counters + then, 1);
      }
    }
    if (threadIdx.x == 0 && p.timeline != nullptr) {
      p.timeline[4 * t + 2] = now_ns();
      p.timeline[4 * t + 3] = page_wait;
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.counters + p.num_counters, 1) == (int)gridDim.x - 1) {
      for (int c = 0; c <= p.num_counters; ++c) atomicExch(p.counters + c, 0);
      __threadfence();
    }
  }
}

}  // namespace

// One kernel per element type and block-row bound BT (4, 8, 16; B <= BT): the projections'
// loops over the block rows are unrolled to BT, so the instruction stream a warp runs
// through holds no code for rows beyond B.
#define DLRT_ROUND_KERNEL(NAME, T, BT)                                              \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const Params* p) { \
    round_kernel<T, BT>(p);                                                        \
  }
// Built with -DDLRT_ROUND_ONLY=n (1..6, in the order below), only that kernel is compiled: the
// host builds the one it launches (a sixth of the compile time); without it, all six.
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 1
DLRT_ROUND_KERNEL(dlrt_persistent_round_bf16_b4, __nv_bfloat16, 4)
#endif
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 2
DLRT_ROUND_KERNEL(dlrt_persistent_round_bf16_b8, __nv_bfloat16, 8)
#endif
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 3
DLRT_ROUND_KERNEL(dlrt_persistent_round_bf16_b16, __nv_bfloat16, 16)
#endif
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 4
DLRT_ROUND_KERNEL(dlrt_persistent_round_f32_b4, float, 4)
#endif
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 5
DLRT_ROUND_KERNEL(dlrt_persistent_round_f32_b8, float, 8)
#endif
#if !defined(DLRT_ROUND_ONLY) || DLRT_ROUND_ONLY == 6
DLRT_ROUND_KERNEL(dlrt_persistent_round_f32_b16, float, 16)
#endif
