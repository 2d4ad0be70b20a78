//! The process-wide progress thread of asynchronous operations.
//!
//! Connection setup happens in the submitting thread (it may wait for peers); the thread here only
//! moves data. It progresses every queued operation of every communicator together (so ranks that
//! are threads of one process cannot deadlock on it), keeps operations of one communicator in
//! submission order, and sleeps in `poll(2)` when nothing can move (no CPU when idle).

use crate::comm::Shared;
use crate::exec::{block, hang_report, wait_note, DriveComm, OpMem, OpRun};
use crate::order::Order;
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, Doorbell, WaitSource};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct Job {
    pub sh: Arc<Shared>,
    pub run: OpRun<'static>,
    pub done: Sender<Result<OpMem<'static>>>,
    pub deadline: Instant,
}

struct Queue {
    jobs: Mutex<Vec<Job>>,
    bell: Doorbell,
}

/// The queue and the fork generation whose progress thread serves it. A `fork` child (where
/// that thread does not exist) starts its own; the inherited queue is left as it is (its lock
/// may have been held by a thread that is gone).
static QUEUE: Mutex<Option<(u64, &'static Queue)>> = Mutex::new(None);

fn queue() -> Result<&'static Queue> {
    let now = crate::fork_generation();
    let mut g = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((gen, q)) = *g {
        if gen == now {
            return Ok(q);
        }
    }
    let q: &'static Queue = Box::leak(Box::new(Queue { jobs: Mutex::new(Vec::new()), bell: Doorbell::new()? }));
    std::thread::Builder::new()
        .name("oxccl-progress".into())
        .spawn(move || main_loop(q))
        .map_err(|e| Error::system("spawning the progress thread", &e))?;
    *g = Some((now, q));
    Ok(q)
}

/// Hand an operation (already connected) to the progress thread.
pub(crate) fn submit(job: Job) -> Result<()> {
    let q = queue()?;
    *job.sh.async_pending.lock().unwrap() += 1;
    q.jobs.lock().unwrap().push(job);
    q.bell.ring();
    Ok(())
}

struct Meta {
    sh: Arc<Shared>,
    done: Sender<Result<OpMem<'static>>>,
    deadline: Instant,
    started: Instant,
    /// When to say next what the operation waits for ([`crate::Config::wait_report`]).
    next_report: Option<Instant>,
}

fn finish(meta: Meta, run: OpRun<'static>, res: Result<()>) {
    // name the operation (a dead peer is found by the transport, which knows only the peer)
    let res = res.map_err(|e| if e.op.is_none() { e.with_op(run.fp.to_string()).with_seq(run.seq) } else { e });
    if let Err(e) = &res {
        meta.sh.set_error(e.clone());
    }
    let _ = meta.done.send(res.map(|_| run.mem));
    let mut g = meta.sh.async_pending.lock().unwrap();
    *g -= 1;
    meta.sh.async_cv.notify_all();
}

/// A queued operation and what the thread knows of it.
struct Entry {
    run: OpRun<'static>,
    meta: Meta,
}

/// The communicators of queued operations, by the index their runs carry. A slot is emptied
/// (its `Arc` dropped) when its last operation finishes, so a destroyed communicator is not
/// kept alive by another's traffic.
#[derive(Default)]
struct Comms {
    slots: Vec<Option<(Arc<Shared>, usize)>>,
}

impl Comms {
    fn index(&mut self, sh: &Arc<Shared>) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s.as_ref().is_some_and(|(x, _)| Arc::ptr_eq(x, sh))) {
            self.slots[i].as_mut().unwrap().1 += 1;
            return i;
        }
        let free = self.slots.iter().position(|s| s.is_none());
        let i = free.unwrap_or(self.slots.len());
        if i == self.slots.len() {
            self.slots.push(None);
        }
        self.slots[i] = Some((sh.clone(), 1));
        i
    }

    fn release(&mut self, i: usize) {
        if let Some((_, n)) = self.slots[i].as_mut() {
            *n -= 1;
            if *n == 0 {
                self.slots[i] = None;
            }
        }
    }

    /// Every slot as a communicator (an empty slot, which no op refers to, shows a live one).
    fn refs(&self) -> Vec<&Shared> {
        let Some(any) = self.slots.iter().flatten().next() else { return vec![] };
        self.slots.iter().map(|s| &*s.as_ref().unwrap_or(any).0).collect()
    }
}

