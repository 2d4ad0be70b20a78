//! A cheap clock for the per-operation times of small calls: [`now`] gives a
//! [`std::time::Instant`] from the CPU's time-stamp counter, without `clock_gettime`.
//!
//! `clock_gettime` reads the same counter, but fenced (`lfence; rdtsc`), so each reading waits
//! for every earlier load to finish. Right after a small collective polled its peer's cache
//! line, that is a cross-core miss: the two readings an 8 B all-reduce takes (entry, end) were
//! 14% of its samples under `perf` (bench/RESULTS.md). A plain `rdtsc` does not wait.
//!
//! Each thread converts counter ticks to time from an anchor, a pair (`Instant::now()`, ticks)
//! read together, at a rate measured from the process's first reading to the anchor. The
//! anchor is renewed once it is 1/16 of that baseline old (at most [`MAX_SPAN`]), so an
//! extrapolation never runs longer than a sixteenth of what measured its rate. Until the
//! baseline is [`MIN_BASELINE`] long (it starts at [`start`], or else at the first [`now`]), and wherever the kernel does not itself keep time by the
//! counter (its clock source is not `tsc`: the counter may differ between cores or stop in
//! sleep), [`now`] is `Instant::now()`. Readings may step back at a renewal by the estimate's
//! error (nanoseconds): take differences with `saturating_duration_since`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shortest baseline a rate is measured over. The error of a rate is the error of the two
/// readings it spans over the baseline's length, and an anchor is extrapolated over a
/// sixteenth of that length, so the error of a time is a sixteenth of the readings' error
/// whatever the baseline.
pub const MIN_BASELINE: Duration = Duration::from_micros(100);
/// The longest an anchor is extrapolated.
pub const MAX_SPAN: Duration = Duration::from_millis(50);

/// The process's first reading (`None`: the counter is not used).
static BASE: OnceLock<Option<(Instant, u64)>> = OnceLock::new();

thread_local! {
    static ANCHOR: Cell<Option<Anchor>> = const { Cell::new(None) };
}

/// A thread's anchor: time `at` was counter value `tsc`; `mult` is nanoseconds per tick in
/// 32.32 fixed point, valid for `span` ticks.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    at: Instant,
    tsc: u64,
    span: u64,
    mult: u64,
}

impl Anchor {
    /// The anchor (`at`, `tsc`) with its rate measured from `base`, or `None` while the
    /// baseline is shorter than [`MIN_BASELINE`].
    fn new(base: (Instant, u64), at: Instant, tsc: u64) -> Option<Anchor> {
        let since = at.checked_duration_since(base.0)?;
        let ticks = tsc.checked_sub(base.1).filter(|&t| t > 0)?;
        if since < MIN_BASELINE {
            return None;
        }
        let mult = u64::try_from((since.as_nanos() << 32) / u128::from(ticks)).ok().filter(|&m| m > 0)?;
        let cap = u64::try_from((MAX_SPAN.as_nanos() << 32) / u128::from(mult)).unwrap_or(u64::MAX);
        let span = (ticks / 16).min(cap).min(u64::MAX / mult);
        Some(Anchor { at, tsc, span, mult })
    }

    /// The time at counter value `t`, if within the anchor's span.
    #[inline]
    fn time(&self, t: u64) -> Option<Instant> {
        let d = t.wrapping_sub(self.tsc);
        (d < self.span).then(|| self.at + Duration::from_nanos((d * self.mult) >> 32))
    }
}

/// Take the process's first reading, if not taken yet: the rate is measured from it, and
/// [`now`] is `Instant::now()` until [`MIN_BASELINE`] after it. Call it early (oxccl does at
/// communicator set-up), so that a short job's calls are already timed by the counter.
pub fn start() {
    BASE.get_or_init(first);
}

