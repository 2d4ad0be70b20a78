//! The engine's ladder: when nothing moved, spin, yield, then sleep on what the operations wait
//! for; the deadlines, the timeout census, the wait reports and the lost-peer probes are checked
//! on the way.

use super::super::wait::{block, hang_report, lost_peer, wait_note, DriveComm, CENSUS_LEAD, STALL};
use super::{Engine, Finished, Runs};
use crate::exec::OpRun;
use oxccl_transport::wait::WaitSource;
use std::time::{Duration, Instant};

impl Engine {
    /// Fail the active operations past their deadline, with one report that names them and
    /// counts the others past it; begin the timeout census of those near it.
    pub(super) fn expire<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &R,
        now: Instant,
        out: &mut Vec<Finished>,
    ) {
        // (the scratch list: this runs every 64 passes of a spinning wait, which allocates nothing)
        let mut active = std::mem::take(&mut self.scratch);
        self.active_into(&mut active);
        if active.iter().any(|&id| now >= self.slot(id).policy.deadline) {
            let due: Vec<u64> = self.iter().filter(|(_, s)| now >= s.policy.deadline).map(|(id, _)| id).collect();
            let e = hang_report(comms, &due.iter().map(|&id| runs.run(id)).collect::<Vec<_>>());
            for id in due {
                self.finish(id, Err(e.clone()), runs, out);
            }
            self.scratch = active;
            return;
        }
        for &id in &active {
            let run = runs.run(id);
            let s = self.slot_mut(id);
            let p = s.policy;
            let collective = !matches!(run.fp.coll, crate::Coll::Send | crate::Coll::Recv);
            if !s.census
                && collective
                && !run.done()
                && now + CENSUS_LEAD >= p.deadline
                && now - p.started >= CENSUS_LEAD
            {
                s.census = true;
                comms[s.comm].near_deadline(run.seq);
            }
        }
        self.scratch = active;
    }

    /// Nothing moved: spin (reading the clock only every 64 passes: short waits, the common case
    /// for small messages, never read it), yield, then block.
    pub(super) fn idle<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &mut R,
        wake: &[WaitSource],
        out: &mut Vec<Finished>,
    ) {
        let l = &mut self.ladder;
        l.idle_passes += 1;
        if l.idle_passes % 64 != 0 && !l.spin.is_zero() {
            std::hint::spin_loop();
            return;
        }
        let now = Instant::now();
        let first = l.idle_since.is_none();
        let since = *l.idle_since.get_or_insert(now);
        let (spin, yield_for) = (l.spin, l.yield_for);
        if first {
            self.idle_at(runs, now);
        }
        let before = out.len();
        self.expire(comms, runs, now, out);
        if out.len() > before || now - since < spin {
            return;
        }
        if now - since < spin + yield_for {
            std::thread::yield_now();
            return;
        }
        self.report(comms, runs, now);
        self.publish(comms, runs, now);
        self.sleep(comms, runs, wake, now - since >= STALL, out);
    }

    /// Say what the active operations wait for, per communicator, where a report is due.
    pub(super) fn report<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(&mut self, comms: &[&C], runs: &R, now: Instant) {
        let mut due: Vec<u64> = self.active();
        due.retain(|&id| self.slot(id).next_report.is_some_and(|t| now >= t));
        while let Some(&first) = due.first() {
            let ci = self.slot(first).comm;
            let (mine, rest): (Vec<u64>, Vec<u64>) = due.iter().partition(|&&id| self.slot(id).comm == ci);
            let p = self.slot(first).policy;
            let ops: Vec<&OpRun<'_>> = mine.iter().map(|&id| runs.run(id)).collect();
            crate::log::notice(
                Some(comms[ci].rank()),
                &wait_note(comms, &ops, now - p.started, p.deadline - p.started),
            );
            for id in mine {
                let s = self.slot_mut(id);
                s.next_report = s.policy.report.map(|r| now + r);
            }
            due = rest;
        }
    }

    /// Sleep on what the active operations wait for (their connections, the abort doorbells,
    /// `wake`); after a stall, ask whether their peers on other machines are still there.
    pub(super) fn sleep<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &R,
        wake: &[WaitSource],
        stalled: bool,
        out: &mut Vec<Finished>,
    ) {
        let active = self.active();
        let mut tx_of: Vec<Vec<usize>> = vec![Vec::new(); comms.len()];
        for l in &self.sends {
            tx_of[l.comm].push(l.peer);
        }
        let deadline = active.iter().map(|&id| self.slot(id).policy.deadline).min();
        let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_millis(500));
        let mut res = block(comms, active.iter().map(|&id| runs.run(id)), &tx_of, deadline, wake);
        if res.is_ok() && stalled {
            if let Some((ci, e)) = lost_peer(comms, active.iter().map(|&id| runs.run(id))) {
                res = Err(Box::new((Some(ci), e)));
            }
        }
        if let Err(b) = res {
            let (ci, e) = *b;
            let hit: Vec<u64> = active.into_iter().filter(|&id| ci.is_none_or(|c| self.slot(id).comm == c)).collect();
            for id in hit {
                self.finish(id, Err(e.clone()), runs, out);
            }
        }
    }
}
