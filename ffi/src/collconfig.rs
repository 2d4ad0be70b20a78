//! NCCL 2.31's per-call configuration: `ncclCollConfig_t` and the `nccl*Config` collectives.
//!
//! What each field does here:
//! - `algSelection` restricts the call's algorithm, with `NCCL_ALGO`'s syntax (see
//!   [`oxccl::AlgoSelection::parse`]); with `forceAlgSelection` (the default) a selection that
//!   leaves no algorithm is `ncclInvalidUsage`, without it the call falls back to the tuner. The
//!   selection travels with the call's messages, so ranks that pass different selections fail as
//!   a mismatch on every rank.
//! - `userProfilerTag` is written with the call into the flight record (`OXCCL_DUMP_DIR`).
//! - `minCTAs`, `maxCTAs`, `nvlsCTAs`, `cgaClusterSize` and `CTAPolicy` size GPU kernels, which
//!   oxccl does not launch per call: they are validated and ignored. `ext` (vendor extensions)
//!   is ignored, as NCCL itself ignores every extension.
//! - `launchCompletionEvent` (2.32) is refused when set: no kernel launch completes to record it.
//!
//! The struct is read through [`crate::probe`], so a garbage pointer is an error, not a crash.

use super::*;
use crate::probe::{read_bytes, read_cstr};

/// `ncclConfigExt_t`: one vendor option (ignored, as NCCL ignores every extension).
#[repr(C)]
pub struct ncclConfigExt_t {
    /// Next option, or NULL.
    pub next: *mut ncclConfigExt_t,
    /// Vendor id.
    pub vendorId: c_int,
    /// Option id.
    pub optionId: c_int,
    /// Value (int, string or pointer).
    pub val: *mut c_void,
}

/// `ncclCollConfig_t` as NCCL 2.32.3 lays it out (72 bytes; 2.31's is the first 64).
#[repr(C)]
pub struct ncclCollConfig_t {
    /// Caller's `sizeof(ncclCollConfig_t)`.
    pub size: size_t,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// Caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// Vendor extensions (ignored).
    pub ext: *mut ncclConfigExt_t,
    /// Lower bound on CTAs (validated, ignored).
    pub minCTAs: c_int,
    /// Upper bound on CTAs (validated, ignored).
    pub maxCTAs: c_int,
    /// NVLS CTAs (validated, ignored).
    pub nvlsCTAs: c_int,
    /// CGA cluster size (validated, ignored).
    pub cgaClusterSize: c_int,
    /// Algorithm selection, `NCCL_ALGO` syntax; NULL or "" is automatic.
    pub algSelection: *const c_char,
    /// 1 (default): an unsatisfiable selection is an error; 0: fall back to automatic.
    pub forceAlgSelection: c_int,
    /// CTA policy bitmask (validated, ignored).
    pub CTAPolicy: c_int,
    /// Opaque tag, written into the flight record.
    pub userProfilerTag: u64,
    /// CUDA event recorded at kernel launch completion (refused when set).
    pub launchCompletionEvent: *mut c_void,
}

/// `ncclCollConfig_t` fields by byte offset (x86_64 and aarch64 Linux layout).
const OFF_ALG: usize = 40;
const OFF_FORCE: usize = 48;
const OFF_POLICY: usize = 52;
const OFF_TAG: usize = 56;
const OFF_EVENT: usize = 64;

