//! Fault tolerance and elasticity: revoke, shrink, grow, suspend and resume
//! (`ncclCommRevoke`, `ncclCommShrink`, `ncclCommGetUniqueId` + `ncclCommGrow`,
//! `ncclCommSuspend` / `ncclCommResume`).

use super::{check_rank, check_state, Communicator};
use crate::bootstrap::{self, UniqueId};
use crate::config::Config;
use crate::runtime::WaitFor;
use crate::{Error, Result};
use oxccl_transport::Cause;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What [`Communicator::shrink`] does with operations still outstanding on the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShrinkMode {
    /// `NCCL_SHRINK_DEFAULT`: nothing may be outstanding; the parent stays usable.
    #[default]
    Default,
    /// `NCCL_SHRINK_ABORT`: revoke the parent first (what is outstanding fails), then shrink.
    /// For a communicator that lost a rank, even in the middle of a collective.
    Abort,
}

const SHRINK: WaitFor<'static> = WaitFor {
    stage: "shrink",
    to: "call shrink",
    before: "before calling shrink",
    what: "ncclCommShrink",
    revocable: false,
};
const GROW: WaitFor<'static> = WaitFor {
    stage: "grow",
    to: "make the grow id",
    before: "before making the grow id",
    what: "ncclCommGrow",
    revocable: false,
};

fn list(ranks: &[usize]) -> String {
    ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
}

impl Communicator {
    /// Revoke (`ncclCommRevoke`): stop every operation of this communicator on this rank. A
    /// blocking call in another thread returns an error within a poll interval, queued
    /// non-blocking ones fail, and the connections close (peers waiting on this rank fail at
    /// once). Afterwards operations are refused ([`Cause::Revoked`]); destroy, split and shrink
    /// work. Local: the peers need not be alive. [`Communicator::quiescent`] says when nothing
    /// runs any more.
    pub fn revoke(&self) {
        self.sh.revoke()
    }

    /// Whether [`Communicator::revoke`] was called.
    pub fn revoked(&self) -> bool {
        self.sh.revoked.load(Ordering::SeqCst)
    }

    /// No operation of this communicator runs on this rank: no blocking call in any thread, and
    /// nothing queued.
    pub fn quiescent(&self) -> bool {
        self.sh.quiescent()
    }

