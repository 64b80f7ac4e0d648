// Sets the condition of a CUDA graph WHILE node from device memory: the block graph's round
// body ends with this kernel, so the loop "while masks remain and rounds < T" runs on the GPU.
// Needs CUDA >= 12.4 (conditional graph nodes). Built on first use by dlrt/runtime/graphs.py
// (NVRTC, else nvcc).
#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#else
// NOTE: NVRTC's cuda_runtime.h leaves out the device runtime API; these are the declarations
// of cuda_device_runtime_api.h and driver_types.h (the call is a driver-patched builtin).
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                   unsigned int value);
#endif

extern "C" __global__ void dlrt_set_condition(cudaGraphConditionalHandle handle,
                                              const int* flag) {
  cudaGraphSetConditional(handle, *flag != 0 ? 1u : 0u);
}
