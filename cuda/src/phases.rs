//! Where the device worker's time goes, phase by phase: the diagnostics that `oxccl-perf --device`
//! prints and `cuda/gpu-check.sh` records. Process-wide sums of nanoseconds and counts, kept
//! with relaxed atomics (a few nanoseconds per phase; the phases take microseconds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A phase of a device operation on the worker thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// From the call that enqueued the job to the worker taking it.
    Queue,
    /// Waiting for the caller's stream to reach the operation (its inputs ready).
    Ready,
    /// IPC: this rank's input copied into its window (per round).
    Window,
    /// IPC: the host barriers around each round's kernel.
    Barrier,
    /// IPC: the kernel (or copies) computing this rank's output from the windows.
    Kernel,
    /// Staged: device to pinned host memory.
    CopyIn,
    /// Staged: the host collective.
    Host,
    /// Staged: pinned host memory back to the device.
    CopyOut,
}

const ALL: [Phase; 8] = [
    Phase::Queue,
    Phase::Ready,
    Phase::Window,
    Phase::Barrier,
    Phase::Kernel,
    Phase::CopyIn,
    Phase::Host,
    Phase::CopyOut,
];

impl Phase {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Queue => "queue",
            Phase::Ready => "ready",
            Phase::Window => "window",
            Phase::Barrier => "barrier",
            Phase::Kernel => "kernel",
            Phase::CopyIn => "copy-in",
            Phase::Host => "host",
            Phase::CopyOut => "copy-out",
        }
    }
}

static NS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
static COUNT: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// Count the time since `since` towards `p`; returns now (the start of the next phase).
pub(crate) fn add(p: Phase, since: Instant) -> Instant {
    let now = Instant::now();
    let i = p as usize;
    NS[i].fetch_add(now.duration_since(since).as_nanos() as u64, Ordering::Relaxed);
    COUNT[i].fetch_add(1, Ordering::Relaxed);
    now
}

/// Each phase that ran since the last [`reset`]: its name, total nanoseconds and count.
pub fn snapshot() -> Vec<(&'static str, u64, u64)> {
    ALL.iter()
        .map(|&p| (p.name(), NS[p as usize].load(Ordering::Relaxed), COUNT[p as usize].load(Ordering::Relaxed)))
        .filter(|&(_, _, n)| n > 0)
        .collect()
}

/// Zero the sums.
pub fn reset() {
    for i in 0..ALL.len() {
        NS[i].store(0, Ordering::Relaxed);
        COUNT[i].store(0, Ordering::Relaxed);
    }
}

/// One line: the mean of each phase per operation, in microseconds.
pub fn report() -> String {
    let parts: Vec<String> =
        snapshot().iter().map(|&(name, ns, n)| format!("{name} {:.1}", ns as f64 / n as f64 / 1e3)).collect();
    if parts.is_empty() {
        "no device operations".into()
    } else {
        parts.join(", ") + " µs"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_means() {
        reset();
        let t = Instant::now() - std::time::Duration::from_micros(30);
        add(Phase::Kernel, t);
        add(Phase::Kernel, t);
        let s = snapshot();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].0, s[0].2), ("kernel", 2));
        assert!(s[0].1 >= 60_000, "{s:?}");
        assert!(report().starts_with("kernel "), "{}", report());
        reset();
        assert_eq!(report(), "no device operations");
    }
}
