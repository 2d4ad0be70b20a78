//! The one progress engine. Blocking calls and groups ([`drive`]), the progress thread of
//! asynchronous operations (`src/progress.rs`) and, through groups, the device worker all move
//! their operations with an [`Engine`]:
//!
//! - **Order.** Operations that share a connection use it in the order they were queued
//!   (`src/order.rs`; a lone operation needs no lines).
//! - **Poll.** Each turn polls every operation that may move, as far as its connections allow.
//! - **Flush.** Each turn pushes every send connection the queued operations use, once; an
//!   operation whose steps all ran completes once its sends have left the process.
//! - **Ladder.** When nothing moved: spin (adapted to how waits end), yield, then arm what the
//!   moving operations wait for and sleep in `poll(2)` (no CPU when idle), with the deadline,
//!   abort, the timeout census, the wait reports and the lost-peer probes checked on the way.

use super::wait::{adaptive_spin, record_wait, with_conns, DriveComm, Policy};
use super::OpRun;
use crate::order::Order;
use crate::{Error, Result};
use oxccl_transport::wait::WaitSource;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

mod ladder;
mod lone;
mod publish;

pub use lone::{quick_polls, QUICK_POLLS};

/// Where the engine finds the queued operations, by id: the caller owns them (a group's list,
/// the progress thread's queue), so the engine never moves one.
pub(crate) trait Runs<'a> {
    /// Operation `id` (queued, not yet finished).
    fn run(&self, id: u64) -> &OpRun<'a>;
    /// The same, to move it.
    fn run_mut(&mut self, id: u64) -> &mut OpRun<'a>;
}

impl<'a> Runs<'a> for [OpRun<'a>] {
    fn run(&self, id: u64) -> &OpRun<'a> {
        &self[id as usize]
    }
    fn run_mut(&mut self, id: u64) -> &mut OpRun<'a> {
        &mut self[id as usize]
    }
}

/// One queued operation's bounds and state in the engine.
struct Slot {
    /// Its communicator (index into `comms`).
    comm: usize,
    policy: Policy,
    /// When to say next what it waits for.
    next_report: Option<Instant>,
    /// When it last published its communicator's status (`None`: never; the first is due
    /// [`Policy::status`] after it started).
    status_at: Option<Instant>,
    /// Whether its timeout census began.
    census: bool,
    /// Its steps all ran; its sends may still be leaving.
    flushing: bool,
}

/// A send connection the queued operations use: (communicator, peer), how many use it, and
/// whether it still held unsent data after the last flush.
struct SendLine {
    comm: usize,
    peer: usize,
    users: usize,
    pending: bool,
}

/// The spin / yield / block ladder's state.
#[derive(Default)]
struct Ladder {
    /// The largest busy-poll budget of the queued operations, and the one in force (adapted).
    max_spin: Duration,
    spin: Duration,
    yield_for: Duration,
    idle_passes: u32,
    idle_since: Option<Instant>,
}

/// An operation that left the engine: its id, and how it ended.
pub(crate) type Finished = (u64, Result<()>);

/// The engine: queued operations (ids increase in queue order), driven turn by turn.
#[derive(Default)]
pub(crate) struct Engine {
    slots: VecDeque<Option<Slot>>,
    /// The id of `slots[0]`.
    base: u64,
    live: usize,
    /// Connection lines, once two operations were queued at once.
    order: Option<Order>,
    sends: Vec<SendLine>,
    flushing: Vec<u64>,
    ladder: Ladder,
    turns: u32,
    /// Scratch: the ids that may move this turn (with connection lines).
    ready: Vec<u64>,
    /// Scratch: the active ids, for the deadline checks of a spinning wait.
    scratch: Vec<u64>,
}

