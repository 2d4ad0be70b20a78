//! The blocking operations: the untyped form, then one typed method per collective.

use super::*;
use crate::exec::OpMem;
use crate::schedule::Coll;
use crate::select::CallOptions;
use crate::types::{Element, ReduceOp};
use crate::{Error, Result};
use std::sync::atomic::Ordering;

impl Communicator {
    // ---- operations ------------------------------------------------------------------------

    pub(crate) fn enter(&self) -> Result<BusyGuard<'_>> {
        if self.sh.busy.swap(true, Ordering::SeqCst) {
            return Err(Error::invalid_usage(
                "communicator used from two threads at once (operations on one communicator must be issued from one thread at a time)",
            )
            .with_rank(self.sh.rank));
        }
        Ok(BusyGuard(&self.sh.busy))
    }

    /// Run one operation on raw bytes: the untyped form under the typed methods and the C ABI.
    /// Buffers are checked against `desc`'s counts.
    pub fn run(&self, desc: OpDesc, mem: OpMem<'_>) -> Result<()> {
        self.run_with(desc, CallOptions::default(), mem)
    }

    /// [`Communicator::run`] with per-call options: an algorithm selection (every rank must pass
    /// the same one, or the call fails as a mismatch) and a profiler tag for the flight record.
    pub fn run_with(&self, desc: OpDesc, opts: CallOptions, mut mem: OpMem<'_>) -> Result<()> {
        self.validate(&desc, &mem.view())?;
        self.run_one(desc, opts, mem)
    }

    /// Sum/prod/min/max/avg of `send` over all ranks, into `recv` on every rank.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run(desc::<T>(Coll::AllReduce, op, send.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::all_reduce`].
    pub fn all_reduce_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::AllReduce, op, n, 0), self.inplace::<T>(Coll::AllReduce, n, 0, buf)?)
    }
    /// Every rank's `send` (equal lengths), concatenated in rank order into `recv`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.run(desc::<T>(Coll::AllGather, ReduceOp::Sum, send.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::all_gather`]: this rank's block is already at
    /// `buf[rank*count..]`, where `count = buf.len() / size`.
    pub fn all_gather_inplace<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let c = self.per_rank(buf.len())?;
        self.run(desc::<T>(Coll::AllGather, ReduceOp::Sum, c, 0), self.inplace::<T>(Coll::AllGather, c, 0, buf)?)
    }
    /// Reduce `send` (`size` blocks) over all ranks; block `rank` of the result lands in `recv`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run(desc::<T>(Coll::ReduceScatter, op, recv.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::reduce_scatter`]: the result is left at `buf[rank*count..]`.
    pub fn reduce_scatter_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let c = self.per_rank(buf.len())?;
        self.run(desc::<T>(Coll::ReduceScatter, op, c, 0), self.inplace::<T>(Coll::ReduceScatter, c, 0, buf)?)
    }
    /// Copy `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::Broadcast, ReduceOp::Sum, n, root), self.inplace::<T>(Coll::Broadcast, n, root, buf)?)
    }
    /// Out-of-place broadcast: `send` is read on `root` only (others may pass `&[]`).
    pub fn broadcast_from<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Broadcast, ReduceOp::Sum, recv.len(), root), split(send, recv))
    }
    /// Reduce `send` over all ranks into `recv` on `root` (others may pass `&mut []`).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Reduce, op, send.len(), root), split(send, recv))
    }
    /// In-place [`Communicator::reduce`].
    pub fn reduce_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::Reduce, op, n, root), self.inplace::<T>(Coll::Reduce, n, root, buf)?)
    }
    /// Block `p` of `send` goes to rank `p`; block `p` of `recv` comes from rank `p`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let c = self.per_rank(send.len())?;
        self.run(desc::<T>(Coll::AllToAll, ReduceOp::Sum, c, 0), split(send, recv))
    }
    /// Every rank's `send` concatenated into `recv` on `root` (others may pass `&mut []`).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Gather, ReduceOp::Sum, send.len(), root), split(send, recv))
    }
    /// Block `p` of `root`'s `send` into rank `p`'s `recv` (others may pass `&[]`).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Scatter, ReduceOp::Sum, recv.len(), root), split(send, recv))
    }
    /// Send `buf` to `peer`. Without a [`Group`], a send larger than the connection's buffering
    /// completes only once the peer receives.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Send, ReduceOp::Sum, buf.len(), peer), split(buf, &mut []))
    }
    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Recv, ReduceOp::Sum, buf.len(), peer), split(&[], buf))
    }

    /// Wait until every rank arrives.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [0u8; 1];
        self.all_reduce_inplace(&mut b, ReduceOp::Sum)
    }
}
