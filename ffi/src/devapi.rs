//! The host side of NCCL's device API (`nccl_device.h`, NCCL 2.28+), as far as it can exist for
//! oxccl, which launches no device-initiated communication.
//!
//! - `ncclCommQueryProperties` fills the struct truthfully: rank, size, device, and no device
//!   API, multimem, GIN or CFT support, so a client that checks it never calls the rest.
//! - Teams are real: the world team, and a load/store-accessible (LSA) team of this rank alone
//!   (no peer's memory is mapped into this one), so the rail team is the world.
//!   `ncclLLA2ACalcSlots` is the pure size computation it is in NCCL.
//! - Everything that needs device communicators or registered windows (`ncclDevCommCreate`, the
//!   window pointer queries, the resource requirement builders) returns `ncclInvalidUsage`,
//!   named in `ncclGetLastError`, and never reads or writes its pointers.

use super::*;
use crate::probe::{read_bytes, write_bytes};

/// `ncclTeam_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ncclTeam_t {
    /// Ranks in the team.
    pub nRanks: c_int,
    /// This rank's index in the team.
    pub rank: c_int,
    /// Distance between consecutive members, in world ranks.
    pub stride: c_int,
}

/// `ncclMultimemHandle_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclMultimemHandle_t {
    /// Multicast base address.
    pub mcBasePtr: *mut c_void,
}

/// `ncclCommProperties_t` as NCCL 2.32.3 lays it out (152 bytes).
#[repr(C)]
pub struct ncclCommProperties_t {
    /// Caller's `sizeof(ncclCommProperties_t)`.
    pub size: size_t,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// Caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// This rank.
    pub rank: c_int,
    /// Ranks.
    pub nRanks: c_int,
    /// CUDA device (as `ncclCommCuDevice`).
    pub cudaDev: c_int,
    /// NVML device index.
    pub nvmlDev: c_int,
    /// Device API support: false.
    pub deviceApiSupport: bool,
    /// Multimem support: false.
    pub multimemSupport: bool,
    /// GIN type: `NCCL_GIN_TYPE_NONE`.
    pub ginType: c_int,
    /// LSA teams: one per rank.
    pub nLsaTeams: c_int,
    /// Host RMA support: false.
    pub hostRmaSupport: bool,
    /// Railed GIN type: none.
    pub railedGinType: c_int,
    /// Communicator hash.
    pub commHash: u64,
    /// GIN minimum stride: 0.
    pub ginMinStride: c_int,
    /// GIN connection type: `NCCL_GIN_CONNECTION_NONE`.
    pub ginConnectionType: c_int,
    /// GIN support per type: none.
    pub ginSupport: [bool; 64],
    /// Device communicator size for runtime-version device code: 0.
    pub devCommRuntimeVersionSize: size_t,
    /// CFT support: false.
    pub cftSupport: bool,
    /// CFT multicast support: false.
    pub cftMulticastSupport: bool,
    /// CFT counted support: false.
    pub cftCountedSupport: bool,
}

/// The properties of `e`, as bytes of NCCL's layout (booleans false, types none).
fn properties(e: &Entry) -> Result<Vec<u8>, Error> {
    use std::mem::offset_of as off;
    type P = ncclCommProperties_t;
    let c = e.ready()?;
    let mut b = vec![0u8; std::mem::size_of::<P>()];
    let mut i32_at = |o: usize, v: i32| b[o..o + 4].copy_from_slice(&v.to_ne_bytes());
    i32_at(off!(P, rank), c.rank() as c_int);
    i32_at(off!(P, nRanks), c.size() as c_int);
    i32_at(off!(P, cudaDev), e.device);
    i32_at(off!(P, nvmlDev), e.device);
    i32_at(off!(P, nLsaTeams), c.size() as c_int);
    b[off!(P, commHash)..off!(P, commHash) + 8].copy_from_slice(&c.comm_hash().to_ne_bytes());
    Ok(b)
}

