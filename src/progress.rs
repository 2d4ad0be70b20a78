//! The process-wide progress thread of asynchronous operations.
//!
//! Connection setup happens in the submitting thread (it may wait for peers); the thread here only
//! moves data. It progresses every queued operation of every communicator together (so ranks that
//! are threads of one process cannot deadlock on it), keeps operations of one communicator in
//! submission order, and sleeps in `poll(2)` when nothing can move (no CPU when idle).

use crate::exec::{DriveComm, Engine, Finished, OpMem, OpRun, Policy, Runs};
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, Doorbell, WaitSource};
use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the progress thread needs from a communicator beyond what the engine needs.
pub(crate) trait AsyncComm: DriveComm + Send + Sync {
    /// An operation of this communicator failed: the communicator is in error from now on.
    fn failed(&self, e: Error);
    /// An operation of this communicator was queued (`true`) or finished (`false`).
    fn queued(&self, more: bool);
    /// An operation of this communicator left the engine (completed or failed).
    fn completed(&self, run: &OpRun<'static>);
}

/// An operation (already connected) for the progress thread.
pub(crate) struct Job {
    pub comm: Arc<dyn AsyncComm>,
    pub run: OpRun<'static>,
    pub done: Sender<Result<OpMem<'static>>>,
    pub policy: Policy,
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
    job.comm.queued(true);
    q.jobs.lock().unwrap().push(job);
    q.bell.ring();
    Ok(())
}

/// Where a finished operation's outcome goes.
struct Meta {
    comm: Arc<dyn AsyncComm>,
    done: Sender<Result<OpMem<'static>>>,
}

fn finish(meta: Meta, run: OpRun<'static>, res: Result<()>) {
    // name the operation (a dead peer is found by the transport, which knows only the peer)
    let res = res.map_err(|e| if e.op.is_none() { e.with_op(run.fp.to_string()).with_seq(run.seq) } else { e });
    meta.comm.completed(&run);
    if let Err(e) = &res {
        meta.comm.failed(e.clone());
    }
    let _ = meta.done.send(res.map(|_| run.mem));
    meta.comm.queued(false);
}

/// The communicators of queued operations, by the index their runs carry. A slot is emptied
/// (its `Arc` dropped) when its last operation finishes, so a destroyed communicator is not
/// kept alive by another's traffic.
#[derive(Default)]
struct Comms {
    slots: Vec<Option<(Arc<dyn AsyncComm>, usize)>>,
}

impl Comms {
    fn index(&mut self, c: &Arc<dyn AsyncComm>) -> usize {
        let same = |x: &Arc<dyn AsyncComm>| std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(c));
        if let Some(i) = self.slots.iter().position(|s| s.as_ref().is_some_and(|(x, _)| same(x))) {
            self.slots[i].as_mut().unwrap().1 += 1;
            return i;
        }
        let free = self.slots.iter().position(|s| s.is_none());
        let i = free.unwrap_or(self.slots.len());
        if i == self.slots.len() {
            self.slots.push(None);
        }
        self.slots[i] = Some((c.clone(), 1));
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
    fn refs(&self) -> Vec<&dyn AsyncComm> {
        let Some(any) = self.slots.iter().flatten().next() else { return vec![] };
        self.slots.iter().map(|s| &*s.as_ref().unwrap_or(any).0).collect()
    }
}

/// The queued operations, by engine id, and where each one's outcome goes.
#[derive(Default)]
struct Queued(HashMap<u64, (OpRun<'static>, Meta)>);

impl Runs<'static> for Queued {
    fn run(&self, id: u64) -> &OpRun<'static> {
        &self.0[&id].0
    }
    fn run_mut(&mut self, id: u64) -> &mut OpRun<'static> {
        &mut self.0.get_mut(&id).expect("a queued op").0
    }
}

/// The thread: take new jobs, turn the engine, hand back what finished; sleep on the doorbell
/// when nothing is queued.
fn main_loop(q: &'static Queue) {
    let mut engine = Engine::default();
    let mut comms = Comms::default();
    let mut queued = Queued::default();
    let mut out: Vec<Finished> = Vec::new();
    let bell = [WaitSource::doorbell(q.bell.read_fd())];
    loop {
        for j in q.jobs.lock().unwrap().drain(..) {
            let mut run = j.run;
            run.comm = comms.index(&j.comm);
            queued.0.insert(engine.next_id(), (run, Meta { comm: j.comm, done: j.done }));
            engine.push(j.policy, &queued);
        }
        if engine.is_empty() {
            let _ = wait_any(&bell, Duration::from_secs(3600));
            continue;
        }
        let refs = comms.refs();
        engine.turn(&refs, &mut queued, &bell, &mut out);
        drop(refs);
        for (id, res) in out.drain(..) {
            let (run, meta) = queued.0.remove(&id).expect("a finished op was queued");
            comms.release(run.comm);
            finish(meta, run, res);
        }
    }
}
