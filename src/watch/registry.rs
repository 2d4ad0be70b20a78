//! The live communicators of this process, for the metrics exporters, which start with the
//! first communicator whose settings ask for them.

use super::metrics::{render, Sample};
use super::Settings;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A communicator the exporters can read.
pub(crate) trait Watched: Send + Sync {
    /// Its counters and labels now.
    fn sample(&self) -> Sample;
}

static LIVE: Mutex<Vec<Weak<dyn Watched>>> = Mutex::new(Vec::new());
static ENDPOINT: OnceLock<Option<std::net::SocketAddr>> = OnceLock::new();
static FILE: OnceLock<()> = OnceLock::new();

/// Add a communicator (held weakly: a destroyed one drops out); start the exporters `s` asks
/// for, once per process.
pub(crate) fn register(c: Weak<dyn Watched>, s: &Settings) {
    {
        let mut live = LIVE.lock().unwrap();
        live.retain(|w| w.strong_count() > 0);
        live.push(c);
    }
    if let Some(port) = s.metrics_port {
        let addr = s.metrics_addr;
        ENDPOINT.get_or_init(|| match super::http::serve(addr, port) {
            Ok(a) => {
                tracing::info!("oxccl: Prometheus metrics on http://{a}/metrics");
                Some(a)
            }
            Err(e) => {
                tracing::warn!("oxccl: no metrics endpoint on {addr}:{port}..+63: {e}");
                None
            }
        });
    }
    if let Some(path) = &s.metrics_file {
        let (path, every) = (expand(path), s.metrics_interval);
        FILE.get_or_init(|| {
            let spawned = std::thread::Builder::new().name("oxccl-metrics".into()).spawn(move || loop {
                write_file(&path);
                std::thread::sleep(every);
            });
            if let Err(e) = spawned {
                tracing::warn!("oxccl: no metrics file writer: {e}");
            }
        });
    }
}

/// The address the metrics endpoint of this process serves on, once started.
pub fn endpoint() -> Option<std::net::SocketAddr> {
    ENDPOINT.get().copied().flatten()
}

/// Every live communicator's metrics, in Prometheus' text format.
pub fn render_all() -> String {
    let live: Vec<Arc<dyn Watched>> = LIVE.lock().unwrap().iter().filter_map(Weak::upgrade).collect();
    let samples: Vec<Sample> = live.iter().map(|c| c.sample()).collect();
    render(&samples)
}

/// `%p` becomes the pid, `%h` the host name.
fn expand(p: &std::path::Path) -> std::path::PathBuf {
    let s = p.to_string_lossy();
    let host = crate::bootstrap::hostname();
    s.replace("%p", &std::process::id().to_string()).replace("%h", &host).into()
}

/// Write the metrics next to `path` and rename it there: a collector never reads half a file.
fn write_file(path: &std::path::Path) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    if let Err(e) = std::fs::write(&tmp, render_all()).and_then(|_| std::fs::rename(&tmp, path)) {
        tracing::warn!("oxccl: could not write the metrics file {}: {e}", path.display());
    }
}
