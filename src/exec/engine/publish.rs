//! The engine's part in watching: it times the waits that outlast its spinning (the first clock
//! reading of an idle spell starts their clocks, [`crate::exec::Observe::idle_at`]), and an
//! operation that ran past [`Policy::status`] has its communicator publish what it waits for,
//! and again at that interval while it runs.

use super::super::wait::{long_op, DriveComm, Policy};
use super::{Engine, Runs, Slot};
use crate::exec::OpRun;
use std::time::Instant;

impl Engine {
    /// The clock read `now` at the start of an idle spell: the active operations' waits are
    /// timed from here.
    pub(super) fn idle_at<'a, R: Runs<'a> + ?Sized>(&mut self, runs: &mut R, now: Instant) {
        let mut active = std::mem::take(&mut self.scratch);
        self.active_into(&mut active);
        for &id in &active {
            runs.run_mut(id).obs.idle_at(now);
        }
        self.scratch = active;
    }

    /// Publish, per communicator, where a status is due.
    pub(super) fn publish<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &R,
        now: Instant,
    ) {
        // (nothing computed when an op is queued: the fast path)
        let is_due = |s: &Slot| {
            let since = s.status_at.unwrap_or(s.policy.started);
            s.policy.status.is_some_and(|r| now.saturating_duration_since(since) >= r)
        };
        if !self.iter().any(|(_, s)| is_due(s)) {
            return;
        }
        let mut due: Vec<u64> = self.active();
        due.retain(|&id| is_due(self.slot(id)));
        while let Some(&first) = due.first() {
            let ci = self.slot(first).comm;
            let (mine, rest): (Vec<u64>, Vec<u64>) = due.iter().partition(|&&id| self.slot(id).comm == ci);
            let p: Policy = self.slot(first).policy;
            let ops: Vec<&OpRun<'_>> = mine.iter().map(|&id| runs.run(id)).collect();
            comms[ci].long_op(long_op(&ops, now - p.started));
            for id in mine {
                let s = self.slot_mut(id);
                s.status_at = Some(now);
            }
            due = rest;
        }
    }
}
