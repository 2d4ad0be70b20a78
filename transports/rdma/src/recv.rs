//! The receiving half of a connection: notified slots, credits, single copy, close.

use super::*;
use oxccl_transport::wait::WaitSource;
use oxccl_transport::{Error, Header, RecvConn, Result, HEADER_BYTES};
use std::sync::Arc;

pub(crate) struct RdmaRecv {
    pub(crate) net: Arc<Net>,
    pub(crate) id: u32,
    pub(crate) peer: usize,
    pub(crate) dest: u64,
    pub(crate) sender_id: u32,
    pub(crate) ring: Option<(Mem, Region)>,
    pub(crate) slots: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) max_message: usize,
    pub(crate) next: u64,
    /// The consumed count last sent in a CREDIT.
    pub(crate) credited: u64,
    pub(crate) peeked: bool,
    /// Opens each message in the ring before it is used (encryption on).
    pub(crate) open: Option<oxccl_transport::seal::Opener>,
    /// The authentication failure that ended this connection (every later call repeats it).
    pub(crate) failed: Option<Error>,
}

impl RecvConn for RdmaRecv {
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>> {
        let ready = {
            let mut st = self.net.st.lock().unwrap();
            // message `next` is in place once its NOTIFY arrived (slot `next % slots` holds it)
            let next = self.next;
            let state = |st: &NetState| {
                st.recvs
                    .get(&self.id)
                    .map(|r| (r.arrived(next), r.aborted, r.closed_after.is_some_and(|n| next >= n)))
                    .unwrap_or((false, true, false))
            };
            let (mut here, mut aborted, mut closed) = state(&st);
            if !here {
                self.net.progress_locked(&mut st).map_err(|e| e.with_peer(self.peer))?;
                (here, aborted, closed) = state(&st);
            }
            if let Some(e) = st.recvs.get(&self.id).and_then(|r| r.error.clone()) {
                return Err(e);
            }
            if !here && aborted {
                return Err(Error::peer_aborted(self.peer));
            }
            if !here && closed {
                return Err(Error::remote(format!("rank {} closed the connection", self.peer))
                    .with_cause(oxccl_transport::Cause::PeerClosed)
                    .with_peer(self.peer));
            }
            here
        };
        if !ready {
            return Ok(None);
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let slot = (self.next % self.slots as u64) as usize;
        let sb = self.slot_bytes;
        if self.open.is_some() && !self.peeked {
            self.open_slot(slot).inspect_err(|e| self.failed = Some(e.clone()))?;
        }
        let ring = &self.ring.as_ref().unwrap().0;
        let bytes = &ring.bytes()[slot * sb..(slot + 1) * sb];
        let at = if self.open.is_some() { SEALED_FROM } else { 0 };
        let h = Header::decode(&bytes[at..at + HEADER_BYTES], self.max_message).map_err(|e| e.with_peer(self.peer))?;
        self.peeked = true;
        Ok(Some((h, &bytes[SLOT_HEADER..SLOT_HEADER + h.len as usize])))
    }
    fn consume(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.peeked) {
            return Err(Error::internal("consume without a peeked message"));
        }
        self.next += 1;
        // credits in batches of half the ring: while fewer than that are unreported, the sender
        // still has half the ring free or messages in flight that this side will consume, so it
        // cannot stall (rings have at least 2 slots)
        if self.next - self.credited < (self.slots as u64 / 2).max(1) {
            return Ok(());
        }
        self.credited = self.next;
        let mut st = self.net.st.lock().unwrap();
        let keys = st.recvs.get_mut(&self.id).and_then(|r| r.ctl.as_mut());
        let m = seal_ctl(keys, control(T_CREDIT, self.sender_id, self.next, false));
        self.net.send_msg(&mut st, 0, self.dest, &m, Owner::Recv(self.id)).map_err(|e| e.with_peer(self.peer))
    }
    fn arm(&mut self) -> Result<Option<WaitSource>> {
        self.net.arm()
    }
    fn check_peer(&self) -> Result<()> {
        let Err(e) = self.net.check_peer(self.peer) else { return Ok(()) };
        // the peer's process is gone, but it may have finished normally: what it sent before
        // exiting can still be on its way through the provider (a software provider reads it
        // from a socket only when progressed), so drain before deciding it is lost
        let (id, next) = (self.id, self.next);
        let here = |st: &NetState| st.recvs.get(&id).is_some_and(|r| r.arrived(next));
        let until = std::time::Instant::now() + DEAD_PEER_DRAIN;
        loop {
            let mut st = self.net.st.lock().unwrap();
            if here(&st) {
                return Ok(());
            }
            if self.net.progress_locked(&mut st).is_err() || std::time::Instant::now() >= until {
                return Err(e);
            }
            if here(&st) {
                return Ok(());
            }
            drop(st);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    fn disarm(&mut self) {}
    fn memory(&self) -> usize {
        self.slots * self.slot_bytes
    }
    fn abort(&mut self) {
        let mut st = self.net.st.lock().unwrap();
        let keys = st.recvs.get_mut(&self.id).and_then(|r| r.ctl.as_mut());
        let m = seal_ctl(keys, control(T_ABORT, self.sender_id, 0, true));
        st.abandoned = true;
        let _ = self.net.send_msg(&mut st, 0, self.dest, &m, Owner::Recv(self.id));
    }
}

impl RdmaRecv {
    /// Authenticate and decrypt message `next` in its ring slot, in place, once.
    fn open_slot(&mut self, slot: usize) -> Result<()> {
        let (sb, max, peer) = (self.slot_bytes, self.max_message, self.peer);
        let ring = &mut self.ring.as_mut().unwrap().0;
        let bytes = &mut ring.bytes_mut()[slot * sb..(slot + 1) * sb];
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let fail = |mut e: Error| {
            e.message = format!("rank {peer}'s encrypted RDMA connection failed: {}", e.message);
            e.with_peer(peer)
        };
        if len > max {
            return Err(fail(
                Error::remote(format!("a message claims {len} bytes (altered in transit)"))
                    .with_cause(oxccl_transport::Cause::Tampered),
            ));
        }
        let (aad, rest) = bytes.split_at_mut(SEALED_FROM);
        self.open.as_mut().unwrap().open(aad, &mut rest[..SLOT_HEADER + len + TAG - SEALED_FROM]).map_err(fail)
    }
}

impl Drop for RdmaRecv {
    fn drop(&mut self) {
        let mut st = self.net.st.lock().unwrap();
        // its sender may still FLUSH it while closing: keep what the answer needs
        if let Some(r) = st.recvs.remove(&self.id) {
            if let Some((dests, sender)) = r.hello {
                st.closed_recvs.insert(self.id, (dests, sender, r.ctl));
            }
        }
        drop(st);
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
        }
    }
}
