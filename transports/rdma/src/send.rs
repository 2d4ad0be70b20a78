//! The sending half of a connection: staging slots, credits, writes from user memory, FLUSH on close.

use super::*;
use oxccl_transport::wait::WaitSource;
use oxccl_transport::{Error, Header, Result, SendConn, HEADER_BYTES};
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct RdmaSend {
    pub(crate) net: Arc<Net>,
    pub(crate) id: u32,
    pub(crate) peer: usize,
    /// The receiver's endpoints.
    pub(crate) dests: Vec<u64>,
    pub(crate) remote_id: u32,
    pub(crate) raddr: u64,
    pub(crate) key: u64,
    pub(crate) ring: Option<(Mem, Region)>,
    pub(crate) slots: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) posted: u64,
    /// Send from user memory in operations of at least this size (`usize::MAX`: never).
    pub(crate) zero_copy_min_op: usize,
    /// Seals each message in its staging slot (encryption on).
    pub(crate) seal: Option<oxccl_transport::seal::Sealer>,
}

impl RdmaSend {
    pub(crate) fn check(&self, st: &NetState) -> Result<()> {
        let s = &st.sends[&self.id];
        if let Some(e) = &s.error {
            return Err(e.clone());
        }
        if s.aborted {
            return Err(Error::peer_aborted(self.peer));
        }
        Ok(())
    }
    /// Room for the next message: fewer than `slots` unconsumed, and its staging slot free.
    pub(crate) fn room(&self, st: &NetState) -> bool {
        let s = &st.sends[&self.id];
        self.posted - s.credits < self.slots as u64 && s.busy[self.slot()] == 0
    }
}

impl SendConn for RdmaSend {
    fn max_message(&self) -> usize {
        self.slot_bytes - SLOT_HEADER - if self.seal.is_some() { TAG } else { 0 }
    }
    fn reserve(&mut self) -> Result<Option<&mut [u8]>> {
        if !self.make_room()? {
            return Ok(None);
        }
        let slot = self.slot();
        let (sb, max) = (self.slot_bytes, self.max_message());
        let ring = &mut self.ring.as_mut().unwrap().0;
        Ok(Some(&mut ring.bytes_mut()[slot * sb + SLOT_HEADER..slot * sb + SLOT_HEADER + max]))
    }
    fn commit(&mut self, header: Header) -> Result<()> {
        self.publish(header, None)
    }
    fn borrow_ready(&mut self, len: usize) -> Result<Option<bool>> {
        if self.zero_copy_min_op == usize::MAX || len > self.max_message() || self.net.user_cache().is_none() {
            return Ok(Some(false));
        }
        Ok(self.make_room()?.then_some(true))
    }
    fn borrow_min_op(&self) -> usize {
        self.zero_copy_min_op
    }
    fn commit_borrowed(&mut self, header: Header, addr: usize) -> Result<()> {
        let len = header.len as usize;
        let user = self.net.user_cache().filter(|_| len <= self.max_message());
        let user = user.ok_or_else(|| Error::internal("RDMA send by reference that borrow_ready did not allow"))?;
        let fab = &self.net.fab;
        // SAFETY: `register` is given a page-aligned run of mapped pages (the cache watches
        // them). The registration is used only while an entry of the cache holds it: the cache
        // drops an entry as soon as its memory is unmapped (before the unmapping call returns)
        // and deregisters it once no write uses it; a write from it runs only while the caller
        // keeps the message unchanged (until `pending` turns false: commit_borrowed's contract).
        let got = user.get(addr, len, |start, bytes| unsafe { fab.register(start as *mut u8, bytes) })?;
        match got {
            Some((id, region, _)) => self.publish(header, Some((addr, region.desc, id))),
            None => {
                // memory the cache cannot watch: copied into the staging slot instead
                let slot = self.slot();
                let sb = self.slot_bytes;
                let ring = &mut self.ring.as_mut().unwrap().0;
                // SAFETY: commit_borrowed's contract: `addr` holds `header.len` readable bytes
                // that stay unchanged during this call.
                let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                ring.bytes_mut()[slot * sb + SLOT_HEADER..slot * sb + SLOT_HEADER + len].copy_from_slice(src);
                self.publish(header, None)
            }
        }
    }
    fn progress(&mut self) -> Result<()> {
        let mut st = self.net.st.lock().unwrap();
        self.net.progress_locked(&mut st).map_err(|e| e.with_peer(self.peer))?;
        self.check(&st)
    }
    fn pending(&self) -> bool {
        let st = self.net.st.lock().unwrap();
        // a queued NOTIFY still has to leave, and a write still reads its staging slot
        !st.outbox.is_empty() || st.sends[&self.id].busy.iter().any(|b| *b > 0)
    }
    fn arm(&mut self) -> Result<Option<WaitSource>> {
        self.net.arm()
    }
    fn check_peer(&self) -> Result<()> {
        self.net.check_peer(self.peer)
    }
    fn disarm(&mut self) {}
    fn memory(&self) -> usize {
        self.slots * self.slot_bytes
    }
    fn abort(&mut self) {
        let mut st = self.net.st.lock().unwrap();
        let keys = st.sends.get_mut(&self.id).and_then(|s| s.ctl.as_mut());
        let m = seal_ctl(keys, control(T_ABORT, self.remote_id, 0, false));
        st.abandoned = true;
        let _ = self.net.send_msg(&mut st, 0, self.dests[0], &m, Owner::Send(self.id));
    }
}

