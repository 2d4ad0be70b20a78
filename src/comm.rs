//! The communicator: life cycle, the Rust API of every collective, groups and split.

use crate::bootstrap::{self, Rendezvous, UniqueId};
use crate::config::Config;
use crate::exec::{drive, Conns, DriveComm, OpMem, OpRun, Policy};
use crate::schedule::{build, inplace_layout, Coll, Fingerprint, Params};
use crate::select::{AlgoSelection, CallOptions};
use crate::store::{Store, StoreServer};
use crate::types::{DataType, Element, ReduceOp};
use crate::{Error, Result};
use oxccl_transport::wait::Doorbell;
use oxccl_transport::{Cause, PeerInfo, Transport, TransportCtx};
use oxccl_transport_rdma::{NetChoice, RdmaConfig, RdmaTransport};
use oxccl_transport_shm::{ShmConfig, ShmTransport};
use oxccl_transport_tcp::{TcpConfig, TcpTransport};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// What an operation is: NCCL's arguments minus the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDesc {
    /// The operation.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (ignored by operations that do not reduce).
    pub op: ReduceOp,
    /// Count, in NCCL's convention (per rank for all-gather, reduce-scatter, all-to-all, gather
    /// and scatter).
    pub count: usize,
    /// Root, or the peer of send/recv.
    pub root: usize,
}

pub(crate) struct State {
    conns: Conns,
    shm: Option<ShmTransport>,
    tcp: TcpTransport,
    /// The RDMA network between hosts (`OXCCL_NET=ofi`), replacing TCP for ranks on other hosts.
    net: Option<RdmaTransport>,
    seq: u64,
    p2p_tx: Vec<u64>,
    p2p_rx: Vec<u64>,
    splits: u64,
    error: Option<Error>,
    /// Schedules built recently, keyed by their parameters (training loops repeat operations).
    sched_cache: std::collections::HashMap<SchedKey, Arc<crate::schedule::Schedule>>,
    /// The schedule of the last call (most calls repeat it; skips hashing the key).
    last_sched: Option<(SchedKey, Arc<crate::schedule::Schedule>)>,
}

type SchedKey = (Coll, usize, usize, usize, bool, crate::schedule::Algo);

/// One entry of the flight recorder.
struct Record {
    seq: u64,
    fp: Fingerprint,
    /// The caller's profiler tag (0: untagged).
    tag: u64,
    sched: Arc<crate::schedule::Schedule>,
    start: Instant,
    end: Option<Instant>,
    failed: bool,
}

/// How many operations the flight recorder keeps per communicator.
const RECORDS: usize = 64;

pub(crate) struct Shared {
    /// The last operations, for the flight record written on the first error.
    recorder: Mutex<std::collections::VecDeque<Record>>,
    /// When the communicator was created (times in the record are relative to it).
    born: Instant,
    /// The fork generation that made it (a `fork` child must not close its connections, which
    /// it shares with the parent).
    generation: u64,
    born_unix_ms: u128,
    /// Busy-poll and yield times in force (see [`Config::spin`]).
    spin: std::time::Duration,
    yield_for: std::time::Duration,
    algos: Vec<crate::schedule::Algo>,
    /// Host index of every rank (hosts numbered in order of their lowest rank).
    host_of: Vec<usize>,
    /// Ranks of this communicator on this host per core (at least 1).
    oversub: f64,
    /// The last tuner decision: (operation, bytes, selection, algorithm).
    last_choice: Mutex<Option<(Coll, usize, AlgoSelection, crate::schedule::Algo)>>,
    rank: usize,
    nranks: usize,
    comm_id: u64,
    prefix: String,
    peers: Vec<PeerInfo>,
    cfg: Config,
    store: Arc<dyn Store>,
    secret: [u8; 32],
    held: Held,
    state: Mutex<State>,
    aborted: AtomicBool,
    /// Whether `state.error` is set (read without the lock before each poll).
    failed: AtomicBool,
    abort_bell: Doorbell,
    busy: AtomicBool,
    pub(crate) async_pending: Mutex<usize>,
    pub(crate) async_cv: Condvar,
    /// The collective whose timeout census began, and when ([`DriveComm::near_deadline`]).
    census_mark: Mutex<Option<(u64, Instant)>>,
    /// Beacon probes of peers on other machines during stalled waits: (last probe, its history).
    watches: Mutex<std::collections::HashMap<usize, (Option<Instant>, crate::beacon::Watch)>>,
}

/// What a communicator keeps running for as long as it exists: the store server of its id (when
/// this process made the id), and this process's liveness beacon.
#[derive(Clone, Default)]
struct Held {
    // (held for their `Drop`: never read)
    _server: Option<Arc<StoreServer>>,
    _beacon: Option<Arc<crate::beacon::Beacon>>,
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
        self.aborted.load(Ordering::SeqCst)
    }
    fn failure(&self) -> Option<Error> {
        if self.aborted() {
            return Some(Error::comm_aborted().with_rank(self.rank));
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
    fn queued(&self, more: bool) {
        let mut g = self.async_pending.lock().unwrap();
        if more {
            *g += 1;
        } else {
            *g -= 1;
            self.async_cv.notify_all();
        }
    }
}

/// A communicator: one rank's membership in a group of ranks that run collectives together
/// (NCCL's `ncclComm_t`).
///
/// All methods take `&self`; a communicator is `Send + Sync` so that [`Communicator::abort`] can
/// be called from another thread, but operations on one communicator must not be issued from
/// two threads at once (that is reported as [`crate::ErrorKind::InvalidUsage`]).
pub struct Communicator {
    pub(crate) sh: Arc<Shared>,
}

impl Drop for Communicator {
    /// In a `fork` child, a communicator inherited from the parent is left untouched: its
    /// sockets and shared memory are the parent's too, and closing them would send the parent's
    /// peers close or abort messages. (Its memory stays allocated in the child.)
    fn drop(&mut self) {
        if self.sh.generation != crate::fork_generation() {
            std::mem::forget(self.sh.clone());
        }
    }
}

/// A handle that aborts a communicator from any thread.
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    /// Abort: operations in progress return an error promptly, and later calls fail.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        self.0.abort_bell.ring();
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {}, {})", self.sh.rank, self.sh.nranks, self.sh.prefix)
    }
}

fn comm_id_of(prefix: &str) -> u64 {
    u64::from_le_bytes(blake3::hash(prefix.as_bytes()).as_bytes()[..8].try_into().unwrap())
}

impl Communicator {
    // ---- life cycle ------------------------------------------------------------------------

    /// Join the communicator of `nranks` ranks identified by `id`, as `rank`
    /// (`ncclCommInitRank`), with the settings of the environment ([`Config::from_env`]).
    /// Blocks until every rank has joined, or the timeout.
    pub fn init(id: &UniqueId, nranks: usize, rank: usize) -> Result<Communicator> {
        Self::init_with_config(id, nranks, rank, Config::from_env())
    }

    /// [`Communicator::init`] with explicit settings.
    pub fn init_with_config(id: &UniqueId, nranks: usize, rank: usize, cfg: Config) -> Result<Communicator> {
        check_rank(nranks, rank)?;
        let rdv = bootstrap::from_unique_id(id, &cfg).map_err(|e| e.with_rank(rank))?;
        Self::join(rdv, nranks, rank, cfg)
    }

    /// Join using a launcher's environment: torchrun (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT`), mpirun (`OMPI_COMM_WORLD_*`) or srun (`SLURM_*`), with `MASTER_ADDR` and
    /// `MASTER_PORT` (or `NCCL_COMM_ID`) naming the store. See [`bootstrap::from_env`].
    pub fn from_env() -> Result<Communicator> {
        Self::from_env_with_config(Config::from_env())
    }

    /// [`Communicator::from_env`] with explicit settings. If `OXCCL_UNIQUE_ID` holds a unique id
    /// (hex), it is used instead of `MASTER_ADDR`/`MASTER_PORT`.
    pub fn from_env_with_config(cfg: Config) -> Result<Communicator> {
        let (rank, nranks, _) = bootstrap::env_rank_size()?;
        check_rank(nranks, rank)?;
        if let Some(hex) = crate::config::env_any(&["OXCCL_UNIQUE_ID"]) {
            let id = UniqueId::from_hex(&hex).map_err(|e| e.with_rank(rank))?;
            return Self::init_with_config(&id, nranks, rank, cfg);
        }
        let rdv = bootstrap::from_env(rank, &cfg).map_err(|e| e.with_rank(rank))?;
        Self::join(rdv, nranks, rank, cfg)
    }

