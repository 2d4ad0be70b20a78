//! The flight recorder: the last operations of a communicator, written out on the first error.

use super::*;
use crate::schedule::Fingerprint;
use crate::Error;
use std::sync::Arc;
use std::time::Instant;

/// One entry of the flight recorder.
pub(crate) struct Record {
    pub(crate) seq: u64,
    pub(crate) fp: Fingerprint,
    /// The caller's profiler tag (0: untagged).
    pub(crate) tag: u64,
    pub(crate) sched: Arc<crate::schedule::Schedule>,
    pub(crate) start: Instant,
    pub(crate) end: Option<Instant>,
    pub(crate) failed: bool,
}

/// How many operations the flight recorder keeps per communicator.
pub(crate) const RECORDS: usize = 64;

/// What a communicator keeps of its operations, under one lock (taken once at the start and
/// once at the end of each): the flight recorder's last operations, the counters the metrics
/// export, and the straggler window.
pub(crate) struct Book {
    pub(crate) ops: std::collections::VecDeque<Record>,
    pub(crate) counters: crate::watch::metrics::Counters,
    pub(crate) lateness: crate::watch::lateness::Tracker,
}

impl Book {
    pub(crate) fn new(nranks: usize, cfg: &crate::Config) -> Book {
        Book {
            ops: std::collections::VecDeque::with_capacity(RECORDS),
            counters: crate::watch::metrics::Counters::new(nranks),
            // (a rank alone has no peer to be late)
            lateness: crate::watch::lateness::Tracker::new(
                nranks,
                if nranks > 1 { cfg.watch.straggler_window } else { 0 },
                cfg.watch.straggler_min,
            ),
        }
    }

    /// A new entry for `run`, from `start` on (`end`: already ended then, `failed` or not).
    /// When full, the oldest entry is overwritten in place, and keeps its schedule when it is
    /// `run`'s: a loop of the same call touches no reference count (no locked instruction).
    pub(crate) fn push(&mut self, run: &crate::exec::OpRun<'_>, start: Instant, end: Option<Instant>, failed: bool) {
        let (seq, fp, tag) = (run.seq, run.fp, run.obs.tag);
        let oldest = (self.ops.len() == RECORDS).then(|| self.ops.pop_front()).flatten();
        let sched = match oldest {
            Some(r) if Arc::ptr_eq(&r.sched, &run.sched) => r.sched,
            _ => run.sched.clone(),
        };
        self.ops.push_back(Record { seq, fp, tag, sched, start, end, failed });
    }

    /// Operation `seq` ended (`done`: completed).
    pub(crate) fn end(&mut self, seq: u64, fp: Fingerprint, done: bool, end: Instant) {
        let this = |x: &Record| x.seq == seq && x.fp == fp && x.end.is_none();
        // (almost always the last one recorded: a blocking call)
        let at = match self.ops.back().is_some_and(this) {
            true => Some(self.ops.len() - 1),
            false => self.ops.iter().rposition(this),
        };
        if let Some(x) = at.and_then(|i| self.ops.get_mut(i)) {
            x.end = Some(end);
            x.failed = !done;
        }
    }
}

impl Shared {
    /// Note `run` in the flight recorder, once, from when it was entered: a group's op when it
    /// is prepared, a lone call's when it goes to the engine to wait (one that never does is
    /// noted at its end, [`Shared::completed`]).
    pub(crate) fn record(&self, run: &mut crate::exec::OpRun<'_>) {
        if !run.obs.recorded {
            let start = run.obs.entered.unwrap_or_else(Instant::now);
            self.recorder.lock().unwrap().push(run, start, None, false);
            run.obs.recorded = true;
        }
    }

    /// Write the flight record (`<dir>/oxccl-<comm>-rank<r>.json`, [`crate::flight`]): the last
    /// operations with sequence number, call, state, peers and times, and the error.
    pub(crate) fn dump(&self, dir: &std::path::Path, e: &Error) {
        use crate::flight::{FlightOp, FlightRecord, OpState};
        let us = |t: Instant| t.saturating_duration_since(self.born).as_micros() as u64;
        let peers = |p: &[usize]| p.iter().map(|&x| x as u64).collect::<Vec<u64>>();
        let ops = self
            .recorder
            .lock()
            .unwrap()
            .ops
            .iter()
            .map(|r| {
                let (rx, tx) = r.sched.peers();
                let state = match (r.end, r.failed) {
                    (None, _) => OpState::Running,
                    (Some(_), true) => OpState::Failed,
                    (Some(_), false) => OpState::Done,
                };
                FlightOp {
                    seq: r.seq,
                    op: r.fp.to_string(),
                    tag: r.tag,
                    state,
                    recv_from: peers(rx),
                    send_to: peers(tx),
                    start_us: us(r.start),
                    end_us: r.end.map(us),
                }
            })
            .collect();
        let record = FlightRecord {
            comm: format!("{:016x}", self.comm_id),
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            host: self.peers[self.rank].hostname.clone(),
            pid: self.peers[self.rank].pid as u64,
            created_unix_ms: self.born_unix_ms as u64,
            error: e.to_string(),
            straggler: self
                .recorder
                .lock()
                .unwrap()
                .lateness
                .report()
                .straggler()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            ops,
        };
        let path = dir.join(format!("oxccl-{:016x}-rank{}.json", self.comm_id, self.rank));
        if let Err(err) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, record.to_json())) {
            tracing::warn!("oxccl: could not write the flight record {}: {err}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RECORDS;
    use crate::{Communicator, Config, ReduceOp};
    use std::sync::Arc;

    /// A full recorder holds the last `RECORDS` calls, in order and ended; a loop of one call
    /// keeps as many holders of its schedule, and another call's entry takes its own.
    #[test]
    fn a_full_recorder_keeps_the_last_calls_and_shares_their_schedule() {
        let c = &Communicator::init_all_with_config(1, Config::from_env()).unwrap()[0];
        let mut x = [1f32; 4];
        let counts = |c: &Communicator| {
            let book = c.sh.recorder.lock().unwrap();
            let seqs: Vec<u64> = book.ops.iter().map(|r| r.seq).collect();
            let ended = book.ops.iter().all(|r| r.end.is_some() && !r.failed);
            (seqs, ended, Arc::strong_count(&book.ops.back().unwrap().sched))
        };
        for _ in 0..RECORDS + 10 {
            c.all_reduce_inplace(&mut x, ReduceOp::Sum).unwrap();
        }
        let (seqs, ended, refs) = counts(c);
        assert_eq!(seqs, (10..RECORDS as u64 + 10).collect::<Vec<_>>());
        assert!(ended);
        for _ in 0..RECORDS {
            c.all_reduce_inplace(&mut x, ReduceOp::Sum).unwrap();
        }
        assert_eq!(counts(c).2, refs, "the same schedule, as many holders");
        // another call: its own schedule in the newest entry, one holder fewer of the old one
        let old = c.sh.recorder.lock().unwrap().ops.back().unwrap().sched.clone();
        let mut y = [1f32; 8];
        c.all_reduce_inplace(&mut y, ReduceOp::Sum).unwrap();
        let book = c.sh.recorder.lock().unwrap();
        let newest = &book.ops.back().unwrap().sched;
        assert!(!Arc::ptr_eq(newest, &old));
        assert_eq!(book.ops.iter().filter(|r| Arc::ptr_eq(&r.sched, &old)).count(), RECORDS - 1);
        assert_eq!(book.ops.back().unwrap().seq, 2 * RECORDS as u64 + 10);
    }
}
