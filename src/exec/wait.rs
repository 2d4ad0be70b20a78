//! Driving operations to completion: polling, flushing, spinning, blocking, and the reports of
//! long waits.

use super::{Blocked, Conns, OpRun};
use crate::schedule::Schedule;
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, WaitSource};
use oxccl_transport::ErrorKind;
use std::time::{Duration, Instant};

/// What [`drive`] needs from each communicator involved.
pub trait DriveComm {
    /// Run `f` with the communicator's connections (locking them as needed).
    fn with_conns<R>(&self, f: impl FnOnce(&mut Conns) -> R) -> R;
    /// Whether the communicator was aborted.
    fn aborted(&self) -> bool;
    /// A doorbell fd rung on abort.
    fn abort_fd(&self) -> i32;
    /// The rank, for messages.
    fn rank(&self) -> usize;
    /// Collective `seq` has waited long and is within [`CENSUS_LEAD`] of its deadline: the
    /// timeout census may begin, so that it is complete at the deadline.
    fn near_deadline(&self, _seq: u64) {}
    /// Whether `peer`, on another machine, is known to be gone (its liveness beacon refuses) or
    /// unreachable (silent for seconds); probed at most once a second per peer. For waits that
    /// stalled: a transport may not notice a host that stopped answering before the timeout.
    fn peer_lost(&self, _peer: usize) -> Option<Error> {
        None
    }
}

/// A wait stalled this long asks whether the peers it waits for on other machines are still there.
pub const STALL: Duration = Duration::from_secs(2);

/// The first peer of the moving ops (blocked on it) that [`DriveComm::peer_lost`] reports.
pub(crate) fn lost_peer<'o, 'm: 'o, C: DriveComm>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
) -> Option<Error> {
    moving.into_iter().filter(|o| !o.done()).find_map(|o| match o.blocked {
        Some(Blocked::Recv(p) | Blocked::Send(p)) => comms[o.comm].peer_lost(p),
        None => None,
    })
}

/// How long before a deadline the timeout census begins (each rank marks the operation it is
/// in, so that at the deadline every rank can read who reached it, without waiting more).
pub const CENSUS_LEAD: Duration = Duration::from_secs(1);

/// Progress policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Busy-poll this long before blocking.
    pub spin: Duration,
    /// Then yield the CPU (`sched_yield`) this long before blocking: on an oversubscribed host
    /// this hands the core straight to the peer being waited for.
    pub yield_for: Duration,
    /// Give up at this instant.
    pub deadline: Instant,
    /// Say what the wait waits for every this often ([`crate::Config::wait_report`]).
    pub report: Option<Duration>,
    /// When the operations started (the caller's one clock read, which the deadline came from).
    pub started: Instant,
}

