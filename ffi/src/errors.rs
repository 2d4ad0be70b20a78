//! Results, the last-error string and the panic boundary every entry point runs behind.

use super::*;
use oxccl::{Error, ErrorKind};
use std::panic::{catch_unwind, AssertUnwindSafe};

// ---- errors and the panic boundary ----------------------------------------------------------
use last_error::set_last_error;

/// The `ncclResult_t` of an oxccl error.
pub fn result_of(e: &Error) -> ncclResult_t {
    match e.kind {
        ErrorKind::UnhandledCuda => ncclUnhandledCudaError,
        ErrorKind::System => ncclSystemError,
        ErrorKind::Internal => ncclInternalError,
        ErrorKind::InvalidArgument => ncclInvalidArgument,
        ErrorKind::InvalidUsage => ncclInvalidUsage,
        // a library, device or kernel feature this system lacks (what oxccl does not implement
        // is InvalidUsage, named as such)
        ErrorKind::Unavailable => ncclSystemError,
        ErrorKind::Remote => ncclRemoteError,
        ErrorKind::InProgress => ncclInProgress,
        ErrorKind::Timeout => ncclTimeout,
        _ => ncclInternalError,
    }
}

pub(crate) type R = Result<ncclResult_t, Error>;

/// Run an entry point: errors become their code plus `ncclGetLastError`'s text; a panic never
/// crosses into C.
pub(crate) fn boundary(name: &str, f: impl FnOnce() -> R) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let code = result_of(&e);
            if e.kind != ErrorKind::InProgress {
                // ncclGetErrorString keeps NCCL's text for the code; the detail says whose bug it is
                let whose = if code == ncclInternalError { REPORT } else { "" };
                set_last_error(&format!("{name}: {e}{whose}"));
                oxccl_log(&format!("{name}: {e}{whose}"), e.rank);
            }
            code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error (panic caught at the C boundary): {what}{REPORT}"));
            ncclInternalError
        }
    }
}

/// Appended to the detail of internal errors: they are oxccl's bugs, not NCCL's.
pub(crate) const REPORT: &str =
    " (a bug in oxccl, not NCCL: please report it to the oxccl project with this message and the \
                      NCCL_DEBUG=INFO output)";

/// A refused call, as a `NCCL WARN` line of oxccl's logger (`NCCL_DEBUG=WARN` or more).
pub(crate) fn oxccl_log(msg: &str, rank: Option<usize>) {
    oxccl::config::init_logging();
    match rank {
        Some(r) => tracing::warn!(target: "CALL", rank = r, "{msg}"),
        None => tracing::warn!(target: "CALL", "{msg}"),
    }
}

pub(crate) fn arg(msg: impl Into<String>) -> Error {
    Error::invalid_argument(msg)
}

pub(crate) fn not_implemented(name: &str) -> R {
    Err(Error::invalid_usage(format!(
        "{name} is not implemented by oxccl yet (host-memory collectives, groups, split and the queries are; see docs/pytorch.md)"
    )))
}

/// Write `v` through the caller's out-pointer `p`.
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (NCCL's contract for out-parameters).
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(arg(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and valid for writes per the function's contract.
    unsafe { p.write(v) };
    Ok(())
}
