/* A rank process that exits while its peer holds its buffer mapped over CUDA IPC: the peer's
 * next collective fails with an error that names the dead rank (no crash, no hang), and it can
 * still destroy its communicator (closing the mapping). Device buffers, 2 forked ranks; run
 * under a GPU or oxccl's simulated driver. */
#include "common.h"
#include <cuda.h>
#include <time.h>

#define CU(x) do { CUresult e_ = (x); EXPECT(e_ == CUDA_SUCCESS, "%s: CUDA error %d", #x, (int)e_); } while (0)

static void body(int rank, int nranks, ncclUniqueId id) {
  enum { N = 1 << 16 };
  CUdevice d;
  CUcontext c;
  CUstream s;
  CUdeviceptr buf;
  CU(cuInit(0));
  CU(cuDeviceGet(&d, 0));
  CU(cuDevicePrimaryCtxRetain(&c, d));
  CU(cuCtxSetCurrent(c));
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU(cuMemAlloc(&buf, N * sizeof(float)));
  CU(cuMemsetD8(buf, 0, N * sizeof(float)));
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  for (int i = 0; i < 3; i++) CHECK(ncclAllReduce((void*)buf, (void*)buf, N, ncclFloat, ncclSum, comm, (cudaStream_t)s));
  CU(cuStreamSynchronize(s));
  if (rank == 1) _exit(0); /* gone, its memory still mapped by rank 0 */
  usleep(300 * 1000);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ncclResult_t rc = ncclAllReduce((void*)buf, (void*)buf, N, ncclFloat, ncclSum, comm, (cudaStream_t)s);
  ncclResult_t st = ncclSuccess;
  for (int i = 0; i < 2000 && rc == ncclSuccess && st == ncclSuccess; i++) {
    if (cuStreamQuery(s) == CUDA_SUCCESS) CHECK(ncclCommGetAsyncError(comm, &st));
    else usleep(5000);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  EXPECT(rc != ncclSuccess || st != ncclSuccess, "a collective with a dead peer succeeded");
  const char* msg = ncclGetLastError(comm);
  EXPECT(strstr(msg, "rank 1"), "the error does not name rank 1: %s", msg);
  EXPECT(secs < 10, "the failure took %.1f s", secs);
  ncclCommAbort(comm); /* releases its IPC mappings of the dead rank's memory */
  CU(cuMemFree(buf));
  printf("dev_exit: the peer's death was reported in %.2f s (%s)\n", secs, msg);
}

int main(void) {
  setenv("OXCCL_TIMEOUT", "30", 0);
  return run_ranks(2, body); /* rank 1 exits early, with status 0, by design */
}