fn query_properties(comm: ncclComm_t, props: *mut ncclCommProperties_t) -> R {
    let e = entry(comm)?;
    if props.is_null() {
        return Err(arg("props is NULL"));
    }
    let head =
        read_bytes(props as usize, 16).ok_or_else(|| arg(format!("props ({props:p}) is not readable memory")))?;
    let size = usize::from_ne_bytes(head[0..8].try_into().unwrap());
    let magic = u32::from_ne_bytes(head[8..12].try_into().unwrap());
    if magic != NCCL_API_MAGIC || !(16..=1 << 16).contains(&size) {
        return Err(arg(format!(
            "ncclCommProperties_t has size {size} and magic {magic:#x} (initialize it with NCCL_COMM_PROPERTIES_INITIALIZER)"
        )));
    }
    let b = properties(&e)?;
    // the caller's struct may be an older, shorter one: write only what its size covers,
    // after its own size/magic/version header
    let n = size.min(b.len());
    if n > 16 && !write_bytes(props as usize + 16, &b[16..n]) {
        return Err(arg(format!("props ({props:p}) of {size} bytes is not writable memory")));
    }
    Ok(ncclSuccess)
}

fn unsupported(name: &str) -> R {
    Err(Error::invalid_usage(format!(
        "{name}: oxccl has no device API (device communicators, symmetric windows, GIN, multimem); \
         ncclCommQueryProperties reports deviceApiSupport = false"
    )))
}

/// Run a team query behind the panic boundary: errors give the empty team and set
/// `ncclGetLastError`.
fn team(name: &str, f: impl FnOnce() -> Result<ncclTeam_t, Error>) -> ncclTeam_t {
    let mut out = ncclTeam_t::default();
    let _ = boundary(name, || {
        out = f()?;
        Ok(ncclSuccess)
    });
    out
}

/// Run an integer query behind the panic boundary: errors give -1 and set `ncclGetLastError`.
fn int(name: &str, f: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    let mut out = -1;
    let _ = boundary(name, || {
        out = f()?;
        Ok(ncclSuccess)
    });
    out
}

fn world(comm: ncclComm_t) -> Result<ncclTeam_t, Error> {
    let c = entry(comm)?;
    let c = c.ready()?;
    Ok(ncclTeam_t { nRanks: c.size() as c_int, rank: c.rank() as c_int, stride: 1 })
}

/// The world rank of member `rank` of `t`, as NCCL computes it.
fn to_world(comm: ncclComm_t, t: ncclTeam_t, rank: c_int) -> Result<c_int, Error> {
    let w = world(comm)?;
    if !(0..t.nRanks).contains(&rank) || !(0..t.nRanks).contains(&t.rank) {
        return Err(arg(format!("rank {rank} is not in a team of {} ranks (this rank at {})", t.nRanks, t.rank)));
    }
    let r = i64::from(w.rank) + (i64::from(rank) - i64::from(t.rank)) * i64::from(t.stride);
    if !(0..i64::from(w.nRanks)).contains(&r) {
        return Err(arg(format!("member {rank} of team {t:?} is world rank {r}, outside 0..{}", w.nRanks)));
    }
    Ok(r as c_int)
}

