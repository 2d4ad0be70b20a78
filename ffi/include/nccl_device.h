/*
 * nccl_device.h - oxccl's host-side declarations of NCCL 2.32.3's device API (the types and
 * functions a host program compiles against; NCCL's layouts). oxccl has no device API:
 * ncclCommQueryProperties reports deviceApiSupport = false, teams are answered, and the rest
 * returns ncclInvalidUsage (see docs/pytorch.md). Device-side (CUDA) code is not declared here.
 */
#ifndef _NCCL_DEVICE_H_
#define _NCCL_DEVICE_H_

#include <nccl.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclTeam {
  int nRanks, rank, stride;
} ncclTeam_t;
typedef struct ncclWindow_vidmem ncclWindow_vidmem_t;
typedef struct ncclMultimemHandle {
  void* mcBasePtr;
} ncclMultimemHandle_t;
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;
typedef uint32_t ncclCftLeId;
typedef ncclCftLeId ncclCftLeId_t;
typedef struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
} ncclLsaBarrierHandle_t;
typedef struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t unused;
} ncclGinBarrierHandle_t;
typedef struct ncclCftBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
} ncclCftBarrierHandle_t;
typedef struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
} ncclLLA2AHandle_t;
typedef struct ncclGinOutboxHandle {
  ncclDevResourceHandle bufHandle;
  uint32_t size_log2;
} ncclGinOutboxHandle_t;
typedef struct ncclGinInboxA2AHandle {
  ncclDevResourceHandle bufHandle;
  ncclGinSignal_t signals;
  uint32_t size_log2;
  uint32_t nPeers_rcp32;
} ncclGinInboxA2AHandle_t;

typedef enum {
  NCCL_GIN_CONNECTION_NONE,
  NCCL_GIN_CONNECTION_FULL,
  NCCL_GIN_CONNECTION_RAIL,
  NCCL_GIN_CONNECTION_CUSTOM_STRIDE,
} ncclGinConnectionType_t;

typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4,
  NCCL_GIN_TYPE_EFA_GDA = 5,
  NCCL_GIN_MAX_TYPES = 6,
} ncclGinType_t;

typedef enum {
  NCCL_CFT_TEAM_FLAT,
  NCCL_CFT_TEAM_HIER_MULTIMEM,
  NCCL_CFT_TEAM_HIER_LSA,
} ncclCftTeamMode_t;

typedef enum {
  NCCL_CFT_NONE = 0x0,
  NCCL_CFT = 0x1,
  NCCL_CFT_MULTIMEM = 0x2,
} ncclCftCap_t;

typedef struct ncclDevResourceRequirements {
  struct ncclDevResourceRequirements* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
} ncclDevResourceRequirements_t;

typedef struct ncclTeamRequirements {
  struct ncclTeamRequirements* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle;
} ncclTeamRequirements_t;

typedef struct ncclDevCommRequirements {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclDevResourceRequirements_t* resourceRequirementsList;
  ncclTeamRequirements_t* teamRequirementsList;
  bool lsaMultimem;
  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;
  int lsaLLA2ABlockCount, lsaLLA2ASlotCount;
  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinConnectionType_t ginConnectionType;
  bool ginExclusiveContexts;
  int ginQueueDepth;
  int ginTrafficClass;
  int worldGinBarrierCount;
  bool ginStrongSignalsRequired;
  bool ginVaSignalsRequired;
  int ginCustomStride;
  ncclGinType_t ginType;
  bool useRuntimeVersion;
  int cftCaps;
  int cftBarrierCount;
  /* NCCL 2.32.6 appended these two (a 2.32.3 caller's size ends before them) */
  int* ginCustomArray;
  int ginCustomArrayCount;
} ncclDevCommRequirements_t;

#define NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER {                                          \
  sizeof(ncclDevCommRequirements_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                   \
  NULL, NULL, false, 0, 0, 0, 0, 0, false, 4, 0, 0, NCCL_GIN_CONNECTION_NONE, false, 0,   \
  NCCL_CONFIG_UNDEF_INT, 0, true, true, 1, NCCL_GIN_TYPE_NONE, false, NCCL_CFT_NONE, 0,   \
  NULL, 0,                                                                                \
}

typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;
  bool multimemSupport;
  ncclGinType_t ginType;
  int nLsaTeams;
  bool hostRmaSupport;
  ncclGinType_t railedGinType;
  uint64_t commHash;
  int ginMinStride;
  ncclGinConnectionType_t ginConnectionType;
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  bool cftSupport;
  bool cftMulticastSupport;
  bool cftCountedSupport;
} ncclCommProperties_t;

#define NCCL_COMM_PROPERTIES_INITIALIZER { sizeof(ncclCommProperties_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, }

/* Device communicators */
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
ncclResult_t pncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs, ncclDevComm_t* outDevComm);
ncclResult_t pncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs, ncclDevComm_t* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);

/* Windows */
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem, void** outPtr);
ncclResult_t pncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem, void** outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);
ncclResult_t pncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t pncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t pncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t pncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId, size_t* leOffset);

/* Teams */
ncclTeam_t ncclTeamWorld(ncclComm_t comm);
ncclTeam_t pncclTeamWorld(ncclComm_t comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm);
ncclTeam_t pncclTeamLsa(ncclComm_t comm);
ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode);
ncclTeam_t pncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode);
ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm);
ncclTeam_t pncclTeamCftMultimem(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);
int pncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);
ncclTeam_t ncclTeamRail(ncclComm_t comm);
ncclTeam_t pncclTeamRail(ncclComm_t comm);

/* Device resource requirements */
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclCftBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclCftBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclCftBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclCftBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
int pncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2, ncclGinOutboxHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinOutboxCreateRequirement(int nBlocks, int size_log2, ncclGinOutboxHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2, ncclGinInboxA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2, ncclGinInboxA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);

#ifdef __cplusplus
} /* end extern "C" */
#endif

#endif /* _NCCL_DEVICE_H_ */
