//! Straggler detection from arrival times, with no extra messages.
//!
//! A peer's first message of an operation tells when that peer entered it only when the peer
//! sent it before receiving anything (ring's first step, recursive doubling's first partner, a
//! tree's leaves): later messages also carry the waits of whoever the peer waited for. Each
//! schedule lists such "clean" peers (`Schedule::clean_peers`, from the peers'
//! own schedules, once per cached schedule). When an operation had to wait for a clean peer's
//! first message, the lag is the time from this rank's entry to that message; the clean peer
//! whose message came last, when past [`LATE_MIN`], was the operation's last to arrive. A
//! window of operations gives, per peer, how often it was last and its median lag.
//!
//! Each rank sees its clean peers only (its left neighbour in a ring, its first partner in
//! recursive doubling); `oxccl-perf --status` adds up every rank's view.

use std::time::Duration;

/// An operation's latest clean peer counts as late (last to arrive) only past this lag (the
/// default of [`crate::watch::Settings::straggler_min`]): below it, arrival order is mostly the
/// previous operation's completion order (a ring's ranks leave it a step apart) and scheduling
/// noise.
pub const LATE_MIN: Duration = Duration::from_millis(1);

/// Lags kept per peer and window for the median.
const SAMPLES: usize = 512;

/// One peer's lateness over a window, as one rank saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLateness {
    /// The peer.
    pub peer: usize,
    /// Operations in which its first message was timed (it was a clean peer).
    pub observed: u64,
    /// Of those, the ones in which it was last to arrive, past [`LATE_MIN`].
    pub last: u64,
    /// Median lag of those (from this rank's entry to its first message).
    pub median_lag: Duration,
}

/// A window of operations' lateness, as one rank saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lateness {
    /// Operations in the window (collectives that completed).
    pub ops: u64,
    /// The peers timed in it, by rank.
    pub peers: Vec<PeerLateness>,
}

/// The rank most often last to arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Straggler {
    /// Its rank.
    pub rank: usize,
    /// Operations in which it was last.
    pub last: u64,
    /// Operations in which its arrival was timed.
    pub observed: u64,
    /// Its median lag when last.
    pub median_lag: Duration,
}

impl std::fmt::Display for Straggler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} was last to arrive in {:.0}% of the last {} operations, median lag {:.1} ms",
            self.rank,
            100.0 * self.last as f64 / self.observed.max(1) as f64,
            self.observed,
            self.median_lag.as_secs_f64() * 1e3
        )
    }
}

impl Lateness {
    /// Per peer: (peer, last, observed, median lag µs), as status records carry it.
    pub(crate) fn view(&self) -> Vec<(usize, u64, u64, u64)> {
        self.peers.iter().map(|p| (p.peer, p.last, p.observed, p.median_lag.as_micros() as u64)).collect()
    }

    /// The peer last in at least half of the operations that timed it (and in at least 3), the
    /// one most often last if several are.
    pub fn straggler(&self) -> Option<Straggler> {
        self.peers
            .iter()
            .filter(|p| p.last >= 3 && 2 * p.last >= p.observed)
            .max_by_key(|p| (p.last, p.median_lag))
            .map(|p| Straggler { rank: p.peer, last: p.last, observed: p.observed, median_lag: p.median_lag })
    }
}

impl PeerLateness {
    /// A peer's lateness from its counts and its lags in µs (reordered, for the median).
    fn from_lags(peer: usize, observed: u64, last: u64, lags_us: &mut [u64]) -> PeerLateness {
        lags_us.sort_unstable();
        let median = lags_us.get(lags_us.len() / 2).copied().unwrap_or(0);
        PeerLateness { peer, observed, last, median_lag: Duration::from_micros(median) }
    }
}

/// Several ranks' views added up, in a communicator of `n` ranks: per peer, the counts summed
/// and the median of the views' median lags. A view lists (peer, last, observed, median lag
/// µs), as status records carry it.
pub fn added_up<'a>(n: usize, views: impl IntoIterator<Item = &'a [(usize, u64, u64, u64)]>) -> Lateness {
    let (mut last, mut seen, mut lags) = (vec![0u64; n], vec![0u64; n], vec![Vec::new(); n]);
    for view in views {
        for &(p, l, o, us) in view.iter().filter(|x| x.0 < n) {
            last[p] += l;
            seen[p] += o;
            if l > 0 {
                lags[p].push(us);
            }
        }
    }
    let peers = (0..n).filter(|&p| seen[p] > 0).map(|p| PeerLateness::from_lags(p, seen[p], last[p], &mut lags[p]));
    Lateness { ops: 0, peers: peers.collect() }
}

