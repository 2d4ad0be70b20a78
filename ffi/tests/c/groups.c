/* Groups of send/recv forming a ring (nested groups), ncclCommInitAll with threads and with one
 * thread driving every communicator in a group, split (NOCOLOR gives NULL), non-blocking
 * communicators polled with ncclCommGetAsyncError, historic ncclConfig_t layouts, abort from
 * another thread, the queries, and a group of thousands of operations. */
#include <pthread.h>
#include <time.h>
#include "common.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define PHASE(name) \
  do { if (getenv("OXCCL_TEST_TRACE")) fprintf(stderr, "rank %d: %s\n", g_rank, name); } while (0)

static ncclResult_t wait_ready(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  double t0 = now();
  while (st == ncclInProgress && now() - t0 < 60) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st == ncclInProgress) usleep(50); /* poll, as PyTorch does, without starving others */
  }
  return st;
}

static void ring_body(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm;
  PHASE("init");
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  PHASE("ring");
  int version;
  CHECK(ncclGetVersion(&version));
  EXPECT(version >= 21800, "version %d", version);
  int count, me, dev;
  CHECK(ncclCommCount(comm, &count));
  CHECK(ncclCommUserRank(comm, &me));
  CHECK(ncclCommCuDevice(comm, &dev));
  EXPECT(count == n && me == rank, "count %d rank %d", count, me);
  /* a ring of send/recv in nested groups, several rounds, odd sizes */
  for (int round = 0; round < 5; round++) {
    size_t c = 1 + round * 997;
    int* s = malloc(c * sizeof(int));
    int* r = malloc(c * sizeof(int));
    for (size_t i = 0; i < c; i++) s[i] = rank * 1000000 + (int)i + round;
    CHECK(ncclGroupStart());
    CHECK(ncclGroupStart());
    CHECK(ncclSend(s, c, ncclInt32, (rank + 1) % n, comm, NULL));
    CHECK(ncclGroupEnd());
    CHECK(ncclRecv(r, c, ncclInt32, (rank + n - 1) % n, comm, NULL));
    CHECK(ncclGroupEnd());
    int from = (rank + n - 1) % n;
    for (size_t i = 0; i < c; i++) EXPECT(r[i] == from * 1000000 + (int)i + round, "ring element %zu", i);
    free(s);
    free(r);
  }
  PHASE("big group");
  /* thousands of one-element all-reduces in one group (MoE and FSDP buckets do this): each
   * operation's buffers are checked, each result exact */
  {
    enum { K = 5000 };
    int* s = malloc(K * sizeof(int));
    int* r = malloc(K * sizeof(int));
    for (int i = 0; i < K; i++) s[i] = i * 3 + rank;
    CHECK(ncclGroupStart());
    for (int i = 0; i < K; i++) CHECK(ncclAllReduce(s + i, r + i, 1, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupEnd());
    for (int i = 0; i < K; i++) EXPECT(r[i] == n * i * 3 + n * (n - 1) / 2, "big group element %d = %d", i, r[i]);
    free(s);
    free(r);
  }
  PHASE("split");
  /* split: even ranks together, odd ranks together, the last rank opts out */
  ncclComm_t sub;
  int color = rank == n - 1 ? NCCL_SPLIT_NOCOLOR : rank % 2;
  CHECK(ncclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    EXPECT(sub == NULL, "NOCOLOR gives NULL");
  } else {
    int sn, sr;
    CHECK(ncclCommCount(sub, &sn));
    CHECK(ncclCommUserRank(sub, &sr));
    int expect_n = 0;
    for (int q = 0; q < n - 1; q++) expect_n += q % 2 == color;
    EXPECT(sn == expect_n, "split size %d, expected %d", sn, expect_n);
    float v = (float)(rank + 1), sum = 0;
    CHECK(ncclAllReduce(&v, &sum, 1, ncclFloat32, ncclSum, sub, NULL));
    float want = 0;
    for (int q = 0; q < n - 1; q++) if (q % 2 == color) want += q + 1;
    EXPECT(sum == want, "split allreduce %f, expected %f", sum, want);
    CHECK(ncclCommDestroy(sub));
  }
  PHASE("nonblocking");
  /* a non-blocking communicator (historic 48-byte config, as NCCL 2.18 laid it out) */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.size = 48;
  cfg.version = 21800;
  cfg.blocking = 0;
  ncclComm_t nb;
  ncclResult_t rc = ncclCommSplit(comm, 0, rank, &nb, &cfg);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "nonblocking split %d", rc);
  EXPECT(wait_ready(nb) == ncclSuccess, "nonblocking comm ready");
  double buf[333];
  for (int i = 0; i < 333; i++) buf[i] = rank + i;
  rc = ncclAllReduce(buf, buf, 333, ncclFloat64, ncclSum, nb, NULL);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "nonblocking allreduce %d", rc);
  rc = wait_ready(nb);
  EXPECT(rc == ncclSuccess, "nonblocking allreduce done: %d %s", rc, ncclGetLastError(NULL));
  for (int i = 0; i < 333; i++) EXPECT(buf[i] == n * (n - 1) / 2.0 + n * i, "nonblocking element %d", i);
  PHASE("finalize");
  CHECK(ncclCommFinalize(nb));
  CHECK(ncclCommDestroy(nb));
  CHECK(ncclCommDestroy(comm));
}