/// From here on, [`now`] is `Instant::now()` in this process: for a caller that compares its
/// readings with `Instant::now()`'s to the nanosecond (a trace of operations and their steps),
/// which the counter's estimate (tens of nanoseconds off) would not match.
pub fn precise() {
    PRECISE.store(true, Ordering::Relaxed);
}

static PRECISE: AtomicBool = AtomicBool::new(false);

/// Now, from the time-stamp counter where the kernel keeps time by it, else `Instant::now()`.
#[inline]
pub fn now() -> Instant {
    if PRECISE.load(Ordering::Relaxed) {
        return Instant::now();
    }
    let Some(base) = *BASE.get_or_init(first) else { return Instant::now() };
    let t = tsc::read();
    ANCHOR.with(|a| match a.get().and_then(|x| x.time(t)) {
        Some(at) => at,
        None => renew(a, base),
    })
}

/// Counter ticks that `f` took, with the counter read in order with the instructions around it
/// (`lfence` before the first reading, `rdtscp` after `f`'s loads have completed): for timing a
/// single memory access. `None` where the counter is not used.
#[inline]
pub fn time(f: impl FnOnce()) -> Option<u64> {
    (*BASE.get_or_init(first))?;
    let t0 = tsc::read_fenced();
    f();
    Some(tsc::read_after().wrapping_sub(t0))
}

/// Counter ticks per nanosecond, measured from the process's first reading; `None` where the
/// counter is not used or until that baseline is [`MIN_BASELINE`] long. It reads the system
/// clock: call it once and keep the value.
pub fn ticks_per_ns() -> Option<f64> {
    let base = (*BASE.get_or_init(first))?;
    let (at, t) = pair();
    let since = at.checked_duration_since(base.0).filter(|&d| d >= MIN_BASELINE)?;
    let ticks = t.checked_sub(base.1).filter(|&t| t > 0)?;
    Some(ticks as f64 / since.as_nanos() as f64)
}

/// A fresh anchor for this thread; returns the time it read.
#[cold]
fn renew(a: &Cell<Option<Anchor>>, base: (Instant, u64)) -> Instant {
    let (at, t) = pair();
    a.set(Anchor::new(base, at, t));
    at
}

/// `Instant::now()` and the counter read together: the counter's midpoint around the clock
/// reading, taken again (up to twice) if the two counter readings are far apart (the thread
/// was interrupted).
fn pair() -> (Instant, u64) {
    let mut best = None;
    for _ in 0..3 {
        let (t1, at, t2) = (tsc::read(), Instant::now(), tsc::read());
        let gap = t2.wrapping_sub(t1);
        if best.is_none_or(|(g, _, _)| gap < g) {
            best = Some((gap, at, t1 + gap / 2));
        }
        if gap < CLOSE {
            break;
        }
    }
    best.map(|(_, at, t)| (at, t)).unwrap_or_else(|| (Instant::now(), tsc::read()))
}

/// Counter ticks within which two readings count as together (about 4 µs at 2.5 GHz).
const CLOSE: u64 = 10_000;