impl Engine {
    /// Empty, as new, keeping the capacity of its lists.
    fn reset(&mut self) {
        self.slots.clear();
        self.base = 0;
        self.live = 0;
        self.order = None;
        self.sends.clear();
        self.flushing.clear();
        self.ladder = Ladder::default();
        self.turns = 0;
        self.ready.clear();
        self.scratch.clear();
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The id the next [`Engine::push`] queues.
    pub fn next_id(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Queue the operation the caller's `runs` hold under [`Engine::next_id`] (its `comm`
    /// indexes the `comms` of every later [`Engine::turn`]; `runs` must find it until it
    /// finished). Returns its id.
    pub fn push<'a, R: Runs<'a> + ?Sized>(&mut self, policy: Policy, runs: &R) -> u64 {
        let id = self.next_id();
        let run = runs.run(id);
        let (rx, tx) = run.sched.peers();
        if self.live == 1 && self.order.is_none() {
            let mut o = Order::default();
            if let Some(first) = self.lone() {
                let r = runs.run(first);
                let (a, b) = r.sched.peers();
                o.push(first, r.comm, a, b);
            }
            self.order = Some(o);
        }
        if let Some(o) = self.order.as_mut() {
            o.push(id, run.comm, rx, tx);
        }
        for &q in tx {
            match self.sends.binary_search_by_key(&(run.comm, q), |s| (s.comm, s.peer)) {
                Ok(i) => self.sends[i].users += 1,
                Err(i) => self.sends.insert(i, SendLine { comm: run.comm, peer: q, users: 1, pending: false }),
            }
        }
        let l = &mut self.ladder;
        if self.live == 0 {
            l.max_spin = Duration::ZERO;
            l.yield_for = Duration::ZERO;
        }
        if policy.spin > l.max_spin || self.live == 0 {
            l.max_spin = l.max_spin.max(policy.spin);
            l.spin = adaptive_spin(l.max_spin);
        }
        l.yield_for = l.yield_for.max(policy.yield_for);
        let next_report = policy.report.map(|r| policy.started + r);
        let slot = Slot { comm: run.comm, policy, next_report, status_at: None, census: false, flushing: false };
        self.slots.push_back(Some(slot));
        self.live += 1;
        id
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Slot)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (self.base + i as u64, s)))
    }

    fn slot(&self, id: u64) -> &Slot {
        self.slots[(id - self.base) as usize].as_ref().expect("a live op")
    }

    fn slot_mut(&mut self, id: u64) -> &mut Slot {
        self.slots[(id - self.base) as usize].as_mut().expect("a live op")
    }

    /// Take operation `id` out, with its outcome.
    fn finish<'a, R: Runs<'a> + ?Sized>(&mut self, id: u64, res: Result<()>, runs: &R, out: &mut Vec<Finished>) {
        let i = (id - self.base) as usize;
        let Some(s) = self.slots.get_mut(i).and_then(Option::take) else { return };
        self.live -= 1;
        if let Some(o) = self.order.as_mut() {
            o.retire(id);
        }
        // (its id leaves `flushing` at the next `complete`: removing it here would cost the
        // length of that list per finished op)
        for &q in runs.run(id).sched.peers().1 {
            if let Ok(i) = self.sends.binary_search_by_key(&(s.comm, q), |l| (l.comm, l.peer)) {
                self.sends[i].users -= 1;
                if self.sends[i].users == 0 {
                    self.sends.remove(i);
                }
            }
        }
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.base += 1;
        }
        out.push((id, res));
    }

    /// Fail every queued operation `which` selects with `e`.
    fn fail_where<'a, R: Runs<'a> + ?Sized>(
        &mut self,
        e: &Error,
        which: impl Fn(u64, &Slot) -> bool,
        runs: &R,
        out: &mut Vec<Finished>,
    ) {
        let ids: Vec<u64> = self.iter().filter(|&(id, s)| which(id, s)).map(|(id, _)| id).collect();
        for id in ids {
            self.finish(id, Err(e.clone()), runs, out);
        }
    }

    /// The lone operation, when there are no lines (at most one was ever queued at once).
    fn lone(&self) -> Option<u64> {
        match self.order {
            None => self.iter().find(|(_, s)| !s.flushing).map(|(id, _)| id),
            Some(_) => None,
        }
    }

    /// One turn: poll what may move, flush, complete what is flushed; when nothing moved, one
    /// rung of the ladder. Operations that completed or failed are appended to `out`. `wake`:
    /// more sources that end a sleep (the progress thread's doorbell of new jobs).
    pub fn turn<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &mut R,
        wake: &[WaitSource],
        out: &mut Vec<Finished>,
    ) {
        let before = out.len();
        let progressed = self.pass(comms, runs, out) || out.len() > before;
        self.turns = self.turns.wrapping_add(1);
        if progressed {
            let l = &mut self.ladder;
            if let Some(since) = l.idle_since.take() {
                record_wait(since.elapsed(), l.spin, l.max_spin);
                l.spin = adaptive_spin(l.max_spin);
            }
            l.idle_passes = 0;
            // an operation stuck behind others that keep moving still meets its deadline
            if self.turns % 1024 == 0 {
                let now = Instant::now();
                self.expire(comms, runs, now, out);
                self.publish(comms, runs, now);
            }
            return;
        }
        self.idle(comms, runs, wake, out);
    }

    /// Poll and flush once. Returns whether any step ran.
    fn pass<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &mut R,
        out: &mut Vec<Finished>,
    ) -> bool {
        let mut progressed = false;
        let lone = self.lone();
        if let (None, Some(o)) = (lone, self.order.as_ref()) {
            self.ready.clear();
            self.ready.extend(o.ready());
        }
        let count = if lone.is_some() {
            1
        } else if self.order.is_some() {
            self.ready.len()
        } else {
            0
        };
        for k in 0..count {
            let id = lone.unwrap_or_else(|| self.ready[k]);
            let c = comms[self.slot(id).comm];
            let run = runs.run_mut(id);
            let res = match c.failure() {
                Some(e) => Err(e),
                None => with_conns(c, |conns| run.poll(conns)),
            };
            match res {
                Ok(p) => progressed |= p,
                Err(e) => {
                    self.finish(id, Err(e), runs, out);
                    continue;
                }
            }
            if run.done() {
                // its connections are free for the next in line; it completes once flushed
                self.slot_mut(id).flushing = true;
                self.flushing.push(id);
                if let Some(o) = self.order.as_mut() {
                    o.retire(id);
                }
            }
        }
        self.flush(comms, runs, out);
        self.complete(comms, runs, out);
        progressed
    }

    /// Push every send connection once; a connection that fails fails the operations using it.
    fn flush<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &R,
        out: &mut Vec<Finished>,
    ) {
        let mut failed: Vec<(usize, usize, Error)> = vec![];
        for l in &mut self.sends {
            let c = comms[l.comm];
            let r = with_conns(c, |conns| match conns.send[l.peer].as_mut() {
                Some(s) => s.progress().map(|_| s.pending()),
                None => Ok(false),
            });
            match r {
                Ok(p) => l.pending = p,
                Err(e) => failed.push((l.comm, l.peer, e.with_peer(l.peer).with_rank(c.rank()))),
            }
        }
        for (ci, q, e) in failed {
            let uses = |id: u64, s: &Slot| s.comm == ci && runs.run(id).sched.peers().1.contains(&q);
            self.fail_where(&e, uses, runs, out);
        }
    }

    /// Complete the flushing operations whose sends all left (or fail them, if their
    /// communicator failed meanwhile).
    fn complete<'a, C: DriveComm + ?Sized, R: Runs<'a> + ?Sized>(
        &mut self,
        comms: &[&C],
        runs: &R,
        out: &mut Vec<Finished>,
    ) {
        if self.flushing.is_empty() {
            return;
        }
        let all_clear = self.sends.iter().all(|l| !l.pending);
        let none_clear = self.sends.iter().all(|l| l.pending) && !self.sends.is_empty();
        let mut list = std::mem::take(&mut self.flushing);
        list.retain(|&id| {
            if !self.is_live(id) {
                return false; // finished otherwise (failed) since it began flushing
            }
            let ci = self.slot(id).comm;
            if let Some(e) = comms[ci].failure() {
                self.finish(id, Err(e), runs, out);
                return false;
            }
            let sent = |q: &usize| match self.sends.binary_search_by_key(&(ci, *q), |l| (l.comm, l.peer)) {
                Ok(i) => !self.sends[i].pending,
                Err(_) => true,
            };
            let clear = all_clear || (!none_clear && runs.run(id).sched.peers().1.iter().all(sent));
            if clear {
                self.finish(id, Ok(()), runs, out);
            }
            !clear
        });
        self.flushing = list;
    }

    /// Whether operation `id` is still queued.
    fn is_live(&self, id: u64) -> bool {
        id >= self.base && self.slots.get((id - self.base) as usize).is_some_and(Option::is_some)
    }

    /// The operations moving or flushing: those a wait is for.
    fn active(&self) -> Vec<u64> {
        let mut ids = Vec::new();
        self.active_into(&mut ids);
        ids
    }

    /// [`Engine::active`] into `ids` (cleared first).
    fn active_into(&self, ids: &mut Vec<u64>) {
        ids.clear();
        match self.order.as_ref() {
            Some(o) => ids.extend(o.ready()),
            None => ids.extend(self.lone()),
        }
        ids.extend(self.flushing.iter().copied().filter(|&id| self.is_live(id)));
    }
}

