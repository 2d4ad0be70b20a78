//! Chrome traces of operations and their steps (`oxccl-perf --trace FILE`).
//!
//! Off unless [`enable`]d: then every operation this process runs keeps the start and end of
//! each of its steps, and [`take_events`] hands them out as Chrome trace events (one JSON
//! object per line, `"ph": "X"`, `pid` the rank, `tid` the communicator; times in microseconds
//! from an epoch the caller gives in Unix time, the same for every process of a job), so the
//! events of ranks in different processes line up in one file. (Microseconds since 1970 would
//! not do: a double holds them to a quarter of a microsecond only.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

static ON: AtomicBool = AtomicBool::new(false);
static DONE: Mutex<Vec<OpSpan>> = Mutex::new(Vec::new());
/// Operations kept at most (the oldest are dropped past it).
const KEEP: usize = 1 << 20;

/// Record operations and steps from now on.
pub fn enable() {
    base();
    // operations' times must match their steps' (read with `Instant::now()`) to the nanosecond
    oxccl_simd::clock::precise();
    ON.store(true, Ordering::Relaxed);
}

/// Whether recording is on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn base() -> (Instant, i128) {
    static BASE: OnceLock<(Instant, i128)> = OnceLock::new();
    *BASE.get_or_init(|| {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        (Instant::now(), unix.as_nanos() as i128)
    })
}

/// `t` in Unix nanoseconds.
fn unix_ns(t: Instant) -> i128 {
    let (i0, u0) = base();
    match t.checked_duration_since(i0) {
        Some(d) => u0 + d.as_nanos() as i128,
        None => u0 - i0.duration_since(t).as_nanos() as i128,
    }
}

/// Now, in Unix microseconds (an epoch for [`take_events`]).
pub fn now_unix_us() -> u64 {
    (unix_ns(Instant::now()) / 1000) as u64
}

/// One step of a traced operation.
#[derive(Debug, Clone, Copy)]
pub struct StepSpan {
    /// Its index in the schedule.
    pub pc: u32,
    /// The peer it received from, and sent to.
    pub recv: Option<u32>,
    /// The peer it sent to.
    pub send: Option<u32>,
    /// Bytes it moved.
    pub bytes: u64,
    /// When it was first tried, and when it ran.
    pub start: Instant,
    /// When it completed.
    pub end: Instant,
}

/// A traced operation.
#[derive(Debug, Clone)]
pub struct OpSpan {
    /// The rank, and its communicator's id.
    pub rank: usize,
    /// The communicator.
    pub comm: u64,
    /// Sequence number and call.
    pub seq: u64,
    /// The call (`allreduce(type=float, ...)`).
    pub op: String,
    /// Entry and completion.
    pub start: Instant,
    /// Completion (or failure).
    pub end: Instant,
    /// Whether it completed.
    pub ok: bool,
    /// Its steps, in order.
    pub steps: Vec<StepSpan>,
}

/// Keep a finished operation.
pub(crate) fn push(op: OpSpan) {
    let mut g = DONE.lock().unwrap();
    if g.len() >= KEEP {
        g.remove(0);
    }
    g.push(op);
}

fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The operations recorded so far, as Chrome trace events (one JSON object per line), and
/// forget them. `label` names the process row (`rank 0 (host, pid 12)`); times are microseconds
/// after `epoch_unix_us`.
pub fn take_events(label: &str, epoch_unix_us: u64) -> Vec<String> {
    let us = |t: Instant| (unix_ns(t) - epoch_unix_us as i128 * 1000) as f64 / 1e3;
    let ops = std::mem::take(&mut *DONE.lock().unwrap());
    let mut out = vec![];
    let mut ranks: Vec<usize> = ops.iter().map(|o| o.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    for r in ranks {
        out.push(format!(
            "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {r}, \"args\": {{\"name\": \"{}\"}}}}",
            quote(&format!("rank {r} {label}"))
        ));
    }
    for o in &ops {
        let name = o.op.split('(').next().unwrap_or("op");
        out.push(format!(
            "{{\"name\": \"{name} #{}\", \"cat\": \"op\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": {}, \"tid\": {}, \"args\": {{\"call\": \"{}\", \"ok\": {}}}}}",
            o.seq,
            us(o.start),
            o.end.saturating_duration_since(o.start).as_secs_f64() * 1e6,
            o.rank,
            o.comm & 0xffff,
            quote(&o.op),
            o.ok
        ));
        for s in &o.steps {
            let peer = |p: Option<u32>| p.map_or("null".to_string(), |p| p.to_string());
            out.push(format!(
                "{{\"name\": \"step {}\", \"cat\": \"step\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": {}, \"tid\": {}, \"args\": {{\"seq\": {}, \"recv\": {}, \"send\": {}, \"bytes\": {}}}}}",
                s.pc,
                us(s.start),
                s.end.saturating_duration_since(s.start).as_secs_f64() * 1e6,
                o.rank,
                o.comm & 0xffff,
                o.seq,
                peer(s.recv),
                peer(s.send),
                s.bytes
            ));
        }
    }
    out
}