thread_local! {
    /// This thread's current busy-poll budget (ns), adapted to how waits actually end.
    static SPIN_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// The busy-poll budget for this thread's next wait: at most `max`, halved each time a wait
/// outlasted its spin (the peer was not running: spinning only stole its core), doubled back
/// (from at least 2 µs) each time a wait ended within the spin or a short yield.
pub(crate) fn adaptive_spin(max: Duration) -> Duration {
    let max_ns = max.as_nanos() as u64;
    Duration::from_nanos(SPIN_NS.with(|c| c.get()).min(max_ns))
}

/// Record how long the last wait took, against the spin it had.
pub(crate) fn record_wait(idle: Duration, spin: Duration, max: Duration) {
    let max_ns = max.as_nanos() as u64;
    SPIN_NS.with(|c| {
        let cur = c.get().min(max_ns);
        let quick = idle <= spin.max(Duration::from_micros(20));
        let next = if quick { (cur * 2).max(2_000) } else { cur / 2 };
        c.set(if next < 1_000 && !quick { 0 } else { next.min(max_ns) });
    });
}

/// Drive `ops` until all are done and their sends flushed. Ops on the same connection run in
/// list order (an op may only use a connection once every earlier op is done with it); the
/// cost of that rule is linear in the ops (one line per connection: `src/order.rs`).
pub fn drive<C: DriveComm>(comms: &[&C], ops: &mut [OpRun<'_>], policy: Policy) -> Result<()> {
    let max_spin = policy.spin;
    let mut policy = policy;
    policy.spin = adaptive_spin(max_spin);
    let scheds: Vec<std::sync::Arc<Schedule>> = ops.iter().map(|o| o.sched.clone()).collect();
    let uses: Vec<(&[usize], &[usize])> = scheds.iter().map(|s| s.peers()).collect();
    let tx_of: Vec<Vec<usize>> = (0..comms.len()).map(|ci| peers_of(ops, &uses, ci).1).collect();
    // one op needs no lines (the fast path allocates nothing for them)
    let mut order = (ops.len() > 1).then(|| {
        let mut o = crate::order::Order::default();
        for (i, (op, u)) in ops.iter().zip(&uses).enumerate() {
            o.push(i as u64, op.comm, u.0, u.1);
        }
        o
    });
    let mut movable: Vec<u64> = Vec::new();
    let mut idle_passes = 0u32;
    let mut idle_since: Option<Instant> = None;
    let started = policy.started;
    let mut next_report = policy.report.map(|r| started + r);
    let mut census_begun = false;
    loop {
        let mut progressed = false;
        let all_done = match order.as_mut() {
            None => {
                for op in ops.iter_mut().filter(|o| !o.done()) {
                    progressed |= comms[op.comm].with_conns(|c| op.poll(c))?;
                }
                ops.iter().all(|o| o.done())
            }
            Some(order) => {
                order.ready_into(&mut movable);
                for &id in &movable {
                    let op = &mut ops[id as usize];
                    progressed |= comms[op.comm].with_conns(|c| op.poll(c))?;
                    if op.done() {
                        order.retire(id);
                    }
                }
                order.len() == 0
            }
        };
        // flush, and find out whether anything is still in flight
        let mut pending = false;
        for (c, tx) in comms.iter().zip(&tx_of) {
            c.with_conns(|conns| -> Result<()> {
                for &q in tx {
                    if let Some(s) = conns.send[q].as_mut() {
                        s.progress().map_err(|e| e.with_peer(q).with_rank(c.rank()))?;
                        pending |= s.pending();
                    }
                }
                Ok(())
            })?;
        }
        if all_done && !pending {
            return Ok(());
        }
        if progressed {
            if let Some(since) = idle_since.take() {
                record_wait(since.elapsed(), policy.spin, max_spin);
                policy.spin = adaptive_spin(max_spin);
            }
            idle_passes = 0;
            continue;
        }
        // idle: spin a while (reading the clock only every 64 passes: short waits, the common
        // case for small messages, never read it), yield a while, then block
        idle_passes += 1;
        if idle_passes % 64 != 0 && !policy.spin.is_zero() {
            std::hint::spin_loop();
            continue;
        }
        for c in comms {
            if c.aborted() {
                return Err(Error::comm_aborted().with_rank(c.rank()));
            }
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        if now >= policy.deadline {
            return Err(hang_report(comms, ops));
        }
        if !census_begun && now + CENSUS_LEAD >= policy.deadline && now - started >= CENSUS_LEAD {
            census_begun = true;
            let p2p = |o: &&OpRun<'_>| matches!(o.fp.coll, crate::Coll::Send | crate::Coll::Recv);
            if let Some(o) = ops.iter().find(|o| !o.done() && !p2p(o)) {
                comms[o.comm].near_deadline(o.seq);
            }
        }
        if now - since < policy.spin {
            continue;
        }
        if now - since < policy.spin + policy.yield_for {
            std::thread::yield_now();
            continue;
        }
        if next_report.is_some_and(|t| now >= t) {
            crate::log::notice(None, &wait_note(comms, ops, now - started, policy.deadline - started));
            next_report = policy.report.map(|r| now + r);
        }
        match order.as_ref() {
            None => block(comms, ops.iter(), &tx_of, policy.deadline, &[])?,
            Some(o) => block(comms, o.ready().map(|id| &ops[id as usize]), &tx_of, policy.deadline, &[])?,
        }
        if now - since >= STALL {
            let lost = match order.as_ref() {
                None => lost_peer(comms, ops.iter()),
                Some(o) => lost_peer(comms, o.ready().map(|id| &ops[id as usize])),
            };
            if let Some(e) = lost {
                return Err(e);
            }
        }
    }
}

pub(crate) fn peers_of(ops: &[OpRun<'_>], uses: &[(&[usize], &[usize])], comm: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rx = vec![];
    let mut tx = vec![];
    for (o, u) in ops.iter().zip(uses) {
        if o.comm == comm {
            rx.extend_from_slice(u.0);
            tx.extend_from_slice(u.1);
        }
    }
    rx.sort_unstable();
    rx.dedup();
    tx.sort_unstable();
    tx.dedup();
    (rx, tx)
}

/// Arm everything the moving ops wait on (their blocking peers, plus sends in `tx_of[comm]` with
/// unflushed data) and sleep until one is ready, or at most 500 ms so the deadline and abort
/// are checked.
pub(crate) fn block<'o, 'm: 'o, C: DriveComm>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
    tx_of: &[Vec<usize>],
    deadline: Instant,
    extra: &[WaitSource],
) -> Result<()> {
    let mut sources: Vec<WaitSource> = comms.iter().map(|c| WaitSource::doorbell(c.abort_fd())).collect();
    sources.extend_from_slice(extra);
    let mut wanted: Vec<(usize, Blocked)> = vec![];
    let mut any_op = false;
    for o in moving {
        any_op = true;
        if let (false, Some(b)) = (o.done(), o.blocked) {
            wanted.push((o.comm, b));
        }
    }
    for (ci, (c, tx)) in comms.iter().zip(tx_of).enumerate() {
        for &q in tx {
            if c.with_conns(|conns| conns.send[q].as_ref().is_some_and(|s| s.pending())) {
                wanted.push((ci, Blocked::Send(q)));
            }
        }
    }
    wanted.sort_unstable_by_key(|&(ci, b)| {
        (
            ci,
            matches!(b, Blocked::Send(_)),
            match b {
                Blocked::Recv(p) | Blocked::Send(p) => p,
            },
        )
    });
    wanted.dedup();
    if wanted.is_empty() && any_op {
        // what the caller saw still in flight (a send being consumed) finished meanwhile:
        // there is nothing to sleep on, so let it look again
        return Ok(());
    }
    let mut armed = vec![];
    let mut ready = false;
    for &(ci, b) in &wanted {
        let r = comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map(|c| c.arm()),
            Blocked::Send(q) => conns.send[q].as_mut().map(|c| c.arm()),
        });
        armed.push((ci, b));
        match r {
            Some(Ok(Some(src))) => sources.push(src),
            Some(Ok(None)) => ready = true,
            Some(Err(e)) => {
                disarm(comms, &armed);
                return Err(e.with_rank(comms[ci].rank()));
            }
            None => {}
        }
        if ready {
            break;
        }
    }
    if !ready {
        let left = deadline.saturating_duration_since(Instant::now());
        wait_any(&sources, left.min(Duration::from_millis(500)))?;
    }
    disarm(comms, &armed);
    // a peer that died without closing anything (shared memory) is noticed here; a peer that
    // finished and exited normally has already delivered what we wait for, so only a connection
    // that is still not ready counts
    // (the same logic for both halves of a connection: they are different traits)
    macro_rules! dead_and_not_ready {
        ($c:expr) => {
            match $c.check_peer() {
                Ok(()) => Ok(()),
                Err(e) => {
                    let ready = matches!($c.arm(), Ok(None));
                    $c.disarm();
                    if ready {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
            }
        };
    }
    for &(ci, b) in &armed {
        let r = comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
            Blocked::Send(q) => conns.send[q].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
        });
        if let Err(e) = r {
            let p = match b {
                Blocked::Recv(p) | Blocked::Send(p) => p,
            };
            return Err(e.with_peer(p).with_rank(comms[ci].rank()));
        }
    }
    Ok(())
}

fn disarm<C: DriveComm>(comms: &[&C], armed: &[(usize, Blocked)]) {
    for &(ci, b) in armed {
        comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => {
                if let Some(c) = conns.recv[p].as_mut() {
                    c.disarm()
                }
            }
            Blocked::Send(q) => {
                if let Some(c) = conns.send[q].as_mut() {
                    c.disarm()
                }
            }
        });
    }
}

