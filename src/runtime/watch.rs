//! What a communicator does for watching (`src/watch`): counting completed operations,
//! straggler windows, status records in the store, trace spans.

use super::*;
use crate::exec::OpRun;
use crate::watch::metrics::Sample;
use crate::watch::status::{registration, RankStatus, Running, COMMS};
use crate::watch::trace::{self, OpSpan};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A rank publishes its straggler view at the end of a window at most this often (a store
/// round trip in a thread of its own: on a busy machine, every 1000 operations of 8 B was 70%
/// on their time), and only when it has something to say: a peer was last to arrive in at
/// least 2 of its operations (once is a hiccup), or in the last view published.
pub(crate) const VIEW_EVERY: Duration = Duration::from_secs(10);

/// A communicator's watching state (its counters and straggler window are in the flight
/// recorder's [`super::Book`]).
#[derive(Default)]
pub(crate) struct CommWatch {
    /// Registered for status in the store (once).
    registered: AtomicBool,
    /// A status record is being written (at most one at a time).
    publishing: Arc<AtomicBool>,
    /// When this rank last published its straggler view, and whether a peer was late in it.
    view_at: Mutex<(Option<Instant>, bool)>,
}

impl Shared {
    /// An operation left the engine (completed, or stopped by a failure): the flight record,
    /// the counters, the straggler window and the trace.
    pub(crate) fn completed(&self, r: &OpRun<'_>, end: Instant) {
        let done = r.done();
        let full = {
            let mut book = self.recorder.lock().unwrap();
            match r.obs.recorded {
                true => book.end(r.seq, r.fp, done, end),
                // (a lone call that completed or failed in its quick polls is recorded only now)
                false => book.push(r, r.obs.entered.unwrap_or(end), Some(end), !done),
            }
            if !done {
                book.counters.failed();
                None
            } else {
                let took = r.obs.entered.map_or(Duration::ZERO, |e| end.saturating_duration_since(e));
                book.counters.completed(r.fp.coll, r.fp.count * r.fp.dtype.size(), took, &r.obs.waits);
                match r.fp.coll {
                    crate::Coll::Send | crate::Coll::Recv => None,
                    _ => book.lateness.observe(r.sched.clean_peers(), r.obs.latest),
                }
            }
        };
        if let Some(l) = full {
            if let Some(s) = l.straggler() {
                tracing::info!(rank = self.rank, "{s} (seen from rank {})", self.rank);
            }
            // every rank's view in the store (the job's straggler adds them up), now and then
            // and when it matters: a healthy job (and a benchmark) never pays a store write
            let late = l.peers.iter().any(|p| p.last >= 2);
            let mut at = self.watch.view_at.lock().unwrap();
            if (late || at.1) && at.0.is_none_or(|t| end.saturating_duration_since(t) >= VIEW_EVERY) {
                *at = (Some(end), late);
                drop(at);
                self.publish_status(None);
            }
        }
        if let (Some(steps), Some(start)) = (r.obs.steps.as_deref(), r.obs.entered) {
            let (rank, comm, seq, op) = (self.rank, self.comm_id, r.seq, r.fp.to_string());
            trace::push(OpSpan { rank, comm, seq, op, start, end, ok: done, steps: steps.0.clone() });
        }
    }

    /// This rank's status record now.
    fn status_record(&self, running: Option<Running>) -> RankStatus {
        let (last, late) = {
            let book = self.recorder.lock().unwrap();
            let last = book.ops.iter().rev().find(|x| x.end.is_some() && !x.failed).map(|x| (x.seq, x.fp.to_string()));
            (last, book.lateness.report())
        };
        let late = late.view();
        let time_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64);
        // (host and pid are the registration's, written once: not in every record)
        RankStatus {
            rank: self.rank,
            time_ms: time_ms.ok(),
            last,
            running,
            error: self.sticky_error().map(|e| e.to_string()),
            late,
            ..Default::default()
        }
    }

    /// Publish this rank's status record (in the background: the store may be slow or gone;
    /// skipped while the previous one is still being written). The first one registers the
    /// communicator for `oxccl-perf --status`.
    pub(crate) fn publish_status(&self, running: Option<Running>) {
        let w = &self.watch;
        if w.publishing.swap(true, Ordering::AcqRel) {
            return;
        }
        let record = self.status_record(running).encode();
        let key = format!("{}/status/{}", self.prefix, self.rank);
        let reg = (!w.registered.swap(true, Ordering::AcqRel)).then(|| {
            let peers: Vec<(String, u64)> = self.peers.iter().map(|p| (p.hostname.clone(), p.pid as u64)).collect();
            (format!("{}/status/registered", self.prefix), registration(&self.prefix, self.comm_id, &peers))
        });
        let (store, busy) = (self.store.clone(), w.publishing.clone());
        let spawned = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            let _ = store.set(&key, record.as_bytes());
            if let Some((once, reg)) = reg {
                // the communicator's first publisher registers it
                if store.add(&once, 1).is_ok_and(|n| n == 1) {
                    if let Ok(k) = store.add(COMMS, 1) {
                        let _ = store.set(&format!("{COMMS}/{k}"), reg.as_bytes());
                    }
                }
            }
            busy.store(false, Ordering::Release);
        });
        if spawned.is_err() {
            w.publishing.store(false, Ordering::Release);
        }
    }
}

