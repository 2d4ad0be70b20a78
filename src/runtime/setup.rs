//! Connection setup: tagged setup blobs, store waits that detect mismatches and dead peers,
//! and the three phases every communicator of a group runs in lock step.

use super::*;
use crate::schedule::Fingerprint;
use crate::{Error, Result};
use oxccl_transport::{Cause, Transport};
use std::time::Instant;

/// A setup blob as published: the transport's name (one length byte, then the name), then the
/// transport's own blob, so a sender that picked another transport for the pair says so.
pub(crate) fn tag_blob(name: &str, blob: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(1 + name.len() + blob.len());
    b.push(name.len() as u8);
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(blob);
    b
}

/// The store key of a pair's setup blob (`kind` "conn") or the sender's acknowledgement ("ack"),
/// for messages from rank `a` to rank `b`.
pub(crate) fn conn_key(prefix: &str, kind: &str, a: usize, b: usize) -> String {
    format!("{prefix}/{kind}/{a}->{b}")
}

/// The transport name and the blob of a tagged setup blob; `None` if truncated.
pub(crate) fn untag_blob(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = *b.first()? as usize;
    let name = b.get(1..1 + n)?;
    Some((name, &b[1 + n..]))
}

/// What a store wait is for, in its messages: "{stage}: rank 3 waiting for rank 1 to {to}",
/// "{stage}: rank 1 died, {before}".
#[derive(Clone, Copy)]
pub(crate) struct WaitFor<'a> {
    pub(crate) stage: &'a str,
    pub(crate) to: &'a str,
    pub(crate) before: &'a str,
    /// What the wait is for, when it is not a collective.
    pub(crate) what: &'a str,
    /// Whether revoke ends the wait (it does for an operation's connection setup; membership
    /// changes such as shrink run on revoked communicators).
    pub(crate) revocable: bool,
}

/// Connection setup's wording.
pub(crate) const CONNECTING: WaitFor<'static> = WaitFor {
    stage: "connection setup",
    to: "connect",
    before: "before connecting",
    what: "its first operation",
    revocable: true,
};

