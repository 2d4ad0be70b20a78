/* Bad input at the C ABI: every kind gets its error code and a message, nothing crashes, and
 * the communicator still works afterwards. */
#include <stdint.h>
#include "common.h"
#include "nccl_device.h"
#include <sys/mman.h>

#define EXPECT_RC(call, want)                                                                          \
  do {                                                                                                 \
    ncclResult_t r_ = (call);                                                                          \
    EXPECT(r_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, r_,                \
           ncclGetErrorString(r_), want, ncclGetLastError(NULL));                                      \
    EXPECT(strlen(ncclGetLastError(NULL)) > 0, "%s left no message", #call);                           \
  } while (0)

int main(void) {
  g_rank = 0;
  ncclComm_t comms[2], comm;
  CHECK(ncclCommInitAll(comms, 1, NULL));
  comm = comms[0];
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
  /* null pointers */
  EXPECT_RC(ncclGetVersion(NULL), ncclInvalidArgument);
  EXPECT_RC(ncclGetUniqueId(NULL), ncclInvalidArgument);
  EXPECT_RC(ncclCommCount(comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(NULL, b, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(a, NULL, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclCommGetAsyncError(comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclRedOpCreatePreMulSum(NULL, a, ncclFloat32, ncclScalarHostImmediate, comm), ncclInvalidArgument);
  /* bad communicators: NULL, garbage, destroyed */
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, (ncclComm_t)(uintptr_t)0x1234, NULL), ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "not a communicator") != NULL, "message: %s", ncclGetLastError(NULL));
  ncclComm_t dead[1];
  CHECK(ncclCommInitAll(dead, 1, NULL));
  CHECK(ncclCommDestroy(dead[0]));
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, dead[0], NULL), ncclInvalidArgument);
  EXPECT_RC(ncclCommDestroy(dead[0]), ncclInvalidArgument);
  /* types, ops, roots, peers out of range */
  EXPECT_RC(ncclAllReduce(a, b, 8, (ncclDataType_t)12, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(a, b, 8, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, (ncclRedOp_t)5, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, (ncclRedOp_t)-3, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclBroadcast(a, b, 8, ncclFloat32, 1, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclReduce(a, b, 8, ncclFloat32, ncclSum, -1, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclSend(a, 8, ncclFloat32, 1, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
  /* a pre-multiplied sum op used with another type */
  ncclRedOp_t pm;
  float two = 2;
  CHECK(ncclRedOpCreatePreMulSum(&pm, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  EXPECT_RC(ncclAllReduce(a, b, 4, ncclFloat64, pm, comm, NULL), ncclInvalidArgument);
  CHECK(ncclAllReduce(a, b, 8, ncclFloat32, pm, comm, NULL));
  EXPECT(b[7] == 16, "premulsum %f", b[7]);
  CHECK(ncclRedOpDestroy(pm, comm));
  EXPECT_RC(ncclRedOpDestroy(pm, comm), ncclInvalidArgument);
  /* byte sizes that overflow */
  EXPECT_RC(ncclAllReduce(a, b, SIZE_MAX / 2, ncclFloat64, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT_RC(ncclAllGather(a, b, SIZE_MAX / 4, ncclFloat32, comm, NULL), ncclInvalidArgument);
  /* overlapping buffers that are not NCCL's in-place layout */
  EXPECT_RC(ncclAllReduce(a, a + 1, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  /* a CUDA stream with host buffers in a process without CUDA: refused, not dereferenced */
  EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, (cudaStream_t)(uintptr_t)0x5000), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(NULL), "CUDA is not loaded") != NULL, "message: %s", ncclGetLastError(NULL));
  /* a device pointer (here: an address nothing is mapped at) without CUDA: a clear error, no crash */
  {
    void* gone = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(gone != MAP_FAILED, "mmap");
    munmap(gone, 1 << 20);
    EXPECT_RC(ncclAllReduce(gone, b, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "CUDA is not loaded") != NULL, "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclAllReduce(a, gone, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclBroadcast(gone, gone, 8, ncclFloat32, 0, comm, NULL), ncclInvalidArgument);
    /* and the communicator still works */
    EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
  }
  /* read-only buffers: an output there is refused (it crashed the process), an input is fine */
  {
    float* ro = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(ro != MAP_FAILED, "mmap");
    for (int i = 0; i < 8; i++) ro[i] = (float)i;
    EXPECT(mprotect(ro, 1 << 16, PROT_READ) == 0, "mprotect");
    EXPECT_RC(ncclAllReduce(a, ro, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "read-only"), "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclAllReduce(ro, ro, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument); /* in place */
    EXPECT_RC(ncclAllReduce(ro, b, 8, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);          /* input only */
    EXPECT(b[7] == 7, "allreduce from read-only memory: %f", b[7]);
    /* an in-place broadcast into a read-only buffer on a rank that is not the root */
    ncclComm_t two[2];
    CHECK(ncclCommInitAll(two, 2, NULL));
    EXPECT_RC(ncclBcast(ro, 8, ncclFloat32, 0, two[1], NULL), ncclInvalidArgument);
    EXPECT_RC(ncclRecv(ro, 8, ncclFloat32, 0, two[1], NULL), ncclInvalidArgument);
    CHECK(ncclCommDestroy(two[0]));
    CHECK(ncclCommDestroy(two[1]));
    munmap(ro, 1 << 16);
    EXPECT_RC(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
  }
  /* NCCL 2.31/2.32 entry points: NULL and garbage arguments */
  {
    void* junkp = (void*)(uintptr_t)0x10;
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, (ncclCollConfig_t*)junkp), ncclInvalidArgument);
    cc.magic = 0;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc), ncclInvalidArgument);
    cc = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
    cc.size = 3;
    EXPECT_RC(ncclAllGatherConfig(a, b, 8, ncclFloat32, comm, NULL, &cc), ncclInvalidArgument);
    cc = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
    cc.algSelection = (const char*)junkp;
    EXPECT_RC(ncclReduceConfig(a, b, 8, ncclFloat32, ncclSum, 0, comm, NULL, &cc), ncclInvalidArgument);
    cc.algSelection = "bogus";
    EXPECT_RC(ncclBroadcastConfig(a, b, 8, ncclFloat32, 0, comm, NULL, &cc), ncclInvalidArgument);
    cc.algSelection = "nvls";
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc), ncclInvalidUsage);
    cc.algSelection = NULL;
    cc.forceAlgSelection = 3;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc), ncclInvalidArgument);
    cc.forceAlgSelection = 1;
    cc.maxCTAs = -4;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc), ncclInvalidArgument);
    cc.maxCTAs = NCCL_CONFIG_UNDEF_INT;
    cc.launchCompletionEvent = (cudaEvent_t)junkp;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc), ncclInvalidUsage);
    cc.launchCompletionEvent = NULL;
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, 9, comm, NULL, &cc), ncclInvalidArgument);
    EXPECT_RC(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, NULL, NULL, &cc), ncclInvalidArgument);
    EXPECT_RC(ncclScatterConfig(a, b, 8, ncclFloat32, 3, comm, NULL, &cc), ncclInvalidArgument);
    CHECK(ncclAllReduceConfig(a, b, 8, ncclFloat32, ncclSum, comm, NULL, &cc));
    /* encryption: validated; a PSK of at least 32 bytes accepted (then turned off again) */
    ncclEncryptionConfig_t ec = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    EXPECT_RC(ncclSetEncryption(NULL), ncclInvalidArgument);
    EXPECT_RC(ncclSetEncryption((ncclEncryptionConfig_t*)junkp), ncclInvalidArgument);
    CHECK(ncclSetEncryption(&ec));
    ec.mode = NCCL_ENCRYPTION_MODE_PSK;
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument); /* NULL key */
    ec.psk = (const char*)junkp;
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    ec.psk = "0123456789abcdef"; /* 16 bytes: too short */
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "at least 32"), "message: %s", ncclGetLastError(NULL));
    ec.psk = "";
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    ec.psk = "a pre-shared key of at least thirty-two bytes";
    CHECK(ncclSetEncryption(&ec));
    ec.mode = NCCL_ENCRYPTION_MODE_NONE;
    CHECK(ncclSetEncryption(&ec));
    ec.mode = NCCL_ENCRYPTION_MODE_PSK;
    ec.mode = 42;
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    ec.mode = NCCL_ENCRYPTION_MODE_NONE;
    ec.magic = 7;
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    ec.magic = NCCL_API_MAGIC;
    ec.size = 4;
    EXPECT_RC(ncclSetEncryption(&ec), ncclInvalidArgument);
    /* properties: truthful, versioned, and never a crash */
    ncclCommProperties_t pr = NCCL_COMM_PROPERTIES_INITIALIZER;
    pr.deviceApiSupport = true;
    CHECK(ncclCommQueryProperties(comm, &pr));
    EXPECT(pr.rank == 0 && pr.nRanks == 1 && !pr.deviceApiSupport && !pr.multimemSupport && pr.ginType == NCCL_GIN_TYPE_NONE,
           "properties rank %d nRanks %d device %d", pr.rank, pr.nRanks, pr.deviceApiSupport);
    EXPECT_RC(ncclCommQueryProperties(comm, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclCommQueryProperties(comm, (ncclCommProperties_t*)junkp), ncclInvalidArgument);
    EXPECT_RC(ncclCommQueryProperties(NULL, &pr), ncclInvalidArgument);
    ncclCommProperties_t bad = NCCL_COMM_PROPERTIES_INITIALIZER;
    bad.magic = 0;
    EXPECT_RC(ncclCommQueryProperties(comm, &bad), ncclInvalidArgument);
    static const ncclCommProperties_t ro = NCCL_COMM_PROPERTIES_INITIALIZER; /* read-only memory */
    EXPECT_RC(ncclCommQueryProperties(comm, (ncclCommProperties_t*)&ro), ncclInvalidArgument);
    /* the device API: a clear ncclInvalidUsage whatever the pointers */
    ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
    EXPECT_RC(ncclDevCommCreate(comm, &reqs, (ncclDevComm_t*)junkp), ncclInvalidUsage);
    EXPECT(strstr(ncclGetLastError(NULL), "ncclDevCommCreate") && strstr(ncclGetLastError(NULL), "deviceApiSupport"),
           "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclDevCommCreate((ncclComm_t)junkp, NULL, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclDevCommDestroy(comm, (ncclDevComm_t*)junkp), ncclInvalidUsage);
    void* out = NULL;
    ncclMultimemHandle_t mm = {junkp};
    EXPECT_RC(ncclGetLsaMultimemDevicePointer((ncclWindow_t)junkp, 0, &out), ncclInvalidUsage);
    EXPECT_RC(ncclGetPeerDevicePointer(NULL, 0, 1, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclGetLsaDevicePointer((ncclWindow_t)junkp, 8, 0, (void**)junkp), ncclInvalidUsage);
    EXPECT_RC(ncclGetMultimemDevicePointer((ncclWindow_t)junkp, 8, mm, (void**)junkp), ncclInvalidUsage);
    EXPECT_RC(ncclGetMultimemDeviceLeInfo((ncclWindow_t)junkp, 0, NULL, NULL), ncclInvalidUsage);
    ncclTeam_t w = ncclTeamWorld(comm);
    EXPECT(w.nRanks == 1 && w.rank == 0 && w.stride == 1, "world team %d %d %d", w.nRanks, w.rank, w.stride);
    EXPECT_RC(ncclGetCftDeviceLeInfo((ncclWindow_t)junkp, 0, 0, w, NULL, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclGetPeerDeviceLeInfo((ncclWindow_t)junkp, 0, 0, NULL, NULL), ncclInvalidUsage);
    ncclTeam_t l = ncclTeamLsa(comm);
    EXPECT(l.nRanks == 1 && l.rank == 0, "lsa team %d %d", l.nRanks, l.rank);
    ncclTeam_t z = ncclTeamWorld((ncclComm_t)junkp);
    EXPECT(z.nRanks == 0 && strstr(ncclGetLastError(NULL), "not a communicator"), "bad comm team %d", z.nRanks);
    z = ncclTeamCft(comm, NCCL_CFT_TEAM_FLAT);
    EXPECT(z.nRanks == 0 && strstr(ncclGetLastError(NULL), "ncclTeamCft"), "cft team %d", z.nRanks);
    EXPECT(ncclTeamRankToWorld(comm, w, 0) == 0, "rank to world");
    EXPECT(ncclTeamRankToWorld(comm, w, 5) == -1, "rank 5 of a team of 1");
    EXPECT(ncclTeamRankToLsa(comm, w, 0) == 0, "rank to lsa");
    EXPECT(ncclLLA2ACalcSlots(10, 9) == 20 && ncclLLA2ACalcSlots(-1, 9) == -1, "slots");
    EXPECT_RC(ncclLsaBarrierCreateRequirement(w, 1, (ncclLsaBarrierHandle_t*)junkp, (ncclDevResourceRequirements_t*)junkp), ncclInvalidUsage);
    EXPECT_RC(ncclGinBarrierCreateRequirement(comm, w, 1, NULL, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclCftBarrierCreateRequirement(w, 1, NULL, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclLLA2ACreateRequirement(1, 1, (ncclLLA2AHandle_t*)junkp, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclGinOutboxCreateRequirement(1, 4, NULL, NULL), ncclInvalidUsage);
    EXPECT_RC(ncclGinInboxA2ACreateRequirement(w, 1, 4, NULL, NULL), ncclInvalidUsage);
    ncclResetDebugInitInternal();
    int v = 0;
    CHECK(ncclGetVersion(&v));
    EXPECT(v == NCCL_VERSION_CODE, "version %d", v);
  }
  /* unimplemented functions say so by name */
  EXPECT_RC(ncclCommWindowRegister(comm, NULL, 0, NULL, 0), ncclInvalidUsage);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclCommWindowRegister") && strstr(ncclGetLastError(NULL), "not implemented"),
         "message: %s", ncclGetLastError(NULL));
  /* shrink, grow, revoke, suspend: every bad argument, and the communicator is untouched */
  {
    ncclComm_t nc = NULL;
    int self[1] = {0}, out[1] = {1}, dup[2] = {0, 0};
    EXPECT_RC(ncclCommShrink(comm, self, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument); /* every rank */
    EXPECT(strstr(ncclGetLastError(NULL), "its own exclude list"), "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclCommShrink(comm, out, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "out of range"), "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclCommShrink(comm, dup, 2, &nc, NULL, NCCL_SHRINK_ABORT), ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "listed twice"), "message: %s", ncclGetLastError(NULL));
    EXPECT_RC(ncclCommShrink(comm, NULL, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    EXPECT_RC(ncclCommShrink(comm, out, -1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    EXPECT_RC(ncclCommShrink(comm, out, 1, NULL, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    EXPECT_RC(ncclCommShrink(comm, out, 1, &nc, NULL, 5), ncclInvalidArgument);
    EXPECT_RC(ncclCommShrink(NULL, out, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    EXPECT(nc == NULL, "no communicator made");
    ncclUniqueId gid;
    EXPECT_RC(ncclCommGetUniqueId(comm, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclCommGetUniqueId(NULL, &gid), ncclInvalidArgument);
    EXPECT_RC(ncclCommGrow(comm, 2, NULL, -1, NULL, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclCommGrow(NULL, 2, NULL, 1, &nc, NULL), ncclInvalidArgument); /* a newcomer needs the id */
    EXPECT_RC(ncclCommGrow(comm, 0, NULL, -1, &nc, NULL), ncclInvalidArgument);
    EXPECT_RC(ncclCommGrow(comm, 1, NULL, -1, &nc, NULL), ncclInvalidArgument); /* not larger */
    EXPECT_RC(ncclCommGrow(comm, 2, NULL, 3, &nc, NULL), ncclInvalidArgument);  /* a member passes -1 */
    memset(&gid, 0x5a, sizeof gid);
    EXPECT_RC(ncclCommGrow(NULL, 2, &gid, 1, &nc, NULL), ncclInvalidArgument); /* not an id */
    EXPECT(nc == NULL, "no communicator made");
    EXPECT_RC(ncclCommRevoke(comm, 7), ncclInvalidArgument);
    EXPECT_RC(ncclCommRevoke(NULL, 0), ncclInvalidArgument);
    EXPECT_RC(ncclCommSuspend(comm, 0), ncclInvalidArgument);
    EXPECT_RC(ncclCommSuspend(NULL, NCCL_SUSPEND_MEM), ncclInvalidArgument);
    EXPECT_RC(ncclCommResume(comm), ncclInvalidUsage); /* not suspended */
    uint64_t v = 7;
    EXPECT_RC(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v), ncclInvalidArgument);
    EXPECT_RC(ncclCommMemStats(comm, ncclStatGpuMemSuspended, NULL), ncclInvalidArgument);
    CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
    EXPECT(v == 0, "suspended %lu", (unsigned long)v);
  }
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_RC(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  /* group misuse */
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage);
  /* config: bad magic, bad blocking value, and every historic size accepted */
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x1234;
  ncclComm_t c2;
  EXPECT_RC(ncclCommInitRankConfig(&c2, 1, id, 0, &cfg), ncclInvalidArgument);
  cfg.magic = NCCL_API_MAGIC;
  cfg.blocking = 7;
  EXPECT_RC(ncclCommInitRankConfig(&c2, 1, id, 0, &cfg), ncclInvalidArgument);
  const size_t sizes[] = {24, 40, 48, 72, 80, 88, 96, 120};
  for (int i = 0; i < 8; i++) {
    ncclConfig_t k = NCCL_CONFIG_INITIALIZER;
    k.size = sizes[i];
    ncclUniqueId id2;
    CHECK(ncclGetUniqueId(&id2));
    CHECK(ncclCommInitRankConfig(&c2, 1, id2, 0, &k));
    CHECK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, c2, NULL));
    CHECK(ncclCommDestroy(c2));
  }
  EXPECT_RC(ncclCommInitRank(&c2, 0, id, 0), ncclInvalidArgument);
  EXPECT_RC(ncclCommInitRank(&c2, 2, id, 2), ncclInvalidArgument);
  ncclUniqueId junk;
  memset(&junk, 0x5a, sizeof junk);
  EXPECT_RC(ncclCommInitRank(&c2, 2, junk, 0), ncclInvalidArgument);
  /* misaligned buffers work */
  char raw[64];
  float* odd = (float*)(raw + 1);
  for (int i = 0; i < 8; i++) memcpy((char*)odd + 4 * i, &a[i], 4);
  CHECK(ncclAllReduce(odd, odd, 8, ncclFloat32, ncclSum, comm, NULL));
  float got;
  memcpy(&got, (char*)odd + 28, 4);
  EXPECT(got == 8, "misaligned in-place allreduce %f", got);
  /* error strings */
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)") == 0, "text");
  EXPECT(strcmp(ncclGetErrorString((ncclResult_t)77), "unknown result code") == 0, "text");
  /* the communicator still works */
  CHECK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(b[3] == 4, "allreduce after bad calls");
  CHECK(ncclCommDestroy(comm));
  printf("badargs: every bad input refused with its code and a message\n");
  return 0;
}
