//! Settings, from the environment (NCCL names where NCCL has one, `OXCCL_` aliases).

use std::time::Duration;

/// Communicator settings. [`Config::default`] reads the environment; fields may then be changed.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bound on every wait (bootstrap, connection setup, each operation). `OXCCL_TIMEOUT`
    /// (seconds), default 600 s like PyTorch's NCCL default.
    pub timeout: Duration,
    /// How long a waiting rank busy-polls before it blocks in the kernel. `OXCCL_SPIN_US`,
    /// default 50 µs (it yields after that as long again, then sleeps).
    pub spin: Duration,
    /// Never use shared memory (`NCCL_SHM_DISABLE=1`).
    pub shm_disable: bool,
    /// Largest message (connection slot) in bytes: `OXCCL_CHUNK_BYTES`, default 256 KiB.
    pub chunk_bytes: usize,
    /// Slots per connection: `OXCCL_SLOTS`, default 4 (at least 2).
    pub slots: usize,
    /// Interface selection (`OXCCL_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// Host identity override (`OXCCL_HOSTID`, else `NCCL_HOSTID`); ranks with different values
    /// never use shared memory between them.
    pub host_id: Option<String>,
}

/// The value of the first set variable among `names`.
pub fn env_any(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok()).filter(|v| !v.is_empty())
}

fn env_num(names: &[&str]) -> Option<f64> {
    env_any(names).and_then(|v| v.trim().parse().ok())
}

impl Default for Config {
    fn default() -> Self {
        let timeout = env_num(&["OXCCL_TIMEOUT"]).filter(|t| *t > 0.0).unwrap_or(600.0);
        Config {
            timeout: Duration::from_secs_f64(timeout),
            spin: Duration::from_micros(env_num(&["OXCCL_SPIN_US"]).unwrap_or(50.0) as u64),
            shm_disable: env_any(&["OXCCL_SHM_DISABLE", "NCCL_SHM_DISABLE"]).is_some_and(|v| v != "0"),
            chunk_bytes: env_num(&["OXCCL_CHUNK_BYTES"]).map(|v| ((v as usize).max(64) / 64) * 64).unwrap_or(256 << 10),
            slots: env_num(&["OXCCL_SLOTS"]).map(|v| (v as usize).clamp(2, 60)).unwrap_or(4),
            socket_ifname: env_any(&["OXCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]),
            host_id: env_any(&["OXCCL_HOSTID", "NCCL_HOSTID"]),
        }
    }
}

impl Config {
    /// The settings from the environment (same as `default`).
    pub fn from_env() -> Config {
        Config::default()
    }
}

/// Start logging once, if `OXCCL_DEBUG` or `NCCL_DEBUG` asks for it (`INFO`, `WARN`, `TRACE`,
/// `DEBUG`; `VERSION` counts as `INFO`). `RUST_LOG` style filters are accepted too.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = env_any(&["OXCCL_DEBUG", "NCCL_DEBUG"]).map(|v| match v.to_ascii_uppercase().as_str() {
            "INFO" | "VERSION" => "info".to_string(),
            "WARN" => "warn".to_string(),
            "TRACE" => "trace".to_string(),
            "DEBUG" => "debug".to_string(),
            _ => v.to_lowercase(),
        });
        let Some(level) = level else { return };
        let filter = tracing_subscriber::EnvFilter::try_new(&level)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .without_time()
            .try_init();
    });
}
