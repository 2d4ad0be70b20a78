//! Receive from any source (MPI's `MPI_ANY_SOURCE`, gloo's `recv` without a rank): wait until
//! the next message on some candidate's connection is that peer's next send to this rank.
//!
//! Connections are set up lazily, pair by pair, through the store, and a sender waits for its
//! receiver's setup blob. So this rank first *offers* a receive connection to every candidate it
//! has none from (publishes the blob and keeps the half-open receive in
//! [`State::pending_rx`]), then watches two things: the heads of the connections it has (a
//! `peek`, which consumes nothing), and the store's acknowledgements of its offers (a sender
//! that connected). An offer nobody took stays for the next operation that needs that peer:
//! [`super::Setup`] uses it instead of publishing another.

use super::setup::{conn_key, tag_blob};
use super::*;
use crate::schedule::Coll;
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, WaitSource};
use std::time::{Duration, Instant};

/// What an any-source receive is called in errors and the flight record.
pub(crate) const RECV_ANY: &str = "recv from any source";

/// How often offers are checked in the store, and liveness of peers not connected yet.
const STORE_EVERY: Duration = Duration::from_millis(10);
const LIVENESS_EVERY: Duration = Duration::from_secs(1);

impl Shared {
    /// The first of `peers` (distinct, valid, not this rank) whose next message to this rank is
    /// its next send, waiting up to the communicator's timeout. Consumes nothing: the caller
    /// receives it with an ordinary receive from the returned peer.
    pub(crate) fn probe_any(&self, peers: &[usize]) -> Result<usize> {
        let deadline = Instant::now() + self.cfg.timeout;
        self.offer(peers)?;
        let spin_until = Instant::now() + self.spin;
        let (mut store_at, mut alive_at) = (Instant::now(), Instant::now() + LIVENESS_EVERY);
        loop {
            if let Some(p) = self.head_send(peers)? {
                return Ok(p);
            }
            if self.stopped() {
                return Err(self.stop_error().with_op(RECV_ANY));
            }
            let now = Instant::now();
            if now >= store_at {
                self.take_offers(peers, deadline)?;
                store_at = now + STORE_EVERY;
            }
            if now >= alive_at {
                if let Err(e) = self.check_alive(peers) {
                    // a candidate that connected to an offer, sent and exited is not dead to
                    // us: take the offers and look at the heads once more before saying so
                    self.take_offers(peers, deadline)?;
                    return self.head_send(peers)?.ok_or(e);
                }
                alive_at = now + LIVENESS_EVERY;
            }
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "rank {}: no message from any of ranks {peers:?} within {:.1} s",
                    self.rank,
                    self.cfg.timeout.as_secs_f64()
                ))
                .with_rank(self.rank)
                .with_op(RECV_ANY));
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            let offers = self.state.lock().unwrap().pending_rx.iter().any(|p| p.is_some());
            let nap = if offers { STORE_EVERY } else { Duration::from_millis(500) };
            self.sleep_on(peers, nap.min(deadline - now))?;
        }
    }

    /// Publish a receive blob to every candidate that has neither a connection nor an offer.
    fn offer(&self, peers: &[usize]) -> Result<()> {
        let me = self.rank;
        for &p in peers {
            let mut st = self.state.lock().unwrap();
            if st.conns.recv[p].is_some() || st.pending_rx[p].is_some() {
                continue;
            }
            let t = self.transport_for(&st, p);
            let (pr, blob) = t.setup_recv(p).map_err(|e| e.with_rank(me))?;
            let blob = tag_blob(t.name(), &blob);
            st.pending_rx[p] = Some(pr);
            drop(st);
            self.store.set(&conn_key(&self.prefix, "conn", p, me), &blob)?;
        }
        Ok(())
    }

    /// Accept the offers whose sender has connected (its acknowledgement is in the store).
    fn take_offers(&self, peers: &[usize], deadline: Instant) -> Result<()> {
        let me = self.rank;
        for &p in peers {
            if self.state.lock().unwrap().pending_rx[p].is_none() {
                continue;
            }
            let ack_key = conn_key(&self.prefix, "ack", p, me);
            if !self.store.check(std::slice::from_ref(&ack_key))? {
                continue;
            }
            let ack = self.store.get(&ack_key, Duration::from_secs(1))?;
            let _ = self.store.delete(&conn_key(&self.prefix, "conn", p, me));
            let _ = self.store.delete(&ack_key);
            let pr = self.state.lock().unwrap().pending_rx[p].take().expect("checked above");
            if let Some(why) = ack.strip_prefix(b"!") {
                return Err(Error::invalid_usage(String::from_utf8_lossy(why).into_owned()).with_rank(me).with_peer(p));
            }
            let c = pr.accept(deadline).map_err(|e| e.with_rank(me).with_peer(p))?;
            self.state.lock().unwrap().conns.recv[p] = Some(c);
        }
        Ok(())
    }

    /// The first candidate (taken in turn, so one busy sender cannot starve the others) whose
    /// connection's next message is its next send to this rank.
    fn head_send(&self, peers: &[usize]) -> Result<Option<usize>> {
        let mut st = self.state.lock().unwrap();
        let n = peers.len();
        let first = st.any_turn % n;
        for i in 0..n {
            let p = peers[(first + i) % n];
            let want = st.p2p_rx[p];
            let Some(c) = st.conns.recv[p].as_mut() else { continue };
            let head = c.peek().map_err(|e| e.with_rank(self.rank).with_peer(p).with_op(RECV_ANY))?;
            if let Some((h, _)) = head {
                if h.comm == self.comm_id && h.call & 0xF == Coll::Send.code() && h.seq == want {
                    st.any_turn = st.any_turn.wrapping_add(1);
                    return Ok(Some(p));
                }
            }
        }
        Ok(None)
    }

    /// A candidate that died (not connected yet: its pid or its beacon; connected: the transport)
    /// fails the receive, naming it.
    fn check_alive(&self, peers: &[usize]) -> Result<()> {
        let me = &self.peers[self.rank];
        for &p in peers {
            let st = self.state.lock().unwrap();
            if let Some(c) = st.conns.recv[p].as_ref() {
                c.check_peer().map_err(|e| e.with_rank(self.rank).with_peer(p).with_op(RECV_ANY))?;
                continue;
            }
            drop(st);
            let info = &self.peers[p];
            if info.machine == me.machine && !oxccl_transport::process_alive(info.pid) {
                return Err(Error::remote(format!("rank {p} (pid {}) died: its process is gone", info.pid))
                    .with_cause(oxccl_transport::Cause::PeerDied)
                    .with_rank(self.rank)
                    .with_peer(p)
                    .with_op(RECV_ANY));
            }
            if let Some(e) = crate::exec::DriveComm::peer_lost(self, p) {
                return Err(e.with_op(RECV_ANY));
            }
        }
        Ok(())
    }

    /// Sleep until a connected candidate has a message, the abort doorbell rings, or `nap` ends.
    fn sleep_on(&self, peers: &[usize], nap: Duration) -> Result<()> {
        let mut sources = vec![WaitSource::doorbell(self.abort_bell.read_fd())];
        let mut armed = vec![];
        let mut ready = false;
        {
            let mut st = self.state.lock().unwrap();
            for &p in peers {
                let Some(c) = st.conns.recv[p].as_mut() else { continue };
                armed.push(p);
                match c.arm().map_err(|e| e.with_rank(self.rank).with_peer(p).with_op(RECV_ANY)) {
                    Ok(Some(s)) => sources.push(s),
                    Ok(None) => ready = true,
                    Err(e) => {
                        armed.iter().for_each(|&q| st.conns.recv[q].as_mut().unwrap().disarm());
                        return Err(e);
                    }
                }
                if ready {
                    break;
                }
            }
        }
        let slept = if ready { Ok(true) } else { wait_any(&sources, nap) };
        let mut st = self.state.lock().unwrap();
        armed.iter().for_each(|&q| {
            if let Some(c) = st.conns.recv[q].as_mut() {
                c.disarm()
            }
        });
        slept.map(|_| ())
    }
}
