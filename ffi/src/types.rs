//! NCCL's types and constants (`nccl.h`), as the C ABI lays them out.

use super::*;

// ---- types and constants (nccl.h) ---------------------------------------------------------

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// `ncclSuccess`
pub const ncclSuccess: ncclResult_t = 0;
/// `ncclUnhandledCudaError`
pub const ncclUnhandledCudaError: ncclResult_t = 1;
/// `ncclSystemError`
pub const ncclSystemError: ncclResult_t = 2;
/// `ncclInternalError`
pub const ncclInternalError: ncclResult_t = 3;
/// `ncclInvalidArgument`
pub const ncclInvalidArgument: ncclResult_t = 4;
/// `ncclInvalidUsage`
pub const ncclInvalidUsage: ncclResult_t = 5;
/// `ncclRemoteError`
pub const ncclRemoteError: ncclResult_t = 6;
/// `ncclInProgress`
pub const ncclInProgress: ncclResult_t = 7;
/// `ncclTimeout`
pub const ncclTimeout: ncclResult_t = 8;
/// `ncclNumResults`
pub const ncclNumResults: ncclResult_t = 9;

/// The NCCL version this library reports (`NCCL_VERSION_CODE` of the header it implements).
pub const NCCL_VERSION_CODE: c_int = 23203;
/// `NCCL_API_MAGIC`: the magic of versioned structs (`ncclConfig_t`).
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_SPLIT_NOCOLOR`
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_CONFIG_UNDEF_INT`
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `ncclNumOps`: user-created reduction ops are numbered from here.
pub const ncclNumOps: c_int = 5;
/// `ncclNumTypes`
pub const ncclNumTypes: c_int = 12;

/// The opaque communicator (`struct ncclComm`); handles are never dereferenced.
#[repr(C)]
pub struct ncclComm {
    pub(crate) _opaque: [u8; 0],
}
/// `ncclComm_t`
pub type ncclComm_t = *mut ncclComm;
/// The opaque window (`struct ncclWindow_vidmem`).
#[repr(C)]
pub struct ncclWindow_vidmem {
    pub(crate) _opaque: [u8; 0],
}
/// `ncclWindow_t`
pub type ncclWindow_t = *mut ncclWindow_vidmem;
/// The opaque CUDA stream (`struct CUstream_st`).
#[repr(C)]
pub struct CUstream_st {
    pub(crate) _opaque: [u8; 0],
}
/// `cudaStream_t`
pub type cudaStream_t = *mut CUstream_st;
/// `ncclParamHandle_t` (opaque).
pub type ncclParamHandle_t = *mut c_void;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The bytes (oxccl's own layout: address and secret of the rendezvous).
    pub internal: [c_char; 128],
}

/// `ncclSimInfo_t`
#[repr(C)]
pub struct ncclSimInfo_t {
    /// Caller's struct size.
    pub size: size_t,
    /// Magic.
    pub magic: u32,
    /// Caller's version.
    pub version: u32,
    /// Estimated time (µs).
    pub estimatedTime: f32,
}

/// `ncclWaitSignalDesc_t`
#[repr(C)]
pub struct ncclWaitSignalDesc_t {
    /// Operation count.
    pub opCnt: c_int,
    /// Peer.
    pub peer: c_int,
    /// Signal index.
    pub sigIdx: c_int,
    /// Context.
    pub ctx: c_int,
}

/// `ncclConfig_t` as NCCL 2.32.3 lays it out (120 bytes); callers may pass any historic prefix.
#[repr(C)]
pub struct ncclConfig_t {
    /// Caller's `sizeof(ncclConfig_t)`.
    pub size: size_t,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// Caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// 1 blocking (default), 0 non-blocking.
    pub blocking: c_int,
    /// CGA cluster size (GPU only; ignored).
    pub cgaClusterSize: c_int,
    /// Minimum CTAs (GPU only; ignored).
    pub minCTAs: c_int,
    /// Maximum CTAs (GPU only; ignored).
    pub maxCTAs: c_int,
    /// Network plugin name (ignored).
    pub netName: *const c_char,
    /// Share the parent's resources on split (ignored).
    pub splitShare: c_int,
    /// Traffic class (ignored).
    pub trafficClass: c_int,
    /// Name for logs.
    pub commName: *const c_char,
    /// CollNet (ignored).
    pub collnetEnable: c_int,
    /// CTA policy (ignored).
    pub CTAPolicy: c_int,
    /// Shrink share (ignored).
    pub shrinkShare: c_int,
    /// NVLS CTAs (ignored).
    pub nvlsCTAs: c_int,
    /// Channels per net peer (ignored).
    pub nChannelsPerNetPeer: c_int,
    /// NVLink-centric scheduling (ignored).
    pub nvlinkCentricSched: c_int,
    /// Graph usage mode (ignored).
    pub graphUsageMode: c_int,
    /// RMA contexts (ignored).
    pub numRmaCtx: c_int,
    /// Max P2P peers (ignored).
    pub maxP2pPeers: c_int,
    /// Graph stream ordering (ignored).
    pub graphStreamOrdering: c_int,
    /// Implicit launch order (2.31; ignored: host operations complete in call order).
    pub launchOrderImplicit: c_int,
    /// RMA signals (2.31; ignored).
    pub numRmaSig: c_int,
    /// Eager RMA initialisation (2.31; ignored).
    pub rmaEagerInit: c_int,
    /// Host CFT mode (2.32; ignored).
    pub hostCftMode: c_int,
    /// Host NVLS components (2.32; ignored: no NVLS).
    pub nvlsHostMode: c_int,
}
