//! What the engine needs from a communicator, and its waits: blocking on the connections the
//! moving operations wait for, asking after lost peers, and the reports of long waits.

use super::{Blocked, Conns, OpRun};
use crate::watch::status::Running;
use crate::Error;
use oxccl_transport::wait::{wait_any, WaitSource};
use oxccl_transport::ErrorKind;
use std::time::{Duration, Instant};

/// What the engine ([`super::drive`], the progress thread) needs from each communicator involved.
pub trait DriveComm {
    /// Call `f` once with the communicator's connections (locking them as needed). Use
    /// [`with_conns`], which returns `f`'s value.
    fn visit_conns(&self, f: &mut dyn FnMut(&mut Conns));
    /// Whether the communicator was aborted.
    fn aborted(&self) -> bool;
    /// Why operations on it can no longer run (aborted, or failed earlier), checked before each
    /// poll: two atomic loads in the common case.
    fn failure(&self) -> Option<Error> {
        self.aborted().then(|| Error::comm_aborted().with_rank(self.rank()))
    }
    /// A doorbell fd rung on abort.
    fn abort_fd(&self) -> i32;
    /// The rank, for messages.
    fn rank(&self) -> usize;
    /// Collective `seq` has waited long and is within [`CENSUS_LEAD`] of its deadline: the
    /// timeout census may begin, so that it is complete at the deadline.
    fn near_deadline(&self, _seq: u64) {}
    /// An operation of this communicator has run past its status time
    /// ([`Policy::status`]): publish what it waits for.
    fn long_op(&self, _op: Running) {}
    /// Whether `peer`, on another machine, is known to be gone (its liveness beacon refuses) or
    /// unreachable (silent for seconds); probed at most once a second per peer. For waits that
    /// stalled: a transport may not notice a host that stopped answering before the timeout.
    fn peer_lost(&self, _peer: usize) -> Option<Error> {
        None
    }
}

/// Run `f` on `c`'s connections and return its value.
pub fn with_conns<C: DriveComm + ?Sized, R>(c: &C, f: impl FnOnce(&mut Conns) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    c.visit_conns(&mut |conns| out = f.take().map(|f| f(conns)));
    out.expect("visit_conns calls its closure once")
}

/// The peers a set of operations receives from and sends to, each sorted and distinct.
pub(crate) fn peers_of<'o, 'm: 'o>(runs: impl IntoIterator<Item = &'o OpRun<'m>>) -> (Vec<usize>, Vec<usize>) {
    let (mut rx, mut tx) = (Vec::new(), Vec::new());
    for r in runs {
        let (a, b) = r.sched.peers();
        rx.extend_from_slice(a);
        tx.extend_from_slice(b);
    }
    rx.sort_unstable();
    rx.dedup();
    tx.sort_unstable();
    tx.dedup();
    (rx, tx)
}

/// A wait stalled this long asks whether the peers it waits for on other machines are still there.
pub const STALL: Duration = Duration::from_secs(2);

