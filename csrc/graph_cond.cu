// Sets the condition of a CUDA graph WHILE node from device memory: the block graph's round
// body ends with this kernel, so the loop "while masks remain and rounds < T" runs on the GPU.
// Needs CUDA >= 12.4 (conditional graph nodes). Built on first use by dlrt/runtime/cuda_while.py.
#include <cuda_runtime.h>

extern "C" __global__ void dlrt_set_condition(cudaGraphConditionalHandle handle,
                                              const int* flag) {
  cudaGraphSetConditional(handle, *flag != 0 ? 1u : 0u);
}