fn main_loop(q: &'static Queue) {
    let mut entries: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut order = Order::default();
    let mut comms = Comms::default();
    // ops whose steps are done and whose sends may still be leaving the process
    let mut flushing: BTreeSet<u64> = BTreeSet::new();
    let mut next_id = 0u64;
    let mut movable: Vec<u64> = Vec::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        for j in q.jobs.lock().unwrap().drain(..) {
            let mut run = j.run;
            run.comm = comms.index(&j.sh);
            let (rx, tx) = run.sched.peers();
            order.push(next_id, run.comm, rx, tx);
            let started = Instant::now();
            let next_report = j.sh.wait_report().map(|r| started + r);
            let meta = Meta { sh: j.sh, done: j.done, deadline: j.deadline, started, next_report };
            entries.insert(next_id, Entry { run, meta });
            next_id += 1;
        }
        if entries.is_empty() {
            let _ = wait_any(&[WaitSource::doorbell(q.bell.read_fd())], Duration::from_secs(3600));
            continue;
        }
        let refs = comms.refs();
        let mut progressed = false;
        let mut outcome: Vec<(u64, Result<()>)> = Vec::new();
        order.ready_into(&mut movable);
        for &id in &movable {
            let run = &mut entries.get_mut(&id).expect("a ready op is queued").run;
            let ci = run.comm;
            let res = if refs[ci].aborted() {
                Err(Error::comm_aborted().with_rank(refs[ci].rank()))
            } else if let Some(e) = refs[ci].sticky_error() {
                Err(e)
            } else {
                refs[ci].with_conns(|c| run.poll(c))
            };
            match res {
                Ok(p) => progressed |= p,
                Err(e) => outcome.push((id, Err(e))),
            }
            if run.done() {
                // its connections are free for the next in line; it completes once flushed
                order.retire(id);
                flushing.insert(id);
            }
        }
        // flush; an op is complete when its steps ran and its sends left the process
        let now = Instant::now();
        for id in movable.iter().chain(&flushing).copied().collect::<BTreeSet<u64>>() {
            if outcome.iter().any(|o| o.0 == id) {
                continue;
            }
            let Entry { run, meta } = &entries[&id];
            let ci = run.comm;
            let flushed = refs[ci].with_conns(|c| -> Result<bool> {
                let mut clear = true;
                for &q in run.sched.peers().1 {
                    if let Some(s) = c.send[q].as_mut() {
                        s.progress().map_err(|e| e.with_peer(q).with_rank(refs[ci].rank()))?;
                        clear &= !s.pending();
                    }
                }
                Ok(clear)
            });
            match flushed {
                Err(e) => outcome.push((id, Err(e))),
                Ok(true) if run.done() => outcome.push((id, Ok(()))),
                Ok(_) if now >= meta.deadline => outcome.push((id, Err(hang_report(&refs, std::slice::from_ref(run))))),
                Ok(_) => {}
            }
        }
        drop(refs);
        if !outcome.is_empty() {
            idle_since = None;
            for (id, res) in outcome {
                order.retire(id);
                flushing.remove(&id);
                let e = entries.remove(&id).expect("a finished op is queued");
                comms.release(e.run.comm);
                finish(e.meta, e.run, res);
            }
            continue;
        }
        if progressed {
            idle_since = None;
            continue;
        }
        idle(q, &comms, &mut entries, &order, &flushing, &mut idle_since);
    }
}

/// Nothing moved: spin, yield, then sleep on what the moving ops wait for (and the doorbell of
/// new jobs). Only the ops that can move or are flushing are looked at: those queued behind
/// them (same communicator, later deadline) wait for them.
fn idle(
    q: &'static Queue,
    comms: &Comms,
    entries: &mut BTreeMap<u64, Entry>,
    order: &Order,
    flushing: &BTreeSet<u64>,
    idle_since: &mut Option<Instant>,
) {
    let now = Instant::now();
    let since = *idle_since.get_or_insert(now);
    let live = || comms.slots.iter().flatten().map(|(sh, _)| sh.waits());
    let spin = live().map(|w| w.0).max().unwrap_or_default();
    let yield_for = live().map(|w| w.1).max().unwrap_or_default();
    if now - since < spin {
        std::hint::spin_loop();
        return;
    }
    if now - since < spin + yield_for {
        std::thread::yield_now();
        return;
    }
    let ids: Vec<u64> = order.ready().chain(flushing.iter().copied()).collect();
    let refs = comms.refs();
    for id in &ids {
        let e = entries.get_mut(id).expect("an active op is queued");
        let m = &mut e.meta;
        if m.next_report.is_some_and(|t| now >= t) {
            let note = wait_note(&refs, std::slice::from_ref(&e.run), now - m.started, m.deadline - m.started);
            crate::log::notice(Some(m.sh.rank()), &note);
            m.next_report = m.sh.wait_report().map(|r| now + r);
        }
    }
    let active: Vec<&Entry> = ids.iter().map(|id| &entries[id]).collect();
    let mut tx_of: Vec<Vec<usize>> = vec![Vec::new(); refs.len()];
    for e in &active {
        tx_of[e.run.comm].extend_from_slice(e.run.sched.peers().1);
    }
    for t in &mut tx_of {
        t.sort_unstable();
        t.dedup();
    }
    let deadline = active.iter().map(|e| e.meta.deadline).min().unwrap_or(now + Duration::from_millis(500));
    let moving = active.iter().map(|e| &e.run);
    let mut res = block(&refs, moving, &tx_of, deadline, &[WaitSource::doorbell(q.bell.read_fd())]);
    if res.is_ok() && now - since >= crate::exec::STALL {
        if let Some(e) = crate::exec::lost_peer(&refs, active.iter().map(|e| &e.run)) {
            res = Err(e);
        }
    }
    if let Err(e) = res {
        for (sh, _) in comms.slots.iter().flatten() {
            sh.set_error(e.clone());
        }
    }
}