impl Shared {
    /// The first transport of the list that connects this rank to `peer`.
    pub(crate) fn transport_for<'s>(&self, st: &'s State, peer: usize) -> &'s dyn Transport {
        let (me, p) = (&self.peers[self.rank], &self.peers[peer]);
        let t = st.transports.iter().find(|t| t.can_connect(me, p)).expect("the last transport connects any pair");
        &**t
    }

    /// Wait for a store key in short slices, so abort and the deadline are noticed. With
    /// `doing` (this rank's collective as (sequence number, description)), each slice that ends
    /// without the key also compares with what the peer published: the same sequence number with
    /// another call, or a peer already past it, is a mismatch, reported at once.
    pub(crate) fn wait_key(
        &self,
        key: &str,
        deadline: Instant,
        peer: usize,
        doing: Option<&(u64, String)>,
    ) -> Result<Vec<u8>> {
        self.wait_key_for(key, deadline, peer, doing, &CONNECTING)
    }

    /// The value of `key` if it is in the store now (a short, bounded look).
    fn published(&self, key: &str) -> Option<Vec<u8>> {
        self.store.check(&[key.to_string()]).ok()?.then_some(())?;
        self.store.get(key, std::time::Duration::from_millis(200)).ok()
    }

    /// [`Shared::wait_key`] for another stage than connection setup (the wording of its messages).
    pub(crate) fn wait_key_for(
        &self,
        key: &str,
        deadline: Instant,
        peer: usize,
        doing: Option<&(u64, String)>,
        why: &WaitFor<'_>,
    ) -> Result<Vec<u8>> {
        let WaitFor { stage, to, before, what, revocable } = *why;
        let started = Instant::now();
        let mut next_report = self.cfg.wait_report.map(|r| started + r);
        let mut watch = crate::beacon::Watch::default();
        let what = doing.map_or_else(|| what.to_string(), |(s, w)| format!("{w} #{s}"));
        let (me, p) = (&self.peers[self.rank], &self.peers[peer]);
        // a peer that will never connect: said at once, not at the timeout
        let gone = |how: String, cause: Cause| {
            Error::remote(format!("{stage}: rank {peer} {how}, {before} (for {what})"))
                .with_rank(self.rank)
                .with_peer(peer)
                .with_cause(cause)
        };
        loop {
            let now = Instant::now();
            if next_report.is_some_and(|t| now >= t) {
                crate::log::notice(
                    Some(self.rank),
                    &format!(
                        "{stage}: rank {} waiting for rank {peer} to {to} for {what}, {:.0} of {:.0} s",
                        self.rank,
                        (now - started).as_secs_f64(),
                        self.cfg.timeout.as_secs_f64()
                    ),
                );
                next_report = self.cfg.wait_report.map(|r| now + r);
            }
            if self.aborted.load(std::sync::atomic::Ordering::SeqCst) || (revocable && self.stopped()) {
                return Err(self.stop_error());
            }
            // on this machine its pid tells; but a peer that published and then exited normally
            // is not dead to us, so the key is looked at once more after its process was seen gone
            if p.machine == me.machine && !oxccl_transport::process_alive(p.pid) {
                return self
                    .published(key)
                    .ok_or_else(|| gone(format!("(pid {}) died: its process is gone", p.pid), Cause::PeerDied));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.store.get(key, left.min(std::time::Duration::from_millis(500))) {
                Ok(v) => return Ok(v),
                Err(e) if e.kind == crate::ErrorKind::Timeout && !left.is_zero() => {
                    // on another machine its beacon tells
                    if p.machine != me.machine {
                        if let Some((why, cause)) = watch.check(p.ip, p.beacon) {
                            return self
                                .published(key)
                                .ok_or_else(|| gone(format!("on {} ({}) {why}", p.hostname, p.ip), cause));
                        }
                    }
                    if let Some((seq, what)) = doing {
                        let k = format!("{}/doing/{peer}", self.prefix);
                        if self.store.check(std::slice::from_ref(&k)).unwrap_or(false) {
                            let v = self.store.get(&k, std::time::Duration::from_millis(200)).unwrap_or_default();
                            let v = String::from_utf8_lossy(&v);
                            if let Some((ps, pw)) = v.split_once('\t') {
                                let ps: u64 = ps.parse().unwrap_or(0);
                                if (ps == *seq && pw != what) || ps > *seq {
                                    return Err(Error::invalid_usage(format!(
                                        "mismatched operations: rank {} called {what} (op #{seq}) but rank {peer} called {pw} (op #{ps})",
                                        self.rank
                                    ))
                                    .with_rank(self.rank)
                                    .with_peer(peer)
                                    .with_cause(Cause::Mismatch));
                                }
                            }
                        }
                    }
                    continue;
                }
                Err(e) if e.kind == crate::ErrorKind::Timeout => {
                    return Err(Error::timeout(format!(
                        "{stage}: rank {peer} did not take part within {:.1} s",
                        self.cfg.timeout.as_secs_f64()
                    ))
                    .with_rank(self.rank)
                    .with_peer(peer))
                }
                Err(e) => return Err(self.store_error(e, why)),
            }
        }
    }
}

/// Connection setup of one communicator, in three phases that every communicator of a group
/// runs in lock step (so one thread can set up many communicators that wait on each other):
/// 1. publish receive blobs; 2. connect sends and acknowledge; 3. accept receives.
pub(crate) struct Setup<'s> {
    sh: &'s Shared,
    rx: Vec<usize>,
    tx: Vec<usize>,
    pending: Vec<(usize, Box<dyn oxccl_transport::PendingRecv>)>,
    deadline: Instant,
    /// The collective being set up, when the group is a single collective.
    doing: Option<(u64, String)>,
}

impl<'s> Setup<'s> {
    pub(crate) fn key(&self, kind: &str, a: usize, b: usize) -> String {
        conn_key(&self.sh.prefix, kind, a, b)
    }

    pub(crate) fn new(sh: &'s Shared, rx: &[usize], tx: &[usize], doing: Option<(u64, Fingerprint)>) -> Self {
        let st = sh.state.lock().unwrap();
        let rx: Vec<usize> = rx.iter().copied().filter(|&p| st.conns.recv[p].is_none()).collect();
        let tx: Vec<usize> = tx.iter().copied().filter(|&q| st.conns.send[q].is_none()).collect();
        // described only when there is something to set up (not on every call)
        let doing = doing.filter(|_| !rx.is_empty() || !tx.is_empty()).map(|(seq, fp)| (seq, fp.to_string()));
        Setup { sh, rx, tx, pending: Vec::new(), deadline: Instant::now() + sh.cfg.timeout, doing }
    }

