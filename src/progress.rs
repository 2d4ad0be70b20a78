//! The process-wide progress thread of asynchronous operations.
//!
//! Connection setup happens in the submitting thread (it may wait for peers); the thread here only
//! moves data. It progresses every queued operation of every communicator together (so ranks that
//! are threads of one process cannot deadlock on it), keeps operations of one communicator in
//! submission order, and sleeps in `poll(2)` when nothing can move (no CPU when idle).

use crate::comm::Shared;
use crate::exec::{block, hang_report, wait_note, DriveComm, OpMem, OpRun};
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, Doorbell, WaitSource};
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

fn main_loop(q: &'static Queue) {
    let mut runs: Vec<OpRun<'static>> = Vec::new();
    let mut metas: Vec<Meta> = Vec::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        for j in q.jobs.lock().unwrap().drain(..) {
            runs.push(j.run);
            let started = Instant::now();
            let next_report = j.sh.wait_report().map(|r| started + r);
            metas.push(Meta { sh: j.sh, done: j.done, deadline: j.deadline, started, next_report });
        }
        if runs.is_empty() {
            let _ = wait_any(&[WaitSource::doorbell(q.bell.read_fd())], Duration::from_secs(3600));
            continue;
        }
        // communicator table for this pass
        let mut shs: Vec<Arc<Shared>> = Vec::new();
        for (r, m) in runs.iter_mut().zip(&metas) {
            r.comm = match shs.iter().position(|s| Arc::ptr_eq(s, &m.sh)) {
                Some(i) => i,
                None => {
                    shs.push(m.sh.clone());
                    shs.len() - 1
                }
            };
        }
        let refs: Vec<&Shared> = shs.iter().map(|a| &**a).collect();
        let scheds: Vec<Arc<crate::schedule::Schedule>> = runs.iter().map(|r| r.sched.clone()).collect();
        let uses: Vec<(&[usize], &[usize])> = scheds.iter().map(|s| s.peers()).collect();
        let mut progressed = false;
        let mut outcome: Vec<Option<Result<()>>> = (0..runs.len()).map(|_| None).collect();
        for i in 0..runs.len() {
            let ci = runs[i].comm;
            if refs[ci].aborted() {
                outcome[i] = Some(Err(Error::invalid_usage("communicator was aborted").with_rank(refs[ci].rank())));
                continue;
            }
            if let Some(e) = refs[ci].sticky_error() {
                outcome[i] = Some(Err(e));
                continue;
            }
            let blocked_by_earlier = (0..i).any(|j| {
                outcome[j].is_none()
                    && runs[j].comm == ci
                    && (uses[j].0.iter().any(|p| uses[i].0.contains(p))
                        || uses[j].1.iter().any(|p| uses[i].1.contains(p)))
            });
            if runs[i].done() || blocked_by_earlier {
                continue;
            }
            let r = &mut runs[i];
            match refs[ci].with_conns(|c| r.poll(c)) {
                Ok(p) => progressed |= p,
                Err(e) => outcome[i] = Some(Err(e)),
            }
        }
        // flush; an op is complete when its steps ran and its sends left the process
        for i in 0..runs.len() {
            if outcome[i].is_some() {
                continue;
            }
            let ci = runs[i].comm;
            let flushed = refs[ci].with_conns(|c| -> Result<bool> {
                let mut clear = true;
                for &q in uses[i].1 {
                    if let Some(s) = c.send[q].as_mut() {
                        s.progress().map_err(|e| e.with_peer(q).with_rank(refs[ci].rank()))?;
                        clear &= !s.pending();
                    }
                }
                Ok(clear)
            });
            match flushed {
                Err(e) => outcome[i] = Some(Err(e)),
                Ok(true) if runs[i].done() => outcome[i] = Some(Ok(())),
                Ok(_) if Instant::now() >= metas[i].deadline => {
                    outcome[i] = Some(Err(hang_report(&refs, std::slice::from_ref(&runs[i]))))
                }
                Ok(_) => {}
            }
        }
        drop(refs);
        // retire finished ops, keeping the others in order
        if outcome.iter().any(|o| o.is_some()) {
            idle_since = None;
            let old_runs = std::mem::take(&mut runs);
            let old_metas = std::mem::take(&mut metas);
            for ((r, m), o) in old_runs.into_iter().zip(old_metas).zip(outcome) {
                match o {
                    Some(res) => finish(m, r, res),
                    None => {
                        runs.push(r);
                        metas.push(m);
                    }
                }
            }
            continue;
        }
        if progressed {
            idle_since = None;
            continue;
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        let spin = metas.iter().map(|m| m.sh.waits().0).max().unwrap_or_default();
        let yield_for = metas.iter().map(|m| m.sh.waits().1).max().unwrap_or_default();
        if now - since < spin {
            std::hint::spin_loop();
            continue;
        }
        if now - since < spin + yield_for {
            std::thread::yield_now();
            continue;
        }
        let refs: Vec<&Shared> = shs.iter().map(|a| &**a).collect();
        for (i, m) in metas.iter_mut().enumerate() {
            if m.next_report.is_some_and(|t| now >= t) {
                let note = wait_note(&refs, std::slice::from_ref(&runs[i]), now - m.started, m.deadline - m.started);
                crate::log::notice(Some(m.sh.rank()), &note);
                m.next_report = m.sh.wait_report().map(|r| now + r);
            }
        }
        let deadline = metas.iter().map(|m| m.deadline).min().unwrap();
        if let Err(e) = block(&refs, &runs, &uses, deadline, &[WaitSource::doorbell(q.bell.read_fd())]) {
            for m in &metas {
                m.sh.set_error(e.clone());
            }
        }
    }
}