    /// `nranks` communicators in this process, one per rank, for threads as ranks
    /// (`ncclCommInitAll`). Hand each to its own thread, or drive them together with a [`Group`].
    pub fn init_all(nranks: usize) -> Result<Vec<Communicator>> {
        Self::init_all_with_config(nranks, Config::from_env())
    }

    /// [`Communicator::init_all`] with explicit settings.
    pub fn init_all_with_config(nranks: usize, cfg: Config) -> Result<Vec<Communicator>> {
        if nranks == 0 {
            return Err(Error::invalid_argument("init_all needs at least one rank"));
        }
        let rdv = bootstrap::in_process()?;
        let handles: Vec<_> = (0..nranks)
            .map(|rank| {
                let r = Rendezvous {
                    store: rdv.store.clone(),
                    prefix: rdv.prefix.clone(),
                    secret: rdv.secret,
                    server: None,
                    root_ip: rdv.root_ip,
                };
                let cfg = cfg.clone();
                std::thread::spawn(move || Self::join(r, nranks, rank, cfg))
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| Error::internal("init thread panicked"))?).collect()
    }

    fn join(rdv: Rendezvous, nranks: usize, rank: usize, cfg: Config) -> Result<Communicator> {
        crate::config::init_logging();
        let _scope = crate::log::RankScope::new(rank);
        let t0 = Instant::now();
        let ip = bootstrap::choose_ip(cfg.socket_ifname.as_deref(), rdv.root_ip).map_err(|e| e.with_rank(rank))?;
        let beacon = if cfg.beacon { crate::beacon::start(ip) } else { None };
        let me = PeerInfo {
            rank,
            host_id: bootstrap::host_id(&cfg),
            pid: std::process::id(),
            machine: bootstrap::machine_id(),
            hostname: bootstrap::hostname(),
            ip,
            beacon: beacon.as_ref().map_or(0, |b| b.port),
        };
        let peers = match bootstrap::exchange_info(&*rdv.store, &rdv.prefix, &me, nranks, cfg.timeout, cfg.wait_report)
        {
            Ok(p) => p,
            Err(e) => {
                // a failure the others can read (published under init-failed): the rank hosting
                // the store waits (bounded) until they have read it, before its process may exit
                if rdv.server.is_some() && e.kind != crate::ErrorKind::Timeout {
                    bootstrap::linger_after_failure(&*rdv.store, &rdv.prefix, std::time::Duration::from_secs(3));
                }
                // the ranks that did join time out at about the same moment and then ask the
                // store which ranks are missing: the rank hosting it keeps serving them a moment
                // (dropping it at once made their messages say "refused" instead)
                if let Some(server) = rdv.server {
                    let linger = cfg.timeout.min(std::time::Duration::from_secs(5));
                    let _ = std::thread::Builder::new().name("oxccl-store-linger".into()).spawn(move || {
                        std::thread::sleep(linger);
                        drop(server);
                    });
                }
                return Err(e);
            }
        };
        let held = Held { _server: rdv.server, _beacon: beacon };
        let c = Self::assemble(rdv.store, rdv.prefix, rdv.secret, held, rank, peers, cfg)?;
        tracing::info!(rank, "communicator of {nranks} ranks ready in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        Ok(c)
    }

    fn assemble(
        store: Arc<dyn Store>,
        prefix: String,
        secret: [u8; 32],
        held: Held,
        rank: usize,
        peers: Vec<PeerInfo>,
        cfg: Config,
    ) -> Result<Communicator> {
        let nranks = peers.len();
        let comm_id = comm_id_of(&prefix);
        let algos = match &cfg.algo {
            Some(spec) => crate::config::parse_algos(spec).map_err(|e| e.with_rank(rank))?,
            None => crate::config::TUNED.to_vec(),
        };
        let mut host_ids: Vec<u64> = Vec::new();
        let host_of: Vec<usize> = peers
            .iter()
            .map(|p| match host_ids.iter().position(|h| *h == p.host_id) {
                Some(i) => i,
                None => {
                    host_ids.push(p.host_id);
                    host_ids.len() - 1
                }
            })
            .collect();
        if let Some(p) = &cfg.proto {
            crate::config::check_proto(p).map_err(|e| e.with_rank(rank))?;
        }
        let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        // ranks on this machine's cores, whatever their network namespace (host id)
        let on_cores = peers.iter().filter(|p| p.machine == peers[rank].machine).count();
        let oversubscribed = on_cores > cores;
        let us = std::time::Duration::from_micros;
        let spin = cfg.spin.unwrap_or(if oversubscribed { us(0) } else { us(50) });
        let yield_for = cfg.yield_for.unwrap_or(if oversubscribed { us(1000) } else { us(50) });
        let ctx = TransportCtx { rank, nranks, comm_id, secret, peers: peers.clone() };
        let shm = if cfg.shm_disable {
            None
        } else {
            Some(ShmTransport::new(
                ctx.clone(),
                ShmConfig {
                    slots: cfg.slots,
                    slot_bytes: cfg.chunk_bytes,
                    cma: cfg.cma,
                    cma_min_op: cfg.cma_min_bytes,
                },
            )?)
        };
        let tcp_cfg = TcpConfig {
            slots: cfg.slots,
            slot_bytes: cfg.chunk_bytes,
            lanes: cfg.nsocks,
            socket_buffer: cfg.socket_buffer,
        };
        let net = open_net(&ctx, &peers, rank, &cfg, host_ids.len() > 1)?;
        let tcp = TcpTransport::new(ctx, tcp_cfg, peers[rank].ip);
        Ok(Communicator {
            sh: Arc::new(Shared {
                recorder: Mutex::new(std::collections::VecDeque::with_capacity(RECORDS)),
                born: Instant::now(),
                generation: crate::fork_generation(),
                born_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0),
                host_of,
                oversub: (on_cores as f64 / cores as f64).max(1.0),
                spin,
                yield_for,
                algos,
                last_choice: Mutex::new(None),
                rank,
                nranks,
                comm_id,
                prefix,
                peers,
                cfg,
                store,
                secret,
                held,
                state: Mutex::new(State {
                    conns: Conns::new(nranks),
                    shm,
                    tcp,
                    net,
                    seq: 0,
                    p2p_tx: vec![0; nranks],
                    p2p_rx: vec![0; nranks],
                    splits: 0,
                    error: None,
                    sched_cache: Default::default(),
                    last_sched: None,
                }),
                aborted: AtomicBool::new(false),
                failed: AtomicBool::new(false),
                abort_bell: Doorbell::new()?,
                busy: AtomicBool::new(false),
                async_pending: Mutex::new(0),
                async_cv: Condvar::new(),
                census_mark: Mutex::new(None),
                watches: Mutex::new(Default::default()),
            }),
        })
    }