impl RdmaSend {
    /// The staging (and remote) slot of the next message.
    pub(crate) fn slot(&self) -> usize {
        (self.posted % self.slots as u64) as usize
    }

    /// Whether the next message has room, after progress if needed.
    pub(crate) fn make_room(&mut self) -> Result<bool> {
        let mut st = self.net.st.lock().unwrap();
        self.check(&st)?;
        if !self.room(&st) {
            self.net.progress_locked(&mut st).map_err(|e| e.with_peer(self.peer))?;
            self.check(&st)?;
            return Ok(self.room(&st));
        }
        Ok(true)
    }

    /// Post message `posted`: the staging slot's header (and payload, unless `user` names the
    /// payload in user memory: address, local descriptor, cache entry), then its NOTIFY.
    pub(crate) fn publish(&mut self, header: Header, user: Option<(usize, usize, u64)>) -> Result<()> {
        let slot = self.slot();
        let sb = self.slot_bytes;
        let (ring, region) = self.ring.as_mut().unwrap();
        let bytes = &mut ring.bytes_mut()[slot * sb..(slot + 1) * sb];
        let len = match self.seal.as_mut() {
            None => {
                bytes[..HEADER_BYTES].copy_from_slice(&header.encode());
                SLOT_HEADER + if user.is_some() { 0 } else { header.len as usize }
            }
            Some(seal) => {
                // the payload is in place; seal header, padding and payload, tag after them
                let end = SLOT_HEADER + header.len as usize;
                bytes[..4].copy_from_slice(&header.len.to_le_bytes());
                bytes[4..SEALED_FROM].fill(0);
                bytes[SEALED_FROM..SEALED_FROM + HEADER_BYTES].copy_from_slice(&header.encode());
                let (aad, rest) = bytes.split_at_mut(SEALED_FROM);
                let tag = seal.seal(aad, &mut rest[..end - SEALED_FROM]).map_err(|e| e.with_peer(self.peer))?;
                bytes[end..end + TAG].copy_from_slice(&tag);
                end + TAG
            }
        };
        let src = ring.ptr().wrapping_add(slot * sb);
        let desc = region.desc;
        let mut st = self.net.st.lock().unwrap();
        let s = st.sends.get_mut(&self.id).unwrap();
        s.busy[slot] += 1 + user.is_some() as u8;
        s.held[slot] = user.map(|u| u.2);
        let token = K_WRITE | ((self.id as u64) << 24) | slot as u64;
        // striped: message k goes from local endpoint k % L to remote endpoint k % R, its writes
        // and its NOTIFY on the same pair (send-after-write ordering holds per endpoint pair)
        let ep = (self.posted % self.net.fab.endpoints() as u64) as usize;
        let dest = self.dests[(self.posted % self.dests.len() as u64) as usize];
        let raddr = self.raddr + (slot * sb) as u64;
        // a message copied into its slot goes as one write that carries its notification where
        // the backend offers that (the slot in the low 16 bits: ids must fit the high 16)
        let notify = (user.is_none() && self.net.write_notify && self.remote_id < 1 << 16)
            .then_some((self.remote_id << 16) | slot as u32);
        // the staging slot (and user memory) stay untouched until the writes complete (busy)
        st.outbox.push_back(Outgoing::Write {
            ep,
            src: src as usize,
            len,
            desc,
            dest,
            raddr,
            key: self.key,
            token,
            notify,
        });
        if let Some((addr, desc, _)) = user {
            st.outbox.push_back(Outgoing::Write {
                ep,
                src: addr,
                len: header.len as usize,
                desc,
                dest,
                raddr: raddr + SLOT_HEADER as u64,
                key: self.key,
                token: token | USER_WRITE,
                notify: None,
            });
        }
        if notify.is_some() {
            self.net.flush(&mut st).map_err(|e| e.with_peer(self.peer))?;
        } else {
            let keys = st.sends.get_mut(&self.id).and_then(|s| s.ctl.as_mut());
            let m = seal_ctl(keys, control(T_NOTIFY, self.remote_id, self.posted, false));
            self.net.send_msg(&mut st, ep, dest, &m, Owner::Send(self.id)).map_err(|e| e.with_peer(self.peer))?;
        }
        self.posted += 1;
        Ok(())
    }
}

