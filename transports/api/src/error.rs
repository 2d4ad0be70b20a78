//! The one error type of oxccl. Its categories mirror `ncclResult_t`.

use std::fmt;

/// Category of an [`Error`]; mirrors `ncclResult_t` so the C ABI maps it one to one.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `ncclUnhandledCudaError`: a CUDA call failed.
    UnhandledCuda,
    /// `ncclSystemError`: an OS call failed (socket, mmap, ...).
    System,
    /// `ncclInternalError`: a broken invariant inside oxccl.
    Internal,
    /// `ncclInvalidArgument`: a bad pointer, size, type, op, root or peer.
    InvalidArgument,
    /// `ncclInvalidUsage`: a call that is wrong in context (mismatched collectives, use after abort).
    InvalidUsage,
    /// `ncclRemoteError`: a peer died, closed its connection or reported an error.
    Remote,
    /// `ncclInProgress`: a non-blocking operation has not finished yet.
    InProgress,
    /// `ncclTimeout` (oxccl extension of the enum, like NCCL's own timeout code): a bounded wait expired.
    Timeout,
    /// A feature or a system library is not available on this machine (maps to `ncclSystemError`
    /// or `ncclInvalidUsage` in the C ABI, depending on whether it is a missing library or feature).
    Unavailable,
}

impl ErrorKind {
    /// Short lower-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::UnhandledCuda => "unhandled cuda error",
            ErrorKind::System => "system error",
            ErrorKind::Internal => "internal error",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidUsage => "invalid usage",
            ErrorKind::Remote => "remote error",
            ErrorKind::InProgress => "in progress",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
        }
    }
}

/// What caused an error, where oxccl knows it: for code that acts on a failure (recovery, retry,
/// the cascade's root cause). Never match on [`Error::message`]: it is for people.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The peer aborted its connections after a failure of its own (the cascade): the root
    /// cause is elsewhere.
    PeerAborted,
    /// The peer's process is gone (killed, crashed or exited): its pid, its liveness beacon or
    /// its launcher said so.
    PeerDied,
    /// The peer closed its connection unexpectedly (its process died, or the connection was
    /// reset).
    PeerClosed,
    /// The peer's host stopped answering (host down, network cut).
    PeerUnreachable,
    /// Two ranks called different operations, or set up different transports for one pair.
    Mismatch,
    /// This rank's communicator was aborted.
    Aborted,
    /// This rank's communicator was revoked: its operations were stopped, and only destroy,
    /// split and shrink remain.
    Revoked,
    /// This rank's communicator is suspended (its connections released) until resumed.
    Suspended,
    /// A frame from the peer failed authentication on an encrypted connection: it was altered,
    /// forged, replayed or reordered in transit, or the two sides' keys differ. Nothing from
    /// it was delivered.
    Tampered,
}

/// An oxccl error: a category plus the context needed to find the culprit
/// (which rank saw it, which peer was involved, which operation and sequence number, and the OS
/// error behind it).
#[non_exhaustive]
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    /// The category.
    pub kind: ErrorKind,
    /// Human-readable detail.
    pub message: String,
    /// The rank that reports the error.
    pub rank: Option<usize>,
    /// The peer involved, if any.
    pub peer: Option<usize>,
    /// The operation (e.g. `allreduce`), if any.
    pub op: Option<String>,
    /// The communicator's operation sequence number, if any.
    pub seq: Option<u64>,
    /// The OS error number behind it, if any.
    pub os_error: Option<i32>,
    /// What caused it, where known.
    pub cause: Option<Cause>,
}

