//! Watching a running job (docs/watching.md): live status in the store, straggler detection,
//! Prometheus metrics and Chrome traces.
//!
//! - [`lateness`]: each rank times the first message of every peer whose first message depends
//!   on nothing but that peer's entry into the operation (its "clean" peers, from the peer's own
//!   schedule), and names the peer that is most often last, and by how much.
//! - [`status`]: an operation running longer than [`Settings::status_after`] publishes a compact
//!   record to the bootstrap store (and again at that interval while it runs, and on the first
//!   error); `oxccl-perf --status` reads every rank's and says who waits for whom.
//! - [`metrics`]: counters per communicator (operations, bytes and time per collective, time
//!   waiting per peer, errors, connection memory), in Prometheus' text format over HTTP or in a
//!   file.
//! - [`trace`]: operations and their steps as a Chrome trace (`oxccl-perf --trace`).
//!
//! The fast path pays a few plain adds per operation under the flight recorder's lock, and no
//! clock read for a short wait: a wait is timed only once it outlasts the engine's spinning
//! (whose first clock reading starts it), with one clock read when its message comes.

pub mod lateness;
pub mod metrics;
pub mod status;
pub mod trace;

mod http;
mod registry;

pub use lateness::{Lateness, PeerLateness, Straggler};
pub use status::{job_status, read_job, CommStatus, JobStatus, RankStatus};

pub use registry::{endpoint as metrics_endpoint, render_all as metrics_text};
pub(crate) use registry::{register, Watched};

use std::time::Duration;

/// The watching settings ([`crate::Config::watch`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// An operation running longer than this publishes its rank's status record to the store,
    /// and again every this often while it runs (`OXCCL_STATUS_AFTER_MS`, default 1000; 0: never).
    pub status_after: Option<Duration>,
    /// Operations per straggler window: the lateness counters restart, and a straggler found is
    /// logged at INFO, every this many operations (`OXCCL_STRAGGLER_WINDOW`, default 1000; 0:
    /// no straggler detection).
    pub straggler_window: u64,
    /// An operation's last peer counts as late from this lag on (`OXCCL_STRAGGLER_MIN_US`,
    /// default 1000).
    pub straggler_min: Duration,
    /// Serve the Prometheus metrics of this process over HTTP on this port
    /// (`OXCCL_METRICS_PORT`; 0: any free port, logged; taken: the next free one up to +63).
    pub metrics_port: Option<u16>,
    /// The address the metrics endpoint binds (`OXCCL_METRICS_ADDR`, default 127.0.0.1).
    pub metrics_addr: std::net::IpAddr,
    /// Rewrite the metrics to this file (`OXCCL_METRICS_FILE`; `%p`: the pid, `%h`: the host),
    /// for node exporters' textfile collectors.
    pub metrics_file: Option<std::path::PathBuf>,
    /// How often the file is rewritten (`OXCCL_METRICS_INTERVAL_MS`, default 5000).
    pub metrics_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            status_after: Some(Duration::from_secs(1)),
            straggler_window: 1000,
            straggler_min: lateness::LATE_MIN,
            metrics_port: None,
            metrics_addr: std::net::IpAddr::from([127, 0, 0, 1]),
            metrics_file: None,
            metrics_interval: Duration::from_secs(5),
        }
    }
}

impl Settings {
    /// The settings from `lookup` (the environment, for [`crate::Config::from_env`]).
    pub fn from_lookup(lookup: &dyn Fn(&[&str]) -> Option<String>) -> Settings {
        let d = Settings::default();
        let num = |k: &str| lookup(&[k]).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| *v >= 0.0);
        Settings {
            status_after: match num("OXCCL_STATUS_AFTER_MS") {
                Some(0.0) => None,
                Some(v) => Some(Duration::from_secs_f64(v / 1e3)),
                None => d.status_after,
            },
            straggler_window: num("OXCCL_STRAGGLER_WINDOW").map_or(d.straggler_window, |v| v as u64),
            straggler_min: num("OXCCL_STRAGGLER_MIN_US").map_or(d.straggler_min, |v| Duration::from_secs_f64(v / 1e6)),
            metrics_port: num("OXCCL_METRICS_PORT").filter(|v| *v <= 65535.0).map(|v| v as u16),
            metrics_addr: lookup(&["OXCCL_METRICS_ADDR"]).and_then(|v| v.trim().parse().ok()).unwrap_or(d.metrics_addr),
            metrics_file: lookup(&["OXCCL_METRICS_FILE"]).filter(|v| !v.is_empty()).map(std::path::PathBuf::from),
            metrics_interval: num("OXCCL_METRICS_INTERVAL_MS")
                .filter(|v| *v >= 10.0)
                .map_or(d.metrics_interval, |v| Duration::from_secs_f64(v / 1e3)),
        }
    }
}