/// The options a caller's `ncclCollConfig_t` asks for (NULL: a plain call).
pub fn parse(cfg: *const ncclCollConfig_t, coll: Coll) -> Result<CallOptions, Error> {
    if cfg.is_null() {
        return Ok(CallOptions::default());
    }
    let head =
        read_bytes(cfg as usize, 16).ok_or_else(|| arg(format!("config ({cfg:p}) points to unreadable memory")))?;
    let size = usize::from_ne_bytes(head[0..8].try_into().unwrap());
    let magic = u32::from_ne_bytes(head[8..12].try_into().unwrap());
    if magic != NCCL_API_MAGIC {
        return Err(arg(format!(
            "ncclCollConfig_t has magic {magic:#x}, expected {NCCL_API_MAGIC:#x} (initialize it with NCCL_COLLCONFIG_INITIALIZER)"
        )));
    }
    if !(16..=1 << 16).contains(&size) {
        return Err(arg(format!(
            "ncclCollConfig_t of {size} bytes (not initialized with NCCL_COLLCONFIG_INITIALIZER?)"
        )));
    }
    let n = size.min(std::mem::size_of::<ncclCollConfig_t>());
    let raw = read_bytes(cfg as usize, n)
        .ok_or_else(|| arg(format!("config ({cfg:p}) of {size} bytes is not readable memory")))?;
    let i32_at =
        |o: usize, dflt: i32| if o + 4 <= n { i32::from_ne_bytes(raw[o..o + 4].try_into().unwrap()) } else { dflt };
    let ptr_at = |o: usize| if o + 8 <= n { usize::from_ne_bytes(raw[o..o + 8].try_into().unwrap()) } else { 0 };
    let undef = NCCL_CONFIG_UNDEF_INT;
    for (name, off, lo, hi) in
        [("minCTAs", 24, 1, 64), ("maxCTAs", 28, 1, 64), ("nvlsCTAs", 32, 1, 64), ("cgaClusterSize", 36, 0, 8)]
    {
        let v = i32_at(off, undef);
        if v != undef && !(lo..=hi).contains(&v) {
            return Err(arg(format!("ncclCollConfig_t.{name} is {v}; it must be unset or in {lo}..={hi}")));
        }
    }
    let (min, max) = (i32_at(24, undef), i32_at(28, undef));
    if min != undef && max != undef && min > max {
        return Err(arg(format!("ncclCollConfig_t.minCTAs {min} exceeds maxCTAs {max}")));
    }
    let policy = i32_at(OFF_POLICY, undef);
    if policy != undef && !(0..=3).contains(&policy) {
        return Err(arg(format!(
            "ncclCollConfig_t.CTAPolicy is {policy}; it must be unset or a NCCL_CTA_POLICY_* mask"
        )));
    }
    let force = match i32_at(OFF_FORCE, 1) {
        1 => true,
        0 => false,
        v if v == undef => true,
        v => return Err(arg(format!("ncclCollConfig_t.forceAlgSelection is {v}; it must be 0 or 1"))),
    };
    if ptr_at(OFF_EVENT) != 0 {
        return Err(Error::invalid_usage(
            "ncclCollConfig_t.launchCompletionEvent is set, but oxccl does not launch a kernel per call to record it on \
             (leave it NULL on every rank)",
        ));
    }
    let spec = read_cstr(ptr_at(OFF_ALG) as *const c_char, 1024, "ncclCollConfig_t.algSelection")?;
    let algos = match spec {
        Some(s) => oxccl::AlgoSelection::parse(&s, coll, force)?,
        None => oxccl::AlgoSelection::AUTO,
    };
    let profiler_tag =
        if OFF_TAG + 8 <= n { u64::from_ne_bytes(raw[OFF_TAG..OFF_TAG + 8].try_into().unwrap()) } else { 0 };
    Ok(CallOptions { algos, profiler_tag })
}