/// Result alias used throughout oxccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a message and no context yet.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            rank: None,
            peer: None,
            op: None,
            seq: None,
            os_error: None,
            cause: None,
        }
    }
    /// The error every transport reports when `peer` aborted its connections after a failure of
    /// its own ([`Cause::PeerAborted`]).
    pub fn peer_aborted(peer: usize) -> Self {
        Self::remote(format!("rank {peer} {}", crate::PEER_ABORTED)).with_peer(peer).with_cause(Cause::PeerAborted)
    }
    /// The error of any call on a communicator this rank aborted ([`Cause::Aborted`]).
    pub fn comm_aborted() -> Self {
        Self::invalid_usage("communicator was aborted").with_cause(Cause::Aborted)
    }
    /// The error of operations on a communicator this rank revoked ([`Cause::Revoked`]).
    pub fn comm_revoked() -> Self {
        Self::invalid_usage("communicator was revoked: only destroy, split and shrink are allowed on it")
            .with_cause(Cause::Revoked)
    }
    /// Attach the cause (kept if already set).
    pub fn with_cause(mut self, cause: Cause) -> Self {
        self.cause.get_or_insert(cause);
        self
    }
    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// Shorthand for [`ErrorKind::InvalidUsage`].
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidUsage, message)
    }
    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// Shorthand for [`ErrorKind::Remote`].
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Remote, message)
    }
    /// Shorthand for [`ErrorKind::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }
    /// A system error from an `io::Error`, keeping its errno and describing what was attempted.
    pub fn system(what: impl Into<String>, err: &std::io::Error) -> Self {
        let mut e = Self::new(ErrorKind::System, format!("{}: {}", what.into(), err));
        e.os_error = err.raw_os_error();
        e
    }
    /// Attach the reporting rank (kept if already set).
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank.get_or_insert(rank);
        self
    }
    /// Attach the peer involved (kept if already set).
    pub fn with_peer(mut self, peer: usize) -> Self {
        self.peer.get_or_insert(peer);
        self
    }
    /// Attach the operation name (kept if already set).
    pub fn with_op(mut self, op: impl Into<String>) -> Self {
        if self.op.is_none() {
            self.op = Some(op.into());
        }
        self
    }
    /// Attach the operation sequence number (kept if already set).
    pub fn with_seq(mut self, seq: u64) -> Self {
        self.seq.get_or_insert(seq);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = self.rank {
            write!(f, "[rank {r}] ")?;
        }
        if let Some(op) = &self.op {
            write!(f, "{op}")?;
            if let Some(s) = self.seq {
                write!(f, " #{s}")?;
            }
            write!(f, ": ")?;
        }
        if let Some(p) = self.peer {
            write!(f, "peer {p}: ")?;
        }
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

/// `Debug` reads like `Display` (what `fn main() -> oxccl::Result<()>` prints), with the OS
/// error number when one caused it.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)?;
        if let Some(n) = self.os_error {
            write!(f, " (os error {n})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_rank_peer_and_op() {
        let e = Error::remote("connection closed").with_rank(2).with_peer(3).with_op("allreduce").with_seq(17);
        assert_eq!(e.to_string(), "[rank 2] allreduce #17: peer 3: remote error: connection closed");
        // first context wins
        let e = e.with_rank(9).with_peer(9);
        assert_eq!(e.rank, Some(2));
        assert_eq!(e.peer, Some(3));
    }

    #[test]
    fn the_cause_is_typed_and_the_first_stands() {
        let e = Error::peer_aborted(3);
        assert_eq!((e.cause, e.peer, e.kind), (Some(Cause::PeerAborted), Some(3), ErrorKind::Remote));
        assert_eq!(e.with_cause(Cause::PeerDied).cause, Some(Cause::PeerAborted));
        assert_eq!(Error::remote("x").cause, None);
    }

    #[test]
    fn system_keeps_errno() {
        let io = std::io::Error::from_raw_os_error(libc::ECONNRESET);
        let e = Error::system("read", &io);
        assert_eq!(e.kind, ErrorKind::System);
        assert_eq!(e.os_error, Some(libc::ECONNRESET));
        // Debug reads like Display, with the errno
        let d = format!("{e:?}");
        assert!(d.starts_with(&e.to_string()) && d.ends_with(&format!("(os error {})", libc::ECONNRESET)), "{d}");
        assert!(!d.contains("os_error: None") && !d.contains("Error {"), "{d}");
        let r = Error::remote("gone").with_rank(1);
        assert_eq!(format!("{r:?}"), r.to_string());
    }
}
