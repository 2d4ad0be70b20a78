//! The exported functions: every `ncclX` and its `pncclX` twin.

use super::*;
use oxccl::{Coll, Communicator, Config, Error, UniqueId};
use std::ffi::CStr;
use std::sync::Arc;

/// Every exported function name (each also exported with a `p` prefix), for the header tests.
pub fn exported() -> Vec<&'static str> {
    [EXPORTED_CORE, collconfig::EXPORTED, devapi::EXPORTED, elastic::EXPORTED, encryption::EXPORTED].concat()
}

pub(crate) static ERROR_STRINGS: [&CStr; 10] = [
    c"no error",
    c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
    c"internal error - please report this issue to the NCCL developers",
    c"invalid argument (run with NCCL_DEBUG=WARN for details)",
    c"invalid usage (run with NCCL_DEBUG=WARN for details)",
    c"remote process exited or there was a network error",
    c"NCCL operation in progress",
    c"timeout",
    c"unknown result code",
];

pub(crate) fn init_rank(comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int, cfg: Parsed) -> R {
    if comm.is_null() {
        return Err(arg("comm (the out-pointer) is NULL"));
    }
    let n =
        usize::try_from(nranks).ok().filter(|&n| n >= 1).ok_or_else(|| arg(format!("nranks {nranks} must be >= 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| arg(format!("rank {rank} is out of range for {nranks} ranks")))?;
    let bytes: [u8; 128] = id.internal.map(|c| c as u8);
    let uid = UniqueId(bytes);
    uid.validate().map_err(|e| arg(format!("the unique id is not one from ncclGetUniqueId: {e}")))?;
    let blocking = cfg.blocking.unwrap_or(true);
    let mut conf = Config::from_env();
    if let Some(t) = cfg.timeout {
        conf.timeout = t;
    }
    let e = Entry::new(blocking, 0);
    if blocking {
        let c = Communicator::init_with_config(&uid, n, r, conf)?;
        let _ = e.comm.set(Arc::new(c));
        // SAFETY: checked non-null above; the caller's out-pointer.
        unsafe { put(comm, register(e), "comm")? };
        return Ok(ncclSuccess);
    }
    let h = register(e.clone());
    // SAFETY: checked non-null above.
    unsafe { put(comm, h, "comm")? };
    std::thread::Builder::new()
        .name("oxccl-init".into())
        .spawn(move || match Communicator::init_with_config(&uid, n, r, conf) {
            Ok(c) => {
                let _ = e.comm.set(Arc::new(c));
            }
            Err(err) => *e.init_error.lock().unwrap() = Some(err),
        })
        .map_err(|err| Error::system("spawning the init thread", &err))?;
    Ok(ncclInProgress)
}

export! {
    EXPORTED_CORE;

    /// `ncclGetVersion`: NCCL_VERSION_CODE of the ABI implemented (2.32.3).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        // SAFETY: NCCL's contract for the out-pointer.
        boundary("ncclGetVersion", || unsafe { put(version, NCCL_VERSION_CODE, "version").map(|_| ncclSuccess) })
    }

    /// `ncclGetUniqueId`: a new id; its rendezvous is served by this process.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        boundary("ncclGetUniqueId", || {
            if uniqueId.is_null() {
                return Err(arg("uniqueId is NULL"));
            }
            let id = UniqueId::new()?;
            let out = ncclUniqueId { internal: id.0.map(|b| b as c_char) };
            // SAFETY: non-null, NCCL's contract.
            unsafe { put(uniqueId, out, "uniqueId")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommInitRank`
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t {
        boundary("ncclCommInitRank", || init_rank(comm, nranks, commId, rank, Parsed { blocking: Some(true), timeout: None }))
    }

    /// `ncclCommInitRankConfig`: `config` may be NULL or any historic `ncclConfig_t` layout.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommInitRankConfig", || {
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            init_rank(comm, nranks, commId, rank, cfg)
        })
    }

    /// `ncclCommInitRankScalable`: with one id, the same as `ncclCommInitRankConfig`.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommInitRankScalable", || {
            if commIds.is_null() {
                return Err(arg("commIds is NULL"));
            }
            if nId != 1 {
                return Err(Error::invalid_usage(format!("ncclCommInitRankScalable with {nId} ids: oxccl implements one id only (its rendezvous already scales)")));
            }
            // SAFETY: non-null, at least nId = 1 ids (NCCL's contract).
            let id = unsafe { *commIds };
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            init_rank(newcomm, nranks, id, myrank, cfg)
        })
    }

    /// `ncclCommInitAll`: `ndev` communicators of one process (threads as ranks).
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        boundary("ncclCommInitAll", || {
            if comm.is_null() {
                return Err(arg("comm (the out-array) is NULL"));
            }
            let n = usize::try_from(ndev).ok().filter(|&n| n >= 1).ok_or_else(|| arg(format!("ndev {ndev} must be >= 1")))?;
            let comms = Communicator::init_all(n)?;
            for (i, c) in comms.into_iter().enumerate() {
                let dev = if devlist.is_null() {
                    i as c_int
                } else {
                    // SAFETY: devlist has ndev entries (NCCL's contract).
                    unsafe { *devlist.add(i) }
                };
                let e = Entry::new(true, dev);
                let _ = e.comm.set(Arc::new(c));
                // SAFETY: comm has room for ndev handles (NCCL's contract).
                unsafe { comm.add(i).write(register(e)) };
            }
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommSplit`: `NCCL_SPLIT_NOCOLOR` gives `*newcomm = NULL`.
    fn ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommSplit", || {
            let e = entry(comm)?;
            if newcomm.is_null() {
                return Err(arg("newcomm is NULL"));
            }
            if color < 0 && color != NCCL_SPLIT_NOCOLOR {
                return Err(arg(format!("color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR")));
            }
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            e.wait_requests();
            let parent = e.ready()?;
            let child = parent.split(color, key)?;
            let h = match child {
                Some(c) => {
                    let ne = Entry::new(cfg.blocking.unwrap_or(e.blocking), e.device);
                    let _ = ne.comm.set(Arc::new(c));
                    register(ne)
                }
                None => std::ptr::null_mut(),
            };
            // SAFETY: checked non-null.
            unsafe { put(newcomm, h, "newcomm")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommFinalize`: completes every operation of the communicator.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommFinalize", || {
            let e = entry(comm)?;
            if e.ready()?.revoked() {
                return Err(Error::invalid_usage("ncclCommFinalize on a revoked communicator: destroy it"));
            }
            e.wait_requests();
            let err = e.async_error.lock().unwrap().clone();
            match err {
                Some(err) => Err(err),
                None => Ok(ncclSuccess),
            }
        })
    }

    /// `ncclCommDestroy`: releases everything; the handle is invalid afterwards.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommDestroy", || {
            if release_inherited(comm) {
                return Ok(ncclSuccess);
            }
            entry(comm)?;
            if let Some(e) = unregister(comm) {
                e.wait_requests();
            }
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommAbort`: from any thread; operations in flight fail at once, then everything is released.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommAbort", || {
            if release_inherited(comm) {
                return Ok(ncclSuccess);
            }
            let e = entry(comm)?;
            if let Some(c) = e.comm.get() {
                c.abort();
            }
            unregister(comm);
            Ok(ncclSuccess)
        })
    }

    /// `ncclGetErrorString`: NCCL's exact texts.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        let i = usize::try_from(result).ok().filter(|&i| i < 9).unwrap_or(9);
        ERROR_STRINGS[i].as_ptr()
    }

    /// `ncclGetLastError`: the last error's detailed text (process-wide, as in NCCL): rank, peer, operation.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        last_error::current()
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while initialization or non-blocking operations run.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        boundary("ncclCommGetAsyncError", || {
            let e = entry(comm)?;
            if asyncError.is_null() {
                return Err(arg("asyncError is NULL"));
            }
            let state = match e.ready() {
                Err(err) => result_of(&err),
                // revoked: in progress until nothing runs, then success (its stopped operations
                // are not errors)
                Ok(c) if c.revoked() => match e.poll_requests() || !c.quiescent() {
                    true => ncclInProgress,
                    false => ncclSuccess,
                },
                Ok(c) => {
                    if e.poll_requests() {
                        ncclInProgress
                    } else if let Some(err) =
                        e.async_error.lock().unwrap().clone().or_else(|| e.device_error()).or_else(|| c.error())
                    {
                        set_last_error(&err.to_string());
                        result_of(&err)
                    } else {
                        ncclSuccess
                    }
                }
            };
            // SAFETY: checked non-null.
            unsafe { put(asyncError, state, "asyncError")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommCount`
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        boundary("ncclCommCount", || {
            let n = entry(comm)?.ready()?.size() as c_int;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(count, n, "count")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommCuDevice`: the device given to `ncclCommInitAll` (its index without a devlist), 0 otherwise.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        boundary("ncclCommCuDevice", || {
            let e = entry(comm)?;
            e.ready()?;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(device, e.device, "device")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommUserRank`
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        boundary("ncclCommUserRank", || {
            let r = entry(comm)?.ready()?.rank() as c_int;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(rank, r, "rank")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclMemAlloc`: page-aligned host memory (the host path needs nothing else).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: size_t) -> ncclResult_t {
        boundary("ncclMemAlloc", || {
            if ptr.is_null() {
                return Err(arg("ptr is NULL"));
            }
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: posix_memalign writes the allocation into `p`.
            let rc = unsafe { libc::posix_memalign(&mut p, 4096, size.max(1)) };
            if rc != 0 {
                return Err(Error::system(format!("allocating {size} bytes"), &std::io::Error::from_raw_os_error(rc)));
            }
            // SAFETY: checked non-null.
            unsafe { put(ptr, p, "ptr")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclMemFree`: frees what `ncclMemAlloc` returned.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        boundary("ncclMemFree", || {
            // SAFETY: `ptr` came from ncclMemAlloc (posix_memalign) or is NULL (NCCL's contract).
            unsafe { libc::free(ptr) };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommRegister`: host memory needs no registration; the handle records the range.
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: size_t, handle: *mut *mut c_void) -> ncclResult_t {
        boundary("ncclCommRegister", || {
            entry(comm)?;
            if buff.is_null() && size > 0 {
                return Err(arg("buff is NULL"));
            }
            let h = Box::into_raw(Box::new((buff as usize, size))) as *mut c_void;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(handle, h, "handle")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommDeregister`
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        boundary("ncclCommDeregister", || {
            entry(comm)?;
            if handle.is_null() {
                return Err(arg("handle is NULL"));
            }
            // SAFETY: a handle from ncclCommRegister (NCCL's contract), freed once.
            drop(unsafe { Box::from_raw(handle as *mut (usize, usize)) });
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommWindowRegister` (not implemented yet).
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: size_t, win: *mut ncclWindow_t, winFlags: c_int) -> ncclResult_t {
        let _ = (comm, buff, size, win, winFlags);
        boundary("ncclCommWindowRegister", || not_implemented("ncclCommWindowRegister"))
    }

    /// `ncclCommWindowDeregister` (not implemented yet).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        let _ = (comm, win);
        boundary("ncclCommWindowDeregister", || not_implemented("ncclCommWindowDeregister"))
    }

    /// `ncclWinGetUserPtr` (not implemented yet).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (comm, win, outUserPtr);
        boundary("ncclWinGetUserPtr", || not_implemented("ncclWinGetUserPtr"))
    }

    /// `ncclRedOpCreatePreMulSum`: `scalar` is read now (`ncclScalarHostImmediate`) or at each use (`ncclScalarDevice`, a host pointer here).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclRedOpCreatePreMulSum", || {
            let e = entry(comm)?;
            let dt = dtype(datatype)?;
            if op.is_null() || scalar.is_null() {
                return Err(arg("op or scalar is NULL"));
            }
            let s = match residence {
                0 => Scalar::Pointer(scalar as usize),
                1 => {
                    let mut b = [0u8; 8];
                    // SAFETY: scalar points to one value of `datatype` (NCCL's contract).
                    unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), dt.size()) };
                    Scalar::Value(b)
                }
                r => return Err(arg(format!("scalar residence {r} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)"))),
            };
            let mut ops = e.ops.lock().unwrap();
            let idx = match ops.iter().position(|o| o.is_none()) {
                Some(i) => {
                    ops[i] = Some((dt, s));
                    i
                }
                None => {
                    ops.push(Some((dt, s)));
                    ops.len() - 1
                }
            };
            // SAFETY: checked non-null.
            unsafe { put(op, ncclNumOps + idx as c_int, "op")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclRedOpDestroy`: built-in ops cannot be destroyed.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclRedOpDestroy", || {
            let e = entry(comm)?;
            if op < ncclNumOps {
                return Err(arg(format!("reduction op {op} is built in and cannot be destroyed")));
            }
            let mut ops = e.ops.lock().unwrap();
            match ops.get_mut((op - ncclNumOps) as usize) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    Ok(ncclSuccess)
                }
                _ => Err(arg(format!("reduction op {op} is not a live op of this communicator"))),
            }
        })
    }

    /// `ncclReduce`: `recvbuff` may be NULL on ranks other than the root.
    fn ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclReduce", || enqueue(comm, Coll::Reduce, sendbuff, recvbuff, count, datatype, op, root, stream))
    }

    /// `ncclBcast`: in-place broadcast.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclBcast", || enqueue(comm, Coll::Broadcast, buff, buff, count, datatype, 0, root, stream))
    }

    /// `ncclBroadcast`
    fn ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclBroadcast", || enqueue(comm, Coll::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclAllReduce`
    fn ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAllReduce", || enqueue(comm, Coll::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, stream))
    }

    /// `ncclReduceScatter`: `recvcount` elements per rank.
    fn ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclReduceScatter", || enqueue(comm, Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream))
    }

    /// `ncclAllGather`: `sendcount` elements per rank.
    fn ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAllGather", || enqueue(comm, Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, stream))
    }

    /// `ncclAlltoAll`: `count` elements to and from each rank.
    fn ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAlltoAll", || enqueue(comm, Coll::AllToAll, sendbuff, recvbuff, count, datatype, 0, 0, stream))
    }

    /// `ncclGather`
    fn ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclGather", || enqueue(comm, Coll::Gather, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclScatter`
    fn ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclScatter", || enqueue(comm, Coll::Scatter, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclSend`: pair it with the peer's `ncclRecv` (in a group when both directions are used).
    fn ncclSend / pncclSend(sendbuff: *const c_void, count: size_t, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclSend", || enqueue(comm, Coll::Send, sendbuff, std::ptr::null_mut(), count, datatype, 0, peer, stream))
    }

    /// `ncclRecv`
    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: size_t, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclRecv", || enqueue(comm, Coll::Recv, std::ptr::null(), recvbuff, count, datatype, 0, peer, stream))
    }

    /// `ncclPutSignal` (not implemented yet).
    fn ncclPutSignal / pncclPutSignal(localbuff: *const c_void, count: size_t, datatype: c_int, peer: c_int, peerWin: ncclWindow_t, peerWinOffset: size_t, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream);
        boundary("ncclPutSignal", || not_implemented("ncclPutSignal"))
    }

    /// `ncclSignal` (not implemented yet).
    fn ncclSignal / pncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (peer, sigIdx, ctx, flags, comm, stream);
        boundary("ncclSignal", || not_implemented("ncclSignal"))
    }

    /// `ncclWaitSignal` (not implemented yet).
    fn ncclWaitSignal / pncclWaitSignal(nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (nDesc, signalDescs, comm, stream);
        boundary("ncclWaitSignal", || not_implemented("ncclWaitSignal"))
    }

    /// `ncclGroupStart`: groups nest; operations are recorded until the outermost `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        boundary("ncclGroupStart", || {
            GROUP.with(|g| g.borrow_mut().0 += 1);
            Ok(ncclSuccess)
        })
    }

    /// `ncclGroupEnd`: the outermost one runs every recorded operation, on every communicator, together.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        boundary("ncclGroupEnd", group_end)
    }

    /// `ncclGroupSimulateEnd` (not implemented yet).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        let _ = simInfo;
        boundary("ncclGroupSimulateEnd", || not_implemented("ncclGroupSimulateEnd"))
    }

    /// `ncclParamBind` (not implemented yet).
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
        let _ = (out, key);
        boundary("ncclParamBind", || not_implemented("ncclParamBind"))
    }

    /// `ncclParamGetI8` (not implemented yet).
    fn ncclParamGetI8 / pncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI8", || not_implemented("ncclParamGetI8"))
    }

    /// `ncclParamGetU8` (not implemented yet).
    fn ncclParamGetU8 / pncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU8", || not_implemented("ncclParamGetU8"))
    }

    /// `ncclParamGetI16` (not implemented yet).
    fn ncclParamGetI16 / pncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI16", || not_implemented("ncclParamGetI16"))
    }

    /// `ncclParamGetU16` (not implemented yet).
    fn ncclParamGetU16 / pncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU16", || not_implemented("ncclParamGetU16"))
    }

    /// `ncclParamGetI32` (not implemented yet).
    fn ncclParamGetI32 / pncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI32", || not_implemented("ncclParamGetI32"))
    }

    /// `ncclParamGetU32` (not implemented yet).
    fn ncclParamGetU32 / pncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU32", || not_implemented("ncclParamGetU32"))
    }

    /// `ncclParamGetI64` (not implemented yet).
    fn ncclParamGetI64 / pncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI64", || not_implemented("ncclParamGetI64"))
    }

    /// `ncclParamGetU64` (not implemented yet).
    fn ncclParamGetU64 / pncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU64", || not_implemented("ncclParamGetU64"))
    }

    /// `ncclParamGetStr` (not implemented yet).
    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetStr", || not_implemented("ncclParamGetStr"))
    }

    /// `ncclParamGet` (not implemented yet).
    fn ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) -> ncclResult_t {
        let _ = (h, out, maxLen, len);
        boundary("ncclParamGet", || not_implemented("ncclParamGet"))
    }

    /// `ncclParamGetParameter` (not implemented yet).
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char, valueLen: *mut c_int) -> ncclResult_t {
        let _ = (key, value, valueLen);
        boundary("ncclParamGetParameter", || not_implemented("ncclParamGetParameter"))
    }

    /// `ncclParamGetAllParameterKeys` (not implemented yet).
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *mut *const c_char, tableLen: *mut c_int) -> ncclResult_t {
        let _ = (table, tableLen);
        boundary("ncclParamGetAllParameterKeys", || not_implemented("ncclParamGetAllParameterKeys"))
    }

    /// `ncclParamDumpAll` (not implemented yet: it prints nothing and sets `ncclGetLastError`).
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        let _ = boundary("ncclParamDumpAll", || not_implemented("ncclParamDumpAll"));
    }

    /// `ncclResetDebugInit` (deprecated in NCCL; nothing to reset here).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {}

    /// `ncclResetDebugInitInternal`: what `ncclResetDebugInit` calls in NCCL (likewise nothing here).
    fn ncclResetDebugInitInternal / pncclResetDebugInitInternal() -> () {}
}
