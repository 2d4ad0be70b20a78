/* The way a typical NCCL test program drives device buffers, through the CUDA runtime
 * (cudaMalloc, cudaMemcpy, streams, events): forked ranks, one GPU, an all-reduce and an
 * all-gather on a stream, timed with events, checked exactly. Built against the CUDA headers and
 * run under a real GPU or oxccl's simulated driver (cuda/sim's libcudart.so.12). */
#include "common.h"
#include <cuda_runtime.h>

#define CUDA(x) do { cudaError_t e_ = (x); EXPECT(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_)); } while (0)

static void body(int rank, int nranks, ncclUniqueId id) {
  enum { N = 1 << 15 };
  CUDA(cudaSetDevice(0));
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  float *d_in, *d_out, *h = malloc(sizeof(float) * N * nranks);
  CUDA(cudaMalloc((void**)&d_in, sizeof(float) * N));
  CUDA(cudaMalloc((void**)&d_out, sizeof(float) * N * nranks));
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));
  cudaEvent_t t0, t1;
  CUDA(cudaEventCreate(&t0));
  CUDA(cudaEventCreate(&t1));
  for (int i = 0; i < N; i++) h[i] = (float)((rank + i) % 5);
  CUDA(cudaMemcpy(d_in, h, sizeof(float) * N, cudaMemcpyHostToDevice));
  CUDA(cudaMemsetAsync(d_out, 0xff, sizeof(float) * N * nranks, s)); /* overwritten below, in order */
  CUDA(cudaEventRecord(t0, s));
  CHECK(ncclAllReduce(d_in, d_out, N, ncclFloat, ncclSum, comm, s));
  CUDA(cudaEventRecord(t1, s));
  CUDA(cudaStreamSynchronize(s));
  float ms = -1;
  CUDA(cudaEventElapsedTime(&ms, t0, t1));
  EXPECT(ms >= 0, "elapsed %f", ms);
  CUDA(cudaMemcpy(h, d_out, sizeof(float) * N, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += (float)((q + i) % 5);
    EXPECT(h[i] == want, "allreduce[%d] = %f, want %f", i, h[i], want);
  }
  CHECK(ncclAllGather(d_in, d_out, N, ncclFloat, comm, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaMemcpy(h, d_out, sizeof(float) * N * nranks, cudaMemcpyDefault));
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i += 97) EXPECT(h[q * N + i] == (float)((q + i) % 5), "allgather[%d][%d]", q, i);
  EXPECT(cudaGetLastError() == cudaSuccess, "a runtime error was left behind");
  CHECK(ncclCommDestroy(comm));
  CUDA(cudaEventDestroy(t0));
  CUDA(cudaEventDestroy(t1));
  CUDA(cudaStreamDestroy(s));
  CUDA(cudaFree(d_in));
  CUDA(cudaFree(d_out));
  free(h);
  if (rank == 0) printf("rt_colls: the CUDA runtime's way, %d ranks: all-reduce and all-gather exact\n", nranks);
}

int main(int argc, char** argv) { return run_ranks(argc > 1 ? atoi(argv[1]) : 2, body); }
