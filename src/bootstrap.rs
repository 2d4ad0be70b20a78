//! Bootstrap: the unique id, host identity, interface choice, launcher environments and the
//! rendezvous in which ranks learn about each other.

use crate::config::{env_any, Config};
use crate::store::{MemStore, Store, StoreServer, TcpStore};
use crate::{Error, ErrorKind, Result};
use oxccl_transport::{random_bytes, Cause, PeerInfo};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod cores;
mod unique_id;
pub use cores::machine_cores;
use unique_id::SERVERS;
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES};

/// Host identity: a hash of the host name and boot id, or of `OXCCL_HOSTID`/`NCCL_HOSTID`.
pub fn host_id(cfg: &Config) -> u64 {
    let key = match &cfg.host_id {
        Some(h) => format!("override:{h}"),
        None => format!(
            "{}:{}",
            hostname(),
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim()
        ),
    };
    u64::from_le_bytes(blake3::hash(key.as_bytes()).as_bytes()[..8].try_into().unwrap())
}

/// Kernel identity: a hash of the boot id and the pid namespace, the scope in which a process id
/// names one process. Every network namespace of one machine shares it; containers with their
/// own pid namespaces (two pods of a job on one node) do not, so nobody reads a peer's pid in
/// the wrong namespace.
pub fn machine_id() -> u64 {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
    let key = format!("machine:{}:{pidns}", boot.trim());
    u64::from_le_bytes(blake3::hash(key.as_bytes()).as_bytes()[..8].try_into().unwrap())
}

/// This host's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The address this rank advertises: from the `NCCL_SOCKET_IFNAME` spec if given; otherwise
/// loopback when the root is on loopback, else NCCL's default choice (not docker, lo or virbr).
pub fn choose_ip(spec: Option<&str>, root: Option<IpAddr>) -> Result<IpAddr> {
    if spec.is_none() && root.is_some_and(|r| r.is_loopback()) {
        return Ok(root.unwrap());
    }
    let iface = oxccl_transport_tcp::netif::select(spec)?;
    tracing::info!("oxccl: using interface {} address {}", iface.name, iface.ip);
    Ok(iface.ip)
}

/// Everything a rank needs to rendezvous.
pub struct Rendezvous {
    /// The root store (unprefixed).
    pub store: Arc<dyn Store>,
    /// Key prefix of this job.
    pub prefix: String,
    /// The job secret.
    pub secret: [u8; 32],
    /// The store server, when this process hosts it.
    pub server: Option<Arc<StoreServer>>,
    /// The root store's IP (for the interface choice), if remote.
    pub root_ip: Option<IpAddr>,
}