    /// Split into sub-communicators (`ncclCommSplit`): ranks with the same `color` form one,
    /// ordered by `key` then by their rank here. A negative color (`NCCL_SPLIT_NOCOLOR`) takes part
    /// in the split but gets `None`. Every rank must call it.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let _busy = self.enter()?;
        let sh = &self.sh;
        let n = {
            let mut st = sh.state.lock().unwrap();
            check_state(sh, &st)?;
            st.splits += 1;
            st.splits
        };
        let base = format!("{}/split{n}", sh.prefix);
        sh.store.set(&format!("{base}/{}", sh.rank), format!("{color} {key}").as_bytes())?;
        let keys: Vec<String> = (0..sh.nranks).map(|r| format!("{base}/{r}")).collect();
        let vals = sh.store.multi_get(&keys, sh.cfg.timeout).map_err(|e| e.with_rank(sh.rank).with_op("split"))?;
        let mut members = Vec::new();
        for (r, v) in vals.iter().enumerate() {
            let s = std::str::from_utf8(v).map_err(|_| Error::remote("malformed split record"))?;
            let (c, k) = s.split_once(' ').ok_or_else(|| Error::remote("malformed split record"))?;
            let c: i32 = c.parse().map_err(|_| Error::remote("malformed split record"))?;
            let k: i32 = k.parse().map_err(|_| Error::remote("malformed split record"))?;
            if c == color && color >= 0 {
                members.push((k, r));
            }
        }
        if color < 0 {
            return Ok(None);
        }
        members.sort_unstable();
        let peers: Vec<PeerInfo> =
            members.iter().enumerate().map(|(i, &(_, r))| PeerInfo { rank: i, ..sh.peers[r].clone() }).collect();
        let rank = members.iter().position(|&(_, r)| r == sh.rank).unwrap();
        Self::assemble(
            sh.store.clone(),
            format!("{base}/c{color}"),
            sh.secret,
            sh.held.clone(),
            rank,
            peers,
            sh.cfg.clone(),
        )
        .map(Some)
    }

    /// The communicator's id: a hash of its namespace, the same on every rank (it is in every
    /// frame header and names the flight record's file).
    pub fn comm_hash(&self) -> u64 {
        self.sh.comm_id
    }

    /// This rank (`ncclCommUserRank`).
    pub fn rank(&self) -> usize {
        self.sh.rank
    }

    /// Number of ranks (`ncclCommCount`).
    pub fn size(&self) -> usize {
        self.sh.nranks
    }

    /// Information about every rank (host, pid, address).
    pub fn peers(&self) -> &[PeerInfo] {
        &self.sh.peers
    }

    /// Bytes of memory this communicator holds in connection buffers (shared-memory rings it
    /// owns and socket buffers), the part that grows with the number of peers.
    pub fn memory_bytes(&self) -> usize {
        let st = self.sh.state.lock().unwrap();
        st.conns.send.iter().flatten().map(|c| c.memory()).sum::<usize>()
            + st.conns.recv.iter().flatten().map(|c| c.memory()).sum::<usize>()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.sh.cfg
    }

    /// The first error this communicator hit, if any (`ncclCommGetAsyncError`). After an error
    /// the communicator refuses further operations; abort it and build a new one.
    pub fn error(&self) -> Option<Error> {
        self.sh.state.lock().unwrap().error.clone()
    }

    /// Abort from any thread (`ncclCommAbort`): operations in progress return promptly with an
    /// error, and later calls fail. Drop the communicator to release everything.
    pub fn abort(&self) {
        self.abort_handle().abort()
    }

    /// A handle to abort this communicator from another thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.sh.clone())
    }

    /// Release everything (`ncclCommDestroy`); the same as dropping it.
    pub fn destroy(self) {}

    // ---- operations ------------------------------------------------------------------------

    fn enter(&self) -> Result<BusyGuard<'_>> {
        if self.sh.busy.swap(true, Ordering::SeqCst) {
            return Err(Error::invalid_usage(
                "communicator used from two threads at once (operations on one communicator must be issued from one thread at a time)",
            )
            .with_rank(self.sh.rank));
        }
        Ok(BusyGuard(&self.sh.busy))
    }

    /// Run one operation on raw bytes: the untyped form under the typed methods and the C ABI.
    /// Buffers are checked against `desc`'s counts.
    pub fn run(&self, desc: OpDesc, mem: OpMem<'_>) -> Result<()> {
        self.run_with(desc, CallOptions::default(), mem)
    }

    /// [`Communicator::run`] with per-call options: an algorithm selection (every rank must pass
    /// the same one, or the call fails as a mismatch) and a profiler tag for the flight record.
    pub fn run_with(&self, desc: OpDesc, opts: CallOptions, mem: OpMem<'_>) -> Result<()> {
        let mut g = Group::new();
        g.add_with(self, desc, opts, mem)?;
        g.run()
    }

    /// Sum/prod/min/max/avg of `send` over all ranks, into `recv` on every rank.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run(desc::<T>(Coll::AllReduce, op, send.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::all_reduce`].
    pub fn all_reduce_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::AllReduce, op, n, 0), self.inplace::<T>(Coll::AllReduce, n, 0, buf)?)
    }
    /// Every rank's `send` (equal lengths), concatenated in rank order into `recv`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.run(desc::<T>(Coll::AllGather, ReduceOp::Sum, send.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::all_gather`]: this rank's block is already at
    /// `buf[rank*count..]`, where `count = buf.len() / size`.
    pub fn all_gather_inplace<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let c = self.per_rank(buf.len())?;
        self.run(desc::<T>(Coll::AllGather, ReduceOp::Sum, c, 0), self.inplace::<T>(Coll::AllGather, c, 0, buf)?)
    }
    /// Reduce `send` (`size` blocks) over all ranks; block `rank` of the result lands in `recv`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run(desc::<T>(Coll::ReduceScatter, op, recv.len(), 0), split(send, recv))
    }
    /// In-place [`Communicator::reduce_scatter`]: the result is left at `buf[rank*count..]`.
    pub fn reduce_scatter_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let c = self.per_rank(buf.len())?;
        self.run(desc::<T>(Coll::ReduceScatter, op, c, 0), self.inplace::<T>(Coll::ReduceScatter, c, 0, buf)?)
    }
    /// Copy `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::Broadcast, ReduceOp::Sum, n, root), self.inplace::<T>(Coll::Broadcast, n, root, buf)?)
    }
    /// Out-of-place broadcast: `send` is read on `root` only (others may pass `&[]`).
    pub fn broadcast_from<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Broadcast, ReduceOp::Sum, recv.len(), root), split(send, recv))
    }
    /// Reduce `send` over all ranks into `recv` on `root` (others may pass `&mut []`).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Reduce, op, send.len(), root), split(send, recv))
    }
    /// In-place [`Communicator::reduce`].
    pub fn reduce_inplace<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let n = buf.len();
        self.run(desc::<T>(Coll::Reduce, op, n, root), self.inplace::<T>(Coll::Reduce, n, root, buf)?)
    }
    /// Block `p` of `send` goes to rank `p`; block `p` of `recv` comes from rank `p`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let c = self.per_rank(send.len())?;
        self.run(desc::<T>(Coll::AllToAll, ReduceOp::Sum, c, 0), split(send, recv))
    }
    /// Every rank's `send` concatenated into `recv` on `root` (others may pass `&mut []`).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Gather, ReduceOp::Sum, send.len(), root), split(send, recv))
    }
    /// Block `p` of `root`'s `send` into rank `p`'s `recv` (others may pass `&[]`).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Scatter, ReduceOp::Sum, recv.len(), root), split(send, recv))
    }
    /// Send `buf` to `peer`. Without a [`Group`], a send larger than the connection's buffering
    /// completes only once the peer receives.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Send, ReduceOp::Sum, buf.len(), peer), split(buf, &mut []))
    }
    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run(desc::<T>(Coll::Recv, ReduceOp::Sum, buf.len(), peer), split(&[], buf))
    }
    // ---- non-blocking forms ----------------------------------------------------------------

    /// Start an operation on owned buffers ([`OpMem::OwnedSplit`] or [`OpMem::OwnedInPlace`])
    /// and return at once; the process's progress thread moves the data. Connection setup, if
    /// this op needs new peers, happens before it returns. Operations on one communicator
    /// complete in submission order, and a later blocking call waits for them first.
    pub fn submit(&self, desc: OpDesc, mem: OpMem<'static>) -> Result<Request<OpMem<'static>>> {
        self.submit_with(desc, CallOptions::default(), mem)
    }

    /// [`Communicator::submit`] with per-call options (see [`Communicator::run_with`]).
    pub fn submit_with(&self, desc: OpDesc, opts: CallOptions, mem: OpMem<'static>) -> Result<Request<OpMem<'static>>> {
        if !matches!(mem, OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. }) {
            return Err(Error::invalid_argument("submit needs owned buffers"));
        }
        let _busy = self.enter()?;
        let mut g = Group::new();
        g.add_with(self, desc, opts, mem)?;
        let run = g
            .prepare(&[self], Instant::now())?
            .pop()
            .and_then(|r| r.into_static())
            .ok_or_else(|| Error::internal("owned op lost its buffers"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        let sh = &self.sh;
        let policy = Policy {
            spin: sh.spin,
            yield_for: sh.yield_for,
            deadline: started + sh.cfg.timeout,
            report: sh.cfg.wait_report,
            started,
        };
        crate::progress::submit(crate::progress::Job { comm: sh.clone(), run, done: tx, policy })?;
        Ok(Request { rx, conv: Ok, done: None })
    }

    fn submit_vec<T: Element>(&self, desc: OpDesc, mem: OpMem<'static>) -> Result<Request<Vec<T>>> {
        let r = self.submit(desc, mem)?;
        Ok(Request { rx: r.rx, conv: take_output::<T>, done: None })
    }

    /// Non-blocking in-place all-reduce of an owned buffer; [`Request::wait`] gives it back.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<Request<Vec<T>>> {
        let n = buf.len();
        self.submit_vec::<T>(
            desc::<T>(Coll::AllReduce, op, n, 0),
            OpMem::OwnedInPlace { buf: Box::new(buf), in_off: 0, out_off: 0 },
        )
    }
    /// Non-blocking broadcast of an owned buffer from `root`.
    pub fn broadcast_async<T: Element>(&self, buf: Vec<T>, root: usize) -> Result<Request<Vec<T>>> {
        let n = buf.len();
        self.submit_vec::<T>(
            desc::<T>(Coll::Broadcast, ReduceOp::Sum, n, root),
            OpMem::OwnedInPlace { buf: Box::new(buf), in_off: 0, out_off: 0 },
        )
    }
    /// Non-blocking all-gather; the request yields the gathered vector.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Result<Request<Vec<T>>> {
        let c = send.len();
        let out = vec![T::zeroed(); c * self.size()];
        self.submit_vec::<T>(
            desc::<T>(Coll::AllGather, ReduceOp::Sum, c, 0),
            OpMem::OwnedSplit { input: Box::new(send), output: Box::new(out) },
        )
    }
    /// Non-blocking reduce-scatter; the request yields this rank's block of the result.
    pub fn reduce_scatter_async<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Result<Request<Vec<T>>> {
        let c = self.per_rank(send.len())?;
        let out = vec![T::zeroed(); c];
        self.submit_vec::<T>(
            desc::<T>(Coll::ReduceScatter, op, c, 0),
            OpMem::OwnedSplit { input: Box::new(send), output: Box::new(out) },
        )
    }

    /// Wait until every rank arrives.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [0u8; 1];
        self.all_reduce_inplace(&mut b, ReduceOp::Sum)
    }

    fn per_rank(&self, len: usize) -> Result<usize> {
        if len % self.sh.nranks != 0 {
            return Err(Error::invalid_argument(format!(
                "buffer of {len} elements is not divisible into {} equal blocks",
                self.sh.nranks
            ))
            .with_rank(self.sh.rank));
        }
        Ok(len / self.sh.nranks)
    }

    fn inplace<'a, T: Element>(&self, coll: Coll, count: usize, root: usize, buf: &'a mut [T]) -> Result<OpMem<'a>> {
        let es = std::mem::size_of::<T>();
        let (io, oo, _) =
            inplace_layout(coll, self.sh.nranks, self.sh.rank, count, root.min(self.sh.nranks.saturating_sub(1)))
                .ok_or_else(|| Error::invalid_argument(format!("{} has no in-place form", coll.name())))?;
        Ok(OpMem::InPlace { buf: bytemuck::cast_slice_mut(buf), in_off: io * es, out_off: oo * es })
    }

    /// Check `desc` and `mem` against this communicator (sizes, root, in-place layout).
    fn validate(&self, d: &OpDesc, mem: &OpMem<'_>) -> Result<()> {
        let (n, r) = (self.sh.nranks, self.sh.rank);
        let bad = |m: String| Err(Error::invalid_argument(m).with_rank(r).with_op(d.coll.name()));
        if d.coll.rooted() && d.root >= n {
            let what = if matches!(d.coll, Coll::Send | Coll::Recv) { "peer" } else { "root" };
            return bad(format!("{what} {} is out of range (communicator of {n} ranks)", d.root));
        }
        let es = d.dtype.size();
        let (ni, no) = d.coll.buffer_counts(n, r, d.count, d.root);
        let bytes = |c: usize| c.checked_mul(es).filter(|b| *b <= isize::MAX as usize);
        let (Some(bi), Some(bo)) = (bytes(ni), bytes(no)) else {
            return bad(format!("count {} of {} overflows the address space", d.count, d.dtype.name()));
        };
        if d.count as u64 >= 1u64 << crate::schedule::COUNT_BITS {
            return bad(format!("count {} is not below 2^{}", d.count, crate::schedule::COUNT_BITS));
        }
        if let ReduceOp::PreMulSum(_) = d.op {
            if !d.coll.reduces() {
                return bad("pre-multiplied sum on an operation that does not reduce".into());
            }
        }
        match mem {
            OpMem::Split { input, output } => {
                // broadcast reads the send buffer on the root only: others may pass none
                let unused = d.coll == Coll::Broadcast && r != d.root && input.is_empty();
                if ni > 0 && input.len() != bi && !unused {
                    return bad(format!(
                        "send buffer has {} bytes, {} needs {bi} ({ni} x {})",
                        input.len(),
                        d.coll.name(),
                        d.dtype.name()
                    ));
                }
                if no > 0 && output.len() != bo {
                    return bad(format!(
                        "receive buffer has {} bytes, {} needs {bo} ({no} x {})",
                        output.len(),
                        d.coll.name(),
                        d.dtype.name()
                    ));
                }
            }
            OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. } => {
                return Err(Error::internal("validate takes a borrowed view"));
            }
            OpMem::InPlace { buf, in_off, out_off } => {
                let Some((io, oo, len)) = inplace_layout(d.coll, n, r, d.count, d.root) else {
                    return bad(format!("{} has no in-place form", d.coll.name()));
                };
                if buf.len() != len * es || *in_off != io * es || *out_off != oo * es {
                    return bad(format!(
                        "in-place buffer of {} bytes does not match {}'s layout ({} bytes, input at {}, output at {})",
                        buf.len(),
                        d.coll.name(),
                        len * es,
                        io * es,
                        oo * es
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A non-blocking operation in flight. Dropping it does not cancel the operation.
pub struct Request<T> {
    rx: std::sync::mpsc::Receiver<Result<OpMem<'static>>>,
    conv: fn(OpMem<'static>) -> Result<T>,
    done: Option<Result<OpMem<'static>>>,
}

impl<T> Request<T> {
    /// Whether the operation has finished (successfully or not); never blocks.
    pub fn test(&mut self) -> bool {
        if self.done.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.done = Some(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.done = Some(Err(Error::internal("progress thread went away")))
                }
            }
        }
        true
    }

    /// Block until the operation finishes; returns its buffers (or its error).
    pub fn wait(self) -> Result<T> {
        let r = match self.done {
            Some(r) => r,
            None => self.rx.recv().unwrap_or_else(|_| Err(Error::internal("progress thread went away"))),
        };
        (self.conv)(r?)
    }
}

fn take_output<T: Element>(m: OpMem<'static>) -> Result<Vec<T>> {
    let b = match m {
        OpMem::OwnedInPlace { buf, .. } => buf,
        OpMem::OwnedSplit { output, .. } => output,
        _ => return Err(Error::internal("request without owned buffers")),
    };
    b.into_any().downcast::<Vec<T>>().map(|b| *b).map_err(|_| Error::internal("request buffer of another type"))
}

struct BusyGuard<'a>(&'a AtomicBool);
impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn check_rank(nranks: usize, rank: usize) -> Result<()> {
    if nranks == 0 || rank >= nranks {
        return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
    }
    Ok(())
}

fn check_state(sh: &Shared, st: &State) -> Result<()> {
    if sh.aborted.load(Ordering::SeqCst) {
        return Err(Error::comm_aborted().with_rank(sh.rank));
    }
    if let Some(e) = &st.error {
        let mut e2 = Error::new(e.kind, format!("communicator failed earlier: {e}"));
        e2.rank = Some(sh.rank);
        return Err(e2);
    }
    Ok(())
}

fn desc<T: Element>(coll: Coll, op: ReduceOp, count: usize, root: usize) -> OpDesc {
    OpDesc { coll, dtype: T::DTYPE, op, count, root }
}

fn split<'a, T: Element>(send: &'a [T], recv: &'a mut [T]) -> OpMem<'a> {
    OpMem::Split { input: bytemuck::cast_slice(send), output: bytemuck::cast_slice_mut(recv) }
}

/// The network between hosts: `OXCCL_NET`/`NCCL_NET` (`socket`, `ofi`, `ib`); asked for and not
/// available is an error naming why. Unset, when the ranks span hosts: verbs if a device opens,
/// else libfabric if it offers a provider that is not itself TCP or sockets (EFA, CXI, verbs),
/// else oxccl's TCP.
fn open_net(
    ctx: &TransportCtx,
    peers: &[PeerInfo],
    rank: usize,
    cfg: &Config,
    several_hosts: bool,
) -> Result<Option<RdmaTransport>> {
    let rcfg = RdmaConfig { slots: cfg.slots.max(2), max_message: cfg.chunk_bytes, ..Default::default() };
    let explicit = std::env::var_os("OXCCL_NET").or_else(|| std::env::var_os("NCCL_NET")).is_some();
    match NetChoice::from_env().map_err(|e| e.with_rank(rank))? {
        NetChoice::Socket if explicit => Ok(None),
        NetChoice::Socket => {
            if !several_hosts {
                return Ok(None);
            }
            // automatic: verbs if a device is there, else a fast libfabric provider if it has
            // one (probed once per process); its TCP/sockets emulation is not faster than
            // oxccl's own sockets
            match RdmaTransport::open(&NetChoice::Ib, ctx.clone(), peers[rank].ip, rcfg.clone()) {
                Ok(t) => return Ok(Some(t)),
                Err(e) => tracing::debug!("NET/IB not used: {e}"),
            }
            if !oxccl_transport_rdma::hardware_provider_available() {
                return Ok(None);
            }
            Ok(RdmaTransport::open(&NetChoice::Ofi(String::new()), ctx.clone(), peers[rank].ip, rcfg).ok())
        }
        choice => RdmaTransport::open(&choice, ctx.clone(), peers[rank].ip, rcfg)
            .map(Some)
            .map_err(|e| e.with_rank(rank).with_op("init: OXCCL_NET")),
    }
}

/// A setup blob as published: the transport's name (one length byte, then the name), then the
/// transport's own blob, so a sender that picked another transport for the pair says so.
fn tag_blob(name: &str, blob: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(1 + name.len() + blob.len());
    b.push(name.len() as u8);
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(blob);
    b
}

/// The transport name and the blob of a tagged setup blob; `None` if truncated.
fn untag_blob(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = *b.first()? as usize;
    let name = b.get(1..1 + n)?;
    Some((name, &b[1 + n..]))
}

impl Shared {
    fn transport_for<'s>(&self, st: &'s State, peer: usize) -> &'s dyn Transport {
        let (me, p) = (&self.peers[self.rank], &self.peers[peer]);
        match &st.shm {
            Some(s) if s.can_connect(me, p) => s,
            _ => match &st.net {
                Some(n) => n,
                None => &st.tcp,
            },
        }
    }

    /// Wait for a store key in short slices, so abort and the deadline are noticed. With
    /// `doing` (this rank's collective as (sequence number, description)), each slice that ends
    /// without the key also compares with what the peer published: the same sequence number with
    /// another call, or a peer already past it, is a mismatch, reported at once.
    fn wait_key(&self, key: &str, deadline: Instant, peer: usize, doing: Option<&(u64, String)>) -> Result<Vec<u8>> {
        let started = Instant::now();
        let mut next_report = self.cfg.wait_report.map(|r| started + r);
        let mut watch = crate::beacon::Watch::default();
        let what = doing.map_or_else(|| "its first operation".to_string(), |(s, w)| format!("{w} #{s}"));
        let (me, p) = (&self.peers[self.rank], &self.peers[peer]);
        // a peer that will never connect: said at once, not at the timeout
        let gone = |how: String, cause: Cause| {
            Error::remote(format!("connection setup: rank {peer} {how}, before connecting (for {what})"))
                .with_rank(self.rank)
                .with_peer(peer)
                .with_cause(cause)
        };
        loop {
            let now = Instant::now();
            if next_report.is_some_and(|t| now >= t) {
                crate::log::notice(
                    Some(self.rank),
                    &format!(
                        "connection setup: rank {} waiting for rank {peer} to connect for {what}, {:.0} of {:.0} s",
                        self.rank,
                        (now - started).as_secs_f64(),
                        self.cfg.timeout.as_secs_f64()
                    ),
                );
                next_report = self.cfg.wait_report.map(|r| now + r);
            }
            if self.aborted.load(Ordering::SeqCst) {
                return Err(Error::comm_aborted().with_rank(self.rank));
            }
            // on this machine its pid tells
            if p.machine == me.machine && !oxccl_transport::process_alive(p.pid) {
                return Err(gone(format!("(pid {}) died: its process is gone", p.pid), Cause::PeerDied));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.store.get(key, left.min(std::time::Duration::from_millis(500))) {
                Ok(v) => return Ok(v),
                Err(e) if e.kind == crate::ErrorKind::Timeout && !left.is_zero() => {
                    // on another machine its beacon tells
                    if p.machine != me.machine {
                        if let Some((why, cause)) = watch.check(p.ip, p.beacon) {
                            return Err(gone(format!("on {} ({}) {why}", p.hostname, p.ip), cause));
                        }
                    }
                    if let Some((seq, what)) = doing {
                        let k = format!("{}/doing/{peer}", self.prefix);
                        if self.store.check(std::slice::from_ref(&k)).unwrap_or(false) {
                            let v = self.store.get(&k, std::time::Duration::from_millis(200)).unwrap_or_default();
                            let v = String::from_utf8_lossy(&v);
                            if let Some((ps, pw)) = v.split_once('\t') {
                                let ps: u64 = ps.parse().unwrap_or(0);
                                if (ps == *seq && pw != what) || ps > *seq {
                                    return Err(Error::invalid_usage(format!(
                                        "mismatched operations: rank {} called {what} (op #{seq}) but rank {peer} called {pw} (op #{ps})",
                                        self.rank
                                    ))
                                    .with_rank(self.rank)
                                    .with_peer(peer)
                                    .with_cause(Cause::Mismatch));
                                }
                            }
                        }
                    }
                    continue;
                }
                Err(e) if e.kind == crate::ErrorKind::Timeout => {
                    return Err(Error::timeout(format!(
                        "connection setup: rank {peer} did not take part within {:.1} s",
                        self.cfg.timeout.as_secs_f64()
                    ))
                    .with_rank(self.rank)
                    .with_peer(peer))
                }
                Err(e) => return Err(e.with_rank(self.rank).with_peer(peer)),
            }
        }
    }
}

/// Connection setup of one communicator, in three phases that every communicator of a group
/// runs in lock step (so one thread can set up many communicators that wait on each other):
/// 1. publish receive blobs; 2. connect sends and acknowledge; 3. accept receives.
struct Setup<'s> {
    sh: &'s Shared,
    rx: Vec<usize>,
    tx: Vec<usize>,
    pending: Vec<(usize, Box<dyn oxccl_transport::PendingRecv>)>,
    deadline: Instant,
    /// The collective being set up, when the group is a single collective.
    doing: Option<(u64, String)>,
}

impl<'s> Setup<'s> {
    fn key(&self, kind: &str, a: usize, b: usize) -> String {
        format!("{}/{kind}/{a}->{b}", self.sh.prefix)
    }

    fn new(sh: &'s Shared, rx: &[usize], tx: &[usize], doing: Option<(u64, Fingerprint)>) -> Self {
        let st = sh.state.lock().unwrap();
        let rx: Vec<usize> = rx.iter().copied().filter(|&p| st.conns.recv[p].is_none()).collect();
        let tx: Vec<usize> = tx.iter().copied().filter(|&q| st.conns.send[q].is_none()).collect();
        // described only when there is something to set up (not on every call)
        let doing = doing.filter(|_| !rx.is_empty() || !tx.is_empty()).map(|(seq, fp)| (seq, fp.to_string()));
        Setup { sh, rx, tx, pending: Vec::new(), deadline: Instant::now() + sh.cfg.timeout, doing }
    }

    fn publish(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        if self.rx.is_empty() && self.tx.is_empty() {
            return Ok(());
        }
        if let Some((seq, what)) = &self.doing {
            sh.store.set(&format!("{}/doing/{me}", sh.prefix), format!("{seq}\t{what}").as_bytes())?;
        }
        for &p in &self.rx {
            let (pr, blob) = {
                let st = sh.state.lock().unwrap();
                let t = sh.transport_for(&st, p);
                let (pr, blob) = t.setup_recv(p).map_err(|e| e.with_rank(me))?;
                (pr, tag_blob(t.name(), &blob))
            };
            sh.store.set(&self.key("conn", p, me), &blob)?;
            self.pending.push((p, pr));
        }
        Ok(())
    }

    fn connect(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        for &q in &self.tx {
            let tagged = sh.wait_key(&self.key("conn", me, q), self.deadline, q, self.doing.as_ref())?;
            let mut st = sh.state.lock().unwrap();
            let t = sh.transport_for(&st, q);
            let name = t.name();
            let Some((theirs, blob)) = untag_blob(&tagged) else {
                return Err(Error::remote("malformed setup blob in the bootstrap store").with_rank(me).with_peer(q));
            };
            if theirs != name.as_bytes() {
                // both ends must pick the same transport: say so on both, at once
                let e = Error::invalid_usage(format!(
                    "rank {q} expects rank {me}'s messages over {}, but rank {me} sends to it over {name}: \
                     OXCCL_NET/NCCL_NET, NCCL_SHM_DISABLE and the host id must agree on every rank",
                    String::from_utf8_lossy(theirs)
                ))
                .with_rank(me)
                .with_peer(q)
                .with_cause(Cause::Mismatch);
                drop(st);
                let _ = sh.store.set(&self.key("ack", me, q), format!("!{}", e.message).as_bytes());
                return Err(e);
            }
            let c = t.connect_send(q, blob, self.deadline).map_err(|e| e.with_rank(me).with_peer(q))?;
            st.conns.send[q] = Some(c);
            drop(st);
            sh.store.set(&self.key("ack", me, q), b"1")?;
            tracing::info!(rank = me, "Channel 00 : {me}[{me}] -> {q}[{q}] via {name}");
        }
        Ok(())
    }

    fn accept(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        for (p, pr) in std::mem::take(&mut self.pending) {
            let ack = sh.wait_key(&self.key("ack", p, me), self.deadline, p, self.doing.as_ref())?;
            if let Some(why) = ack.strip_prefix(b"!") {
                let _ = sh.store.delete(&self.key("conn", p, me));
                let _ = sh.store.delete(&self.key("ack", p, me));
                return Err(Error::invalid_usage(String::from_utf8_lossy(why).into_owned()).with_rank(me).with_peer(p));
            }
            let c = pr.accept(self.deadline).map_err(|e| e.with_rank(me).with_peer(p))?;
            sh.state.lock().unwrap().conns.recv[p] = Some(c);
            let _ = sh.store.delete(&self.key("conn", p, me));
            let _ = sh.store.delete(&self.key("ack", p, me));
        }
        Ok(())
    }
}

impl Shared {
    fn record(&self, seq: u64, fp: Fingerprint, tag: u64, sched: Arc<crate::schedule::Schedule>, start: Instant) {
        let mut r = self.recorder.lock().unwrap();
        if r.len() == RECORDS {
            r.pop_front();
        }
        r.push_back(Record { seq, fp, tag, sched, start, end: None, failed: false });
    }

    fn record_end(&self, seq: u64, fp: Fingerprint, done: bool, end: Instant) {
        let mut r = self.recorder.lock().unwrap();
        if let Some(x) = r.iter_mut().rev().find(|x| x.seq == seq && x.fp == fp && x.end.is_none()) {
            x.end = Some(end);
            x.failed = !done;
        }
    }

    /// Write the flight record (`<dir>/oxccl-<comm>-rank<r>.json`): the last operations with
    /// sequence number, call, state, peers and times, and the error.
    fn dump(&self, dir: &std::path::Path, e: &Error) {
        fn q(s: &str) -> String {
            let mut o = String::from("\"");
            for ch in s.chars() {
                match ch {
                    '"' => o.push_str("\\\""),
                    '\\' => o.push_str("\\\\"),
                    c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
                    c => o.push(c),
                }
            }
            o.push('"');
            o
        }
        let us = |t: Instant| t.saturating_duration_since(self.born).as_micros();
        let ops: Vec<String> = self
            .recorder
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                let (rx, tx) = r.sched.peers();
                let state = match (r.end, r.failed) {
                    (None, _) => "running",
                    (Some(_), true) => "failed",
                    (Some(_), false) => "done",
                };
                format!(
                    "{{\"seq\": {}, \"op\": {}, \"tag\": {}, \"state\": \"{state}\", \"recv_from\": {rx:?}, \"send_to\": {tx:?}, \"start_us\": {}, \"end_us\": {}}}",
                    r.seq,
                    q(&r.fp.to_string()),
                    r.tag,
                    us(r.start),
                    r.end.map_or("null".to_string(), |t| us(t).to_string())
                )
            })
            .collect();
        let body = format!(
            "{{\"comm\": \"{:016x}\", \"rank\": {}, \"nranks\": {}, \"host\": {}, \"pid\": {}, \"created_unix_ms\": {}, \"error\": {}, \"ops\": [\n  {}\n]}}\n",
            self.comm_id,
            self.rank,
            self.nranks,
            q(&self.peers[self.rank].hostname),
            self.peers[self.rank].pid,
            self.born_unix_ms,
            q(&e.to_string()),
            ops.join(",\n  ")
        );
        let path = dir.join(format!("oxccl-{:016x}-rank{}.json", self.comm_id, self.rank));
        if let Err(err) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, body)) {
            tracing::warn!("oxccl: could not write the flight record {}: {err}", path.display());
        }
    }

    /// Record the first error (sticky). The first time, also close every connection, so peers
    /// waiting on this rank fail at once instead of at their timeout (and theirs close in turn),
    /// and publish the error in the store (in the background: the store may be gone too), so
    /// every rank can name the first failure.
    pub(crate) fn set_error(&self, e: Error) {
        let conns = {
            let mut st = self.state.lock().unwrap();
            if st.error.is_some() {
                return;
            }
            st.error = Some(e.clone());
            self.failed.store(true, Ordering::Release);
            std::mem::replace(&mut st.conns, Conns::new(self.nranks))
        };
        if let Some(dir) = &self.cfg.dump_dir {
            self.dump(dir, &e);
        }
        let mut conns = conns;
        conns.abort_all();
        drop(conns);
        if e.cause == Some(Cause::PeerAborted) {
            return; // a cascade, not a cause: the cause is published by the rank that saw it
        }
        let store = self.store.clone();
        let key = format!("{}/failed", self.prefix);
        let msg = e.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            if let Ok(k) = store.add(&format!("{key}/count"), 1) {
                let _ = store.set(&format!("{key}/{k}"), msg.as_bytes());
            }
            let _ = tx.send(());
        });
        // wait for the report (the process may exit right after the error), but never long
        let _ = rx.recv_timeout(std::time::Duration::from_secs(1));
    }

    /// After a timeout in collective `seq`: say this rank reached it, give the others up to 1 s
    /// to say the same, and name the ranks that did not (they never reached the operation).
    /// Which ranks reached operation `seq`, for a timeout's report: every rank that times out
    /// says so in the store; `heard` are the peers whose messages of it arrived here, so a
    /// missing one among them reached it and then stopped responding (stopped, hung, paused).
    pub(crate) fn census(&self, seq: u64, heard: &[usize]) -> String {
        let key = |r: usize| format!("{}/reached/{seq}/{r}", self.prefix);
        let store = self.store.clone();
        let (me, n) = (self.rank, self.nranks);
        let prefix_keys: Vec<String> = (0..n).map(key).collect();
        // begun a second before the deadline, the census is complete at it; otherwise this rank
        // marks now and gives the others a second
        let begun = self.census_mark.lock().unwrap().filter(|m| m.0 == seq).map(|m| m.1);
        let until = begun.unwrap_or_else(Instant::now) + crate::exec::CENSUS_LEAD;
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            if begun.is_none() {
                let _ = store.set(&prefix_keys[me], b"1");
            }
            let mut missing: Vec<usize> = (0..n).collect();
            loop {
                missing.retain(|&r| !store.check(std::slice::from_ref(&prefix_keys[r])).unwrap_or(false));
                if missing.is_empty() || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = tx.send(missing);
        });
        match rx.recv_timeout(std::time::Duration::from_millis(1500)) {
            Ok(m) if m.is_empty() => format!("every rank reached op #{seq}: a wait inside it never completed"),
            Ok(m) => {
                let (inside, absent): (Vec<usize>, Vec<usize>) = m.into_iter().partition(|r| heard.contains(r));
                let mut parts = vec![];
                if !inside.is_empty() {
                    parts.push(format!(
                        "ranks {inside:?} reached op #{seq} (their messages of it arrived) and then stopped responding (stopped, hung or paused: they did not answer the timeout census)"
                    ));
                }
                if !absent.is_empty() {
                    let last = seq.checked_sub(1).map_or("none".to_string(), |s| format!("#{s}"));
                    parts.push(format!(
                        "ranks {absent:?} did not answer the timeout census: they never reached op #{seq}, or stopped before sending any of it (the last op this rank completed is {last})"
                    ));
                }
                parts.join("; ")
            }
            Err(_) => "the bootstrap store did not answer: cannot tell which ranks reached the operation".into(),
        }
    }

    /// For an error caused by a peer closing its connections, add the first failure reported in
    /// this communicator (waits at most 2 s for it).
    pub(crate) fn with_root_cause(&self, mut e: Error) -> Error {
        if e.cause != Some(Cause::PeerAborted) {
            return e;
        }
        let store = self.store.clone();
        let key = format!("{}/failed/1", self.prefix);
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            let _ = tx.send(store.get(&key, std::time::Duration::from_secs(2)));
        });
        if let Ok(Ok(v)) = rx.recv_timeout(std::time::Duration::from_millis(2100)) {
            e.message =
                format!("{} (first failure reported in this communicator: {})", e.message, String::from_utf8_lossy(&v));
        }
        e
    }

    /// The tuner: the algorithm for `coll` on `bytes` per rank buffer. Deterministic mode forces
    /// the ordered schedules for reductions; otherwise an α-β model picks among the allowed
    /// algorithms (ring, recursive doubling, Rabenseifner, double binary tree, hierarchical when
    /// ranks share hosts across several hosts), with shared-memory constants inside a host and network constants between hosts.
    pub(crate) fn choose_algo(&self, coll: Coll, bytes: usize, sel: AlgoSelection) -> Result<crate::schedule::Algo> {
        use crate::schedule::Algo;
        let mut last = self.last_choice.lock().unwrap();
        if let Some((c, b, s, a)) = *last {
            if c == coll && b == bytes && s == sel {
                return Ok(a); // the common case: the same call again
            }
        }
        let restricted;
        let algos: &[Algo] = if !sel.is_restricted() {
            &self.algos
        } else if self.cfg.deterministic && coll.reduces() {
            if sel.force {
                return Err(Error::invalid_usage(format!(
                    "{}: OXCCL_DETERMINISTIC=1 fixes the algorithm of reductions, so algSelection {:?} cannot be honoured (forceAlgSelection is set)",
                    coll.name(),
                    AlgoSelection::describe_wire(sel.wire())
                ))
                .with_rank(self.rank));
            }
            &self.algos
        } else if coll != Coll::AllReduce {
            crate::select::restrict(&[Algo::Ring], sel, coll).map_err(|e| e.with_rank(self.rank))?;
            &self.algos
        } else {
            restricted = crate::select::restrict(&self.algos, sel, coll).map_err(|e| e.with_rank(self.rank))?;
            &restricted
        };
        let algo = if self.cfg.deterministic && coll.reduces() {
            Algo::Ordered
        } else if coll != Coll::AllReduce {
            Algo::Ring
        } else if algos.len() == 1 {
            algos[0]
        } else {
            let t = &self.cfg.tuner;
            let hosts = self.host_of.iter().max().map_or(1, |m| m + 1);
            let n = self.nranks as f64;
            let h = hosts as f64;
            let g = (0..hosts).map(|x| self.host_of.iter().filter(|&&y| y == x).count()).max().unwrap_or(1) as f64;
            let s = bytes as f64; // bytes; betas in bytes/µs
            let sa = t.shm_alpha_us + (self.oversub - 1.0) * t.switch_us;
            let sb = t.shm_beta_gbps * 1e3;
            // log-round algorithms lose bandwidth when ranks wait for cores
            let pen = if self.oversub > 1.0 { t.oversub_round_factor } else { 1.0 };
            let (na, nb) = (t.net_alpha_us, t.net_beta_gbps * 1e3);
            let one_host = hosts == 1 && !self.cfg.shm_disable;
            let (alpha, beta) = if one_host { (sa, sb) } else { (na, nb) };
            let ring = 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * s / beta;
            let p2 = (1usize << (usize::BITS - 1 - self.nranks.leading_zeros())) as f64;
            let fold = if p2 < n { 2.0 } else { 0.0 };
            // recursive doubling moves the whole message every round: twice the penalty
            let pen_rd = if pen > 1.0 { 2.0 * pen } else { 1.0 };
            let rd = (p2.log2() + fold) * (alpha + pen_rd * s / beta);
            let rab = (2.0 * p2.log2() + fold) * alpha + pen * (2.0 * (p2 - 1.0) / p2 + fold) * s / beta;
            let depth = (usize::BITS - self.nranks.leading_zeros()) as f64;
            let tree = 2.0 * depth * alpha + pen * 2.0 * s / beta;
            let hier = if hosts > 1 && hosts < self.nranks {
                2.0 * ((g - 1.0) * sa + s / sb) + 2.0 * (h - 1.0) * na + 2.0 * (h - 1.0) / h * s / nb
            } else {
                f64::INFINITY
            };
            let mut best = (f64::INFINITY, algos[0]);
            let costs = [
                (ring, Algo::Ring),
                (rd, Algo::RecursiveDoubling),
                (rab, Algo::Rabenseifner),
                (tree, Algo::Tree),
                (hier, Algo::Hierarchical),
            ];
            for (cost, a) in costs {
                if algos.contains(&a) && cost < best.0 {
                    best = (cost, a);
                }
            }
            best.1
        };
        if last.map(|(c, _, _, a)| (c, a)) != Some((coll, algo)) {
            let why = if sel.is_restricted() {
                format!(" (algSelection {})", AlgoSelection::describe_wire(sel.wire()))
            } else {
                String::new()
            };
            tracing::info!(target: "TUNING", rank = self.rank, "{} of {bytes} bytes uses {}{why}", coll.name(), algo.name());
        }
        *last = Some((coll, bytes, sel, algo));
        Ok(algo)
    }

    /// The first error, if any.
    pub(crate) fn sticky_error(&self) -> Option<Error> {
        self.state.lock().unwrap().error.clone()
    }

    /// Wait until the asynchronous operations already queued on this communicator finished.
    pub(crate) fn wait_async_idle(&self) {
        let mut g = self.async_pending.lock().unwrap();
        while *g > 0 {
            g = self.async_cv.wait(g).unwrap();
        }
    }
}

