//! Fault tolerance and elasticity in the C ABI: `ncclCommRevoke`, `ncclCommShrink`,
//! `ncclCommGetUniqueId` + `ncclCommGrow`, `ncclCommSuspend` / `ncclCommResume` and
//! `ncclCommMemStats` (NCCL 2.27–2.29), over the core's [`Communicator`] methods.

use super::*;
use oxccl::{Communicator, Config, ShrinkMode, UniqueId};
use std::sync::Arc;

/// `NCCL_SHRINK_DEFAULT`.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`.
pub const NCCL_SHRINK_ABORT: c_int = 1;
/// `NCCL_REVOKE_DEFAULT`.
pub const NCCL_REVOKE_DEFAULT: c_int = 0;
/// `NCCL_SUSPEND_MEM`.
pub const NCCL_SUSPEND_MEM: c_int = 1;

/// `ncclCommMemStat_t` values.
const STAT_SUSPEND: c_int = 0;
const STAT_SUSPENDED: c_int = 1;
const STAT_PERSIST: c_int = 2;
const STAT_TOTAL: c_int = 3;

/// A new handle for `c`, blocking or not as `config` says (default: the parent's mode).
fn child(c: Communicator, blocking: Option<bool>, parent: Option<&Entry>) -> ncclComm_t {
    let e = Entry::new(blocking.or(parent.map(|p| p.blocking)).unwrap_or(true), parent.map_or(0, |p| p.device));
    let _ = e.comm.set(Arc::new(c));
    register(e)
}

fn settings(timeout: Option<std::time::Duration>) -> Config {
    let mut conf = Config::from_env();
    if let Some(t) = timeout {
        conf.timeout = t;
    }
    conf
}

/// Stop everything of `e` (revoke), wait for its queued requests (they fail) and its device
/// operations; `ncclInProgress` if something still runs.
fn revoke(e: &Entry) -> R {
    let c = e.ready()?;
    c.revoke();
    e.wait_requests();
    Ok(if c.quiescent() { ncclSuccess } else { ncclInProgress })
}

/// `ncclCommShrink`.
fn shrink(
    comm: ncclComm_t,
    list: *mut c_int,
    count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    flags: c_int,
) -> R {
    let e = entry(comm)?;
    if newcomm.is_null() {
        return Err(arg("newcomm is NULL"));
    }
    let n = usize::try_from(count).map_err(|_| arg(format!("excludeRanksCount {count} is negative")))?;
    if n > 0 && list.is_null() {
        return Err(arg(format!("excludeRanksList is NULL with excludeRanksCount {count}")));
    }
    let mode = match flags {
        NCCL_SHRINK_DEFAULT => ShrinkMode::Default,
        NCCL_SHRINK_ABORT => ShrinkMode::Abort,
        f => return Err(arg(format!("shrinkFlags {f:#x}: expected NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT"))),
    };
    // SAFETY: NCCL's contract for `config`.
    let cfg = unsafe { parse_config(config)? };
    let mut ex = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: non-null, `count` entries (NCCL's contract).
        let r = unsafe { *list.add(i) };
        ex.push(usize::try_from(r).map_err(|_| arg(format!("excludeRanksList[{i}] = {r} is negative")))?);
    }
    let c = e.ready()?;
    match mode {
        // the core checks the list, then revokes and waits until nothing runs
        ShrinkMode::Abort => {}
        ShrinkMode::Default if e.poll_requests() => {
            return Err(Error::invalid_usage(
                "ncclCommShrink: operations are outstanding (NCCL_SHRINK_DEFAULT needs none; NCCL_SHRINK_ABORT aborts them)",
            ));
        }
        ShrinkMode::Default => e.drain_device(),
    }
    let shrunk = c.shrink(&ex, mode)?;
    if mode == ShrinkMode::Abort {
        e.wait_requests(); // failed by the revoke: collected, not reported later
        e.async_error.lock().unwrap().take();
    }
    let h = child(shrunk, cfg.blocking, Some(&e));
    // SAFETY: checked non-null.
    unsafe { put(newcomm, h, "newcomm")? };
    Ok(ncclSuccess)
}