/// The process's first reading, if the counter can be used.
fn first() -> Option<(Instant, u64)> {
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    let trusted = tsc::AVAILABLE && source.is_ok_and(|s| s.trim() == "tsc");
    trusted.then(pair)
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    pub const AVAILABLE: bool = true;

    /// The time-stamp counter, unfenced.
    #[inline]
    pub fn read() -> u64 {
        // SAFETY: rdtsc reads a register; it has no preconditions on x86-64 (the kernel leaves
        // it enabled for user space where its clock source is the counter, checked first).
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    /// The counter, read after every earlier instruction has completed and before any later
    /// one starts (`lfence; rdtsc; lfence`).
    #[inline]
    pub fn read_fenced() -> u64 {
        use std::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: lfence (SSE2, baseline on x86-64) and rdtsc have no preconditions.
        unsafe {
            _mm_lfence();
            let t = _rdtsc();
            _mm_lfence();
            t
        }
    }

    /// The counter, read once every earlier instruction (its loads included) has completed
    /// (`rdtscp`; later ones wait behind an `lfence`).
    #[inline]
    pub fn read_after() -> u64 {
        use std::arch::x86_64::{__rdtscp, _mm_lfence};
        let mut aux = 0u32;
        // SAFETY: rdtscp writes the processor id into `aux`, a valid u32; lfence has no
        // preconditions. Every x86-64 CPU with an invariant counter (which the kernel's `tsc`
        // clock source, checked before the counter is used, requires) has rdtscp.
        unsafe {
            let t = __rdtscp(&mut aux);
            _mm_lfence();
            t
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    pub const AVAILABLE: bool = false;
    pub fn read() -> u64 {
        0
    }
    pub fn read_fenced() -> u64 {
        0
    }
    pub fn read_after() -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_extrapolates_at_the_measured_rate_within_its_span() {
        let t0 = Instant::now();
        // 10 ms over 24,000,000 ticks: 2.4 ticks per ns
        let a = Anchor::new((t0, 1000), t0 + Duration::from_millis(10), 24_001_000).unwrap();
        let at = |ticks: u64| a.time(24_001_000 + ticks).map(|t| t.duration_since(t0).as_nanos() as i64);
        assert!((at(0).unwrap() - 10_000_000).abs() <= 1);
        assert!((at(1_200_000).unwrap() - 10_500_000).abs() <= 1);
        // a sixteenth of the baseline: 1,500,000 ticks
        assert!(at(1_499_999).is_some() && at(1_500_000).is_none());
        // a counter behind the anchor (another core's reading) is not extrapolated backwards
        assert!(a.time(24_000_999).is_none());
    }

    #[test]
    fn no_rate_from_a_short_baseline_or_a_counter_that_did_not_move() {
        let t0 = Instant::now();
        assert!(Anchor::new((t0, 0), t0 + Duration::from_micros(50), 120_000).is_none());
        assert!(Anchor::new((t0, 5), t0 + Duration::from_secs(1), 5).is_none());
        assert!(Anchor::new((t0, 5), t0 + Duration::from_secs(1), 4).is_none());
        // a long baseline: the span stops at MAX_SPAN
        let a = Anchor::new((t0, 0), t0 + Duration::from_secs(100), 240_000_000_000).unwrap();
        let end = a.time(a.tsc + a.span - 1).unwrap().duration_since(t0 + Duration::from_secs(100));
        assert!(end <= MAX_SPAN && end > MAX_SPAN - Duration::from_micros(1), "{end:?}");
    }

    #[test]
    fn the_rate_is_measured_where_the_counter_is_used() {
        start();
        std::thread::sleep(MIN_BASELINE * 2);
        let timed = time(|| std::thread::sleep(Duration::from_micros(1)));
        match (timed, ticks_per_ns()) {
            (Some(t), Some(r)) => {
                assert!(r > 0.05 && r < 20.0, "{r} ticks per ns");
                // a microsecond's sleep takes at least a microsecond's ticks
                assert!(t as f64 >= r * 1000.0, "{t} ticks");
            }
            (None, None) => {}
            other => panic!("counter and rate disagree: {other:?}"),
        }
    }

    #[test]
    fn now_follows_the_system_clock() {
        // (wherever the counter is used, after the baseline is long enough)
        let start = Instant::now();
        let mut worst = Duration::ZERO;
        while start.elapsed() < Duration::from_millis(120) {
            let (a, b, c) = (Instant::now(), now(), Instant::now());
            assert!(b + Duration::from_micros(200) >= a && b <= c + Duration::from_micros(200), "{a:?} {b:?} {c:?}");
            if start.elapsed() > MIN_BASELINE * 4 {
                worst = worst.max(b.saturating_duration_since(c).max(a.saturating_duration_since(b)));
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        assert!(worst < Duration::from_micros(200), "{worst:?}");
    }
}
