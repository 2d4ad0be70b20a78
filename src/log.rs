//! oxccl's one logger, with NCCL's conventions, so that logs are read and grepped as NCCL's are:
//!
//! ```text
//! vm:4121:4121 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM
//! vm:4122:4127 [1] NCCL WARN [rank 1] allreduce(...) #12: peer 0: remote error: ...
//! ```
//!
//! - `NCCL_DEBUG` (or `OXCCL_DEBUG`): `VERSION`, `WARN`, `INFO` or `TRACE` (`DEBUG` too).
//! - `NCCL_DEBUG_SUBSYS`: a comma list of `INIT`, `COLL`, `P2P`, `SHM`, `NET`, `GRAPH`, `TUNING`,
//!   `ENV`, `ALLOC`, `CALL`, `PROXY`, `NVLS`, `BOOTSTRAP`, `REG`, `PROFILE`, `RAS` or `ALL`; a
//!   leading `^` excludes them. Default, as NCCL's: `INIT,BOOTSTRAP,ENV`. Warnings always show.
//! - `NCCL_DEBUG_FILE`: write to this file instead of stderr; `%h` is the host name and `%p` the
//!   pid, so each rank of a job gets its own file.
//!
//! Every line starts `host:pid:tid [rank]`: the rank is the event's `rank` field, else the rank
//! whose operation the logging thread is running ([`RankScope`]), else `-`. An event's
//! subsystem is its target when that is a subsystem name (`tracing::info!(target: "TUNING",
//! ...)`), else the one its module belongs to.

use std::cell::Cell;
use std::io::Write;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// NCCL's subsystem names, in its bit order.
pub const SUBSYSTEMS: [&str; 16] = [
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
];

/// The subsystems shown: a bit per [`SUBSYSTEMS`] entry, from an `NCCL_DEBUG_SUBSYS` value.
pub fn parse_subsys(spec: Option<&str>) -> u32 {
    let bit = |n: &str| SUBSYSTEMS.iter().position(|s| s.eq_ignore_ascii_case(n)).map(|i| 1u32 << i);
    let all = (1u32 << SUBSYSTEMS.len()) - 1;
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
        return bit("INIT").unwrap() | bit("BOOTSTRAP").unwrap() | bit("ENV").unwrap();
    };
    let (invert, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let mut m = 0;
    for name in list.split(',').map(str::trim) {
        m |= if name.eq_ignore_ascii_case("ALL") { all } else { bit(name).unwrap_or(0) };
    }
    if invert {
        all & !m
    } else {
        m
    }
}

/// The subsystem of an event: its target when that names one, else by module.
pub fn subsystem_of(target: &str) -> &'static str {
    if let Some(s) = SUBSYSTEMS.iter().find(|s| **s == target) {
        return s;
    }
    let t = target;
    if t.starts_with("oxccl::bootstrap") || t.starts_with("oxccl::store") || t.starts_with("oxccl::launcher") {
        "BOOTSTRAP"
    } else if t.starts_with("oxccl_transport_shm") {
        "SHM"
    } else if t.starts_with("oxccl_transport_tcp") || t.starts_with("oxccl_transport_rdma") {
        "NET"
    } else if t.starts_with("oxccl::exec") || t.starts_with("oxccl::progress") {
        "COLL"
    } else if t.starts_with("oxccl_ffi") || t.starts_with("nccl") {
        "CALL"
    } else {
        "INIT"
    }
}

/// `%h` and `%p` of `NCCL_DEBUG_FILE`.
pub fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    pattern.replace("%h", host).replace("%p", &pid.to_string())
}

thread_local! {
    static RANK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// While it lives, this thread's log lines without a `rank` field carry `rank`.
pub struct RankScope(Option<usize>);

impl RankScope {
    /// Tag this thread's lines with `rank` until the scope ends.
    pub fn new(rank: usize) -> RankScope {
        RankScope(RANK.with(|r| r.replace(Some(rank))))
    }
}

impl Drop for RankScope {
    fn drop(&mut self) {
        RANK.with(|r| r.set(self.0));
    }
}

struct Fields {
    message: String,
    rank: Option<u64>,
    rest: String,
}

impl Visit for Fields {
    fn record_u64(&mut self, f: &Field, v: u64) {
        if f.name() == "rank" {
            self.rank = Some(v);
        } else {
            self.record_debug(f, &v);
        }
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        match u64::try_from(v) {
            Ok(u) if f.name() == "rank" => self.rank = Some(u),
            _ => self.record_debug(f, &v),
        }
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            self.message = format!("{v:?}");
        } else {
            self.rest.push_str(&format!(" {}={v:?}", f.name()));
        }
    }
}

enum Sink {
    Stderr,
    File(Mutex<std::fs::File>),
}