/// `ncclCommGrow`: a member (comm non-NULL, rank -1) or a newcomer (comm NULL, id and rank).
fn grow(
    comm: ncclComm_t,
    nranks: c_int,
    id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> R {
    if newcomm.is_null() {
        return Err(arg("newcomm is NULL"));
    }
    let n =
        usize::try_from(nranks).ok().filter(|&n| n >= 1).ok_or_else(|| arg(format!("nRanks {nranks} must be >= 1")))?;
    // SAFETY: NCCL's contract for `config`.
    let cfg = unsafe { parse_config(config)? };
    let uid = if id.is_null() {
        None
    } else {
        // SAFETY: non-null: one ncclUniqueId (NCCL's contract).
        let bytes: [u8; 128] = unsafe { (*id).internal }.map(|c| c as u8);
        let uid = UniqueId(bytes);
        uid.validate().map_err(|e| arg(format!("the unique id is not one from ncclCommGetUniqueId: {e}")))?;
        Some(uid)
    };
    let (c, parent) = if comm.is_null() {
        let uid = uid.ok_or_else(|| arg("a new rank (comm NULL) needs the uniqueId from ncclCommGetUniqueId"))?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| arg(format!("rank {rank} is out of range for {nranks} ranks")))?;
        (Communicator::join_grow_with_config(&uid, n, r, settings(cfg.timeout))?, None)
    } else {
        let e = entry(comm)?;
        let c = e.ready()?;
        if rank != -1 && usize::try_from(rank).ok() != Some(c.rank()) {
            return Err(arg(format!("rank {rank}: an existing rank passes -1 (it keeps its rank, {})", c.rank())));
        }
        e.wait_requests();
        (c.grow(n, uid.as_ref())?, Some(e))
    };
    let h = child(c, cfg.blocking, parent.as_deref());
    // SAFETY: checked non-null.
    unsafe { put(newcomm, h, "newcomm")? };
    Ok(ncclSuccess)
}

/// `ncclCommMemStats`: host connection memory is what suspend releases; nothing persists.
fn mem_stats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> R {
    let e = entry(comm)?;
    if value.is_null() {
        return Err(arg("value is NULL"));
    }
    let c = e.ready()?;
    let released = c.memory_bytes() as u64;
    let v = match stat {
        STAT_SUSPEND => released,
        STAT_SUSPENDED => c.suspended() as u64,
        STAT_PERSIST => 0,
        STAT_TOTAL => released,
        s => return Err(arg(format!("stat {s} is not a ncclCommMemStat_t (0 to 3)"))),
    };
    // SAFETY: checked non-null.
    unsafe { put(value, v, "value")? };
    Ok(ncclSuccess)
}

export! {
    EXPORTED;

    /// `ncclCommShrink`: a communicator of the ranks not excluded; only they call it.
    fn ncclCommShrink / pncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) -> ncclResult_t {
        boundary("ncclCommShrink", || shrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags))
    }

    /// `ncclCommGetUniqueId`: the single-use id of the next grow; its store is served here.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        boundary("ncclCommGetUniqueId", || {
            let e = entry(comm)?;
            if uniqueId.is_null() {
                return Err(arg("uniqueId is NULL"));
            }
            let id = e.ready()?.grow_id()?;
            let out = ncclUniqueId { internal: id.0.map(|b| b as c_char) };
            // SAFETY: checked non-null.
            unsafe { put(uniqueId, out, "uniqueId")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommGrow`: members keep their ranks; newcomers (comm NULL) take the new ones.
    fn ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommGrow", || grow(comm, nRanks, uniqueId, rank, newcomm, config))
    }

    /// `ncclCommRevoke`: stops every operation here; `ncclInProgress` until quiescent.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        boundary("ncclCommRevoke", || {
            let e = entry(comm)?;
            if revokeFlags != NCCL_REVOKE_DEFAULT {
                return Err(arg(format!("revokeFlags {revokeFlags:#x}: expected NCCL_REVOKE_DEFAULT (0)")));
            }
            revoke(&e)
        })
    }

    /// `ncclCommSuspend`: releases the connections and the device executor.
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        boundary("ncclCommSuspend", || {
            let e = entry(comm)?;
            if flags != NCCL_SUSPEND_MEM {
                return Err(arg(format!("flags {flags:#x}: expected NCCL_SUSPEND_MEM")));
            }
            let c = e.ready()?;
            e.wait_requests();
            c.suspend()?;
            *e.dev.lock().unwrap() = None; // its worker and staging memory, made again on use
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommResume`: connections are made again by the operations that need them.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommResume", || {
            entry(comm)?.ready()?.resume()?;
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommMemStats`: true byte counts of the connection memory, and the suspended flag.
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t {
        boundary("ncclCommMemStats", || mem_stats(comm, stat, value))
    }
}
