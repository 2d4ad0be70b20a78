//! What an operation notes for watching (`src/watch`): how long it waited for each peer's
//! messages, when its clean peers' first messages came, and, when tracing, its steps. Off the
//! fast path: the clock is read only when a message comes after a wait (and per step when
//! tracing).

use crate::watch::trace::StepSpan;
use smallvec::SmallVec;
use std::time::{Duration, Instant};

/// An operation's notes.
#[derive(Debug, Default)]
pub struct Observe {
    /// When it was entered (`None`: nothing is noted).
    pub entered: Option<Instant>,
    /// The peer whose message it is waiting for, since when.
    waiting: Option<(usize, Instant)>,
    /// Time waited per peer (peer, ns).
    pub waits: SmallVec<[(u32, u64); 2]>,
    /// The clean peer whose first message came last after a wait, and its lag from entry.
    pub latest: Option<(usize, Duration)>,
    /// The steps so far, and when the current one was first tried (tracing only).
    pub steps: Option<Box<(Vec<StepSpan>, Option<Instant>)>>,
}

impl Observe {
    /// Notes from `entered` on; steps too if tracing is on.
    pub fn new(entered: Instant) -> Observe {
        let steps = crate::watch::trace::enabled().then(|| Box::new((Vec::new(), None)));
        Observe { entered: Some(entered), steps, ..Default::default() }
    }

    /// The op found no message from `peer`.
    #[inline]
    pub(crate) fn blocked_on(&mut self, peer: usize) {
        if self.entered.is_some() && self.waiting.is_none_or(|(p, _)| p != peer) {
            self.waiting = Some((peer, Instant::now()));
        }
    }

    /// Whether the op waits for a message from `peer` (then call [`Observe::received`] when
    /// it is taken).
    #[inline]
    pub(crate) fn waits_for(&self, peer: usize) -> bool {
        self.waiting.is_some_and(|(p, _)| p == peer)
    }

    /// The message from `peer` it waited for was taken; `first_clean`: its first of the op,
    /// from a clean peer.
    pub(crate) fn received(&mut self, peer: usize, first_clean: bool) {
        let Some((_, since)) = self.waiting.take() else { return };
        let now = Instant::now();
        let ns = now.saturating_duration_since(since).as_nanos() as u64;
        match self.waits.iter_mut().find(|w| w.0 as usize == peer) {
            Some(w) => w.1 += ns,
            None => self.waits.push((peer as u32, ns)),
        }
        if let (true, Some(e)) = (first_clean, self.entered) {
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

    /// Step `pc` ran (tracing).
    #[inline]
    pub(crate) fn step_done(&mut self, pc: usize, step: &crate::schedule::Step, bytes: usize) {
        if let Some(s) = self.steps.as_deref_mut() {
            let end = Instant::now();
            let start = s.1.take().unwrap_or(end);
            let (recv, send) = (step.recv.map(|p| p as u32), step.send.map(|p| p as u32));
            s.0.push(StepSpan { pc: pc as u32, recv, send, bytes: bytes as u64, start, end });
        }
    }
}