struct NcclLayer {
    max: Level,
    subsys: u32,
    host: String,
    sink: Sink,
}

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let m = event.metadata();
        let level = *m.level();
        if level > self.max {
            return;
        }
        let sub = subsystem_of(m.target());
        let bit = SUBSYSTEMS.iter().position(|s| *s == sub).map_or(0, |i| 1u32 << i);
        if level > Level::WARN && self.subsys & bit == 0 {
            return;
        }
        let mut f = Fields { message: String::new(), rank: None, rest: String::new() };
        event.record(&mut f);
        let rank = f.rank.map(|r| r as usize).or_else(|| RANK.with(Cell::get));
        let rank = rank.map_or("-".to_string(), |r| r.to_string());
        let word = match level {
            Level::ERROR | Level::WARN => "WARN",
            Level::INFO => "INFO",
            _ => "TRACE",
        };
        let msg = f.message.strip_prefix("oxccl: ").unwrap_or(&f.message);
        let line = format!(
            "{}:{}:{} [{rank}] NCCL {word} {msg}{}\n",
            self.host,
            std::process::id(),
            oxccl_transport::thread::thread_id(),
            f.rest
        );
        match &self.sink {
            // one write per line, so ranks sharing a terminal never split each other's lines
            Sink::Stderr => drop(std::io::stderr().lock().write_all(line.as_bytes())),
            Sink::File(file) => drop(file.lock().unwrap().write_all(line.as_bytes())),
        }
    }
}

/// A line that shows whatever `NCCL_DEBUG` says (a wait report), with the usual prefix, on
/// stderr in one write.
pub fn notice(rank: Option<usize>, msg: &str) {
    let rank = rank.or_else(|| RANK.with(Cell::get)).map_or("-".to_string(), |r| r.to_string());
    let line = format!(
        "{}:{}:{} [{rank}] NCCL WARN {msg}\n",
        crate::bootstrap::hostname(),
        std::process::id(),
        oxccl_transport::thread::thread_id()
    );
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Start the logger once, as `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` ask.
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let cfg = crate::Config::from_env();
        let Some(level) = cfg.debug else { return };
        let max = match level.trim().to_ascii_uppercase().as_str() {
            "WARN" | "ABORT" => Level::WARN,
            "INFO" | "VERSION" => Level::INFO,
            "TRACE" | "DEBUG" => Level::TRACE,
            _ => return,
        };
        let subsys = parse_subsys(cfg.debug_subsys.as_deref());
        let host = crate::bootstrap::hostname();
        let sink = match cfg.debug_file {
            Some(p) => {
                let path = expand_file_name(&p, &host, std::process::id());
                match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                    Ok(f) => Sink::File(Mutex::new(f)),
                    Err(e) => {
                        eprintln!(
                            "{host}:{} [-] NCCL WARN cannot open NCCL_DEBUG_FILE {path}: {e}",
                            std::process::id()
                        );
                        Sink::Stderr
                    }
                }
            }
            None => Sink::Stderr,
        };
        let layer = NcclLayer { max, subsys, host, sink };
        let _ = tracing_subscriber::registry().with(layer).try_init();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsystems_parse_like_nccl() {
        let bit = |n: &str| 1u32 << SUBSYSTEMS.iter().position(|s| *s == n).unwrap();
        assert_eq!(parse_subsys(None), bit("INIT") | bit("BOOTSTRAP") | bit("ENV"));
        assert_eq!(parse_subsys(Some("net,Tuning")), bit("NET") | bit("TUNING"));
        assert_eq!(parse_subsys(Some("ALL")), (1 << 16) - 1);
        assert_eq!(parse_subsys(Some("^NET")), ((1 << 16) - 1) & !bit("NET"));
        assert_eq!(parse_subsys(Some("bogus")), 0);
    }

    #[test]
    fn modules_map_to_subsystems() {
        assert_eq!(subsystem_of("TUNING"), "TUNING");
        assert_eq!(subsystem_of("oxccl::store"), "BOOTSTRAP");
        assert_eq!(subsystem_of("oxccl_transport_tcp::netif"), "NET");
        assert_eq!(subsystem_of("oxccl::comm"), "INIT");
    }

    #[test]
    fn file_names_expand() {
        assert_eq!(expand_file_name("/tmp/nccl.%h.%p.log", "vm", 42), "/tmp/nccl.vm.42.log");
    }

    #[test]
    fn rank_scopes_nest() {
        assert_eq!(RANK.with(Cell::get), None);
        {
            let _a = RankScope::new(3);
            {
                let _b = RankScope::new(5);
                assert_eq!(RANK.with(Cell::get), Some(5));
            }
            assert_eq!(RANK.with(Cell::get), Some(3));
        }
        assert_eq!(RANK.with(Cell::get), None);
    }
}
