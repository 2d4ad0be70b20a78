/* Fault tolerance at the C ABI, with forked ranks:
 *  1. kill -9 of one of 4 ranks mid-collective; the survivors shrink with NCCL_SHRINK_ABORT,
 *     run collectives on 3, grow back to 4 with a new process (ncclCommGetUniqueId +
 *     ncclCommGrow), run collectives on 4, and destroy the parents promptly; a used grow id is
 *     refused;
 *  2. ncclCommRevoke from the main thread while another thread waits in a collective no one
 *     else joins: it returns, ncclCommGetAsyncError reaches ncclSuccess, later calls are
 *     ncclInvalidUsage;
 *  3. suspend / resume with ncclCommMemStats. */
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include "common.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* rank r contributes r + 1 + k: the exact sum names every member */
static void check_allreduce(ncclComm_t c, int k) {
  int n, r;
  CHECK(ncclCommCount(c, &n));
  CHECK(ncclCommUserRank(c, &r));
  int64_t a[1000], b[1000];
  for (int i = 0; i < 1000; i++) a[i] = r + 1 + k;
  CHECK(ncclAllReduce(a, b, 1000, ncclInt64, ncclSum, c, NULL));
  int64_t want = (int64_t)n * (n + 1) / 2 + (int64_t)n * k;
  for (int i = 0; i < 1000; i++) EXPECT(b[i] == want, "rank %d of %d: b[%d] = %ld, want %ld", r, n, i, (long)b[i], (long)want);
}

static void put_all(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != (ssize_t)n) exit(3);
}
static void get_all(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char*)p + got, n - got);
    if (k <= 0) exit(3);
    got += (size_t)k;
  }
}

/* ---- 1. kill -9, shrink, grow ---------------------------------------------------------- */
static int to_kid[4][2], from_kid[4][2];

static void member(int rank) {
  g_rank = rank;
  ncclUniqueId id;
  get_all(to_kid[rank][0], &id, sizeof id);
  ncclComm_t comm, sub, grown;
  CHECK(ncclCommInitRank(&comm, 4, id, rank));
  check_allreduce(comm, 0);
  put_all(from_kid[rank][1], "R", 1);
  float v[1 << 14];
  for (int i = 0; i < (1 << 14); i++) v[i] = 1;
  ncclResult_t rc;
  while ((rc = ncclAllReduce(v, v, 1 << 14, ncclFloat32, ncclSum, comm, NULL)) == ncclSuccess) {
  }
  EXPECT(rc == ncclRemoteError || rc == ncclSystemError, "a dead peer: rc %d (%s)", rc, ncclGetLastError(NULL));
  EXPECT(strstr(ncclGetLastError(NULL), "rank"), "names a rank: %s", ncclGetLastError(NULL));
  int dead[1] = {2};
  double t0 = now_s();
  CHECK(ncclCommShrink(comm, dead, 1, &sub, NULL, NCCL_SHRINK_ABORT));
  check_allreduce(sub, 1);
  double shrink_ms = (now_s() - t0) * 1e3;
  int me;
  CHECK(ncclCommUserRank(sub, &me));
  EXPECT(me == (rank < 2 ? rank : rank - 1), "renumbered: %d -> %d", rank, me);
  ncclUniqueId gid;
  if (me == 0) {
    CHECK(ncclCommGetUniqueId(sub, &gid));
    ncclUniqueId again;
    EXPECT(ncclCommGetUniqueId(sub, &again) == ncclInvalidUsage, "a second grow id before the grow");
    put_all(from_kid[rank][1], &gid, sizeof gid);
  }
  t0 = now_s();
  CHECK(ncclCommGrow(sub, 4, me == 0 ? &gid : NULL, -1, &grown, NULL));
  check_allreduce(grown, 2);
  double grow_ms = (now_s() - t0) * 1e3;
  CHECK(ncclCommUserRank(grown, &me));
  EXPECT(me == (rank < 2 ? rank : rank - 1), "members keep their ranks in the grow: %d", me);
  t0 = now_s();
  CHECK(ncclCommDestroy(comm));
  CHECK(ncclCommDestroy(sub));
  double destroy_ms = (now_s() - t0) * 1e3;
  EXPECT(destroy_ms < 3000, "destroying the parents took %.0f ms", destroy_ms);
  check_allreduce(grown, 3);
  CHECK(ncclCommDestroy(grown));
  printf("rank %d: shrunk in %.1f ms, grown in %.1f ms, parents destroyed in %.1f ms\n", rank, shrink_ms, grow_ms,
         destroy_ms);
  exit(0);
}

static void newcomer(ncclUniqueId gid) {
  g_rank = 3;
  ncclComm_t grown, again;
  CHECK(ncclCommGrow(NULL, 4, &gid, 3, &grown, NULL));
  check_allreduce(grown, 2);
  /* the id is spent (asked while its store, served by the maker, still runs: the members wait
   * in the next collective) */
  EXPECT(ncclCommGrow(NULL, 5, &gid, 4, &again, NULL) == ncclInvalidUsage, "a used grow id: %s", ncclGetLastError(NULL));
  EXPECT(strstr(ncclGetLastError(NULL), "used already"), "message: %s", ncclGetLastError(NULL));
  check_allreduce(grown, 3);
  CHECK(ncclCommDestroy(grown));
  exit(0);
}

