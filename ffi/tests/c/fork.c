/* fork() and oxccl's process-wide state (the classic NCCL test pattern): the unique id made in
 * the parent before fork, and made in a child after fork; init, collectives, destroy and abort
 * in the children; a communicator and the progress thread of the parent inherited by a child
 * (unusable there, released without touching the parent's connections, which keep working). */
#include "common.h"
#include <time.h>

static double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void wait_ready(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  double t0 = t_now();
  while (st == ncclInProgress && t_now() - t0 < 60) {
    CHECK(ncclCommGetAsyncError(comm, &st));
    if (st == ncclInProgress) usleep(50);
  }
  EXPECT(st == ncclSuccess, "async state %d: %s", st, ncclGetLastError(comm));
}

/* init, an all-reduce checked exactly (blocking and non-blocking), then destroy or abort */
static void rank_body(int rank, int nranks, ncclUniqueId id, int end_with_abort) {
  ncclComm_t comm, nb;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int a[64], b[64];
  for (int i = 0; i < 64; i++) a[i] = rank + i;
  CHECK(ncclAllReduce(a, b, 64, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 64; i++) EXPECT(b[i] == nranks * i + nranks * (nranks - 1) / 2, "b[%d] = %d", i, b[i]);
  /* a non-blocking communicator split off it: needs this process's own progress thread */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t rc = ncclCommSplit(comm, 0, rank, &nb, &cfg);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "split %d", rc);
  wait_ready(nb);
  rc = ncclAllReduce(a, b, 64, ncclInt32, ncclSum, nb, NULL);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "non-blocking allreduce %d", rc);
  wait_ready(nb);
  EXPECT(b[5] == nranks * 5 + nranks * (nranks - 1) / 2, "non-blocking b[5] = %d", b[5]);
  CHECK(ncclCommDestroy(nb));
  if (end_with_abort)
    CHECK(ncclCommAbort(comm));
  else
    CHECK(ncclCommDestroy(comm));
}

static int g_abort;
static void after_fork_body(int rank, int nranks, ncclUniqueId id) { rank_body(rank, nranks, id, g_abort); }

/* the id made in the parent, every rank a child */
static int id_before_fork(int nranks, int end_with_abort) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  pid_t pids[16];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      g_rank = r;
      rank_body(r, nranks, id, end_with_abort);
      exit(0);
    }
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = fprintf(stderr, "rank %d failed (status %d)\n", r, st);
  }
  return failed;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  g_rank = 0;
  /* the parent's own communicator, with the progress thread running (non-blocking ops) */
  ncclComm_t mine;
  ncclUniqueId pid_id;
  CHECK(ncclGetUniqueId(&pid_id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t rc = ncclCommInitRankConfig(&mine, 1, pid_id, 0, &cfg);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "parent init %d", rc);
  wait_ready(mine);
  int x[4] = {1, 2, 3, 4}, y[4];
  rc = ncclAllReduce(x, y, 4, ncclInt32, ncclSum, mine, NULL);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "parent allreduce %d", rc);
  wait_ready(mine);
  for (int end = 0; end < 2; end++) {
    EXPECT(id_before_fork(n, end) == 0, "id made before fork, ending with %s", end ? "abort" : "destroy");
    g_abort = end;
    EXPECT(run_ranks(n, after_fork_body) == 0, "id made after fork, ending with %s", end ? "abort" : "destroy");
  }
  /* a child cannot use the parent's communicator; releasing it there leaves the parent's intact */
  pid_t c = fork();
  if (c == 0) {
    g_rank = 1;
    rc = ncclAllReduce(x, y, 4, ncclInt32, ncclSum, mine, NULL);
    EXPECT(rc == ncclInvalidUsage, "inherited communicator used: %d", rc);
    EXPECT(strstr(ncclGetLastError(NULL), "before fork"), "message: %s", ncclGetLastError(NULL));
    CHECK(ncclCommDestroy(mine));
    ncclComm_t fresh[1];
    CHECK(ncclCommInitAll(fresh, 1, NULL));
    CHECK(ncclAllReduce(x, y, 4, ncclInt32, ncclSum, fresh[0], NULL));
    CHECK(ncclCommDestroy(fresh[0]));
    exit(0);
  }
  int st;
  waitpid(c, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child with the inherited communicator: status %d", st);
  rc = ncclAllReduce(x, y, 4, ncclInt32, ncclSum, mine, NULL);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "parent allreduce after the child %d", rc);
  wait_ready(mine);
  EXPECT(y[3] == 4, "parent result %d", y[3]);
  CHECK(ncclCommDestroy(mine));
  printf("fork: ids before and after fork, destroy and abort in children, inherited communicators: passed on %d ranks\n", n);
  return 0;
}
