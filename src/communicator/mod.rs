//! The communicator: life cycle, the Rust API of every collective (blocking and
//! non-blocking), groups, split and argument checks. The state behind it is `crate::runtime`.

mod anysource;
mod elastic;
mod group;
mod life;
mod nonblocking;
mod ops;
mod single;
#[cfg(test)]
mod tests;
mod validate;
mod watch;

pub use elastic::ShrinkMode;
pub use group::Group;
pub use nonblocking::Request;
pub(crate) use validate::{check_rank, check_state};

use crate::exec::OpMem;
use crate::runtime::Shared;
use crate::schedule::Coll;
use crate::types::{DataType, Element, ReduceOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What an operation is: NCCL's arguments minus the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDesc {
    /// The operation.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (ignored by operations that do not reduce).
    pub op: ReduceOp,
    /// Count, in NCCL's convention (per rank for all-gather, reduce-scatter, all-to-all, gather
    /// and scatter).
    pub count: usize,
    /// Root, or the peer of send/recv.
    pub root: usize,
}

/// A communicator: one rank's membership in a group of ranks that run collectives together
/// (NCCL's `ncclComm_t`).
///
/// All methods take `&self`; a communicator is `Send + Sync` so that [`Communicator::abort`] can
/// be called from another thread, but operations on one communicator must not be issued from
/// two threads at once (that is reported as [`crate::ErrorKind::InvalidUsage`]).
pub struct Communicator {
    pub(crate) sh: Arc<Shared>,
}

impl Drop for Communicator {
    /// In a `fork` child, a communicator inherited from the parent is left untouched: its
    /// sockets and shared memory are the parent's too, and closing them would send the parent's
    /// peers close or abort messages. (Its memory stays allocated in the child.)
    fn drop(&mut self) {
        if self.sh.generation != crate::fork_generation() {
            std::mem::forget(self.sh.clone());
        }
    }
}

/// A handle that aborts a communicator from any thread.
#[derive(Clone)]
pub struct AbortHandle(pub(crate) Arc<Shared>);

impl AbortHandle {
    /// Abort: operations in progress return an error promptly, and later calls fail.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        self.0.abort_bell.ring();
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {}, {})", self.sh.rank, self.sh.nranks, self.sh.prefix)
    }
}

pub(crate) struct BusyGuard<'a>(&'a AtomicBool);
impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        // (a release store, a plain one on x86: whoever waits for quiescence polls the flag,
        // and nothing this thread reads afterwards depends on the order)
        self.0.store(false, Ordering::Release);
    }
}

pub(crate) fn desc<T: Element>(coll: Coll, op: ReduceOp, count: usize, root: usize) -> OpDesc {
    OpDesc { coll, dtype: T::DTYPE, op, count, root }
}

pub(crate) fn split<'a, T: Element>(send: &'a [T], recv: &'a mut [T]) -> OpMem<'a> {
    OpMem::Split { input: bytemuck::cast_slice(send), output: bytemuck::cast_slice_mut(recv) }
}