/// Drive `runs` (a group, or one blocking call) until all completed, or the first fails. Ops on
/// the same connection run in list order. The engine and its scratch lists are this thread's
/// spare ones, reset and reused, so a blocking call allocates nothing here in the steady state
/// (a nested drive, should one ever happen, gets fresh ones).
pub fn drive<C: DriveComm + ?Sized>(comms: &[&C], runs: &mut [OpRun<'_>], policy: Policy) -> Result<()> {
    thread_local! {
        static SPARE: std::cell::RefCell<(Engine, Vec<Finished>)> = Default::default();
    }
    SPARE.with(|spare| match spare.try_borrow_mut() {
        Ok(mut spare) => {
            let (eng, out) = &mut *spare;
            eng.reset();
            out.clear();
            let res = drive_with(eng, out, comms, runs, policy);
            out.clear(); // (no error kept alive past the call)
            res
        }
        Err(_) => drive_with(&mut Engine::default(), &mut Vec::new(), comms, runs, policy),
    })
}

fn drive_with<C: DriveComm + ?Sized>(
    eng: &mut Engine,
    out: &mut Vec<Finished>,
    comms: &[&C],
    runs: &mut [OpRun<'_>],
    policy: Policy,
) -> Result<()> {
    for _ in 0..runs.len() {
        eng.push(policy, runs);
    }
    while !eng.is_empty() {
        eng.turn(comms, runs, &[], out);
        if let Some(k) = out.iter().position(|(_, r)| r.is_err()) {
            return out.swap_remove(k).1;
        }
        out.clear();
    }
    Ok(())
}