/* ncclCommInitAll: one thread per rank, then one thread driving all ranks in a group */
#define NDEV 4
static ncclComm_t g_comms[NDEV];

static void* thread_rank(void* arg) {
  int i = (int)(intptr_t)arg;
  int v[3] = {i, 2 * i, 3 * i}, out[3];
  CHECK(ncclAllReduce(v, out, 3, ncclInt32, ncclSum, g_comms[i], NULL));
  for (int k = 0; k < 3; k++) EXPECT(out[k] == (k + 1) * (NDEV * (NDEV - 1) / 2), "threaded allreduce");
  return NULL;
}

static void* abort_later(void* arg) {
  usleep(300000);
  CHECK(ncclCommAbort((ncclComm_t)arg));
  return NULL;
}

static ncclResult_t g_blocked_rc;
static double g_blocked_took;

static void* blocked_allreduce(void* arg) {
  float x = 1, y;
  double t0 = now();
  g_blocked_rc = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, (ncclComm_t)arg, NULL);
  g_blocked_took = now() - t0;
  return NULL;
}

static void init_all_and_abort(void) {
  g_rank = 0;
  int devs[NDEV] = {3, 2, 1, 0};
  CHECK(ncclCommInitAll(g_comms, NDEV, devs));
  for (int i = 0; i < NDEV; i++) {
    int d;
    CHECK(ncclCommCuDevice(g_comms[i], &d));
    EXPECT(d == devs[i], "device of comm %d is %d", i, d);
  }
  pthread_t th[NDEV];
  for (int i = 0; i < NDEV; i++) pthread_create(&th[i], NULL, thread_rank, (void*)(intptr_t)i);
  for (int i = 0; i < NDEV; i++) pthread_join(th[i], NULL);
  /* one thread, every communicator, one group */
  long long v[NDEV][5];
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++) {
    for (int k = 0; k < 5; k++) v[i][k] = i * k;
    CHECK(ncclAllReduce(v[i], v[i], 5, ncclInt64, ncclMax, g_comms[i], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++)
    for (int k = 0; k < 5; k++) EXPECT(v[i][k] == (long long)(NDEV - 1) * k, "grouped allreduce");
  /* comm 1 waits in one thread for ranks that never come; a second thread using the same
   * communicator meanwhile is refused; a third aborts it */
  pthread_t ab, w;
  pthread_create(&ab, NULL, abort_later, g_comms[1]);
  pthread_create(&w, NULL, blocked_allreduce, g_comms[1]);
  usleep(100000);
  float x = 1, y;
  ncclResult_t rc = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, g_comms[1], NULL);
  EXPECT(rc == ncclInvalidUsage, "a communicator used from two threads at once: %d (%s)", rc, ncclGetLastError(NULL));
  EXPECT(strstr(ncclGetLastError(NULL), "two threads") != NULL, "message: %s", ncclGetLastError(NULL));
  pthread_join(w, NULL);
  pthread_join(ab, NULL);
  EXPECT(g_blocked_rc != ncclSuccess, "an aborted allreduce fails");
  EXPECT(g_blocked_took < 1.5, "abort took %.2f s", g_blocked_took);
  int cnt;
  EXPECT(ncclCommCount(g_comms[1], &cnt) == ncclInvalidArgument, "an aborted handle is invalid");
  for (int i = 0; i < NDEV; i++)
    if (i != 1) CHECK(ncclCommAbort(g_comms[i]));
  printf("groups: InitAll, threads, grouped ranks and abort passed\n");
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  if (run_ranks(n, ring_body)) return 1;
  printf("groups: send/recv ring, split, non-blocking passed on %d ranks\n", n);
  init_all_and_abort();
  return 0;
}
