//! Creating, splitting, inspecting, aborting and destroying communicators.

use super::{check_rank, check_state, AbortHandle, Communicator};
use crate::bootstrap::{self, Rendezvous, UniqueId};
use crate::config::Config;
use crate::exec::Conns;
use crate::runtime::*;
use crate::store::Store;
use crate::{Error, Result};
use oxccl_transport::wait::Doorbell;
use oxccl_transport::{PeerInfo, TransportCtx};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

const SPLIT: crate::runtime::WaitFor<'static> = crate::runtime::WaitFor {
    stage: "split",
    to: "call split",
    before: "before calling split",
    what: "ncclCommSplit",
    revocable: false,
};

pub(crate) fn comm_id_of(prefix: &str) -> u64 {
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
    /// (`ncclCommInitAll`). Hand each to its own thread, or drive them together with a [`crate::Group`].
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

    pub(super) fn join(rdv: Rendezvous, nranks: usize, rank: usize, cfg: Config) -> Result<Communicator> {
        crate::config::init_logging();
        let _scope = crate::log::RankScope::new(rank);
        oxccl_simd::clock::start(); // (its rate is measured from here, over the set-up)
        let t0 = Instant::now();
        let ip = bootstrap::choose_ip(cfg.socket_ifname.as_deref(), rdv.root_ip).map_err(|e| e.with_rank(rank))?;
        let beacon = if cfg.beacon { crate::beacon::start(ip) } else { None };
        let cpus = oxccl_transport::cpus::allowed();
        let me = PeerInfo {
            rank,
            host_id: bootstrap::host_id(&cfg),
            pid: std::process::id(),
            machine: bootstrap::machine_id(),
            hostname: bootstrap::hostname(),
            ip,
            beacon: beacon.as_ref().map_or(0, |b| b.port),
            cpu_quota: oxccl_transport::cpus::quota(&cpus),
            cpus,
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
                // store which ranks are missing: a dropped server serves its connected clients
                // until they go (StoreServer's LINGER)
                drop(rdv.server);
                return Err(e);
            }
        };
        let held = Held { _server: rdv.server, _beacon: beacon };
        let c = Self::assemble(rdv.store, rdv.prefix, rdv.secret, held, rank, peers, cfg)?;
        tracing::info!(rank, "communicator of {nranks} ranks ready in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        Ok(c)
    }

    pub(super) fn assemble(
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
        if let Some(p) = &cfg.shm_placement {
            crate::config::parse_placement(p).map_err(|e| e.with_rank(rank))?;
        }
        let parallel = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        let cores = bootstrap::machine_cores(&peers, rank, parallel);
        // ranks on this machine's cores, whatever their network namespace (host id)
        let on_cores = peers.iter().filter(|p| p.machine == peers[rank].machine).count();
        let oversubscribed = on_cores > cores;
        let us = std::time::Duration::from_micros;
        let spin = cfg.spin.unwrap_or(if oversubscribed { us(0) } else { us(50) });
        let yield_for = cfg.yield_for.unwrap_or(if oversubscribed { us(1000) } else { us(50) });
        let ctx = TransportCtx { rank, nranks, comm_id, secret, peers: peers.clone() };
        let watch = crate::runtime::CommWatch::default();
        let transports = crate::runtime::transports(ctx, &cfg, host_ids.len() > 1)?;
        let sh = Arc::new(Shared {
            recorder: Mutex::new(crate::runtime::Book::new(nranks, &cfg)),
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
                transports,
                seq: 0,
                p2p_tx: vec![0; nranks],
                p2p_rx: vec![0; nranks],
                pending_rx: (0..nranks).map(|_| None).collect(),
                any_turn: 0,
                splits: 0,
                grows: 0,
                grow_id: None,
                suspended: false,
                error: None,
                sched_cache: Default::default(),
                last_sched: None,
                last_choice: None,
            }),
            aborted: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            abort_bell: Doorbell::new()?,
            busy: AtomicBool::new(false),
            async_queued: Default::default(),
            async_pending: Mutex::new(0),
            async_cv: Condvar::new(),
            census_mark: Mutex::new(None),
            watches: Mutex::new(Default::default()),
            watch,
        });
        let watched: Arc<dyn crate::watch::Watched> = sh.clone();
        crate::watch::register(Arc::downgrade(&watched), &sh.cfg.watch);
        Ok(Communicator { sh })
    }

    /// Split into sub-communicators (`ncclCommSplit`): ranks with the same `color` form one,
    /// ordered by `key` then by their rank here. A negative color (`NCCL_SPLIT_NOCOLOR`) takes part
    /// in the split but gets `None`. Every rank must call it.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let _busy = self.enter()?;
        let sh = &self.sh;
        let n = {
            let mut st = sh.state.lock().unwrap();
            // a revoked communicator still splits (its connections are not needed)
            if !sh.revoked.load(std::sync::atomic::Ordering::SeqCst)
                || sh.aborted.load(std::sync::atomic::Ordering::SeqCst)
            {
                check_state(sh, &st)?;
            }
            st.splits += 1;
            st.splits
        };
        let base = format!("{}/split{n}", sh.prefix);
        let all: Vec<usize> = (0..sh.nranks).collect();
        let vals = sh.gather_records(&base, format!("{color} {key}").as_bytes(), &all, &SPLIT, &|_, _| Ok(()))?;
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
        let order: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        self.subset(&order, format!("{base}/c{color}")).map(Some)
    }

    /// A communicator of `members` (ranks of this one, in their new order; this rank among
    /// them) in the store namespace `prefix`, on this one's store and settings.
    pub(super) fn subset(&self, members: &[usize], prefix: String) -> Result<Communicator> {
        let sh = &self.sh;
        let peers: Vec<PeerInfo> =
            members.iter().enumerate().map(|(i, &r)| PeerInfo { rank: i, ..sh.peers[r].clone() }).collect();
        let rank = members.iter().position(|&r| r == sh.rank).expect("this rank is a member");
        Self::assemble(sh.store.clone(), prefix, sh.secret, sh.held.clone(), rank, peers, sh.cfg.clone())
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
}
