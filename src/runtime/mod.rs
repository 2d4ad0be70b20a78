//! The state behind a communicator: its shared part ([`Shared`]), connection setup, the
//! failure cascade, the flight recorder, the network choice and the tuner's inputs.

mod anysource;
mod cascade;
mod elastic;
mod net;
mod recorder;
mod setup;
mod tune;
mod watch;

pub(crate) use anysource::RECV_ANY;
pub(crate) use net::transports;
#[cfg(test)]
pub(crate) use setup::CONNECTING;
pub(crate) use setup::{Setup, WaitFor};
pub(crate) use watch::CommWatch;

use crate::config::Config;
use crate::exec::{Conns, DriveComm};
use crate::schedule::Coll;
use crate::select::AlgoSelection;
use crate::store::{Store, StoreServer};
use crate::Error;
use oxccl_transport::wait::Doorbell;
use oxccl_transport::{PeerInfo, Transport};
pub(crate) use recorder::Book;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

pub(crate) struct State {
    pub(crate) conns: Conns,
    /// The transports, in priority order: a pair uses the first that can connect it (shared
    /// memory on one machine, then the RDMA network when chosen, then TCP, which connects any).
    pub(crate) transports: Vec<Box<dyn Transport>>,
    pub(crate) seq: u64,
    pub(crate) p2p_tx: Vec<u64>,
    pub(crate) p2p_rx: Vec<u64>,
    /// Receive connections offered to a peer by an any-source receive and not taken yet.
    pub(crate) pending_rx: Vec<Option<Box<dyn oxccl_transport::PendingRecv>>>,
    /// Where the next any-source receive starts looking (rotates, for fairness).
    pub(crate) any_turn: usize,
    /// Splits and shrinks made from this communicator (each names its store namespace).
    pub(crate) splits: u64,
    /// Grows joined from this communicator, and the grow id this rank made for the next one.
    pub(crate) grows: u64,
    pub(crate) grow_id: Option<crate::bootstrap::UniqueId>,
    /// Suspended: connections released, operations refused until resumed.
    pub(crate) suspended: bool,
    pub(crate) error: Option<Error>,
    /// Schedules built recently, keyed by their parameters (training loops repeat operations).
    pub(crate) sched_cache: std::collections::HashMap<SchedKey, Arc<crate::schedule::Schedule>>,
    /// The schedule of the last call (most calls repeat it; skips hashing the key).
    pub(crate) last_sched: Option<(SchedKey, Arc<crate::schedule::Schedule>)>,
    /// The last tuner decision: (operation, bytes, selection, algorithm).
    pub(crate) last_choice: Option<(Coll, usize, AlgoSelection, crate::schedule::Algo)>,
}

pub(crate) type SchedKey = (Coll, usize, usize, usize, bool, crate::schedule::Algo);

pub(crate) struct Shared {
    /// The last operations (for the flight record written on the first error), the counters and
    /// the straggler window.
    pub(crate) recorder: Mutex<recorder::Book>,
    /// When the communicator was created (times in the record are relative to it).
    pub(crate) born: Instant,
    /// The fork generation that made it (a `fork` child must not close its connections, which
    /// it shares with the parent).
    pub(crate) generation: u64,
    pub(crate) born_unix_ms: u128,
    /// Busy-poll and yield times in force (see [`Config::spin`]).
    pub(crate) spin: std::time::Duration,
    pub(crate) yield_for: std::time::Duration,
    pub(crate) algos: Vec<crate::schedule::Algo>,
    /// Host index of every rank (hosts numbered in order of their lowest rank).
    pub(crate) host_of: Vec<usize>,
    /// Ranks of this communicator on this host per core (at least 1).
    pub(crate) oversub: f64,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) comm_id: u64,
    pub(crate) prefix: String,
    pub(crate) peers: Vec<PeerInfo>,
    pub(crate) cfg: Config,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) secret: [u8; 32],
    pub(crate) held: Held,
    pub(crate) state: Mutex<State>,
    pub(crate) aborted: AtomicBool,
    /// Revoked ([`Shared::revoke`]): operations stop, as on abort, but destroy, split and shrink
    /// still work.
    pub(crate) revoked: AtomicBool,
    /// Whether `state.error` is set (read without the lock before each poll).
    pub(crate) failed: AtomicBool,
    pub(crate) abort_bell: Doorbell,
    pub(crate) busy: AtomicBool,
    /// Asynchronous operations queued and not finished (changed under `async_pending`'s lock;
    /// read without it, so that a blocking call with none queued takes no lock for them).
    pub(crate) async_queued: std::sync::atomic::AtomicUsize,
    pub(crate) async_pending: Mutex<usize>,
    pub(crate) async_cv: Condvar,
    /// The collective whose timeout census began, and when ([`DriveComm::near_deadline`]).
    pub(crate) census_mark: Mutex<Option<(u64, Instant)>>,
    /// Beacon probes of peers on other machines during stalled waits: (last probe, its history).
    pub(crate) watches: Mutex<std::collections::HashMap<usize, (Option<Instant>, crate::beacon::Watch)>>,
    /// Metrics, straggler window and status publication (`src/watch`).
    pub(crate) watch: watch::CommWatch,
}

