/* The per-call config (NCCL 2.31's nccl*Config): an algorithm restriction that changes the
 * algorithm used (the script checks NCCL_DEBUG=INFO's "uses <algo> (algSelection ...)" lines),
 * forced and unforced unsatisfiable selections, a NULL config, and ranks that pass different
 * selections failing as a mismatch on every rank. Run with 2 or more ranks. */
#include "common.h"

static void fill(float* a, size_t n, int r) {
  for (size_t i = 0; i < n; i++) a[i] = (float)((r + i) % 3);
}

static void check_sum(const float* b, size_t n, int nranks, const char* what) {
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += (float)((q + i) % 3);
    EXPECT(b[i] == want, "%s: element %zu is %f, expected %f", what, i, b[i], want);
  }
}

static void body(int rank, int nranks, ncclUniqueId id) {
  enum { N = 4096 };
  static float a[N], b[N * 8];
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  fill(a, N, rank);
  /* NULL config: the plain call */
  CHECK(ncclAllReduceConfig(a, b, N, ncclFloat32, ncclSum, comm, NULL, NULL));
  check_sum(b, N, nranks, "NULL config");
  /* each restriction is honoured (and logged with its selection) */
  const char* sels[] = {"tree", "ring", "recdouble", "allreduce:rabenseifner;allgather:ring", "^ring,recdouble,rabenseifner,hierarchical"};
  for (int s = 0; s < 5; s++) {
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    cfg.algSelection = sels[s];
    cfg.userProfilerTag = 1000 + s;
    cfg.maxCTAs = 8; /* validated, ignored */
    memset(b, 0, sizeof b);
    CHECK(ncclAllReduceConfig(a, b, N, ncclFloat32, ncclSum, comm, NULL, &cfg));
    check_sum(b, N, nranks, sels[s]);
  }
  /* every collective takes a config */
  ncclCollConfig_t ring = NCCL_COLLCONFIG_INITIALIZER;
  ring.algSelection = "ring";
  CHECK(ncclAllGatherConfig(a, b, N, ncclFloat32, comm, NULL, &ring));
  CHECK(ncclReduceScatterConfig(b, a, N, ncclFloat32, ncclSum, comm, NULL, &ring));
  CHECK(ncclBroadcastConfig(a, b, N, ncclFloat32, 0, comm, NULL, &ring));
  CHECK(ncclReduceConfig(a, b, N, ncclFloat32, ncclSum, 0, comm, NULL, &ring));
  CHECK(ncclAlltoAllConfig(b, b + N * 4, 8, ncclFloat32, comm, NULL, &ring));
  CHECK(ncclGatherConfig(a, b, 8, ncclFloat32, 0, comm, NULL, &ring));
  CHECK(ncclScatterConfig(b, a, 8, ncclFloat32, 0, comm, NULL, &ring));
  /* tree for an all-gather cannot be honoured: an error when forced (the communicator stays
   * usable), the automatic choice when not */
  ncclCollConfig_t tree = NCCL_COLLCONFIG_INITIALIZER;
  tree.algSelection = "tree";
  ncclResult_t rc = ncclAllGatherConfig(a, b, N, ncclFloat32, comm, NULL, &tree);
  EXPECT(rc == ncclInvalidUsage, "forced unsatisfiable selection returned %d", rc);
  EXPECT(strstr(ncclGetLastError(comm), "leaves no algorithm for allgather"), "message: %s", ncclGetLastError(comm));
  tree.forceAlgSelection = 0;
  CHECK(ncclAllGatherConfig(a, b, N, ncclFloat32, comm, NULL, &tree));
  fill(a, N, rank);
  CHECK(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, NULL));
  check_sum(b, N, nranks, "after a refused call");
  /* ranks that disagree fail on every rank, naming the selection */
  ncclCollConfig_t mine = NCCL_COLLCONFIG_INITIALIZER;
  mine.algSelection = rank == 0 ? "ring" : "ring,tree";
  rc = ncclAllReduceConfig(a, b, N, ncclFloat32, ncclSum, comm, NULL, &mine);
  /* the ranks that see the mismatch report it (ncclInvalidUsage); any other rank fails by the
   * cascade (ncclRemoteError) with the first failure in its message */
  EXPECT(rc == ncclInvalidUsage || rc == ncclRemoteError, "mismatched selections returned %d (%s)", rc,
         ncclGetLastError(comm));
  const char* msg = ncclGetLastError(comm);
  EXPECT(strstr(msg, "algSelection") && (rc == ncclRemoteError || strstr(msg, "mismatch")), "message: %s", msg);
  ncclCommAbort(comm);
  if (rank == 0) printf("collconfig: selections honoured, refused and mismatched as documented\n");
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  return run_ranks(n, body);
}
