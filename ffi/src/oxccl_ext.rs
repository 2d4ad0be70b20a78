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

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> ncclUniqueId {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, ncclSuccess);
        id
    }

    /// Bad timeouts and a NULL out-pointer are clear argument errors; a good one makes a
    /// working one-rank communicator.
    #[test]
    fn init_with_a_timeout_checks_its_arguments() {
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
}
