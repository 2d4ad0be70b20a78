/* Nothing outlives the last communicator: after ncclCommDestroy of a communicator and of one
 * split off it, every rank process has no more threads and file descriptors than before its
 * init (rank 0 fewer: the store server of the id it made stops once the communicator that owned
 * it is destroyed and the other ranks have disconnected). Over shared memory and over TCP
 * (NCCL_SHM_DISABLE=1). */
#include <dirent.h>
#include "common.h"

static int entries(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void body(int rank, int n, ncclUniqueId id) {
  int fds0 = entries("/proc/self/fd"), threads0 = entries("/proc/self/task");
  ncclComm_t comm, sub;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int a[8], b[8];
  for (int i = 0; i < 8; i++) a[i] = rank + i;
  CHECK(ncclAllReduce(a, b, 8, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 8; i++) EXPECT(b[i] == n * i + n * (n - 1) / 2, "b[%d] = %d", i, b[i]);
  CHECK(ncclCommSplit(comm, rank % 2, rank, &sub, NULL));
  CHECK(ncclAllReduce(a, b, 8, ncclInt32, ncclSum, sub, NULL));
  CHECK(ncclCommDestroy(sub));
  CHECK(ncclCommDestroy(comm));
  int fds1 = -1, threads1 = -1;
  /* threads end just after destroy returns (a joined thread leaves /proc a moment later; the
   * store's client threads once the other ranks have their last answers) */
  for (int i = 0; i < 1000; i++) {
    fds1 = entries("/proc/self/fd");
    threads1 = entries("/proc/self/task");
    if (fds1 <= fds0 && threads1 <= threads0) break;
    usleep(10000);
  }
  EXPECT(fds1 <= fds0, "file descriptors %d before init, %d after the last destroy", fds0, fds1);
  EXPECT(threads1 <= threads0, "threads %d before init, %d after the last destroy", threads0, threads1);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int rc = run_ranks(n, body);
  if (rc == 0) printf("lifetimes: no thread or fd outlives the last communicator on %d ranks\n", n);
  return rc;
}