    /// Shrink (`ncclCommShrink`): a new communicator of every rank not in `exclude`, renumbered
    /// in order. Only those survivors call it, with the same list. It needs no new unique id: it
    /// meets in the parent's store. A survivor that died is named at once, one that never comes
    /// at the timeout, and survivors with different lists fail on both sides ([`Cause::Mismatch`]).
    pub fn shrink(&self, exclude: &[usize], mode: ShrinkMode) -> Result<Communicator> {
        let sh = &self.sh;
        let (n, me) = (sh.nranks, sh.rank);
        let bad = |m: String| Err(Error::invalid_argument(format!("shrink: {m}")).with_rank(me).with_op("shrink"));
        let mut ex = exclude.to_vec();
        ex.sort_unstable();
        if let Some(r) = ex.iter().find(|&&r| r >= n) {
            return bad(format!("rank {r} of the exclude list is out of range (communicator of {n} ranks)"));
        }
        if let Some(w) = ex.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("rank {} is listed twice in the exclude list", w[0]));
        }
        if ex.contains(&me) {
            return bad(format!("rank {me} is in its own exclude list: only the ranks that stay call shrink"));
        }
        if sh.aborted.load(Ordering::SeqCst) {
            return Err(Error::comm_aborted().with_rank(me));
        }
        match mode {
            ShrinkMode::Abort => {
                sh.revoke();
                sh.wait_quiescent(sh.cfg.timeout)?;
            }
            ShrinkMode::Default if !sh.quiescent() => {
                return Err(Error::invalid_usage(
                    "shrink: operations are outstanding on the communicator (NCCL_SHRINK_DEFAULT needs none; \
                     NCCL_SHRINK_ABORT aborts them first)",
                )
                .with_rank(me));
            }
            ShrinkMode::Default => {}
        }
        let _busy = self.enter()?;
        let k = {
            let mut st = sh.state.lock().unwrap();
            st.splits += 1;
            st.splits
        };
        let base = format!("{}/shrink{k}", sh.prefix);
        let members: Vec<usize> = (0..n).filter(|r| !ex.contains(r)).collect();
        let mine = list(&ex);
        let same = |m: usize, r: &[u8]| {
            match r == mine.as_bytes() {
            true => Ok(()),
            false => Err(Error::invalid_usage(format!(
                "shrink: rank {m} excludes [{}] but rank {me} excludes [{mine}]: every rank that stays must pass the same list",
                String::from_utf8_lossy(r)
            ))
            .with_rank(me)
            .with_peer(m)
            .with_cause(Cause::Mismatch)),
        }
        };
        sh.gather_records(&base, mine.as_bytes(), &members, &SHRINK, &same)?;
        let t0 = Instant::now();
        let c = self.subset(&members, format!("{base}/c"))?;
        tracing::info!(
            rank = me,
            "shrunk to {} ranks (excluded [{mine}]) in {:.1} ms",
            members.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(c)
    }

    /// The id of a grow (`ncclCommGetUniqueId`): one existing rank makes it and hands it to the
    /// newcomers; the other existing ranks pass `None` to [`Communicator::grow`] and find it in
    /// the communicator's store. Its rendezvous is served by this process. Single-use: a second
    /// id before the grow completed is an error, on this rank or any other.
    pub fn grow_id(&self) -> Result<UniqueId> {
        let sh = &self.sh;
        let _busy = self.enter()?;
        let g = self.next_grow()?;
        let base = format!("{}/grow{g}", sh.prefix);
        let made = sh.store.add(&format!("{base}/made"), 1).map_err(|e| sh.store_error(e, &GROW))?;
        if made != 1 {
            return Err(Error::invalid_usage(
                "a grow id was already made for this grow and the grow has not completed: ids are single-use",
            )
            .with_rank(sh.rank));
        }
        let id = UniqueId::with_config(&sh.cfg)?;
        sh.store.set(&format!("{base}/id"), &id.0).map_err(|e| sh.store_error(e, &GROW))?;
        sh.state.lock().unwrap().grow_id = Some(id);
        Ok(id)
    }

    /// Grow (`ncclCommGrow`) to `nranks` ranks, as an existing member: this rank keeps its
    /// number, and the newcomers ([`Communicator::join_grow`]) take the ranks from
    /// [`Communicator::size`] up. `id` is the one [`Communicator::grow_id`] made, or `None` to
    /// read it from the store. Every existing rank calls it. The parent stays usable.
    pub fn grow(&self, nranks: usize, id: Option<&UniqueId>) -> Result<Communicator> {
        let sh = &self.sh;
        let _busy = self.enter()?;
        let g = self.next_grow()?;
        if nranks <= sh.nranks {
            return Err(Error::invalid_argument(format!(
                "grow to {nranks} ranks: must be more than the communicator's {}",
                sh.nranks
            ))
            .with_rank(sh.rank));
        }
        let id = match id {
            Some(id) => *id,
            None => self.find_grow_id(g)?,
        };
        let maker = sh.state.lock().unwrap().grow_id == Some(id);
        let res = Self::grow_join(&id, nranks, sh.rank, Some((sh.nranks, maker)), sh.cfg.clone());
        let mut st = sh.state.lock().unwrap();
        st.grows = g;
        st.grow_id = None;
        res
    }

    /// The number of the next grow, on a communicator that can run one.
    fn next_grow(&self) -> Result<u64> {
        let st = self.sh.state.lock().unwrap();
        check_state(&self.sh, &st)?;
        Ok(st.grows + 1)
    }

    /// The id of grow `g`, published by the rank that made it.
    fn find_grow_id(&self, g: u64) -> Result<UniqueId> {
        let sh = &self.sh;
        let key = format!("{}/grow{g}/id", sh.prefix);
        let deadline = Instant::now() + sh.cfg.timeout;
        loop {
            if sh.stopped() {
                return Err(sh.stop_error());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match sh.store.get(&key, left.min(Duration::from_millis(500))) {
                Ok(v) if v.len() == bootstrap::UNIQUE_ID_BYTES => {
                    let mut id = UniqueId([0; bootstrap::UNIQUE_ID_BYTES]);
                    id.0.copy_from_slice(&v);
                    return Ok(id);
                }
                Ok(_) => return Err(Error::remote("grow: malformed grow id in the store").with_rank(sh.rank)),
                Err(e) if e.kind == crate::ErrorKind::Timeout && !left.is_zero() => continue,
                Err(e) if e.kind == crate::ErrorKind::Timeout => {
                    return Err(Error::timeout(format!(
                        "grow: no rank made a grow id (ncclCommGetUniqueId) within {:.1} s",
                        sh.cfg.timeout.as_secs_f64()
                    ))
                    .with_rank(sh.rank))
                }
                Err(e) => return Err(sh.store_error(e, &GROW)),
            }
        }
    }

    /// Join a grow as a newcomer (`ncclCommGrow` with no communicator): `id` from the member that
    /// made it, `rank` one of the new ranks (from the old size up to `nranks - 1`).
    pub fn join_grow(id: &UniqueId, nranks: usize, rank: usize) -> Result<Communicator> {
        Self::join_grow_with_config(id, nranks, rank, Config::from_env())
    }

    /// [`Communicator::join_grow`] with explicit settings.
    pub fn join_grow_with_config(id: &UniqueId, nranks: usize, rank: usize, cfg: Config) -> Result<Communicator> {
        Self::grow_join(id, nranks, rank, None, cfg)
    }

    /// Join grow `id`; `old` is (the old size, whether this rank made the id) for a member.
    fn grow_join(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        old: Option<(usize, bool)>,
        cfg: Config,
    ) -> Result<Communicator> {
        check_rank(nranks, rank)?;
        id.validate().map_err(|e| e.with_rank(rank))?;
        // the store's server, in the maker's process, is owned by the maker's new communicator
        // (a newcomer thread of that process must not take it)
        let maker = old.is_some_and(|o| o.1);
        let rdv = bootstrap::from_unique_id_owning(id, &cfg, maker).map_err(|e| e.with_rank(rank))?;
        let p = rdv.prefix.clone();
        let used = || {
            Error::invalid_usage("grow: this grow id was used already (ids are single-use: make a new one)")
                .with_rank(rank)
        };
        let done = rdv.store.check(&[format!("{p}/grow-done")])?;
        match old {
            Some(_) if done => return Err(used()),
            Some((n, _)) => rdv.store.set(&format!("{p}/grow-old"), n.to_string().as_bytes())?,
            None => {
                // the members record the old size before any of them finishes, so a spent id
                // still has it: a newcomer claiming a member's rank hears that whatever the timing
                let v = rdv.store.get(&format!("{p}/grow-old"), cfg.timeout).map_err(|e| {
                    e.with_rank(rank).with_op("grow: waiting for the existing ranks to call ncclCommGrow")
                })?;
                let n: usize =
                    String::from_utf8_lossy(&v).parse().map_err(|_| Error::remote("grow: malformed record"))?;
                if rank < n {
                    return Err(Error::invalid_argument(format!(
                        "grow: rank {rank} belongs to an existing member; a newcomer takes a rank from {n} to {}",
                        nranks - 1
                    ))
                    .with_rank(rank));
                }
                if done || rdv.store.check(&[format!("{p}/grow-done")])? {
                    return Err(used());
                }
            }
        }
        let store = rdv.store.clone();
        let t0 = Instant::now();
        let c = Self::join(rdv, nranks, rank, cfg)?;
        let _ = store.set(&format!("{p}/grow-done"), b"1");
        tracing::info!(rank, "grown to {nranks} ranks in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        Ok(c)
    }

    /// Suspend (`ncclCommSuspend`): finish what is queued, then release every connection and
    /// its memory (shared-memory rings, socket buffers, RDMA rings and registrations).
    /// Operations are refused ([`Cause::Suspended`]) until [`Communicator::resume`]. Every rank
    /// suspends before any uses the communicator again; connections are made anew, lazily.
    pub fn suspend(&self) -> Result<()> {
        let sh = &self.sh;
        let _busy = self.enter()?;
        check_state(sh, &sh.state.lock().unwrap())?;
        sh.wait_async_idle();
        sh.close_conns(false);
        sh.state.lock().unwrap().suspended = true;
        Ok(())
    }

    /// Resume after [`Communicator::suspend`] (`ncclCommResume`); connections are made again by
    /// the operations that need them.
    pub fn resume(&self) -> Result<()> {
        let _busy = self.enter()?;
        let mut st = self.sh.state.lock().unwrap();
        if !st.suspended {
            return Err(Error::invalid_usage("resume: the communicator is not suspended").with_rank(self.sh.rank));
        }
        st.suspended = false;
        Ok(())
    }

    /// Whether the communicator is suspended.
    pub fn suspended(&self) -> bool {
        self.sh.state.lock().unwrap().suspended
    }
}
