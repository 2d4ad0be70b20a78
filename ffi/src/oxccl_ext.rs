//! oxccl's own entry points, beyond NCCL's API (named `oxccl…`, so no NCCL header declares them).

use super::*;
use std::time::Duration;

/// `oxcclCommInitRankTimeout`: `ncclCommInitRank` with this communicator's own bound on every
/// wait (bootstrap, connection setup, each operation), in seconds, instead of `OXCCL_TIMEOUT`'s.
/// The torch backend passes its group's timeout this way, so that two groups of one process
/// keep their own timeouts.
///
/// # Safety
/// As for `ncclCommInitRank`: `comm` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn oxcclCommInitRankTimeout(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    timeout_seconds: f64,
) -> ncclResult_t {
    boundary("oxcclCommInitRankTimeout", || {
        if !(timeout_seconds.is_finite() && timeout_seconds > 0.0) {
            return Err(arg(format!("timeout_seconds {timeout_seconds} must be a positive number of seconds")));
        }
        let timeout = Duration::try_from_secs_f64(timeout_seconds)
            .map_err(|_| arg(format!("timeout_seconds {timeout_seconds} is too large")))?;
        init_rank(comm, nranks, commId, rank, Parsed { blocking: Some(true), timeout: Some(timeout) })
    })
}

/// `oxcclUniqueIdDerive`: the id of a fresh job on `id`'s store (same address and secret), one
/// per `salt`: communicators built on `*out` meet in their own namespace. The torch backend's
/// reconfigure makes one communicator per instance this way from one handle.
///
/// # Safety
/// `id` is NULL or points to one `ncclUniqueId`; `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn oxcclUniqueIdDerive(
    id: *const ncclUniqueId,
    salt: u64,
    out: *mut ncclUniqueId,
) -> ncclResult_t {
    boundary("oxcclUniqueIdDerive", || {
        if id.is_null() {
            return Err(arg("id is NULL"));
        }
        // SAFETY: non-null: one ncclUniqueId (the function's contract).
        let bytes: [u8; 128] = unsafe { (*id).internal }.map(|c| c as u8);
        let derived = oxccl::UniqueId(bytes)
            .derive(salt)
            .map_err(|e| arg(format!("the unique id is not one from ncclGetUniqueId: {e}")))?;
        // SAFETY: the caller's out-pointer (checked non-null by put).
        unsafe { put(out, ncclUniqueId { internal: derived.0.map(|b| b as c_char) }, "out")? };
        Ok(ncclSuccess)
    })
}