export! {
    EXPORTED;

    /// `ncclCommQueryProperties`: rank, size and device; no device API, multimem, GIN or CFT.
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: ncclComm_t, props: *mut ncclCommProperties_t) -> ncclResult_t {
        boundary("ncclCommQueryProperties", || query_properties(comm, props))
    }

    /// `ncclDevCommCreate` (no device API: `ncclInvalidUsage`).
    fn ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void, outDevComm: *mut c_void) -> ncclResult_t {
        let _ = (reqs, outDevComm);
        boundary("ncclDevCommCreate", || entry(comm).and_then(|_| unsupported("ncclDevCommCreate")))
    }

    /// `ncclDevCommDestroy` (no device communicator can exist: `ncclInvalidUsage`).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void) -> ncclResult_t {
        let _ = devComm;
        boundary("ncclDevCommDestroy", || entry(comm).and_then(|_| unsupported("ncclDevCommDestroy")))
    }

    /// `ncclGetLsaMultimemDevicePointer` (no windows: `ncclInvalidUsage`).
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(window: ncclWindow_t, offset: size_t, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, outPtr);
        boundary("ncclGetLsaMultimemDevicePointer", || unsupported("ncclGetLsaMultimemDevicePointer"))
    }

    /// `ncclGetMultimemDevicePointer` (no windows: `ncclInvalidUsage`).
    fn ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(window: ncclWindow_t, offset: size_t, multimem: ncclMultimemHandle_t, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, multimem, outPtr);
        boundary("ncclGetMultimemDevicePointer", || unsupported("ncclGetMultimemDevicePointer"))
    }

    /// `ncclGetLsaDevicePointer` (no windows: `ncclInvalidUsage`).
    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(window: ncclWindow_t, offset: size_t, lsaRank: c_int, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, lsaRank, outPtr);
        boundary("ncclGetLsaDevicePointer", || unsupported("ncclGetLsaDevicePointer"))
    }

    /// `ncclGetPeerDevicePointer` (no windows: `ncclInvalidUsage`).
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(window: ncclWindow_t, offset: size_t, peer: c_int, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, peer, outPtr);
        boundary("ncclGetPeerDevicePointer", || unsupported("ncclGetPeerDevicePointer"))
    }

    /// `ncclGetMultimemDeviceLeInfo` (no windows: `ncclInvalidUsage`).
    fn ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(window: ncclWindow_t, offset: size_t, leId: *mut u32, leOffset: *mut size_t) -> ncclResult_t {
        let _ = (window, offset, leId, leOffset);
        boundary("ncclGetMultimemDeviceLeInfo", || unsupported("ncclGetMultimemDeviceLeInfo"))
    }

    /// `ncclGetCftDeviceLeInfo` (no windows: `ncclInvalidUsage`).
    fn ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(window: ncclWindow_t, offset: size_t, peerCft: c_int, cftTeam: ncclTeam_t, leId: *mut u32, leOffset: *mut size_t) -> ncclResult_t {
        let _ = (window, offset, peerCft, cftTeam, leId, leOffset);
        boundary("ncclGetCftDeviceLeInfo", || unsupported("ncclGetCftDeviceLeInfo"))
    }

    /// `ncclGetPeerDeviceLeInfo` (no windows: `ncclInvalidUsage`).
    fn ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(window: ncclWindow_t, offset: size_t, peerWorld: c_int, leId: *mut u32, leOffset: *mut size_t) -> ncclResult_t {
        let _ = (window, offset, peerWorld, leId, leOffset);
        boundary("ncclGetPeerDeviceLeInfo", || unsupported("ncclGetPeerDeviceLeInfo"))
    }

    /// `ncclTeamWorld`: every rank, stride 1 (the empty team for a bad comm).
    fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamWorld", || world(comm))
    }

    /// `ncclTeamLsa`: this rank alone (no peer memory is load/store accessible here).
    fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamLsa", || world(comm).map(|_| ncclTeam_t { nRanks: 1, rank: 0, stride: 1 }))
    }

    /// `ncclTeamRail`: one rank per LSA team, so the world.
    fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamRail", || world(comm))
    }

    /// `ncclTeamCft` (no CFT: the empty team, and `ncclGetLastError` says why).
    fn ncclTeamCft / pncclTeamCft(comm: ncclComm_t, mode: c_int) -> ncclTeam_t {
        let _ = mode;
        team("ncclTeamCft", || world(comm).and_then(|_| unsupported("ncclTeamCft").map(|_| ncclTeam_t::default())))
    }

    /// `ncclTeamCftMultimem` (no CFT: the empty team, and `ncclGetLastError` says why).
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamCftMultimem", || world(comm).and_then(|_| unsupported("ncclTeamCftMultimem").map(|_| ncclTeam_t::default())))
    }

    /// `ncclTeamRankToWorld`: the world rank of member `rank` of `team` (-1 if out of range).
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        int("ncclTeamRankToWorld", || to_world(comm, team, rank))
    }

    /// `ncclTeamRankToLsa`: the LSA rank of member `rank` of `team`: 0 for this rank, -1 for any
    /// other (each LSA team is one rank).
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        int("ncclTeamRankToLsa", || {
            let me = world(comm)?.rank;
            let w = to_world(comm, team, rank)?;
            if w == me {
                Ok(0)
            } else {
                Err(arg(format!("world rank {w} is not in this rank's LSA team (each LSA team is one rank here)")))
            }
        })
    }

    /// `ncclLLA2ACalcSlots`: slots for `maxElts` elements of `maxEltSize` bytes (8-byte slots).
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
        int("ncclLLA2ACalcSlots", || {
            if maxElts < 0 || maxEltSize < 0 {
                return Err(arg(format!("ncclLLA2ACalcSlots({maxElts}, {maxEltSize}): negative size")));
            }
            maxElts.checked_mul((maxEltSize + 7) / 8).ok_or_else(|| arg("ncclLLA2ACalcSlots: the slot count overflows int"))
        })
    }

    /// `ncclLsaBarrierCreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (team, nBarriers, outHandle, outReq);
        boundary("ncclLsaBarrierCreateRequirement", || unsupported("ncclLsaBarrierCreateRequirement"))
    }

    /// `ncclGinBarrierCreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(comm: ncclComm_t, team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (comm, team, nBarriers, outHandle, outReq);
        boundary("ncclGinBarrierCreateRequirement", || unsupported("ncclGinBarrierCreateRequirement"))
    }

    /// `ncclCftBarrierCreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclCftBarrierCreateRequirement / pncclCftBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (team, nBarriers, outHandle, outReq);
        boundary("ncclCftBarrierCreateRequirement", || unsupported("ncclCftBarrierCreateRequirement"))
    }

    /// `ncclLLA2ACreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (nBlocks, nSlots, outHandle, outReq);
        boundary("ncclLLA2ACreateRequirement", || unsupported("ncclLLA2ACreateRequirement"))
    }

    /// `ncclGinOutboxCreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(nBlocks: c_int, sizeLog2: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (nBlocks, sizeLog2, outHandle, outReq);
        boundary("ncclGinOutboxCreateRequirement", || unsupported("ncclGinOutboxCreateRequirement"))
    }

    /// `ncclGinInboxA2ACreateRequirement` (no device communicators: `ncclInvalidUsage`).
    fn ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(peers: ncclTeam_t, nBlocks: c_int, sizeLog2: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t {
        let _ = (peers, nBlocks, sizeLog2, outHandle, outReq);
        boundary("ncclGinInboxA2ACreateRequirement", || unsupported("ncclGinInboxA2ACreateRequirement"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layouts_are_nccls() {
        type P = ncclCommProperties_t;
        assert_eq!(std::mem::size_of::<P>(), 152);
        assert_eq!(offset_of!(P, deviceApiSupport), 32);
        assert_eq!(offset_of!(P, ginType), 36);
        assert_eq!(offset_of!(P, commHash), 56);
        assert_eq!(offset_of!(P, ginSupport), 72);
        assert_eq!(offset_of!(P, devCommRuntimeVersionSize), 136);
        assert_eq!(offset_of!(P, cftCountedSupport), 146);
        assert_eq!(std::mem::size_of::<ncclTeam_t>(), 12);
    }

    #[test]
    fn slot_counts_are_nccls() {
        // SAFETY: plain integer arguments.
        unsafe {
            assert_eq!(ncclLLA2ACalcSlots(10, 8), 10);
            assert_eq!(ncclLLA2ACalcSlots(10, 9), 20);
            assert_eq!(ncclLLA2ACalcSlots(0, 100), 0);
            assert_eq!(ncclLLA2ACalcSlots(-1, 8), -1);
            assert_eq!(ncclLLA2ACalcSlots(i32::MAX, 64), -1);
        }
    }
}
