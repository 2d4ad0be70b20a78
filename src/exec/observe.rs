//! What an operation notes for watching (`src/watch`): how long it waited for each peer's
//! messages, when its clean peers' first messages came, and, when tracing, its steps. Off the
//! fast path: a wait is timed only once the engine has read the clock during it (after 64
//! passes of spinning, or at once when it does not spin), so a short wait, the common case for
//! small messages, reads no clock at all; a timed one reads it once more when its message comes
//! (and per step when tracing).

use crate::watch::trace::StepSpan;
use smallvec::SmallVec;
use std::time::{Duration, Instant};

/// An operation's notes.
#[derive(Debug, Default)]
pub struct Observe {
    /// When it was entered (`None`: nothing is noted).
    pub entered: Option<Instant>,
    /// The peer whose message it is waiting for, and the engine's first clock reading during
    /// the wait (`None`: a short wait so far, not timed).
    waiting: Option<(usize, Option<Instant>)>,
    /// Time waited per peer (peer, ns).
    pub waits: SmallVec<[(u32, u64); 2]>,
    /// The clean peer whose first message came last after a wait, and its lag from entry.
    pub latest: Option<(usize, Duration)>,
    /// The steps so far, and when the current one was first tried (tracing only).
    pub steps: Option<Box<(Vec<StepSpan>, Option<Instant>)>>,
    /// The caller's profiler tag (0: none).
    pub tag: u64,
    /// Whether the flight recorder has it yet: a lone blocking call is recorded only when it
    /// goes to the engine to wait, or when it ends.
    pub recorded: bool,
}

impl Observe {
    /// Notes from `entered` on; steps too if tracing is on.
    pub fn new(entered: Instant, tag: u64) -> Observe {
        let steps = crate::watch::trace::enabled().then(|| Box::new((Vec::new(), None)));
        Observe { entered: Some(entered), steps, tag, ..Default::default() }
    }

    /// The op found no message from `peer`.
    #[inline]
    pub(crate) fn blocked_on(&mut self, peer: usize) {
        if self.entered.is_some() && self.waiting.is_none_or(|(p, _)| p != peer) {
            self.waiting = Some((peer, None));
        }
    }

    /// The engine read the clock (`now`) while the op made no progress: its wait, if it has
    /// one, is timed from here.
    #[inline]
    pub(crate) fn idle_at(&mut self, now: Instant) {
        if let Some((_, since @ None)) = &mut self.waiting {
            *since = Some(now);
        }
    }

    /// Whether the op waits for a message from `peer` (then call [`Observe::received`] when
    /// it is taken).
    #[inline]
    pub(crate) fn waits_for(&self, peer: usize) -> bool {
        self.waiting.is_some_and(|(p, _)| p == peer)
    }

    /// The message from `peer` it waited for was taken; `first_clean`: whether it is its first
    /// of the op, from a clean peer (asked only of a timed wait).
    pub(crate) fn received(&mut self, peer: usize, first_clean: impl FnOnce() -> bool) {
        let Some((_, Some(since))) = self.waiting.take() else { return };
        let now = Instant::now();
        let ns = now.saturating_duration_since(since).as_nanos() as u64;
        match self.waits.iter_mut().find(|w| w.0 as usize == peer) {
            Some(w) => w.1 += ns,
            None => self.waits.push((peer as u32, ns)),
        }
        if let (Some(e), true) = (self.entered, first_clean()) {
            let lag = now.saturating_duration_since(e);
            if self.latest.is_none_or(|(_, l)| lag > l) {
                self.latest = Some((peer, lag));
            }
        }
    }

    /// Step `pc` is being tried (tracing).
    #[inline]
    pub(crate) fn step_try(&mut self) {
        if let Some(s) = self.steps.as_deref_mut() {
            s.1.get_or_insert_with(Instant::now);
        }
    }

    /// Step `pc` ran (tracing; `es`: the element size).
    #[inline]
    pub(crate) fn step_done(&mut self, pc: usize, step: &crate::schedule::Step, es: usize) {
        if let Some(s) = self.steps.as_deref_mut() {
            let end = Instant::now();
            let start = s.1.take().unwrap_or(end);
            let (recv, send) = (step.recv.map(|p| p as u32), step.send.map(|p| p as u32));
            s.0.push(StepSpan { pc: pc as u32, recv, send, bytes: (step.count * es) as u64, start, end });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_timed_only_once_the_engine_read_the_clock_in_it() {
        let entered = Instant::now();
        let mut o = Observe::new(entered, 0);
        // a short wait: no clock reading during it, nothing timed, no lag
        o.blocked_on(1);
        assert!(o.waits_for(1) && !o.waits_for(2));
        o.received(1, || panic!("asked only of a timed wait"));
        assert!(o.waits.is_empty() && o.latest.is_none() && !o.waits_for(1));
        // a long one: timed from the engine's reading, its lag from entry
        o.blocked_on(2);
        let read = Instant::now();
        o.idle_at(read);
        o.idle_at(read + Duration::from_secs(1)); // (the first reading of the spell counts)
        std::thread::sleep(Duration::from_millis(2));
        o.received(2, || true);
        let (peer, lag) = o.latest.unwrap();
        assert_eq!(peer, 2);
        assert!(lag >= Duration::from_millis(2));
        assert_eq!(o.waits.len(), 1);
        assert!(o.waits[0].0 == 2 && o.waits[0].1 >= 2_000_000 && o.waits[0].1 <= lag.as_nanos() as u64);
        // a reading while not waiting starts nothing
        o.idle_at(Instant::now());
        o.received(2, || true);
        assert_eq!(o.waits.len(), 1);
        // an op that notes nothing
        let mut off = Observe::default();
        off.blocked_on(1);
        off.idle_at(Instant::now());
        off.received(1, || true);
        assert!(off.waits.is_empty() && off.latest.is_none());
    }
}
