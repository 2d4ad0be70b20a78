//! What revoke, shrink, grow and suspend need from the shared state: stopping operations,
//! quiescence, releasing connections, and collecting every member's record through the store.

use super::*;
use crate::exec::Conns;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Shared {
    /// Aborted or revoked: operations in progress stop, and new ones are refused.
    pub(crate) fn stopped(&self) -> bool {
        self.aborted.load(Ordering::SeqCst) || self.revoked.load(Ordering::SeqCst)
    }

    /// The error of an operation stopped by abort or revoke.
    pub(crate) fn stop_error(&self) -> Error {
        if self.aborted.load(Ordering::SeqCst) {
            Error::comm_aborted().with_rank(self.rank)
        } else {
            Error::comm_revoked().with_rank(self.rank)
        }
    }

    /// Revoke: every operation in flight on this rank stops (blocking calls in other threads and
    /// queued asynchronous ones fail), and the connections close, so peers waiting on this rank
    /// fail at once instead of at their timeout. Local: needs nothing from the peers.
    pub(crate) fn revoke(&self) {
        if self.revoked.swap(true, Ordering::SeqCst) {
            return;
        }
        self.abort_bell.ring();
        self.close_conns(true);
    }

    /// Close every connection (and drop the offers of any-source receives); `abort` tells the
    /// peers it is a failure, without waiting for them to confirm they read the last messages.
    pub(crate) fn close_conns(&self, abort: bool) {
        let mut conns = {
            let mut st = self.state.lock().unwrap();
            st.pending_rx.iter_mut().for_each(|p| *p = None);
            std::mem::replace(&mut st.conns, Conns::new(self.nranks))
        };
        if abort {
            conns.abort_all();
        }
        drop(conns);
    }

    /// No operation runs on this rank: no blocking call in any thread, nothing queued.
    pub(crate) fn quiescent(&self) -> bool {
        !self.busy.load(Ordering::SeqCst) && self.async_queued.load(Ordering::Acquire) == 0
    }

    /// Wait (bounded by `limit`) until [`Shared::quiescent`]; a stopped communicator gets there
    /// within a poll interval.
    pub(crate) fn wait_quiescent(&self, limit: Duration) -> Result<()> {
        let until = Instant::now() + limit;
        while !self.quiescent() {
            if Instant::now() >= until {
                return Err(Error::timeout(format!(
                    "operations on this communicator did not stop within {:.1} s",
                    limit.as_secs_f64()
                ))
                .with_rank(self.rank));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Publish this rank's `record` under `base` and collect the records of `members` (ranks of
    /// this communicator, this one included), in order, passing each to `check` as it arrives
    /// (so a disagreement is said at once). A member that died is named at once; one that never
    /// comes is named at the timeout.
    pub(crate) fn gather_records(
        &self,
        base: &str,
        record: &[u8],
        members: &[usize],
        why: &WaitFor<'_>,
        check: &dyn Fn(usize, &[u8]) -> Result<()>,
    ) -> Result<Vec<Vec<u8>>> {
        self.store.set(&format!("{base}/{}", self.rank), record).map_err(|e| self.store_error(e, why))?;
        let deadline = Instant::now() + self.cfg.timeout;
        let mut out = Vec::with_capacity(members.len());
        for &m in members {
            let v = match m == self.rank {
                true => record.to_vec(),
                false => self.wait_key_for(&format!("{base}/{m}"), deadline, m, None, why)?,
            };
            check(m, &v)?;
            out.push(v);
        }
        Ok(out)
    }

    /// A store failure during `why`: the store serves every membership change, so say so.
    pub(crate) fn store_error(&self, e: Error, why: &WaitFor<'_>) -> Error {
        let mut e = e.with_rank(self.rank);
        e.message = format!(
            "{}: the bootstrap store did not answer ({}); {} needs the communicator's store, which lives in the \
             process that made the unique id (or torchrun's agent)",
            why.stage, e.message, why.stage
        );
        e
    }
}
