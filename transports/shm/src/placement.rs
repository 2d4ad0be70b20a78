//! How far apart the two processes of a connection run: the time the receiver's core takes to
//! load a cache line that the sender's core has just written.
//!
//! Where the kernel's copy between processes is slow (`probe.rs`), two copies through the slots
//! that pipeline (operations of more than one message) beat one through the kernel while the
//! two cores are close (a line between them in about 60 ns on the AMD EPYC VM of
//! bench/RESULTS.md), and lose when the hypervisor has placed them far apart (220–250 ns a
//! line): every byte of a slot then crosses at that cost, while the kernel's read of an input
//! that has not changed since the last call finds it in the reader's cache. That placement
//! changes every few minutes on such a machine, so the receiver keeps measuring it: before
//! copying a message of at least [`TIMED_MIN`] bytes out of its slot, it times one load of a
//! line in the middle of it, on its own core's counter (`oxccl_simd::clock::time`). The
//! smallest of [`WINDOW`] such loads is the line's way between the cores. The verdict goes into
//! the segment, where the sender reads it before sending by reference
//! (`ShmConfig::cma_forward_far_only`); while far, the sender still sends one such message in
//! [`PROBE_EVERY`] through the slots, so that the measurement goes on.

/// Messages of at least this many bytes are timed.
pub const TIMED_MIN: usize = 16 << 10;
/// Loads per verdict.
pub const WINDOW: u32 = 16;
/// A window whose fastest load took longer than this is far apart... (the AMD EPYC VM: 40–60
/// ns close, 140–150 far)
pub const FAR_NS: f64 = 100.0;
/// ... and one whose fastest took less than this is close; in between, the verdict stays.
pub const NEAR_NS: f64 = 80.0;
/// While far, one message in this many that could go by reference goes through the slots.
pub const PROBE_EVERY: u32 = 16;

/// The verdict, as stored in the segment (`OFF_PLACEMENT`): not measured yet.
pub const UNKNOWN: u32 = 0;
/// See [`UNKNOWN`].
pub const NEAR: u32 = 1;
/// See [`UNKNOWN`].
pub const FAR: u32 = 2;

/// The sender's side: whether to send by reference now, given the receiver's `verdict`. Far
/// apart, yes but for one ask in [`PROBE_EVERY`] (counted in `asked`); otherwise no.
pub fn forward_now(verdict: u32, asked: &std::cell::Cell<u32>) -> bool {
    if verdict != FAR {
        return false;
    }
    let n = asked.get().wrapping_add(1);
    asked.set(n);
    n % PROBE_EVERY != 0
}

/// The receiver's side of the measurement.
#[derive(Debug, Default)]
pub struct LineTime {
    /// The last message timed (its number plus one; 0: none).
    last: u64,
    /// The fastest load (ticks) in this window, and how many were timed.
    min: u64,
    taken: u32,
    /// Counter ticks per ns, once the clock has measured it.
    rate: Option<f64>,
    verdict: u32,
}

impl LineTime {
    /// Whether message `msg` of `len` bytes is to be timed (each message once).
    #[inline]
    pub fn wants(&self, msg: u64, len: usize) -> bool {
        len >= TIMED_MIN && self.last != msg + 1
    }

    /// Message `msg`'s load took `ticks` (`None`: the counter is not used). Returns the new
    /// verdict and the window's fastest load (ns) when the verdict changes; `rate` gives the
    /// counter's ticks per ns (asked until known).
    pub fn timed(&mut self, msg: u64, ticks: Option<u64>, rate: impl FnOnce() -> Option<f64>) -> Option<(u32, f64)> {
        self.last = msg + 1;
        let t = ticks?;
        self.min = if self.taken == 0 { t } else { self.min.min(t) };
        self.taken += 1;
        if self.taken < WINDOW {
            return None;
        }
        self.taken = 0;
        if self.rate.is_none() {
            self.rate = rate();
        }
        let ns = self.min as f64 / self.rate?;
        let verdict = if ns > FAR_NS {
            FAR
        } else if ns < NEAR_NS || self.verdict == UNKNOWN {
            NEAR
        } else {
            self.verdict
        };
        (verdict != self.verdict).then(|| {
            self.verdict = verdict;
            (verdict, ns)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One window of loads (ticks, at 2 ticks per ns), from message `first` on.
    fn window(l: &mut LineTime, first: u64, ticks: impl Fn(u64) -> u64) -> Option<(u32, f64)> {
        let mut out = None;
        for m in first..first + u64::from(WINDOW) {
            assert!(l.wants(m, TIMED_MIN));
            if let Some(v) = l.timed(m, Some(ticks(m)), || Some(2.0)) {
                out = Some(v);
            }
            assert!(!l.wants(m, TIMED_MIN), "each message once");
        }
        out
    }

    #[test]
    fn the_fastest_load_of_a_window_decides_with_hysteresis() {
        let mut l = LineTime::default();
        // close: 60 ns at best, whatever the rest of the window
        assert_eq!(window(&mut l, 0, |m| if m == 7 { 120 } else { 900 }).map(|v| v.0), Some(NEAR));
        // far: 200 ns at best
        let (v, ns) = window(&mut l, 100, |m| 400 + m % 5).unwrap();
        assert!(v == FAR && (ns - 200.0).abs() < 0.01, "{v} {ns}");
        // in between (90 ns): no change; then close again, and in between again
        assert_eq!(window(&mut l, 200, |_| 180), None);
        assert_eq!(window(&mut l, 300, |_| 100).map(|v| v.0), Some(NEAR));
        assert_eq!(window(&mut l, 400, |_| 180), None);
    }

    #[test]
    fn far_apart_the_sender_forwards_but_for_one_message_in_a_few() {
        let asked = std::cell::Cell::new(0);
        assert!(!forward_now(UNKNOWN, &asked) && !forward_now(NEAR, &asked));
        let through_slots = (0..PROBE_EVERY * 4).filter(|_| !forward_now(FAR, &asked)).count();
        assert_eq!(through_slots, 4);
        assert!(!forward_now(NEAR, &asked));
    }

    #[test]
    fn small_messages_and_a_clock_without_a_rate_give_no_verdict() {
        let mut l = LineTime::default();
        assert!(!l.wants(1, TIMED_MIN - 1));
        for m in 0..u64::from(WINDOW) * 3 {
            assert_eq!(l.timed(m, Some(1000), || None), None);
            assert_eq!(l.timed(m, None, || Some(1.0)), None);
        }
        assert_eq!(l.verdict, UNKNOWN);
    }
}