/// The first peer of the moving ops (blocked on it) that [`DriveComm::peer_lost`] reports, with
/// the index of its communicator.
pub(crate) fn lost_peer<'o, 'm: 'o, C: DriveComm + ?Sized>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
) -> Option<(usize, Error)> {
    moving.into_iter().filter(|o| !o.done()).find_map(|o| match o.blocked {
        Some(Blocked::Recv(p) | Blocked::Send(p)) => comms[o.comm].peer_lost(p).map(|e| (o.comm, e)),
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
    /// Publish the communicator's status after this long, and again every this often
    /// ([`crate::watch::Settings::status_after`]).
    pub status: Option<Duration>,
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

/// Why a [`block`] failed: the error, and the index of the communicator whose connection failed
/// (`None`: the wait itself failed).
pub(crate) type BlockError = Box<(Option<usize>, Error)>;

/// Arm everything the moving ops wait on (their blocking peers, plus sends in `tx_of[comm]` with
/// unflushed data) and sleep until one is ready, or at most 500 ms so the deadline and abort
/// are checked.
pub(crate) fn block<'o, 'm: 'o, C: DriveComm + ?Sized>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
    tx_of: &[Vec<usize>],
    deadline: Instant,
    extra: &[WaitSource],
) -> Result<(), BlockError> {
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
            if with_conns(*c, |conns| conns.send[q].as_ref().is_some_and(|s| s.pending())) {
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
        let r = with_conns(comms[ci], |conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map(|c| c.arm()),
            Blocked::Send(q) => conns.send[q].as_mut().map(|c| c.arm()),
        });
        armed.push((ci, b));
        match r {
            Some(Ok(Some(src))) => sources.push(src),
            Some(Ok(None)) => ready = true,
            Some(Err(e)) => {
                disarm(comms, &armed);
                return Err(Box::new((Some(ci), e.with_rank(comms[ci].rank()))));
            }
            None => {}
        }
        if ready {
            break;
        }
    }
    if !ready {
        let left = deadline.saturating_duration_since(Instant::now());
        wait_any(&sources, left.min(Duration::from_millis(500))).map_err(|e| Box::new((None, e)))?;
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
        let r = with_conns(comms[ci], |conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
            Blocked::Send(q) => conns.send[q].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
        });
        if let Err(e) = r {
            let p = match b {
                Blocked::Recv(p) | Blocked::Send(p) => p,
            };
            return Err(Box::new((Some(ci), e.with_peer(p).with_rank(comms[ci].rank()))));
        }
    }
    Ok(())
}

fn disarm<C: DriveComm + ?Sized>(comms: &[&C], armed: &[(usize, Blocked)]) {
    for &(ci, b) in armed {
        with_conns(comms[ci], |conns| match b {
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

/// The peers the unfinished `ops` are blocked on, sorted and distinct.
fn blocked_on(ops: &[&OpRun<'_>]) -> Vec<usize> {
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
    peers
}

/// `(float, 4 MiB)`: an op's type and size, for messages.
fn size_of(o: &OpRun<'_>) -> String {
    format!("({}, {})", o.fp.dtype.name(), human_bytes(o.fp.count * o.fp.dtype.size()))
}

/// What a long wait waits for, for the periodic report: "rank 0: waiting for ranks [1] in
/// allreduce #12 (float, 4 MiB), 30 of 600 s".
pub(crate) fn wait_note<C: DriveComm + ?Sized>(
    comms: &[&C],
    ops: &[&OpRun<'_>],
    waited: Duration,
    limit: Duration,
) -> String {
    let rank = ops.first().map(|o| comms[o.comm].rank()).unwrap_or(0);
    let peers = blocked_on(ops);
    let what = match ops.iter().find(|o| !o.done()) {
        Some(o) => format!("{} #{} {}", o.fp.coll.wire_name(), o.seq, size_of(o)),
        None => "flushing the last sends".into(),
    };
    format!(
        "rank {rank}: waiting for ranks {peers:?} in {what}, {:.0} of {:.0} s (OXCCL_WAIT_REPORT=0 silences this)",
        waited.as_secs_f64(),
        limit.as_secs_f64()
    )
}

/// What `ops` (one communicator's active operations) wait for, for its status record.
pub(crate) fn long_op(ops: &[&OpRun<'_>], waited: Duration) -> Running {
    let waiting_for = blocked_on(ops);
    let (seq, op) = match ops.iter().find(|o| !o.done()).or(ops.first()) {
        Some(o) => (o.seq, format!("{} {}", o.fp.coll.wire_name(), size_of(o))),
        None => (0, "flushing".into()),
    };
    Running { seq, op, for_ms: waited.as_millis() as u64, waiting_for }
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

/// The error of operations that reached their deadline: the first unfinished ones (those that
/// could move) named with what each waits for, and how many more queue behind them.
pub(crate) fn hang_report<C: DriveComm + ?Sized>(comms: &[&C], ops: &[&OpRun<'_>]) -> Error {
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
