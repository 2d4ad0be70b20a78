//! Settings, from the environment (NCCL names where NCCL has one, `OXCCL_` aliases).

use std::time::Duration;

/// Communicator settings. [`Config::from_env`] reads the environment (the calls without a
/// `Config` use it); [`Config::default`] is the built-in values alone. Fields may then be changed.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bound on every wait (bootstrap, connection setup, each operation). `OXCCL_TIMEOUT`
    /// (seconds), default 600 s like PyTorch's NCCL default.
    pub timeout: Duration,
    /// How long a waiting rank busy-polls before it blocks in the kernel. `OXCCL_SPIN_US`;
    /// default 50 µs, or 0 when the host is oversubscribed (more local ranks than the cores
    /// they may run on together, [`crate::bootstrap::machine_cores`]), where a spinning rank
    /// would steal the core of the peer it waits for. It is an upper bound: each
    /// thread halves its spin after waits that outlast it and doubles it back after quick ones.
    pub spin: Option<Duration>,
    /// How long a waiting rank then yields its core before it blocks. `OXCCL_YIELD_US`; default
    /// 50 µs, or 1 ms when the host is oversubscribed (yielding hands the core to a peer at once,
    /// blocking costs a wake-up of about 20 µs).
    pub yield_for: Option<Duration>,
    /// Never use shared memory (`NCCL_SHM_DISABLE=1`).
    pub shm_disable: bool,
    /// Largest message (connection slot) in bytes: `OXCCL_CHUNK_BYTES`, default 256 KiB.
    pub chunk_bytes: usize,
    /// Slots per connection: `OXCCL_SLOTS`, default 4 (at least 2).
    pub slots: usize,
    /// Single copy between processes of one host (`process_vm_readv`, Linux CMA) where the
    /// kernel allows it: `OXCCL_CMA=0` turns it off. In operations of at least `cma_min_bytes`
    /// (`OXCCL_CMA_MIN_BYTES`, count × type size, default 32 MiB), values that stay unchanged in
    /// a user buffer until the operation ends are sent by reference to receivers that only copy
    /// them, which read them straight from the sender's memory (one that combines a message
    /// with its own data gets it through a slot). Measured here, the kernel's copy runs
    /// at about half of memcpy's speed, so it wins only once buffers no longer fit the caches
    /// (bench/RESULTS.md).
    pub cma: bool,
    /// See [`Config::cma`].
    pub cma_min_bytes: usize,
    /// Smaller operations (count × type size) in this range, default 32 KiB..32 MiB
    /// (`OXCCL_CMA_FORWARD_MIN_BYTES`, `OXCCL_CMA_FORWARD_MAX_BYTES`), send by reference only
    /// the messages that pass the sender's unchanged input on (all-gather, broadcast; in place
    /// from twice the start, where no step overwrites those bytes), published before the
    /// sender's own copy so that the receiver's read overlaps it, and only where that saves a
    /// copy: a rank that receives too (2-rank all-gather) over the whole range, one that only
    /// sends (a broadcast's root) while the operation is at most 4 messages out of place or one
    /// in place, never one that also passes on what it received (bench/RESULTS.md).
    pub cma_forward: std::ops::Range<usize>,
    /// Measure once per process how fast the kernel's copy runs against memcpy; where it is
    /// below `oxccl_transport_shm::FORWARD_MIN_RATIO` of it, inputs are forwarded by reference
    /// while the two processes run on cores far apart (measured all along by the receiver,
    /// which times a load of each large message), and between close cores only in operations
    /// of one message (`oxccl_transport_shm::NEAR_FORWARD_MAX_OP`): from two messages on the
    /// slots pipeline their two copies, which then take less time than one through the kernel
    /// (bench/RESULTS.md "Copies whose buffers are not aligned alike", "One message by reference
    /// between close cores").
    /// `OXCCL_CMA_FORWARD_PROBE=0` skips the probe and keeps the rules of `cma_forward`.
    pub cma_forward_probe: bool,
    /// While the two processes of a shared-memory connection run far apart, operations of at
    /// least this many bytes (`OXCCL_CMA_FAR_MIN_BYTES`, default 64 KiB) send every value that
    /// stays unchanged until they end by reference, to receivers that combine it too: a byte
    /// through the slots then crosses between the cores twice, through the kernel once
    /// (bench/RESULTS.md "Far apart, one crossing").
    pub cma_far_min_bytes: usize,
    /// `OXCCL_SHM_PLACEMENT`: `measure` (the default: the receiver measures whether the two
    /// processes run far apart, which counts where the kernel's copy is slow), `near` or `far`
    /// (taken as given). Checked when a communicator is created ([`parse_placement`]).
    pub shm_placement: Option<String>,
    /// Interface selection (`OXCCL_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// TCP sockets per directed peer pair, frames striped over them (`OXCCL_NSOCKS`, else
    /// NCCL's `NCCL_NSOCKS_PERTHREAD` × `NCCL_SOCKET_NTHREADS`); default 1, at most 16. Several
    /// sockets help where one flow is bound to one NIC queue or core; between network namespaces
    /// of one 2-core machine they measured no better than one (bench/RESULTS.md).
    pub nsocks: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` of TCP data sockets in bytes (`OXCCL_SOCKET_BUFFER`); default
    /// unset: the kernel's autotuning, which grows to `net.ipv4.tcp_{w,r}mem`'s maximum.
    pub socket_buffer: Option<usize>,
    /// Host identity override (`OXCCL_HOSTID`, else `NCCL_HOSTID`); ranks with different values
    /// never use shared memory between them.
    pub host_id: Option<String>,
    /// Allowed algorithms, NCCL syntax (`OXCCL_ALGO`, else `NCCL_ALGO`): a comma list of
    /// `ring`, `recdouble`, `rabenseifner`, `tree`, `hierarchical`, `star`; a leading `^` excludes.
    /// Checked when a communicator is created.
    pub algo: Option<String>,
    /// Allowed protocols (`NCCL_PROTO`); oxccl has one protocol, `Simple`.
    pub proto: Option<String>,
    /// Deterministic reductions (`OXCCL_DETERMINISTIC=1`): floating-point results are bitwise
    /// identical whatever the algorithm or chunk size, for a given rank count.
    pub deterministic: bool,
    /// Where to write the flight record of each rank on its first error (`OXCCL_DUMP_DIR`).
    pub dump_dir: Option<std::path::PathBuf>,
    /// While a wait (init, connection setup, an operation) lasts, say every this often what it
    /// waits for (`OXCCL_WAIT_REPORT` seconds, default 30; 0 turns it off).
    pub wait_report: Option<Duration>,
    /// Run a liveness beacon (a TCP port on an ephemeral number, as NCCL's bootstrap uses) that
    /// ranks on other machines probe to tell a dead or unreachable rank from a slow one
    /// (`OXCCL_BEACON=0` turns it off: then such a death in init or setup is found at the
    /// timeout, and a silent host by the transport).
    pub beacon: bool,
    /// Whether device collectives may use CUDA IPC one-shot kernels between GPUs of one host
    /// (`OXCCL_CUDA_IPC=0` turns them off: device buffers are staged through host memory).
    pub cuda_ipc: bool,
    /// Bytes of each rank's CUDA IPC window (`OXCCL_CUDA_IPC_WINDOW`, default 32 MiB, at least
    /// 64 KiB): device memory that every rank of the host maps once, at the first one-shot
    /// collective; larger operations go through it in rounds.
    pub cuda_ipc_window: usize,
    /// Where compiled device kernels are cached: `$XDG_CACHE_HOME/oxccl/kernels` (else
    /// `~/.cache/oxccl/kernels`); `OXCCL_KERNEL_CACHE=0`: nowhere (`None`).
    pub kernel_cache: Option<std::path::PathBuf>,
    /// Where NVRTC may be besides the loader's search path: `OXCCL_NVRTC` (a file), then the
    /// PyPI wheel's libraries under `OXCCL_NVRTC_DIR`.
    pub nvrtc_paths: Vec<String>,
    /// The log level: `NCCL_DEBUG` (`WARN`, `INFO`, `TRACE`; `OXCCL_DEBUG` too), read once when
    /// the logger starts ([`crate::log`]).
    pub debug: Option<String>,
    /// `NCCL_DEBUG_SUBSYS`: which subsystems log.
    pub debug_subsys: Option<String>,
    /// `NCCL_DEBUG_FILE`: where the log goes (`%h` host, `%p` pid), instead of stderr.
    pub debug_file: Option<String>,
    /// `NCCL_COMM_BLOCKING`: the C ABI's default for `ncclConfig_t.blocking` (`None`: blocking).
    pub comm_blocking: Option<bool>,
    /// The network between hosts: `OXCCL_NET`/`NCCL_NET` (`socket`, `ofi`, `ib`); `None`:
    /// automatic (verbs if a device opens, else a hardware libfabric provider, else TCP).
    pub net: Option<String>,
    /// The libfabric provider: `OXCCL_OFI_PROVIDER`/`FI_PROVIDER` (empty: libfabric's choice).
    pub ofi_provider: String,
    /// The RDMA network's settings: `OXCCL_NET_ENDPOINTS`, `OXCCL_NET_ZERO_COPY*`,
    /// `OXCCL_NET_LINGER_MS`, `OXCCL_NET_REG_CACHE_BYTES`, `OXCCL_NET_WRITE_NOTIFY` and
    /// NCCL's `NCCL_IB_HCA`, `_GID_INDEX`, `_QPS_PER_CONNECTION`, `_TIMEOUT`, `_RETRY_CNT`,
    /// `_SL`, `_TC` (its slots and message size follow `slots` and `chunk_bytes`). With the
    /// `rdma` feature.
    #[cfg(feature = "rdma")]
    pub rdma: oxccl_transport_rdma::RdmaConfig,
    /// Tuner constants: per-message latency in µs and bandwidth in GB/s of the links
    /// (`OXCCL_TUNER_SHM_ALPHA_US`, `..._BETA_GBPS`, and `OXCCL_TUNER_NET_*`).
    pub tuner: Tuner,
    /// How traffic between hosts is protected: [`crate::set_encryption`]'s setting if it was
    /// called, else `OXCCL_ENCRYPT` (`off`, the default; `psk`, keyed from the file named by
    /// `OXCCL_PSK_FILE`; `uid`, keyed from the unique id's secret). See docs/security.md.
    pub encryption: crate::Encryption,
    /// Watching a running job (docs/watching.md): `OXCCL_STATUS_AFTER_MS`,
    /// `OXCCL_STRAGGLER_WINDOW`, `OXCCL_STRAGGLER_MIN_US`, `OXCCL_METRICS_PORT`, `OXCCL_METRICS_ADDR`,
    /// `OXCCL_METRICS_FILE`, `OXCCL_METRICS_INTERVAL_MS`.
    pub watch: crate::watch::Settings,
}

/// The α-β model's constants, per link kind.
#[derive(Debug, Clone, Copy)]
pub struct Tuner {
    /// Latency of one message between ranks on one host, µs.
    pub shm_alpha_us: f64,
    /// Bandwidth between ranks on one host, GB/s.
    pub shm_beta_gbps: f64,
    /// Latency of one message between hosts, µs.
    pub net_alpha_us: f64,
    /// Bandwidth between hosts, GB/s.
    pub net_beta_gbps: f64,
    /// Added to each message's latency per rank beyond one per core on a host (each message
    /// then waits for a context switch), µs.
    pub switch_us: f64,
    /// Bandwidth factor of the log-round algorithms (Rabenseifner, tree) against the pipelined
    /// ring when ranks outnumber cores: their exchanges need both partners on a core at once.
    pub oversub_round_factor: f64,
}

/// The value of the first set variable among `names`.
pub fn env_any(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok()).filter(|v| !v.is_empty())
}

fn env_num(names: &[&str]) -> Option<f64> {
    env_any(names).and_then(|v| v.trim().parse().ok())
}

impl Default for Tuner {
    /// Measured on the 2-core development machines (bench/RESULTS.md): wake-up-free message
    /// latency and achieved bandwidth of one ring step.
    fn default() -> Self {
        Tuner {
            shm_alpha_us: 0.4,
            shm_beta_gbps: 8.0,
            net_alpha_us: 15.0,
            net_beta_gbps: 1.5,
            switch_us: 2.0,
            oversub_round_factor: 1.5,
        }
    }
}

impl Default for Config {
    /// The built-in settings, with nothing read from the environment: what
    /// [`Config::from_env`] starts from.
    fn default() -> Self {
        // the transports' own defaults, written once in their crates
        let shm = oxccl_transport_shm::ShmConfig::default();
        let tcp = oxccl_transport_tcp::TcpConfig::default();
        Config {
            timeout: Duration::from_secs(600),
            spin: None,
            yield_for: None,
            shm_disable: false,
            chunk_bytes: shm.slot_bytes,
            slots: shm.slots,
            cma: shm.cma,
            cma_min_bytes: shm.cma_min_op,
            cma_forward: shm.cma_forward_min..shm.cma_forward_max,
            cma_forward_probe: true,
            cma_far_min_bytes: shm.cma_far_min_op,
            shm_placement: None,
            socket_ifname: None,
            nsocks: tcp.lanes,
            socket_buffer: None,
            host_id: None,
            algo: None,
            proto: None,
            deterministic: false,
            dump_dir: None,
            wait_report: Some(Duration::from_secs(30)),
            beacon: true,
            cuda_ipc: true,
            cuda_ipc_window: 32 << 20,
            kernel_cache: None,
            nvrtc_paths: Vec::new(),
            comm_blocking: None,
            debug: None,
            debug_subsys: None,
            debug_file: None,
            net: None,
            ofi_provider: String::new(),
            #[cfg(feature = "rdma")]
            rdma: oxccl_transport_rdma::RdmaConfig::default(),
            tuner: Tuner::default(),
            encryption: crate::Encryption::Off,
            watch: crate::watch::Settings::default(),
        }
    }
}

impl Config {
    /// The settings from the environment (the table in the README), over [`Config::default`]:
    /// the one place oxccl reads its settings, every crate's (the RDMA network's, the CUDA
    /// kernels', the logger's, the C ABI's). What identifies the job rather than configuring it
    /// (the launcher's `RANK`, `MASTER_ADDR`, `SLURM_*`, `OMPI_*`, `NCCL_COMM_ID`, ...) is read
    /// where the job is discovered (`launcher.rs`, `bootstrap.rs`), with the same [`env_any`].
    pub fn from_env() -> Config {
        let d = Config::default();
        let t = d.tuner;
        let num = |names: &[&str], or: f64| env_num(names).unwrap_or(or);
        Config {
            timeout: env_num(&["OXCCL_TIMEOUT"]).filter(|t| *t > 0.0).map(Duration::from_secs_f64).unwrap_or(d.timeout),
            spin: env_num(&["OXCCL_SPIN_US"]).map(|v| Duration::from_micros(v as u64)),
            yield_for: env_num(&["OXCCL_YIELD_US"]).map(|v| Duration::from_micros(v as u64)),
            shm_disable: env_any(&["OXCCL_SHM_DISABLE", "NCCL_SHM_DISABLE"]).is_some_and(|v| v != "0"),
            chunk_bytes: env_num(&["OXCCL_CHUNK_BYTES"])
                .map(|v| ((v as usize).max(64) / 64) * 64)
                .unwrap_or(d.chunk_bytes),
            slots: env_num(&["OXCCL_SLOTS"]).map(|v| (v as usize).clamp(2, 60)).unwrap_or(d.slots),
            cma: env_any(&["OXCCL_CMA"]).is_none_or(|v| v != "0"),
            cma_min_bytes: env_num(&["OXCCL_CMA_MIN_BYTES"]).map(|v| v as usize).unwrap_or(d.cma_min_bytes),
            cma_forward: env_num(&["OXCCL_CMA_FORWARD_MIN_BYTES"]).map_or(d.cma_forward.start, |v| v as usize)
                ..env_num(&["OXCCL_CMA_FORWARD_MAX_BYTES"]).map_or(d.cma_forward.end, |v| v as usize),
            cma_forward_probe: env_any(&["OXCCL_CMA_FORWARD_PROBE"]).is_none_or(|v| v != "0"),
            cma_far_min_bytes: env_num(&["OXCCL_CMA_FAR_MIN_BYTES"]).map_or(d.cma_far_min_bytes, |v| v as usize),
            shm_placement: env_any(&["OXCCL_SHM_PLACEMENT"]),
            socket_ifname: env_any(&["OXCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]),
            nsocks: env_num(&["OXCCL_NSOCKS"])
                .or_else(|| {
                    let per = env_num(&["NCCL_NSOCKS_PERTHREAD"]);
                    let threads = env_num(&["NCCL_SOCKET_NTHREADS"]);
                    (per.is_some() || threads.is_some()).then(|| per.unwrap_or(1.0) * threads.unwrap_or(1.0))
                })
                .map(|v| (v as usize).clamp(1, 16))
                .unwrap_or(d.nsocks),
            socket_buffer: env_num(&["OXCCL_SOCKET_BUFFER"]).filter(|v| *v >= 4096.0).map(|v| v as usize),
            host_id: env_any(&["OXCCL_HOSTID", "NCCL_HOSTID"]),
            algo: env_any(&["OXCCL_ALGO", "NCCL_ALGO"]),
            proto: env_any(&["NCCL_PROTO"]),
            deterministic: env_any(&["OXCCL_DETERMINISTIC"]).is_some_and(|v| v != "0"),
            dump_dir: env_any(&["OXCCL_DUMP_DIR"]).map(std::path::PathBuf::from),
            wait_report: match env_num(&["OXCCL_WAIT_REPORT"]) {
                Some(s) if s <= 0.0 => None,
                Some(s) => Some(Duration::from_secs_f64(s)),
                None => d.wait_report,
            },
            beacon: env_any(&["OXCCL_BEACON"]).is_none_or(|v| v.trim() != "0"),
            cuda_ipc: env_any(&["OXCCL_CUDA_IPC"]).is_none_or(|v| v.trim() != "0"),
            cuda_ipc_window: env_num(&["OXCCL_CUDA_IPC_WINDOW"])
                .map(|v| (v as usize).max(64 << 10))
                .unwrap_or(d.cuda_ipc_window),
            kernel_cache: match env_any(&["OXCCL_KERNEL_CACHE"]) {
                Some(v) if v.trim() == "0" => None,
                _ => env_any(&["XDG_CACHE_HOME"])
                    .map(std::path::PathBuf::from)
                    .or_else(|| env_any(&["HOME"]).map(|h| std::path::PathBuf::from(h).join(".cache")))
                    .map(|b| b.join("oxccl").join("kernels")),
            },
            nvrtc_paths: {
                let dir = env_any(&["OXCCL_NVRTC_DIR"]);
                let wheel = ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"];
                let in_dir = dir.iter().flat_map(|d| wheel.iter().map(move |n| format!("{d}/{n}")));
                env_any(&["OXCCL_NVRTC"]).into_iter().chain(in_dir).collect()
            },
            comm_blocking: env_num(&["NCCL_COMM_BLOCKING"]).map(|v| v != 0.0),
            debug: env_any(&["OXCCL_DEBUG", "NCCL_DEBUG"]),
            debug_subsys: env_any(&["OXCCL_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS"]),
            debug_file: env_any(&["OXCCL_DEBUG_FILE", "NCCL_DEBUG_FILE"]),
            net: env_any(&["OXCCL_NET", "NCCL_NET"]),
            ofi_provider: env_any(&["OXCCL_OFI_PROVIDER", "FI_PROVIDER"]).unwrap_or_default(),
            #[cfg(feature = "rdma")]
            rdma: oxccl_transport_rdma::RdmaConfig::from_lookup(&env_any),
            tuner: Tuner {
                shm_alpha_us: num(&["OXCCL_TUNER_SHM_ALPHA_US"], t.shm_alpha_us),
                shm_beta_gbps: num(&["OXCCL_TUNER_SHM_BETA_GBPS"], t.shm_beta_gbps),
                net_alpha_us: num(&["OXCCL_TUNER_NET_ALPHA_US"], t.net_alpha_us),
                net_beta_gbps: num(&["OXCCL_TUNER_NET_BETA_GBPS"], t.net_beta_gbps),
                switch_us: num(&["OXCCL_TUNER_SWITCH_US"], t.switch_us),
                oversub_round_factor: num(&["OXCCL_TUNER_OVERSUB_FACTOR"], t.oversub_round_factor),
            },
            encryption: crate::encryption::from_env(),
            watch: crate::watch::Settings::from_lookup(&env_any),
        }
    }
}

/// Start logging once, as `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` ask (see
/// [`crate::log`]).
pub fn init_logging() {
    crate::log::init();
}

/// The algorithms the tuner chooses among (the ordered schedules are only for deterministic mode).
pub const TUNED: [crate::schedule::Algo; 6] = {
    use crate::schedule::Algo;
    [Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Tree, Algo::Hierarchical, Algo::Star]
};

/// Parse an `NCCL_ALGO`-style list into the allowed algorithms (in oxccl's order).
pub fn parse_algos(spec: &str) -> crate::Result<Vec<crate::schedule::Algo>> {
    use crate::schedule::Algo;
    let spec = spec.trim();
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let mut named = Vec::new();
    for name in list.split(',').map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()) {
        let a = match name.as_str() {
            "ring" => Algo::Ring,
            "recdouble" | "recursivedoubling" | "rd" => Algo::RecursiveDoubling,
            "hierarchical" | "hier" => Algo::Hierarchical,
            "tree" => Algo::Tree,
            "rabenseifner" | "rechalving" | "rh" => Algo::Rabenseifner,
            "star" => Algo::Star,
            "collnetdirect" | "collnetchain" | "nvls" | "nvlstree" | "pat" => {
                if exclude {
                    continue; // excluding what we do not have is fine
                }
                return Err(crate::Error::invalid_usage(format!(
                    "algorithm {name:?} (from OXCCL_ALGO/NCCL_ALGO) is not implemented by oxccl; available: ring, recdouble, rabenseifner, tree, hierarchical, star"
                )));
            }
            other => {
                return Err(crate::Error::invalid_argument(format!(
                    "unknown algorithm {other:?} in OXCCL_ALGO/NCCL_ALGO; available: ring, recdouble, rabenseifner, tree, hierarchical, star"
                )))
            }
        };
        named.push(a);
    }
    let all = TUNED;
    let allowed: Vec<Algo> = all.into_iter().filter(|a| named.contains(a) != exclude).collect();
    if allowed.is_empty() {
        return Err(crate::Error::invalid_usage(format!("OXCCL_ALGO/NCCL_ALGO={spec:?} leaves no algorithm")));
    }
    Ok(allowed)
}

/// Check an `NCCL_PROTO` value: oxccl implements only the `Simple` protocol.
pub fn check_proto(spec: &str) -> crate::Result<()> {
    let spec = spec.trim();
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let names: Vec<String> = list.split(',').map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()).collect();
    let simple_allowed = names.iter().any(|n| n == "simple") != exclude;
    if !simple_allowed {
        return Err(crate::Error::invalid_usage(format!(
            "NCCL_PROTO={spec:?}: oxccl implements only the Simple protocol (it carries messages of up to 16 bytes inline with their flag on shared memory, LL-style, but LL and LL128 cannot be forced)"
        )));
    }
    Ok(())
}

/// An `OXCCL_SHM_PLACEMENT` value (`measure`, `near`, `far`; any case).
pub fn parse_placement(spec: &str) -> crate::Result<oxccl_transport_shm::Placement> {
    use oxccl_transport_shm::Placement;
    match spec.trim().to_ascii_lowercase().as_str() {
        "measure" | "measured" => Ok(Placement::Measured),
        "near" => Ok(Placement::Near),
        "far" => Ok(Placement::Far),
        _ => {
            Err(crate::Error::invalid_argument(format!("OXCCL_SHM_PLACEMENT={spec:?}: expected measure, near or far")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Algo;

    #[test]
    fn algo_syntax() {
        assert_eq!(parse_algos("ring").unwrap(), vec![Algo::Ring]);
        assert_eq!(parse_algos("Ring,RecDouble").unwrap(), vec![Algo::Ring, Algo::RecursiveDoubling]);
        assert_eq!(
            parse_algos("^ring").unwrap(),
            vec![Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Tree, Algo::Hierarchical, Algo::Star]
        );
        assert_eq!(
            parse_algos("^tree,nvls").unwrap(),
            vec![Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Hierarchical, Algo::Star]
        );
        assert_eq!(parse_algos("Tree").unwrap(), vec![Algo::Tree]);
        assert_eq!(parse_algos("rabenseifner").unwrap(), vec![Algo::Rabenseifner]);
        assert_eq!(parse_algos("Star").unwrap(), vec![Algo::Star]);
        let e = parse_algos("NVLS").unwrap_err();
        assert!(e.to_string().contains("not implemented"), "{e}");
        assert!(parse_algos("bogus").is_err());
        assert!(parse_algos("^ring,rd,hier,tree,rh,star").is_err());
        assert!(check_proto("Simple").is_ok());
        assert!(check_proto("^LL,LL128").is_ok());
        assert!(check_proto("LL").unwrap_err().to_string().contains("only the Simple"));
    }

    /// `chunk_bytes` and `slots` drive both transports, from the shared-memory crate's
    /// defaults: the TCP crate's own must agree, or one of them would be silently overridden.
    #[test]
    fn transport_defaults_agree() {
        let (c, tcp) = (Config::default(), oxccl_transport_tcp::TcpConfig::default());
        assert_eq!((c.chunk_bytes, c.slots, c.nsocks), (tcp.slot_bytes, tcp.slots, tcp.lanes));
        assert_eq!((c.chunk_bytes, c.slots), (256 << 10, 4));
        assert_eq!(c.cma_forward, (32 << 10)..(32 << 20));
        assert_eq!(c.cma_far_min_bytes, 64 << 10);
    }

    #[test]
    fn placement_values() {
        use oxccl_transport_shm::Placement;
        assert_eq!(parse_placement("far").unwrap(), Placement::Far);
        assert_eq!(parse_placement(" Near ").unwrap(), Placement::Near);
        assert_eq!(parse_placement("measure").unwrap(), Placement::Measured);
        let e = parse_placement("faraway").unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::InvalidArgument);
        assert!(e.message.contains("expected measure, near or far"), "{e}");
    }
}