/// Operations that progress together (`ncclGroupStart`/`ncclGroupEnd`): matching sends and
/// receives, and operations on many communicators from one thread, cannot deadlock.
///
/// ```no_run
/// # use oxccl::{Communicator, Group};
/// # fn f(comms: &[Communicator], a: &[f32], b: &mut [f32]) -> oxccl::Result<()> {
/// let (c, n) = (&comms[0], comms[0].size());
/// let mut g = Group::new();
/// g.send(c, a, (c.rank() + 1) % n)?;
/// g.recv(c, b, (c.rank() + n - 1) % n)?;
/// g.run()?;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct Group<'a> {
    ops: Vec<(&'a Communicator, OpDesc, CallOptions, OpMem<'a>)>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Group { ops: Vec::new() }
    }

    /// Add any operation in its untyped form.
    pub fn add(&mut self, comm: &'a Communicator, desc: OpDesc, mem: OpMem<'a>) -> Result<&mut Self> {
        self.add_with(comm, desc, CallOptions::default(), mem)
    }

    /// Add an operation with per-call options (algorithm selection, profiler tag).
    pub fn add_with(
        &mut self,
        comm: &'a Communicator,
        desc: OpDesc,
        opts: CallOptions,
        mut mem: OpMem<'a>,
    ) -> Result<&mut Self> {
        comm.validate(&desc, &mem.view())?;
        self.ops.push((comm, desc, opts, mem));
        Ok(self)
    }

    /// Add a send.
    pub fn send<T: Element>(&mut self, comm: &'a Communicator, buf: &'a [T], peer: usize) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::Send, ReduceOp::Sum, buf.len(), peer), split(buf, &mut []))
    }

    /// Add a receive.
    pub fn recv<T: Element>(&mut self, comm: &'a Communicator, buf: &'a mut [T], peer: usize) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::Recv, ReduceOp::Sum, buf.len(), peer), split(&[], buf))
    }

    /// Add an all-reduce.
    pub fn all_reduce<T: Element>(
        &mut self,
        comm: &'a Communicator,
        send: &'a [T],
        recv: &'a mut [T],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::AllReduce, op, send.len(), 0), split(send, recv))
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Run every operation to completion.
    pub fn run(self) -> Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let comms = self.comms();
        let _scope = crate::log::RankScope::new(comms[0].sh.rank);
        let _guards = comms.iter().map(|c| c.enter()).collect::<Result<Vec<_>>>()?;
        for c in &comms {
            c.sh.wait_async_idle();
        }
        let now = Instant::now(); // one clock read for the deadline and the flight record
        let mut runs = self.prepare(&comms, now)?;
        let shareds: Vec<&Shared> = comms.iter().map(|c| &*c.sh).collect();
        let deadline = shareds.iter().map(|sh| now + sh.cfg.timeout).max().unwrap();
        let spin = shareds.iter().map(|sh| sh.spin).max().unwrap();
        let yield_for = shareds.iter().map(|sh| sh.yield_for).max().unwrap();
        let report = shareds.iter().filter_map(|sh| sh.cfg.wait_report).min();
        let res = drive(&shareds, &mut runs, Policy { spin, yield_for, deadline, report, started: now });
        let end = Instant::now();
        for r in &runs {
            shareds[r.comm].record_end(r.seq, r.fp, r.done(), end);
        }
        match res {
            Ok(()) => Ok(()),
            Err(mut e) => {
                // name the operation the failure stopped (a dead peer is found by the transport,
                // which knows the peer but not the call)
                if e.op.is_none() {
                    let stopped = runs.iter().filter(|r| !r.done());
                    let involved = |r: &&OpRun<'_>| {
                        let (rx, tx) = r.sched.peers();
                        e.peer.is_some_and(|p| rx.contains(&p) || tx.contains(&p))
                    };
                    if let Some(r) = stopped.clone().find(involved).or_else(|| stopped.clone().next()) {
                        e = e.with_op(r.fp.to_string()).with_seq(r.seq);
                    }
                }
                if e.kind == crate::ErrorKind::Timeout {
                    if let Some(r) = runs.iter().find(|r| !r.done() && !matches!(r.fp.coll, Coll::Send | Coll::Recv)) {
                        e.message = format!("{}; {}", e.message, shareds[r.comm].census(r.seq, &r.heard_from()));
                    }
                }
                for sh in &shareds {
                    sh.set_error(e.clone());
                }
                Err(shareds[0].with_root_cause(e))
            }
        }
    }

    /// Distinct communicators, in first-use order.
    fn comms(&self) -> Vec<&'a Communicator> {
        // distinct communicators, in first-use order
        let mut comms: Vec<&Communicator> = Vec::new();
        for (c, _, _, _) in &self.ops {
            if !comms.iter().any(|x| Arc::ptr_eq(&x.sh, &c.sh)) {
                comms.push(c);
            }
        }
        comms
    }

    /// Sequence numbers, schedules and connections for every op (the caller holds the busy
    /// guards of `comms`).
    fn prepare(self, comms: &[&'a Communicator], now: Instant) -> Result<Vec<OpRun<'a>>> {
        for c in comms {
            check_state(&c.sh, &c.sh.state.lock().unwrap())?;
        }
        // pass 1: sequence numbers and schedules, in the order the ops were added (which is the
        // order they use each connection)
        // the algorithms first: a call whose selection cannot be honoured fails before any
        // sequence number is taken, and the communicator stays usable
        let algos = self
            .ops
            .iter()
            .map(|(c, d, o, _)| {
                c.sh.choose_algo(d.coll, d.count * d.dtype.size(), o.algos).map_err(|e| e.with_op(d.coll.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut runs: Vec<OpRun<'a>> = Vec::with_capacity(self.ops.len());
        for ((c, d, opts, mem), algo) in self.ops.into_iter().zip(algos) {
            let ci = comms.iter().position(|x| Arc::ptr_eq(&x.sh, &c.sh)).unwrap();
            let sh = &*c.sh;
            let chunk = (sh.cfg.chunk_bytes / d.dtype.size()).max(1);
            let avg = d.op == ReduceOp::Avg && d.coll.reduces();
            let (seq, sched) = {
                let mut st = sh.state.lock().unwrap();
                let ctr = match d.coll {
                    Coll::Send => &mut st.p2p_tx[d.root],
                    Coll::Recv => &mut st.p2p_rx[d.root],
                    _ => &mut st.seq,
                };
                *ctr += 1;
                let seq = *ctr - 1;
                let key = (d.coll, d.count, d.root, chunk, avg, algo);
                let sched = match st.last_sched.as_ref().filter(|(k, _)| *k == key) {
                    Some((_, s)) => s.clone(),
                    None => match st.sched_cache.get(&key) {
                        Some(s) => s.clone(),
                        None => {
                            let params = Params {
                                coll: d.coll,
                                nranks: sh.nranks,
                                rank: sh.rank,
                                count: d.count,
                                root: d.root,
                                chunk,
                                avg,
                                algo,
                            };
                            let s = Arc::new(if algo == crate::schedule::Algo::Hierarchical {
                                crate::schedule::build_hierarchical(&params, &sh.host_of)
                            } else {
                                build(&params)
                            });
                            if st.sched_cache.len() >= 256 {
                                st.sched_cache.clear();
                            }
                            st.sched_cache.insert(key, s.clone());
                            s
                        }
                    },
                };
                st.last_sched = Some((key, sched.clone()));
                (seq, sched)
            };
            let op = if d.coll.reduces() { d.op } else { ReduceOp::Sum };
            let sel = opts.algos.wire();
            let fp = Fingerprint { coll: d.coll, dtype: d.dtype, op, root: d.root, count: d.count, algo, sel };
            sh.record(seq, fp, opts.profiler_tag, sched.clone(), now);
            runs.push(OpRun::new(ci, sh.rank, sh.nranks, sh.comm_id, seq, fp, sched, mem));
        }
        // pass 2: connect what the ops need, all communicators phase by phase (nothing to do,
        // and nothing allocated, when every connection exists: the steady state)
        let connected = runs.iter().all(|r| {
            let st = comms[r.comm].sh.state.lock().unwrap();
            let (rx, tx) = r.sched.peers();
            rx.iter().all(|&p| st.conns.recv[p].is_some()) && tx.iter().all(|&q| st.conns.send[q].is_some())
        });
        if connected {
            return Ok(runs);
        }
        let shareds: Vec<&Shared> = comms.iter().map(|c| &*c.sh).collect();
        let mut setups: Vec<Setup<'_>> = shareds
            .iter()
            .enumerate()
            .map(|(ci, sh)| {
                let (rx, tx) = crate::exec::peers_of(runs.iter().filter(|r| r.comm == ci));
                let mine: Vec<&OpRun<'_>> = runs.iter().filter(|r| r.comm == ci).collect();
                let doing = match mine.as_slice() {
                    [one] if !matches!(one.fp.coll, Coll::Send | Coll::Recv) => Some((one.seq, one.fp)),
                    _ => None,
                };
                Setup::new(sh, &rx, &tx, doing)
            })
            .collect();
        let phased = (|| -> Result<()> {
            setups.iter_mut().try_for_each(|s| s.publish())?;
            setups.iter_mut().try_for_each(|s| s.connect())?;
            setups.iter_mut().try_for_each(|s| s.accept())
        })();
        drop(setups);
        if let Err(e) = phased {
            for sh in &shareds {
                sh.set_error(e.clone());
            }
            return Err(e);
        }
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_blobs_round_trip_and_truncation_is_refused() {
        let t = tag_blob("NET/OFI", b"\x01\x02blob");
        assert_eq!(untag_blob(&t), Some((&b"NET/OFI"[..], &b"\x01\x02blob"[..])));
        assert_eq!(untag_blob(&tag_blob("SHM", b"")), Some((&b"SHM"[..], &b""[..])));
        for cut in 0..1 + "NET/OFI".len() {
            assert_eq!(untag_blob(&t[..cut]), None, "cut at {cut}");
        }
        // any bytes: no panic
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b: Vec<u8> = (0..(x % 24) as usize).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = untag_blob(&b);
        }
    }
}
