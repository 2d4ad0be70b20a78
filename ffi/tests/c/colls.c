/* Every collective, every type and op, odd counts, in-place and out-of-place, across forked
 * processes, compared bit for bit with a reference (inputs are small integers, so every result
 * is exact in every type and in any reduction order). */
#include "common.h"

/* Built with -DOXCCL_DEVICE (and -lcuda) by cuda/gpu-check.sh: the same checks on device
 * buffers, enqueued on a CUDA stream and observed by synchronising it. */
#ifdef OXCCL_DEVICE
#include <cuda.h>
static CUstream g_stream;
#define CU(x) do { CUresult e_ = (x); EXPECT(e_ == CUDA_SUCCESS, "%s: CUDA error %d", #x, (int)e_); } while (0)
static void dev_init(void) {
  CUdevice d;
  CUcontext c;
  CU(cuInit(0));
  CU(cuDeviceGet(&d, 0));
  CU(cuDevicePrimaryCtxRetain(&c, d));
  CU(cuCtxSetCurrent(c));
  CU(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
}
#define STREAM ((cudaStream_t)g_stream)
#else
#define STREAM NULL
#endif

enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_ALLTOALL, C_GATHER, C_SCATTER };
static const char* kColl[] = {"allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall", "gather", "scatter"};
#define PREMUL 99

typedef struct { int coll, op, n, r; size_t c; int root, is_float; } Ctx;

static double in_val(int op, int r, size_t i) {
  switch (op) {
    case ncclSum: case PREMUL: return (double)((r + i) % 3);
    case ncclProd: return (double)(1 + (r + i) % 2);
    case ncclMax: case ncclMin: return (double)((r * 7 + i) % 5);
    case ncclAvg: return (double)(i % 2 + r);
    default: return (double)((r * 3 + i) % 5); /* data of the collectives that do not reduce */
  }
}

static double reduced(int op, int n, size_t i, int is_float) {
  double acc = in_val(op, 0, i);
  for (int q = 1; q < n; q++) {
    double v = in_val(op, q, i);
    switch (op) {
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: acc += v;
    }
  }
  if (op == ncclAvg) acc = is_float ? acc / n : floor(acc / n); /* integers: NCCL divides with truncation */
  if (op == PREMUL) acc *= 2;
  return acc;
}

static double want(size_t i, void* p) {
  Ctx* x = (Ctx*)p;
  size_t c = x->c;
  switch (x->coll) {
    case C_ALLREDUCE: case C_REDUCE: return reduced(x->op, x->n, i, x->is_float);
    case C_REDUCESCATTER: return reduced(x->op, x->n, x->r * c + i, x->is_float);
    case C_ALLGATHER: case C_GATHER: return in_val(-1, (int)(i / c), i % c);
    case C_BROADCAST: return in_val(-1, x->root, i);
    case C_ALLTOALL: return in_val(-1, (int)(i / c), x->r * c + i % c);
    default: return in_val(-1, x->root, x->r * c + i); /* scatter */
  }
}

static void run_one(ncclComm_t comm, int coll, int t, int op, size_t c, int root, int inplace) {
  int n, r;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &r));
  size_t es = type_size(t);
  int reduces = coll == C_ALLREDUCE || coll == C_REDUCE || coll == C_REDUCESCATTER;
  int dop = reduces ? op : -1;
  /* element counts of input and output, NCCL's convention */
  size_t nin = c, nout = c;
  if (coll == C_REDUCESCATTER) nin = n * c;
  if (coll == C_ALLGATHER || coll == C_GATHER) nout = n * c;
  if (coll == C_ALLTOALL) nin = nout = n * c;
  if (coll == C_SCATTER) nin = n * c;
  size_t total = (nin > nout ? nin : nout) + 16;
  char* a = calloc(total, es);
  char* b = calloc(total, es);
  /* input, and NCCL's in-place layout where asked */
  char* sendp = a;
  char* recvp = b;
  if (inplace) {
    recvp = a;
    if (coll == C_ALLGATHER || (coll == C_GATHER && r == root)) sendp = a + r * c * es;
    if (coll == C_SCATTER && r == root) recvp = a + r * c * es;
    if (coll == C_REDUCESCATTER) recvp = a + r * c * es;
  }
  int only_root_input = coll == C_SCATTER || coll == C_BROADCAST;
  for (size_t i = 0; i < nin; i++) {
    if (only_root_input && r != root) break;
    put_val(sendp, t, i, in_val(dop, r, i));
  }
  ncclRedOp_t rop = (ncclRedOp_t)op;
  if (op == PREMUL) {
    unsigned char two[8];
    put_val(two, t, 0, 2.0);
    CHECK(ncclRedOpCreatePreMulSum(&rop, two, (ncclDataType_t)t, ncclScalarHostImmediate, comm));
  }
  ncclDataType_t dt = (ncclDataType_t)t;