    pub(crate) fn publish(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        if self.rx.is_empty() && self.tx.is_empty() {
            return Ok(());
        }
        if let Some((seq, what)) = &self.doing {
            sh.store.set(&format!("{}/doing/{me}", sh.prefix), format!("{seq}\t{what}").as_bytes())?;
        }
        for &p in &self.rx {
            let (pr, blob) = {
                let mut st = sh.state.lock().unwrap();
                // offered already by an any-source receive: its blob is the one the peer uses
                if let Some(pr) = st.pending_rx[p].take() {
                    self.pending.push((p, pr));
                    continue;
                }
                let t = sh.transport_for(&st, p);
                let (pr, blob) = t.setup_recv(p).map_err(|e| e.with_rank(me))?;
                (pr, tag_blob(t.name(), &blob))
            };
            sh.store.set(&self.key("conn", p, me), &blob)?;
            self.pending.push((p, pr));
        }
        Ok(())
    }

    pub(crate) fn connect(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        for &q in &self.tx {
            let tagged = sh.wait_key(&self.key("conn", me, q), self.deadline, q, self.doing.as_ref())?;
            let mut st = sh.state.lock().unwrap();
            let t = sh.transport_for(&st, q);
            let name = t.name();
            let Some((theirs, blob)) = untag_blob(&tagged) else {
                return Err(Error::remote("malformed setup blob in the bootstrap store").with_rank(me).with_peer(q));
            };
            if theirs != name.as_bytes() {
                // both ends must pick the same transport: say so on both, at once
                let e = Error::invalid_usage(format!(
                    "rank {q} expects rank {me}'s messages over {}, but rank {me} sends to it over {name}: \
                     OXCCL_NET/NCCL_NET, NCCL_SHM_DISABLE and the host id must agree on every rank",
                    String::from_utf8_lossy(theirs)
                ))
                .with_rank(me)
                .with_peer(q)
                .with_cause(Cause::Mismatch);
                drop(st);
                let _ = sh.store.set(&self.key("ack", me, q), format!("!{}", e.message).as_bytes());
                return Err(e);
            }
            let c = t.connect_send(q, blob, self.deadline).map_err(|e| e.with_rank(me).with_peer(q))?;
            st.conns.send[q] = Some(c);
            drop(st);
            sh.store.set(&self.key("ack", me, q), b"1")?;
            tracing::info!(rank = me, "Channel 00 : {me}[{me}] -> {q}[{q}] via {name}");
        }
        Ok(())
    }

    pub(crate) fn accept(&mut self) -> Result<()> {
        let (sh, me) = (self.sh, self.sh.rank);
        for (p, pr) in std::mem::take(&mut self.pending) {
            let ack = sh.wait_key(&self.key("ack", p, me), self.deadline, p, self.doing.as_ref())?;
            if let Some(why) = ack.strip_prefix(b"!") {
                let _ = sh.store.delete(&self.key("conn", p, me));
                let _ = sh.store.delete(&self.key("ack", p, me));
                return Err(Error::invalid_usage(String::from_utf8_lossy(why).into_owned()).with_rank(me).with_peer(p));
            }
            let c = pr.accept(self.deadline).map_err(|e| e.with_rank(me).with_peer(p))?;
            sh.state.lock().unwrap().conns.recv[p] = Some(c);
            let _ = sh.store.delete(&self.key("conn", p, me));
            let _ = sh.store.delete(&self.key("ack", p, me));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_blobs_round_trip_and_truncation_is_refused() {
        let t = tag_blob("NET/OFI", b"\x01\x02blob");
        assert_eq!(untag_blob(&t), Some((&b"NET/OFI"[..], &b"\x01\x02blob"[..])));
        assert_eq!(untag_blob(&tag_blob("SHM", b"")), Some((&b"SHM"[..], &b""[..])));
        for cut in 0..1 + "NET/OFI".len() {
            assert_eq!(untag_blob(&t[..cut]), None, "cut at {cut}");
        }
        // any bytes: no panic
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b: Vec<u8> = (0..(x % 24) as usize).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = untag_blob(&b);
        }
    }
}
