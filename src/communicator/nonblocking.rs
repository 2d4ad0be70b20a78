//! The non-blocking operations: submitted to the progress thread, finished through a
//! [`Request`].

use super::*;
use crate::exec::{OpMem, Policy};
use crate::schedule::Coll;
use crate::select::CallOptions;
use crate::types::{Element, ReduceOp};
use crate::{Error, Result};

impl Communicator {
    // ---- non-blocking forms ----------------------------------------------------------------

    /// Start an operation on owned buffers ([`OpMem::OwnedSplit`] or [`OpMem::OwnedInPlace`])
    /// and return at once; the process's progress thread moves the data. Connection setup, if
    /// this op needs new peers, happens before it returns. Operations on one communicator
    /// complete in submission order, and a later blocking call waits for them first.
    pub fn submit(&self, desc: OpDesc, mem: OpMem<'static>) -> Result<Request<OpMem<'static>>> {
        self.submit_with(desc, CallOptions::default(), mem)
    }

    /// [`Communicator::submit`] with per-call options (see [`Communicator::run_with`]).
    pub fn submit_with(&self, desc: OpDesc, opts: CallOptions, mem: OpMem<'static>) -> Result<Request<OpMem<'static>>> {
        if !matches!(mem, OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. }) {
            return Err(Error::invalid_argument("submit needs owned buffers"));
        }
        let _busy = self.enter()?;
        let mut g = Group::new();
        g.add_with(self, desc, opts, mem)?;
        let mut runs = super::group::Runs::new();
        let started = oxccl_simd::clock::now();
        g.prepare(&[self], started, &mut runs)?;
        let run =
            runs.pop().and_then(|r| r.into_static()).ok_or_else(|| Error::internal("owned op lost its buffers"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let sh = &self.sh;
        let policy = Policy {
            spin: sh.spin,
            yield_for: sh.yield_for,
            deadline: started + sh.cfg.timeout,
            report: sh.cfg.wait_report,
            started,
            status: sh.cfg.watch.status_after,
        };
        crate::progress::submit(crate::progress::Job { comm: sh.clone(), run, done: tx, policy })?;
        Ok(Request { rx, conv: Ok, done: None })
    }

    pub(crate) fn submit_vec<T: Element>(&self, desc: OpDesc, mem: OpMem<'static>) -> Result<Request<Vec<T>>> {
        let r = self.submit(desc, mem)?;
        Ok(Request { rx: r.rx, conv: take_output::<T>, done: None })
    }

    /// Non-blocking in-place all-reduce of an owned buffer; [`Request::wait`] gives it back.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<Request<Vec<T>>> {
        let n = buf.len();
        self.submit_vec::<T>(
            desc::<T>(Coll::AllReduce, op, n, 0),
            OpMem::OwnedInPlace { buf: Box::new(buf), in_off: 0, out_off: 0 },
        )
    }
    /// Non-blocking broadcast of an owned buffer from `root`.
    pub fn broadcast_async<T: Element>(&self, buf: Vec<T>, root: usize) -> Result<Request<Vec<T>>> {
        let n = buf.len();
        self.submit_vec::<T>(
            desc::<T>(Coll::Broadcast, ReduceOp::Sum, n, root),
            OpMem::OwnedInPlace { buf: Box::new(buf), in_off: 0, out_off: 0 },
        )
    }
    /// Non-blocking all-gather; the request yields the gathered vector.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Result<Request<Vec<T>>> {
        let c = send.len();
        let out = vec![T::zeroed(); c * self.size()];
        self.submit_vec::<T>(
            desc::<T>(Coll::AllGather, ReduceOp::Sum, c, 0),
            OpMem::OwnedSplit { input: Box::new(send), output: Box::new(out) },
        )
    }
    /// Non-blocking reduce-scatter; the request yields this rank's block of the result.
    pub fn reduce_scatter_async<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Result<Request<Vec<T>>> {
        let c = self.per_rank(send.len())?;
        let out = vec![T::zeroed(); c];
        self.submit_vec::<T>(
            desc::<T>(Coll::ReduceScatter, op, c, 0),
            OpMem::OwnedSplit { input: Box::new(send), output: Box::new(out) },
        )
    }
}

/// A non-blocking operation in flight. Dropping it does not cancel the operation.
pub struct Request<T> {
    rx: std::sync::mpsc::Receiver<Result<OpMem<'static>>>,
    conv: fn(OpMem<'static>) -> Result<T>,
    done: Option<Result<OpMem<'static>>>,
}

impl<T> Request<T> {
    /// Whether the operation has finished (successfully or not); never blocks.
    pub fn test(&mut self) -> bool {
        if self.done.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.done = Some(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.done = Some(Err(Error::internal("progress thread went away")))
                }
            }
        }
        true
    }

    /// Block until the operation finishes; returns its buffers (or its error).
    pub fn wait(self) -> Result<T> {
        let r = match self.done {
            Some(r) => r,
            None => self.rx.recv().unwrap_or_else(|_| Err(Error::internal("progress thread went away"))),
        };
        (self.conv)(r?)
    }
}

pub(crate) fn take_output<T: Element>(m: OpMem<'static>) -> Result<Vec<T>> {
    let b = match m {
        OpMem::OwnedInPlace { buf, .. } => buf,
        OpMem::OwnedSplit { output, .. } => output,
        _ => return Err(Error::internal("request without owned buffers")),
    };
    b.into_any().downcast::<Vec<T>>().map(|b| *b).map_err(|_| Error::internal("request buffer of another type"))
}