static int kill_shrink_grow(void) {
  pid_t pids[5];
  for (int r = 0; r < 4; r++) {
    if (pipe(to_kid[r]) || pipe(from_kid[r])) return perror("pipe"), 1;
  }
  for (int r = 0; r < 4; r++)
    if ((pids[r] = fork()) == 0) member(r);
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < 4; r++) put_all(to_kid[r][1], &id, sizeof id);
  char c;
  for (int r = 0; r < 4; r++) get_all(from_kid[r][0], &c, 1);
  usleep(100000);
  double t0 = now_s();
  kill(pids[2], SIGKILL);
  int st;
  waitpid(pids[2], &st, 0);
  ncclUniqueId gid;
  get_all(from_kid[0][0], &gid, sizeof gid);
  printf("kill -9 to the grow id (shrunk, checked, id made): %.0f ms\n", (now_s() - t0) * 1e3);
  fflush(stdout); /* not inherited by the child */
  if ((pids[4] = fork()) == 0) newcomer(gid);
  int failed = 0;
  for (int r = 0; r < 5; r++) {
    if (r == 2) continue;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "process %d failed (status %d)\n", r, st);
      failed = 1;
    }
  }
  return failed;
}

/* ---- 2. revoke from another thread ------------------------------------------------------ */
static ncclComm_t g_comm;
static ncclResult_t g_rc;
static double g_returned;

static void* lone_collective(void* arg) {
  int32_t a[64] = {0};
  g_rc = ncclAllReduce(a, a, 64, ncclInt32, ncclSum, g_comm, NULL);
  g_returned = now_s();
  return arg;
}

static void revoke_body(int rank, int n, ncclUniqueId id) {
  CHECK(ncclCommInitRank(&g_comm, n, id, rank));
  check_allreduce(g_comm, 0); /* connected */
  if (rank == 0) {
    pthread_t t;
    pthread_create(&t, NULL, lone_collective, NULL);
    usleep(300000);
    double t0 = now_s();
    ncclResult_t rc = ncclCommRevoke(g_comm, NCCL_REVOKE_DEFAULT);
    EXPECT(rc == ncclSuccess || rc == ncclInProgress, "revoke: %d", rc);
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
      CHECK(ncclCommGetAsyncError(g_comm, &st));
      EXPECT(now_s() - t0 < 2, "still in progress 2 s after revoke");
      usleep(1000);
    }
    EXPECT(st == ncclSuccess, "quiescent: %d", st);
    pthread_join(t, NULL);
    EXPECT(g_rc == ncclInvalidUsage, "the waiting collective: %d (%s)", g_rc, ncclGetLastError(NULL));
    EXPECT(g_returned - t0 < 1.5, "it returned %.2f s after revoke", g_returned - t0);
    int32_t a[4] = {0};
    EXPECT(ncclAllReduce(a, a, 4, ncclInt32, ncclSum, g_comm, NULL) == ncclInvalidUsage, "after revoke");
    EXPECT(strstr(ncclGetLastError(NULL), "revoked"), "message: %s", ncclGetLastError(NULL));
    EXPECT(ncclCommFinalize(g_comm) == ncclInvalidUsage, "finalize after revoke");
    printf("revoke: the waiting collective returned %.0f ms after it\n", (g_returned - t0) * 1e3);
  } else {
    usleep(600000); /* never joins; rank 0's revoke closed its connections */
    ncclResult_t rc = ncclCommRevoke(g_comm, NCCL_REVOKE_DEFAULT);
    EXPECT(rc == ncclSuccess || rc == ncclInProgress, "revoke: %d", rc);
  }
  CHECK(ncclCommDestroy(g_comm));
}

/* ---- 3. suspend / resume ---------------------------------------------------------------- */
static void suspend_body(int rank, int n, ncclUniqueId id) {
  ncclComm_t c;
  CHECK(ncclCommInitRank(&c, n, id, rank));
  check_allreduce(c, 0);
  uint64_t bytes = 0, flag = 9, total = 0;
  CHECK(ncclCommMemStats(c, ncclStatGpuMemSuspend, &bytes));
  CHECK(ncclCommMemStats(c, ncclStatGpuMemSuspended, &flag));
  CHECK(ncclCommMemStats(c, ncclStatGpuMemTotal, &total));
  EXPECT(bytes > 0 && flag == 0 && total >= bytes, "before: %lu bytes, suspended %lu", (unsigned long)bytes, (unsigned long)flag);
  CHECK(ncclCommSuspend(c, NCCL_SUSPEND_MEM));
  CHECK(ncclCommMemStats(c, ncclStatGpuMemSuspend, &bytes));
  CHECK(ncclCommMemStats(c, ncclStatGpuMemSuspended, &flag));
  EXPECT(bytes == 0 && flag == 1, "suspended: %lu bytes, flag %lu", (unsigned long)bytes, (unsigned long)flag);
  int32_t a[4] = {0};
  EXPECT(ncclAllReduce(a, a, 4, ncclInt32, ncclSum, c, NULL) == ncclInvalidUsage, "a collective while suspended");
  EXPECT(strstr(ncclGetLastError(NULL), "suspended"), "message: %s", ncclGetLastError(NULL));
  CHECK(ncclCommResume(c));
  check_allreduce(c, 5);
  CHECK(ncclCommMemStats(c, ncclStatGpuMemSuspend, &bytes));
  EXPECT(bytes > 0, "connections again after resume");
  CHECK(ncclCommDestroy(c));
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int rc = kill_shrink_grow();
  rc |= run_ranks(2, revoke_body);
  rc |= run_ranks(3, suspend_body);
  if (rc == 0) printf("elastic: kill/shrink/grow, revoke and suspend OK\n");
  return rc;
}