/// A collective with a per-call config.
#[allow(clippy::too_many_arguments)] // NCCL's argument list
fn call(
    comm: ncclComm_t,
    coll: Coll,
    send: *const c_void,
    recv: *mut c_void,
    count: size_t,
    datatype: c_int,
    op: c_int,
    root: c_int,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> R {
    let opts = parse(config, coll)?;
    enqueue_with(comm, coll, send, recv, count, datatype, op, root, stream, opts)
}

export! {
    EXPORTED;

    /// `ncclAllReduceConfig`: [`ncclAllReduce`] with a per-call config (NULL: the plain call).
    fn ncclAllReduceConfig / pncclAllReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclAllReduceConfig", || call(comm, Coll::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, stream, config))
    }

    /// `ncclBroadcastConfig`
    fn ncclBroadcastConfig / pncclBroadcastConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclBroadcastConfig", || call(comm, Coll::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, stream, config))
    }

    /// `ncclReduceConfig`
    fn ncclReduceConfig / pncclReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclReduceConfig", || call(comm, Coll::Reduce, sendbuff, recvbuff, count, datatype, op, root, stream, config))
    }

    /// `ncclAllGatherConfig`
    fn ncclAllGatherConfig / pncclAllGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclAllGatherConfig", || call(comm, Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, stream, config))
    }

    /// `ncclReduceScatterConfig`
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclReduceScatterConfig", || call(comm, Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream, config))
    }

    /// `ncclAlltoAllConfig`
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclAlltoAllConfig", || call(comm, Coll::AllToAll, sendbuff, recvbuff, count, datatype, 0, 0, stream, config))
    }

    /// `ncclGatherConfig`
    fn ncclGatherConfig / pncclGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclGatherConfig", || call(comm, Coll::Gather, sendbuff, recvbuff, count, datatype, 0, root, stream, config))
    }

    /// `ncclScatterConfig`
    fn ncclScatterConfig / pncclScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t {
        boundary("ncclScatterConfig", || call(comm, Coll::Scatter, sendbuff, recvbuff, count, datatype, 0, root, stream, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::ErrorKind;

    #[test]
    fn layout_is_nccls() {
        assert_eq!(std::mem::size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, algSelection), OFF_ALG);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, forceAlgSelection), OFF_FORCE);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, CTAPolicy), OFF_POLICY);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, userProfilerTag), OFF_TAG);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, launchCompletionEvent), OFF_EVENT);
        assert_eq!(std::mem::size_of::<ncclConfigExt_t>(), 24);
    }

    fn initializer() -> ncclCollConfig_t {
        let u = NCCL_CONFIG_UNDEF_INT;
        ncclCollConfig_t {
            size: 72,
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as u32,
            ext: std::ptr::null_mut(),
            minCTAs: u,
            maxCTAs: u,
            nvlsCTAs: u,
            cgaClusterSize: u,
            algSelection: std::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: u,
            userProfilerTag: 0,
            launchCompletionEvent: std::ptr::null_mut(),
        }
    }

    #[test]
    fn configs_parse_and_bad_ones_are_refused() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let ar = Coll::AllReduce;
        assert_eq!(parse(std::ptr::null(), ar).unwrap(), CallOptions::default());
        let mut c = initializer();
        assert_eq!(parse(&c, ar).unwrap(), CallOptions::default());
        c.algSelection = c"tree".as_ptr();
        c.userProfilerTag = 42;
        let o = parse(&c, ar).unwrap();
        assert!(o.algos.allows(oxccl::Algo::Tree) && !o.algos.allows(oxccl::Algo::Ring));
        assert_eq!(o.profiler_tag, 42);
        // 2.31's 64-byte layout: no event field is read
        c.size = 64;
        c.launchCompletionEvent = 8 as *mut c_void;
        assert!(parse(&c, ar).is_ok());
        c.size = 72;
        assert_eq!(parse(&c, ar).unwrap_err().kind, ErrorKind::InvalidUsage);
        for bad in [
            |c: &mut ncclCollConfig_t| c.magic = 0,
            |c: &mut ncclCollConfig_t| c.size = 3,
            |c: &mut ncclCollConfig_t| c.size = usize::MAX,
            |c: &mut ncclCollConfig_t| c.minCTAs = 0,
            |c: &mut ncclCollConfig_t| {
                c.minCTAs = 8;
                c.maxCTAs = 2
            },
            |c: &mut ncclCollConfig_t| c.cgaClusterSize = 99,
            |c: &mut ncclCollConfig_t| c.CTAPolicy = 16,
            |c: &mut ncclCollConfig_t| c.forceAlgSelection = 7,
            |c: &mut ncclCollConfig_t| c.algSelection = c"bogus".as_ptr(),
            |c: &mut ncclCollConfig_t| c.algSelection = 24 as *const c_char,
        ] {
            let mut x = initializer();
            bad(&mut x);
            assert_eq!(parse(&x, ar).unwrap_err().kind, ErrorKind::InvalidArgument);
        }
        assert!(parse(16 as *const ncclCollConfig_t, ar).is_err());
    }
}