impl Drop for RdmaSend {
    fn drop(&mut self) {
        let mut st = self.net.st.lock().unwrap();
        // writes still in flight read the staging ring: let them finish (bounded)
        let t = Instant::now();
        while st.sends[&self.id].busy.iter().any(|b| *b > 0) && t.elapsed() < std::time::Duration::from_secs(2) {
            if self.net.progress_locked(&mut st).is_err() {
                break;
            }
        }
        // messages the receiver has not credited may still be on their way: FLUSH each
        // endpoint pair they took, answered before the endpoint closes (Net::linger)
        let s = &st.sends[&self.id];
        if !st.abandoned && s.error.is_none() && !s.aborted && !s.receiver_closed {
            let (eps, ndests) = (self.net.fab.endpoints() as u64, self.dests.len() as u64);
            let mut pairs: Vec<(usize, u64)> =
                (s.credits..self.posted).map(|k| ((k % eps) as usize, self.dests[(k % ndests) as usize])).collect();
            pairs.sort_unstable();
            pairs.dedup();
            for (ep, dest) in pairs {
                let nonce = st.next_flush;
                st.next_flush += 1;
                st.flushes.insert(nonce, (self.peer, self.id));
                let keys = st.sends.get_mut(&self.id).and_then(|s| s.ctl.as_mut());
                let m = seal_ctl(keys, control(T_FLUSH, self.remote_id, nonce, false));
                if self.net.send_msg(&mut st, ep, dest, &m, Owner::Flush(nonce)).is_err() {
                    st.flushes.remove(&nonce);
                }
            }
            // and say it is closed, after how many messages (best effort: a receiver that
            // misses it waits for the communicator's bound, as for a silent peer)
            let keys = st.sends.get_mut(&self.id).and_then(|s| s.ctl.as_mut());
            let m = seal_ctl(keys, control(T_CLOSED, self.remote_id, self.posted, false));
            let _ = self.net.send_msg(&mut st, 0, self.dests[0], &m, Owner::Reply);
        }
        // an encrypted half's FLUSHED answers are checked with its keys after it is gone
        if let Some(ctl) = st.sends.remove(&self.id).and_then(|s| s.ctl) {
            if st.flushes.values().any(|f| f.1 == self.id) {
                st.closing_ctl.insert(self.id, ctl);
            }
        }
        drop(st);
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
        }
    }
}