/// The counters of the window in progress, and the last full window.
pub(crate) struct Tracker {
    window: u64,
    min: Duration,
    ops: u64,
    observed: Vec<u64>,
    last: Vec<u64>,
    lags: Vec<Vec<u32>>,
    full: Option<Lateness>,
}

impl Tracker {
    /// Windows of `window` operations (0: off) in a communicator of `nranks`; lags from `min`
    /// count as late.
    pub(crate) fn new(nranks: usize, window: u64, min: Duration) -> Tracker {
        Tracker {
            window,
            min,
            ops: 0,
            observed: vec![0; nranks],
            last: vec![0; nranks],
            lags: vec![Vec::new(); nranks],
            full: None,
        }
    }

    /// One completed collective: its clean peers, and the one whose first message came last
    /// after a wait, with its lag. Returns the window it completed, if it did.
    pub(crate) fn observe(&mut self, clean: &[usize], latest: Option<(usize, Duration)>) -> Option<Lateness> {
        if self.window == 0 {
            return None;
        }
        self.ops += 1;
        for &p in clean {
            self.observed[p] += 1;
        }
        if let Some((p, lag)) = latest.filter(|(_, lag)| *lag >= self.min) {
            self.last[p] += 1;
            let us = lag.as_micros().min(u32::MAX as u128) as u32;
            let v = &mut self.lags[p];
            match v.len() < SAMPLES {
                true => v.push(us),
                false => v[(self.last[p] as usize) % SAMPLES] = us,
            }
        }
        if self.ops < self.window {
            return None;
        }
        let full = self.snapshot();
        self.ops = 0;
        self.observed.iter_mut().for_each(|x| *x = 0);
        self.last.iter_mut().for_each(|x| *x = 0);
        self.lags.iter_mut().for_each(Vec::clear);
        self.full = Some(full.clone());
        Some(full)
    }

    /// The window in progress.
    fn snapshot(&self) -> Lateness {
        let peers = (0..self.observed.len())
            .filter(|&p| self.observed[p] > 0)
            .map(|p| {
                let mut lags: Vec<u64> = self.lags[p].iter().map(|&us| us as u64).collect();
                PeerLateness::from_lags(p, self.observed[p], self.last[p], &mut lags)
            })
            .collect();
        Lateness { ops: self.ops, peers }
    }

    /// The last full window, or the one in progress before the first is full.
    pub(crate) fn report(&self) -> Lateness {
        self.full.clone().unwrap_or_else(|| self.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_mostly_last_is_named_and_no_other() {
        let mut t = Tracker::new(4, 10, LATE_MIN);
        let ms = Duration::from_millis;
        for i in 0..10 {
            // rank 3 late 8 times in 10 (5 ms); rank 1 late twice, briefly; rank 2 never past LATE_MIN
            let latest = if i < 8 { (3, ms(5)) } else { (1, ms(2)) };
            let done = t.observe(&[1, 3], Some(latest));
            assert_eq!(done.is_some(), i == 9);
        }
        let r = t.report();
        assert_eq!(r.ops, 10);
        let s = r.straggler().expect("rank 3 named");
        assert_eq!((s.rank, s.last, s.observed, s.median_lag), (3, 8, 10, ms(5)));
        assert!(s
            .to_string()
            .starts_with("rank 3 was last to arrive in 80% of the last 10 operations, median lag 5.0"));
        // below LATE_MIN nobody is named
        let mut t = Tracker::new(2, 5, LATE_MIN);
        for _ in 0..5 {
            t.observe(&[1], Some((1, Duration::from_micros(500))));
        }
        assert_eq!(t.report().straggler(), None);
        assert_eq!(t.report().peers, vec![PeerLateness { peer: 1, observed: 5, last: 0, median_lag: Duration::ZERO }]);
    }

    #[test]
    fn off_counts_nothing() {
        let mut t = Tracker::new(2, 0, LATE_MIN);
        assert!(t.observe(&[1], Some((1, Duration::from_secs(1)))).is_none());
        assert_eq!(t.report(), Lateness::default());
    }
}
