//! Authenticated control messages of encrypted connections: NOTIFY, CREDIT, ABORT, FLUSH,
//! FLUSHED and CLOSED carry ids and counters (never data), and on an encrypted connection each
//! also carries its number in its direction and a GMAC tag under a key of that connection and
//! direction. Messages striped over several endpoints may arrive out of order, so the receiver
//! keeps a replay window instead of expecting the next number. A message that fails is dropped
//! (as a stranger's is), so a forged or replayed one changes nothing.

use oxccl_transport::seal::{derive, Mac, MasterKey, Window, TAG_BYTES};

/// Bytes of the plain control message (kind, id, value, direction).
pub(crate) const CTL_BYTES: usize = 17;
/// Bytes appended on an encrypted connection: the message's number and its tag.
pub(crate) const CTL_AUTH: usize = 8 + TAG_BYTES;

/// One side's control keys of a connection: its own direction's and the peer's.
pub(crate) struct CtlKeys {
    tx: Mac,
    rx: Mac,
    next: u64,
    window: Window,
}

impl CtlKeys {
    /// The keys of the connection with context `conn` (communicator and token), for its sender
    /// side (`sender`) or its receiver side.
    pub(crate) fn new(master: &MasterKey, conn: &[u8], sender: bool) -> CtlKeys {
        let s2r = derive(&master.0, b"rdma control: sender to receiver", conn);
        let r2s = derive(&master.0, b"rdma control: receiver to sender", conn);
        let (tx, rx) = if sender { (s2r, r2s) } else { (r2s, s2r) };
        CtlKeys { tx: Mac::new(&tx), rx: Mac::new(&rx), next: 0, window: Window::default() }
    }

    /// `m` (a plain control message) with its number and tag appended.
    pub(crate) fn sign(&mut self, m: &[u8; CTL_BYTES]) -> Vec<u8> {
        let n = self.next;
        self.next += 1;
        let mut v = m.to_vec();
        v.extend_from_slice(&n.to_le_bytes());
        v.extend_from_slice(&self.tx.tag(n, m));
        v
    }

    /// Whether `m` (as received) is an authentic control message not seen before.
    pub(crate) fn check(&mut self, m: &[u8]) -> bool {
        if m.len() != CTL_BYTES + CTL_AUTH {
            return false;
        }
        let n = u64::from_le_bytes(m[CTL_BYTES..CTL_BYTES + 8].try_into().unwrap());
        self.rx.verify(n, &m[..CTL_BYTES], &m[CTL_BYTES + 8..]) && self.window.accept(n)
    }
}

/// A control message for a connection that has `keys` (signed) or not (plain).
pub(crate) fn seal_ctl(keys: Option<&mut CtlKeys>, m: [u8; CTL_BYTES]) -> Vec<u8> {
    match keys {
        Some(k) => k.sign(&m),
        None => m.to_vec(),
    }
}

/// Whether a received control message may act on a connection with `keys`: any message for a
/// plain connection, only an authentic new one for an encrypted connection.
pub(crate) fn admit(keys: Option<&mut CtlKeys>, m: &[u8]) -> bool {
    match keys {
        Some(k) => k.check(m),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_messages_pass_once_and_forgeries_never() {
        let m = MasterKey([1; 32]);
        let (mut s, mut r) = (CtlKeys::new(&m, b"conn", true), CtlKeys::new(&m, b"conn", false));
        let a = s.sign(&[2; CTL_BYTES]);
        let b = s.sign(&[3; CTL_BYTES]);
        assert!(r.check(&b) && r.check(&a), "out of order is fine");
        assert!(!r.check(&a), "a replay is not");
        let mut c = s.sign(&[4; CTL_BYTES]);
        c[5] ^= 1;
        assert!(!r.check(&c), "an altered one is not");
        assert!(!r.check(&[4; CTL_BYTES]), "nor an unsigned one");
        let back = r.sign(&[5; CTL_BYTES]);
        assert!(s.check(&back) && !r.check(&back), "each direction has its key");
        assert!(!CtlKeys::new(&m, b"other", false).check(&s.sign(&[6; CTL_BYTES])), "and each connection");
    }
}