#ifdef OXCCL_DEVICE
  char* host_a = a;
  char* host_b = b;
  /* mirror both allocations on the device; pointers keep their offsets */
  CUdeviceptr da, db;
  CU(cuMemAlloc(&da, total * es));
  CU(cuMemAlloc(&db, total * es));
  /* on the collective's stream: a synchronous copy from pageable memory may return before
   * the data reaches the device, and a non-blocking stream would not wait for it */
  CU(cuMemcpyHtoDAsync(da, a, total * es, g_stream));
  CU(cuMemcpyHtoDAsync(db, b, total * es, g_stream));
  int recv_in_a = recvp >= host_a && recvp < host_a + total * es;
  size_t recv_off = (size_t)(recv_in_a ? recvp - host_a : recvp - host_b);
  sendp = (char*)da + (sendp - host_a);
  recvp = (recv_in_a ? (char*)da : (char*)db) + recv_off;
  a = (char*)da;
  b = (char*)db;
#endif
  switch (coll) {
    case C_ALLREDUCE: CHECK(ncclAllReduce(sendp, recvp, c, dt, rop, comm, STREAM)); break;
    case C_REDUCE: CHECK(ncclReduce(sendp, r == root ? recvp : NULL, c, dt, rop, root, comm, STREAM)); break;
    case C_REDUCESCATTER: CHECK(ncclReduceScatter(sendp, recvp, c, dt, rop, comm, STREAM)); break;
    case C_ALLGATHER: CHECK(ncclAllGather(sendp, recvp, c, dt, comm, STREAM)); break;
    case C_BROADCAST:
      if (inplace) CHECK(ncclBcast(sendp, c, dt, root, comm, STREAM));
      else CHECK(ncclBroadcast(sendp, recvp, c, dt, root, comm, STREAM));
      break;
    case C_ALLTOALL: CHECK(ncclAlltoAll(sendp, recvp, c, dt, comm, STREAM)); break;
    case C_GATHER: CHECK(ncclGather(sendp, recvp, c, dt, root, comm, STREAM)); break;
    case C_SCATTER: CHECK(ncclScatter(sendp, recvp, c, dt, root, comm, STREAM)); break;
  }
#ifdef OXCCL_DEVICE
  CU(cuStreamSynchronize(g_stream));
  CU(cuMemcpyDtoH(host_a, da, total * es));
  CU(cuMemcpyDtoH(host_b, db, total * es));
  CU(cuMemFree(da));
  CU(cuMemFree(db));
  recvp = (recv_in_a ? host_a : host_b) + recv_off;
  a = host_a;
  b = host_b;
#endif
  if (op == PREMUL) CHECK(ncclRedOpDestroy(rop, comm));
  int has_output = !((coll == C_REDUCE || coll == C_GATHER) && r != root);
  if (has_output) {
    int is_float = t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
                   t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
    Ctx x = {coll, dop, n, r, c, root, is_float};
    const char* out = (inplace && coll == C_ALLGATHER) || (inplace && coll == C_GATHER) ? a : recvp;
    size_t bad = count_wrong(out, t, nout, want, &x);
    EXPECT(bad == 0, "%s %s op %d count %zu root %d %s: %zu of %zu elements wrong", kColl[coll], kTypeNames[t],
           op, c, root, inplace ? "in-place" : "out-of-place", bad, nout);
    /* nothing written past the output */
    for (size_t k = 0; k < 16 * es; k++) {
      const char* base = inplace ? a : b;
      size_t used = inplace ? (nin > nout ? nin : nout) : nout;
      EXPECT(base[used * es + k] == 0, "%s wrote past its output", kColl[coll]);
    }
  }
  free(a);
  free(b);
}

static void body(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm;
#ifdef OXCCL_DEVICE
  dev_init(); /* after the fork: every rank is a process of its own (CUDA IPC between them) */
#endif
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  const size_t counts[] = {1, 7, 1001};
  const int ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, PREMUL};
  int checks = 0;
  for (int ti = 0; ti < NTYPES; ti++) {
    int t = kTypes[ti];
    for (int ci = 0; ci < 3; ci++) {
      size_t c = counts[ci];
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int oi = 0; oi < 6; oi++) {
          run_one(comm, C_ALLREDUCE, t, ops[oi], c, 0, inplace);
          run_one(comm, C_REDUCE, t, ops[oi], c, 1 % nranks, inplace);
          run_one(comm, C_REDUCESCATTER, t, ops[oi], c, 0, inplace);
          checks += 3;
        }
        for (int coll = C_ALLGATHER; coll <= C_SCATTER; coll++) {
          if (coll == C_ALLTOALL && inplace) continue; /* no in-place form */
          run_one(comm, coll, t, ncclSum, c, (int)(c % nranks), inplace);
          checks++;
        }
      }
    }
  }
  CHECK(ncclCommDestroy(comm));
#ifdef OXCCL_DEVICE
  if (rank == 0) printf("colls (device buffers): %d checks per rank passed on %d ranks\n", checks, nranks);
#else
  if (rank == 0) printf("colls: %d checks per rank passed on %d ranks\n", checks, nranks);
#endif
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  return run_ranks(n, body);
}
