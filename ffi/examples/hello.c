#include <nccl.h>
#include <stdio.h>

int main(void) {
  ncclComm_t comms[2];
  float a[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  if (ncclCommInitAll(comms, 2, NULL) != ncclSuccess) return 1;
  ncclGroupStart(); /* one thread drives both ranks */
  for (int r = 0; r < 2; r++) ncclAllReduce(a[r], a[r], 4, ncclFloat, ncclSum, comms[r], NULL);
  if (ncclGroupEnd() != ncclSuccess) return printf("%s\n", ncclGetLastError(NULL)), 1;
  printf("%g %g %g %g\n", a[1][0], a[1][1], a[1][2], a[1][3]);
  for (int r = 0; r < 2; r++) ncclCommDestroy(comms[r]);
  return 0;
}