/// The store key prefix of the job of a unique id.
fn job_prefix(job: &[u8; 8]) -> String {
    format!("oxccl/{}", job.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Rendezvous through a unique id.
pub fn from_unique_id(id: &UniqueId, cfg: &Config) -> Result<Rendezvous> {
    from_unique_id_owning(id, cfg, true)
}

/// [`from_unique_id`]; with `own` false the rendezvous is a client only, and the store's
/// server (if this process has it) waits for another communicator to own it.
pub(crate) fn from_unique_id_owning(id: &UniqueId, cfg: &Config, own: bool) -> Result<Rendezvous> {
    let addr = id.addr()?;
    let job = id.job();
    let master = cfg.encryption.master(&id.secret())?;
    let report = (
        format!("{}/init-failed", job_prefix(&job)),
        "a rank's encryption setting or key differs from the job's (its bootstrap store refused it): every rank \
         needs the same OXCCL_ENCRYPT / OXCCL_PSK_FILE / ncclSetEncryption"
            .to_string(),
    );
    // connected first: a rank the store refuses must not take the server with it
    let store = TcpStore::connect_member(addr, id.secret(), master, report, cfg.timeout)?;
    // the first communicator of this process built on the id owns its store from now on
    let server = if !own {
        None
    } else {
        let mut g = SERVERS.lock().unwrap();
        // servers inherited through fork run in the parent: this process is their client
        let now = crate::fork_generation();
        g.retain(|u| u.generation == now);
        g.iter().position(|u| u.job == job).map(|i| g.remove(i).server)
    };
    Ok(Rendezvous {
        store: Arc::new(store),
        prefix: job_prefix(&job),
        secret: id.secret(),
        server,
        root_ip: Some(addr.ip()),
    })
}

/// Rank and size from a launcher's environment: torchrun (`RANK`/`WORLD_SIZE`), Open MPI
/// (`OMPI_COMM_WORLD_*`), PMI (`PMI_RANK`/`PMI_SIZE`) or Slurm (`SLURM_PROCID`/`SLURM_NTASKS`).
pub fn env_rank_size() -> Result<(usize, usize, &'static str)> {
    let pairs: [(&str, &str, &'static str); 4] = [
        ("RANK", "WORLD_SIZE", "torchrun/env"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
        ("PMI_RANK", "PMI_SIZE", "PMI"),
        ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
    ];
    for (r, s, who) in pairs {
        if let (Some(r), Some(s)) = (env_any(&[r]), env_any(&[s])) {
            let parse = |v: &str, name: &str| {
                v.trim().parse::<usize>().map_err(|_| Error::invalid_argument(format!("{name}={v:?} is not a number")))
            };
            return Ok((parse(&r, "rank")?, parse(&s, "size")?, who));
        }
    }
    Err(Error::invalid_usage(
        "no launcher environment found: set RANK and WORLD_SIZE (torchrun), or run under mpirun or srun",
    ))
}

/// Rendezvous through `MASTER_ADDR`/`MASTER_PORT` (or `NCCL_COMM_ID=host:port`).
///
/// Under torchrun (`TORCHELASTIC_RUN_ID` set) the port belongs to torchrun's c10d store and every
/// rank is its client. Otherwise rank 0 serves a compatible store there (if the port is taken it
/// becomes a client of whatever store is there). Rank 0 publishes a fresh job secret in the store;
/// this mode is only as private as the store itself, like PyTorch's.
pub fn from_env(rank: usize, cfg: &Config) -> Result<Rendezvous> {
    crate::config::init_logging();
    let (host, port) = match env_any(&["NCCL_COMM_ID"]) {
        Some(v) => {
            let (h, p) = v
                .rsplit_once(':')
                .ok_or_else(|| Error::invalid_argument(format!("NCCL_COMM_ID={v:?} is not host:port")))?;
            (
                h.trim_matches(['[', ']']).to_string(),
                p.parse::<u16>().map_err(|_| Error::invalid_argument(format!("bad port in NCCL_COMM_ID={v:?}")))?,
            )
        }
        None => {
            let m = crate::launcher::master()?;
            tracing::info!("oxccl: bootstrap store at {}:{} ({})", m.host, m.port, m.source);
            (m.host, m.port)
        }
    };
    use std::net::ToSocketAddrs;
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| Error::system(format!("resolving {host}:{port}"), &e))?
        .next()
        .ok_or_else(|| Error::invalid_argument(format!("{host} has no address")))?;
    let torchrun = env_any(&["TORCHELASTIC_RUN_ID"]);
    let job = match &torchrun {
        Some(id) => format!("{id}/{}", env_any(&["TORCHELASTIC_RESTART_COUNT"]).unwrap_or_else(|| "0".into())),
        None => env_any(&["SLURM_JOB_ID", "OXCCL_JOB_ID"]).unwrap_or_else(|| "job".into()),
    };
    let mut server = None;
    if torchrun.is_none() && rank == 0 {
        match TcpListener::bind(addr) {
            Ok(l) => {
                server = Some(Arc::new(StoreServer::start(l, None)?));
                tracing::info!("oxccl: serving the bootstrap store on {addr}");
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                tracing::info!("oxccl: {addr} is taken; using the store that is there");
            }
            Err(e) => return Err(Error::system(format!("binding the bootstrap store on {addr}"), &e)),
        }
    }
    let store = TcpStore::connect(addr, None, cfg.timeout)?;
    if torchrun.is_none() {
        // a program that holds the port but is no store would leave every rank waiting for the
        // job secret until the timeout: ask it for a store's ping first
        store.ping().map_err(|e| {
            Error::invalid_usage(format!(
                "{addr} is held by a program that is not an oxccl or c10d store ({}): set MASTER_PORT to a free port",
                e.message
            ))
        })?;
    }
    let store: Arc<dyn Store> = Arc::new(store);
    let prefix = format!("oxccl/{job}");
    let key = format!("{prefix}/secret");
    let secret = if rank == 0 {
        let mut s = [0u8; 32];
        random_bytes(&mut s)?;
        store.set(&key, &s)?;
        s
    } else {
        let v = store.get(&key, cfg.timeout).map_err(|e| {
            if e.kind == ErrorKind::Timeout {
                Error::timeout(format!(
                    "init: rank 0 did not publish the job secret at {addr} within {:.0} s",
                    cfg.timeout.as_secs_f64()
                ))
            } else {
                e
            }
        })?;
        v.try_into().map_err(|_| Error::remote("malformed job secret in the store"))?
    };
    Ok(Rendezvous { store, prefix, secret, server, root_ip: Some(addr.ip()) })
}

/// Rendezvous for threads as ranks in one process.
pub fn in_process() -> Result<Rendezvous> {
    let mut secret = [0u8; 32];
    random_bytes(&mut secret)?;
    let mut job = [0u8; 8];
    random_bytes(&mut job)?;
    Ok(Rendezvous {
        store: MemStore::new(),
        prefix: format!("oxccl/local-{}", u64::from_le_bytes(job)),
        secret,
        server: None,
        root_ip: Some(IpAddr::from([127, 0, 0, 1])),
    })
}

/// Publish this rank's info and collect everyone's (bounded by the timeout; names the ranks that
/// never arrived).
pub fn exchange_info(
    store: &dyn Store,
    prefix: &str,
    me: &PeerInfo,
    nranks: usize,
    timeout: Duration,
    report: Option<Duration>,
) -> Result<Vec<PeerInfo>> {
    let claimed = store.add(&format!("{prefix}/claim/{}", me.rank), 1)?;
    if claimed != 1 {
        return Err(Error::invalid_usage(format!("rank {} joined this job twice", me.rank)).with_rank(me.rank));
    }
    let mut v = format!("{nranks}\n").into_bytes();
    v.extend_from_slice(&me.encode());
    // counted before the record appears: a rank that sees the record and fails also sees this
    // rank counted, and serves the store until it has read the failure
    store.add(&format!("{prefix}/joined"), 1)?;
    store.set(&format!("{prefix}/info/{}", me.rank), &v)?;
    let keys: Vec<String> = (0..nranks).map(|r| format!("{prefix}/info/{r}")).collect();
    let vals = wait_for_peers(store, prefix, me.rank, nranks, &keys, timeout, report)?;
    let mut peers = Vec::with_capacity(nranks);
    for (r, v) in vals.iter().enumerate() {
        let (their_n, rest) = split_record(v, r)?;
        if let Some(e) = size_mismatch(r, their_n, me.rank, nranks) {
            let _ = store.set(&format!("{prefix}/init-failed"), e.to_string().as_bytes());
            return Err(e);
        }
        let p = PeerInfo::decode(rest)?;
        if p.rank != r {
            return Err(Error::remote("peer record under the wrong rank").with_peer(r));
        }
        peers.push(p);
    }
    Ok(peers)
}

/// A peer record: the rank count its rank was started with, and the encoded `PeerInfo`.
fn split_record(v: &[u8], r: usize) -> Result<(usize, &[u8])> {
    let bad = || Error::remote(format!("malformed peer record of rank {r}")).with_peer(r);
    let nl = v.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
    let n = std::str::from_utf8(&v[..nl]).ok().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    Ok((n, &v[nl + 1..]))
}

fn size_mismatch(r: usize, their_n: usize, me: usize, nranks: usize) -> Option<Error> {
    (their_n != nranks).then(|| {
        Error::invalid_usage(format!(
            "rank {r} was started with {their_n} ranks and rank {me} with {nranks} (WORLD_SIZE, -np or nranks \
             must be the same on every rank)"
        ))
        .with_rank(me)
        .with_peer(r)
    })
}

/// Wait for every rank's record, in slices: between them, a failure another rank published
/// (`init-failed`) or a rank 0 started with another rank count ends the wait at once, so every
/// rank gets the cause instead of the timeout or a closed store.
fn wait_for_peers(
    store: &dyn Store,
    prefix: &str,
    me: usize,
    nranks: usize,
    keys: &[String],
    timeout: Duration,
    report: Option<Duration>,
) -> Result<Vec<Vec<u8>>> {
    let started = std::time::Instant::now();
    let deadline = started + timeout;
    let failed = [format!("{prefix}/init-failed")];
    let mut joined = Joined::new(nranks);
    let mut checked_rank0 = me == 0;
    let mut next_report = report.map(|r| started + r);
    let missing = || -> Vec<usize> {
        (0..nranks).filter(|r| !store.check(std::slice::from_ref(&keys[*r])).unwrap_or(false)).collect()
    };
    loop {
        let now = std::time::Instant::now();
        if next_report.is_some_and(|t| now >= t) {
            let m = missing();
            crate::log::notice(
                Some(me),
                &format!(
                    "init: rank {me} waiting for ranks {m:?} to join ({} of {nranks} joined), {:.0} of {:.0} s",
                    nranks - m.len(),
                    (now - started).as_secs_f64(),
                    timeout.as_secs_f64()
                ),
            );
            next_report = report.map(|r| now + r);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let slice = left.min(Duration::from_secs(1));
        if store.wait_all(keys, slice).map_err(|e| store_lost(e, me))? {
            return store.multi_get(keys, timeout).map_err(|e| store_lost(e, me));
        }
        if store.check(&failed).unwrap_or(false) {
            let why = store.get(&failed[0], Duration::from_secs(1)).unwrap_or_default();
            let _ = store.add(&format!("{prefix}/init-failed-seen"), 1);
            return Err(Error::invalid_usage(format!(
                "init failed on another rank: {}",
                String::from_utf8_lossy(&why)
            ))
            .with_rank(me));
        }
        joined.fetch_new(store, keys, me);
        if let Some(e) = joined.dead(me) {
            // a rank that saw everyone join may have finished and exited since the wait above:
            // then every record is here and nobody died
            if store.check(keys).unwrap_or(false) {
                return store.multi_get(keys, timeout).map_err(|e| store_lost(e, me));
            }
            let _ = store.set(&failed[0], e.to_string().as_bytes());
            return Err(e);
        }
        if let (false, Some(n0)) = (checked_rank0, joined.nranks_of(0)) {
            checked_rank0 = true;
            if let Some(e) = size_mismatch(0, n0, me, nranks) {
                // the others learn the cause from the store instead of a closed connection
                let _ = store.set(&failed[0], e.to_string().as_bytes());
                return Err(e);
            }
        }
        if left.is_zero() {
            let missing = missing();
            return Err(Error::timeout(format!(
                "init: ranks {missing:?} did not join within {:.1} s ({} of {nranks} joined)",
                timeout.as_secs_f64(),
                nranks - missing.len()
            ))
            .with_rank(me));
        }
    }
}

/// The records of the ranks that joined so far, each fetched from the store once while the
/// others are awaited: the rank count it was started with, and how to tell whether it is alive.
struct Joined {
    records: Vec<Option<(usize, Alive)>>,
    machine: u64,
    /// Where the round of beacon probes stopped (a few ranks per slice, not all).
    next_probe: usize,
}

/// How to tell whether a joined rank is still there.
#[derive(Clone)]
enum Alive {
    /// On this machine: its pid.
    Pid(u32),
    /// On another: its beacon, and what the probes saw so far.
    Beacon(IpAddr, u16, String, crate::beacon::Watch),
    /// A record that could not be read: only the timeout tells.
    Unknown,
}

/// Beacons probed per wait slice (a second): a job of n ranks notices a remote death among the
/// joined within about n / 4 s, and a waiting rank makes at most 4 connections a second.
const PROBES_PER_SLICE: usize = 4;

impl Joined {
    fn new(nranks: usize) -> Joined {
        Joined { records: vec![None; nranks], machine: machine_id(), next_probe: 0 }
    }

    /// Fetch the records published since the last call.
    fn fetch_new(&mut self, store: &dyn Store, keys: &[String], me: usize) {
        for (r, k) in keys.iter().enumerate() {
            if r == me || self.records[r].is_some() || !store.check(std::slice::from_ref(k)).unwrap_or(false) {
                continue;
            }
            let Ok(v) = store.get(k, Duration::from_secs(1)) else { continue };
            let Ok((n, rest)) = split_record(&v, r) else { continue };
            let alive = match PeerInfo::decode(rest) {
                Ok(p) if p.machine == self.machine => Alive::Pid(p.pid),
                Ok(p) => Alive::Beacon(p.ip, p.beacon, p.hostname, Default::default()),
                Err(_) => Alive::Unknown,
            };
            self.records[r] = Some((n, alive));
        }
    }

    /// The rank count rank `r` was started with, once its record arrived.
    fn nranks_of(&self, r: usize) -> Option<usize> {
        self.records[r].as_ref().map(|(n, _)| *n)
    }

    /// A rank that joined and is gone since (its process on this machine, its beacon on
    /// another): it will never finish init.
    fn dead(&mut self, me: usize) -> Option<Error> {
        let died = |r: usize, how: String, cause: Cause| {
            Error::remote(format!("init: rank {r} {how}, after joining")).with_rank(me).with_peer(r).with_cause(cause)
        };
        let mut probes = 0;
        let n = self.records.len();
        for i in 0..n {
            let r = (self.next_probe + i) % n;
            match self.records[r].as_mut().map(|x| &mut x.1) {
                Some(Alive::Pid(pid)) if !oxccl_transport::process_alive(*pid) => {
                    return Some(died(r, format!("(pid {pid}) died: its process is gone"), Cause::PeerDied))
                }
                Some(Alive::Beacon(ip, port, host, watch)) if probes < PROBES_PER_SLICE => {
                    probes += 1;
                    self.next_probe = r + 1;
                    if let Some((why, cause)) = watch.check(*ip, *port) {
                        return Some(died(r, format!("on {host} ({ip}) {why}"), cause));
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// The store failed while this rank waited to join: it is served by rank 0 (or the launcher).
fn store_lost(e: Error, me: usize) -> Error {
    if e.kind == ErrorKind::Timeout {
        return e.with_rank(me);
    }
    Error::remote(format!(
        "init: the bootstrap store stopped answering while this rank waited for the others ({}); the process \
         serving it (rank 0, or the launcher's store) failed or exited: see its output",
        e.message
    ))
    .with_rank(me)
}

/// After a failed init, the rank that hosts the store keeps serving it until every rank that
/// joined has read the failure (or `limit` passed), so none of them sees a closed store.
pub fn linger_after_failure(store: &dyn Store, prefix: &str, limit: Duration) {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < limit {
        let joined = store.add(&format!("{prefix}/joined"), 0).unwrap_or(0);
        let seen = store.add(&format!("{prefix}/init-failed-seen"), 0).unwrap_or(0);
        if seen >= joined - 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_override() {
        let a = Config { host_id: Some("x".into()), ..Default::default() };
        let mut b = a.clone();
        assert_eq!(host_id(&a), host_id(&b));
        b.host_id = Some("y".into());
        assert_ne!(host_id(&a), host_id(&b));
        b.host_id = None;
        assert_ne!(host_id(&a), host_id(&b));
    }
}