/// `oxcclRecvAny`: `ncclRecv` from whichever rank sends to this one first (gloo's and MPI's
/// any-source receive); the matched rank is written to `*source`. The peer sends with an
/// ordinary `ncclSend`. Host memory only, outside a group, and blocking: it returns once the
/// message is received (or with the communicator's timeout, which leaves it usable).
///
/// # Safety
/// As for `ncclRecv` on host memory; `source` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn oxcclRecvAny(
    recvbuff: *mut c_void,
    count: size_t,
    datatype: c_int,
    source: *mut c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("oxcclRecvAny", || {
        if source.is_null() {
            return Err(arg("source is NULL"));
        }
        let e = entry(comm)?;
        let c = e.ready()?;
        let dt = dtype(datatype)?;
        if GROUP.with(|g| g.borrow().0 > 0) {
            return Err(oxccl::Error::invalid_usage(
                "oxcclRecvAny cannot be part of a group (call it outside ncclGroupStart/End)",
            ));
        }
        let desc = |root| oxccl::OpDesc { coll: oxccl::Coll::Recv, dtype: dt, op: oxccl::ReduceOp::Sum, count, root };
        let layout = layout(c, &desc(0), std::ptr::null(), recvbuff)?;
        if placement(&layout, "oxcclRecvAny")?.is_some() {
            return Err(oxccl::Error::invalid_usage(
                "oxcclRecvAny takes host memory (device buffers: use ncclRecv with the peer)",
            ));
        }
        if count == 0 {
            return Err(arg("oxcclRecvAny needs at least one element: a send of nothing puts nothing on the wire"));
        }
        host_after_stream(stream, "oxcclRecvAny")?;
        e.drain_device();
        let peer = c.probe_any(&[])?;
        // SAFETY: blocking, as NCCL's own ncclRecv on host memory: the buffer outlives the call.
        c.run(desc(peer), unsafe { borrowed(&layout) })?;
        // SAFETY: checked non-NULL; the caller's contract makes it valid for one write.
        unsafe { *source = peer as c_int };
        Ok(ncclSuccess)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> ncclUniqueId {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, ncclSuccess);
        id
    }

    /// A derived id names the same store (a communicator builds on it) in a namespace of its
    /// own per salt; NULLs and ids that are not ids are argument errors.
    #[test]
    fn derived_ids_build_communicators_and_bad_input_is_refused() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let id = uid();
        let (mut a, mut b) = (ncclUniqueId { internal: [0; 128] }, ncclUniqueId { internal: [0; 128] });
        // SAFETY: valid pointers.
        unsafe {
            assert_eq!(oxcclUniqueIdDerive(&id, 1, &mut a), ncclSuccess);
            assert_eq!(oxcclUniqueIdDerive(&id, 2, &mut b), ncclSuccess);
            assert_eq!(oxcclUniqueIdDerive(std::ptr::null(), 1, &mut a), ncclInvalidArgument);
            assert_eq!(oxcclUniqueIdDerive(&id, 1, std::ptr::null_mut()), ncclInvalidArgument);
            let zero = ncclUniqueId { internal: [0; 128] };
            assert_eq!(oxcclUniqueIdDerive(&zero, 1, &mut b), ncclInvalidArgument);
        }
        assert_ne!(a.internal, id.internal);
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the communicator is destroyed below.
        assert_eq!(unsafe { ncclCommInitRank(&mut comm, 1, a, 0) }, ncclSuccess);
        // SAFETY: the communicator just made.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
    }

    /// Bad timeouts and a NULL out-pointer are clear argument errors; a good one makes a
    /// working one-rank communicator.
    #[test]
    fn init_with_a_timeout_checks_its_arguments() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut comm: ncclComm_t = std::ptr::null_mut();
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            // SAFETY: a valid out-pointer.
            let r = unsafe { oxcclCommInitRankTimeout(&mut comm, 1, uid(), 0, bad) };
            assert_eq!(r, ncclInvalidArgument, "timeout {bad}");
        }
        // SAFETY: NULL is checked.
        assert_eq!(unsafe { oxcclCommInitRankTimeout(std::ptr::null_mut(), 1, uid(), 0, 5.0) }, ncclInvalidArgument);
        // SAFETY: a valid out-pointer; the communicator is destroyed below.
        assert_eq!(unsafe { oxcclCommInitRankTimeout(&mut comm, 1, uid(), 0, 5.0) }, ncclSuccess);
        // SAFETY: the communicator just made.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
    }

    /// Ranks 1 and 2 `ncclSend` to rank 0, which receives both with `oxcclRecvAny`: each
    /// source once, its data exact. Bad arguments are refused and lose nothing.
    #[test]
    fn recv_any_matches_each_sender_and_checks_its_arguments() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut comms: [ncclComm_t; 3] = [std::ptr::null_mut(); 3];
        // SAFETY: room for 3 handles; NULL device list.
        assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), 3, std::ptr::null()) }, ncclSuccess);
        let hs: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
        let (mut buf, mut src) = ([0u32; 5], -1);
        let c0 = comms[0];
        // SAFETY: a live handle and buffers valid for each call.
        unsafe {
            assert_eq!(
                oxcclRecvAny(buf.as_mut_ptr().cast(), 5, 3, std::ptr::null_mut(), c0, std::ptr::null_mut()),
                ncclInvalidArgument
            );
            assert_eq!(
                oxcclRecvAny(buf.as_mut_ptr().cast(), 0, 3, &mut src, c0, std::ptr::null_mut()),
                ncclInvalidArgument
            );
            assert_eq!(
                oxcclRecvAny(buf.as_mut_ptr().cast(), 5, 99, &mut src, c0, std::ptr::null_mut()),
                ncclInvalidArgument
            );
            assert_eq!(
                oxcclRecvAny(std::ptr::null_mut(), 5, 3, &mut src, c0, std::ptr::null_mut()),
                ncclInvalidArgument
            );
        }
        std::thread::scope(|s| {
            for (r, &h) in hs.iter().enumerate().skip(1) {
                s.spawn(move || {
                    let data = [r as u32 * 100; 5];
                    // SAFETY: a live handle; the buffer outlives the blocking call.
                    let rc = unsafe { ncclSend(data.as_ptr().cast(), 5, 3, 0, h as ncclComm_t, std::ptr::null_mut()) };
                    assert_eq!(rc, ncclSuccess);
                });
            }
            let mut seen = vec![];
            for _ in 0..2 {
                // SAFETY: as above.
                let rc = unsafe { oxcclRecvAny(buf.as_mut_ptr().cast(), 5, 3, &mut src, c0, std::ptr::null_mut()) };
                assert_eq!(rc, ncclSuccess);
                assert_eq!(buf, [src as u32 * 100; 5]);
                seen.push(src);
            }
            seen.sort();
            assert_eq!(seen, [1, 2]);
        });
        for c in comms {
            // SAFETY: the handles made above.
            assert_eq!(unsafe { ncclCommDestroy(c) }, ncclSuccess);
        }
    }
}