/// What a communicator keeps running for as long as it exists: the store server of its id (when
/// this process made the id), and this process's liveness beacon.
#[derive(Clone, Default)]
pub(crate) struct Held {
    // (held for their `Drop`: never read)
    pub(crate) _server: Option<Arc<StoreServer>>,
    pub(crate) _beacon: Option<Arc<crate::beacon::Beacon>>,
}

impl Drop for Shared {
    /// Closing an aborted communicator tells its peers and waits for nothing: connections
    /// closed normally may first wait (bounded) for peers to confirm they read the last
    /// messages (the RDMA network's FLUSH), which an abort must not.
    fn drop(&mut self) {
        if *self.aborted.get_mut() {
            if let Ok(st) = self.state.get_mut() {
                st.conns.abort_all();
            }
        }
    }
}

impl DriveComm for Shared {
    fn visit_conns(&self, f: &mut dyn FnMut(&mut Conns)) {
        f(&mut self.state.lock().unwrap().conns)
    }
    fn aborted(&self) -> bool {
        self.stopped()
    }
    fn failure(&self) -> Option<Error> {
        if self.aborted.load(Ordering::SeqCst) {
            return Some(Error::comm_aborted().with_rank(self.rank));
        }
        if self.revoked.load(Ordering::SeqCst) {
            return Some(Error::comm_revoked().with_rank(self.rank));
        }
        if self.failed.load(Ordering::Acquire) {
            return self.sticky_error();
        }
        None
    }
    fn peer_lost(&self, peer: usize) -> Option<Error> {
        let p = self.peers.get(peer)?;
        if p.machine == self.peers[self.rank].machine {
            return None; // the transports check the pid
        }
        let mut w = self.watches.lock().unwrap();
        let (last, watch) = w.entry(peer).or_insert((None, Default::default()));
        if last.is_some_and(|t: Instant| t.elapsed() < std::time::Duration::from_secs(1)) {
            return None;
        }
        *last = Some(Instant::now());
        let (why, cause) = watch.check(p.ip, p.beacon)?;
        Some(
            Error::remote(format!("rank {peer} on {} ({}) {why}", p.hostname, p.ip))
                .with_cause(cause)
                .with_rank(self.rank)
                .with_peer(peer),
        )
    }
    fn long_op(&self, op: crate::watch::status::Running) {
        self.publish_status(Some(op));
    }
    fn near_deadline(&self, seq: u64) {
        *self.census_mark.lock().unwrap() = Some((seq, Instant::now()));
        let (store, key) = (self.store.clone(), format!("{}/reached/{seq}/{}", self.prefix, self.rank));
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            let _ = store.set(&key, b"1");
        });
    }
    fn abort_fd(&self) -> i32 {
        self.abort_bell.read_fd()
    }
    fn rank(&self) -> usize {
        self.rank
    }
}

impl crate::progress::AsyncComm for Shared {
    fn failed(&self, e: Error) {
        self.set_error(e)
    }
    fn completed(&self, run: &crate::exec::OpRun<'static>) {
        self.completed(run, oxccl_simd::clock::now());
    }
    fn queued(&self, more: bool) {
        let mut g = self.async_pending.lock().unwrap();
        if more {
            *g += 1;
        } else {
            *g -= 1;
            self.async_cv.notify_all();
        }
        self.async_queued.store(*g, Ordering::Release);
    }
}

impl Shared {
    /// The first error, if any.
    pub(crate) fn sticky_error(&self) -> Option<Error> {
        self.state.lock().unwrap().error.clone()
    }

    /// Wait until the asynchronous operations already queued on this communicator finished.
    pub(crate) fn wait_async_idle(&self) {
        // (the count drops to 0 on the progress thread after the last one finished: Acquire)
        if self.async_queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut g = self.async_pending.lock().unwrap();
        while *g > 0 {
            g = self.async_cv.wait(g).unwrap();
        }
    }
}