/// What a long wait waits for, for the periodic report: "rank 0: waiting for ranks [1] in
/// allreduce #12 (float, 4 MiB), 30 of 600 s".
pub(crate) fn wait_note<C: DriveComm>(comms: &[&C], ops: &[OpRun<'_>], waited: Duration, limit: Duration) -> String {
    let rank = ops.first().map(|o| comms[o.comm].rank()).unwrap_or(0);
    let mut peers: Vec<usize> = ops
        .iter()
        .filter(|o| !o.done())
        .filter_map(|o| match o.blocked {
            Some(Blocked::Recv(p) | Blocked::Send(p)) => Some(p),
            None => None,
        })
        .collect();
    peers.sort_unstable();
    peers.dedup();
    let what = match ops.iter().find(|o| !o.done()) {
        Some(o) => {
            let bytes = o.fp.count * o.fp.dtype.size();
            let name =
                if matches!(o.fp.coll, crate::Coll::Send | crate::Coll::Recv) { "send/recv" } else { o.fp.coll.name() };
            format!("{name} #{} ({}, {})", o.seq, o.fp.dtype.name(), human_bytes(bytes))
        }
        None => "flushing the last sends".into(),
    };
    format!(
        "rank {rank}: waiting for ranks {peers:?} in {what}, {:.0} of {:.0} s (OXCCL_WAIT_REPORT=0 silences this)",
        waited.as_secs_f64(),
        limit.as_secs_f64()
    )
}

/// `4 MiB`, `512 B`: sizes for messages.
pub fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

pub(crate) fn hang_report<C: DriveComm>(comms: &[&C], ops: &[OpRun<'_>]) -> Error {
    let mut parts = vec![];
    // the first unfinished ops are the ones that could move; the rest queue behind them
    const NAMED: usize = 8;
    let queued = ops.iter().filter(|o| !o.done()).count().saturating_sub(NAMED);
    for o in ops.iter().filter(|o| !o.done()).take(NAMED) {
        let what = match o.blocked {
            Some(Blocked::Recv(p)) => format!("waiting for data from rank {p}"),
            Some(Blocked::Send(q)) => format!("waiting for rank {q} to drain its receive buffer"),
            None => "waiting for an earlier operation on the same connection".into(),
        };
        parts.push(format!("{} (op #{}) at step {}/{}: {what}", o.fp, o.seq, o.pc, o.sched.steps.len()));
    }
    if parts.is_empty() {
        parts.push("all steps done, waiting for sends to flush".into());
    }
    if queued > 0 {
        parts.push(format!("{queued} more operations queued behind these"));
    }
    let rank = ops.first().map(|o| comms[o.comm].rank()).unwrap_or(0);
    let mut e = Error::new(ErrorKind::Timeout, format!("operation timed out (OXCCL_TIMEOUT): {}", parts.join("; ")))
        .with_rank(rank);
    if let Some(o) = ops.iter().find(|o| !o.done()) {
        e = e.with_op(o.fp.to_string()).with_seq(o.seq);
        if let Some(Blocked::Recv(p) | Blocked::Send(p)) = o.blocked {
            e = e.with_peer(p);
        }
    }
    e
}