impl Shared {
    /// Every rank's lateness view added up (their status records in the store, this rank's
    /// own now): the communicator's straggler. Falls back to this rank's view if the store
    /// does not answer.
    pub(crate) fn job_straggler(&self) -> Option<crate::watch::Straggler> {
        let mine = self.recorder.lock().unwrap().lateness.report();
        let wait = Duration::from_millis(500);
        // a rank's view: (peer, last, observed, median lag µs); none yet: empty
        let read = |r: usize| -> Option<Vec<(usize, u64, u64, u64)>> {
            let key = format!("{}/status/{r}", self.prefix);
            if !self.store.check(std::slice::from_ref(&key)).ok()? {
                return Some(vec![]);
            }
            Some(RankStatus::parse(&String::from_utf8_lossy(&self.store.get(&key, wait).ok()?)).ok()?.late)
        };
        let mut views = Vec::with_capacity(self.nranks);
        for r in 0..self.nranks {
            match r == self.rank {
                true => views.push(mine.view()),
                false => match read(r) {
                    Some(v) => views.push(v),
                    None => return mine.straggler(),
                },
            }
        }
        crate::watch::lateness::added_up(self.nranks, views.iter().map(Vec::as_slice)).straggler()
    }
}

impl crate::watch::Watched for Shared {
    fn sample(&self) -> Sample {
        let memory = {
            let st = self.state.lock().unwrap();
            st.conns.send.iter().flatten().map(|c| c.memory()).sum::<usize>()
                + st.conns.recv.iter().flatten().map(|c| c.memory()).sum::<usize>()
        };
        let (counters, late) = {
            let book = self.recorder.lock().unwrap();
            (book.counters.clone(), book.lateness.report())
        };
        Sample {
            comm: self.comm_id,
            rank: self.rank,
            nranks: self.nranks,
            counters,
            memory,
            last_arrivals: late.peers.iter().map(|p| (p.peer, p.last)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Communicator, Config, ReduceOp};
    use std::time::{Duration, Instant};

    /// 2 ranks, `ops` all-reduces, rank 1 sleeping `sleep` before each: whether each rank's
    /// status record reached the store within `wait`.
    fn published(min: Duration, sleep: Duration, wait: Duration) -> [bool; 2] {
        let mut cfg = Config::from_env();
        cfg.watch.straggler_window = 5;
        cfg.watch.straggler_min = min;
        cfg.watch.status_after = None;
        let cs = Communicator::init_all_with_config(2, cfg).unwrap();
        std::thread::scope(|s| {
            for c in &cs {
                s.spawn(move || {
                    let mut x = [1f32; 2];
                    for _ in 0..10 {
                        if c.rank() == 1 {
                            std::thread::sleep(sleep);
                        }
                        c.all_reduce_inplace(&mut x, ReduceOp::Max).unwrap();
                    }
                });
            }
        });
        let sh = &cs[0].sh;
        let key = |r: usize| format!("{}/status/{r}", sh.prefix);
        let t = Instant::now();
        loop {
            let got = [0, 1].map(|r| sh.store.check(&[key(r)]).unwrap());
            if got.iter().all(|&g| g) || t.elapsed() >= wait {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_view_reaches_the_store_only_when_a_peer_was_late() {
        // nobody late (nothing counts as late below 10 s): no store write at all
        assert_eq!(published(Duration::from_secs(10), Duration::ZERO, Duration::from_millis(300)), [false; 2]);
        // rank 1 late by 3 ms each time: rank 0 (which waited for it) publishes; rank 1 does not
        assert_eq!(
            published(Duration::from_millis(1), Duration::from_millis(3), Duration::from_secs(2)),
            [true, false]
        );
    }
}
