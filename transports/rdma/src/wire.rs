//! The protocol's wire format: message kinds, completion tokens, control messages, endpoint
//! addresses and the setup blob.

use oxccl_transport::{Error, Result};

pub(crate) const MSG_BYTES: usize = 256;
/// Where a HELLO's encryption word starts (after kind, ids, token and proof).
pub(crate) const HELLO_WORD: usize = 60;
/// Where a HELLO's address list starts.
pub(crate) const HELLO_ADDRS: usize = HELLO_WORD + oxccl_transport::seal::WORD_BYTES;
pub(crate) const RX_BUFS: usize = 256;
pub(crate) const TX_BUFS: usize = 256;
pub(crate) const SLOT_HEADER: usize = 64;
pub(crate) const BLOB_MAGIC: u32 = 0x0CC1_0F11;
/// Bytes of a sealed message's tag, after its payload in the slot.
pub(crate) const TAG: usize = oxccl_transport::seal::TAG_BYTES;
/// A sealed slot: the payload length (u32 LE, associated data) and 4 reserved bytes, then the
/// sealed header (from here), padding and payload, then the tag.
pub(crate) const SEALED_FROM: usize = 8;

pub(crate) const T_HELLO: u8 = 1;
pub(crate) const T_NOTIFY: u8 = 2;
pub(crate) const T_CREDIT: u8 = 3;
pub(crate) const T_ABORT: u8 = 4;
pub(crate) const T_FLUSH: u8 = 5;
pub(crate) const T_FLUSHED: u8 = 6;
pub(crate) const T_CLOSED: u8 = 7;

// completion tokens: kind in the top byte
pub(crate) const K_RX: u64 = 1 << 56;
pub(crate) const K_TXMSG: u64 = 2 << 56;
pub(crate) const K_WRITE: u64 = 3 << 56;
/// Write tokens: connection id << 24, a flag for payload writes from user memory, the slot.
pub(crate) const USER_WRITE: u64 = 1 << 20;
pub(crate) const SLOT_MASK: u64 = USER_WRITE - 1;

/// A list of endpoint addresses: a count, then each address as a length byte and its bytes.
pub(crate) fn encode_addrs(addrs: &[Vec<u8>]) -> Vec<u8> {
    let mut b = vec![addrs.len() as u8];
    for a in addrs {
        b.push(a.len() as u8);
        b.extend_from_slice(a);
    }
    b
}

/// Decode an address list; `None` if malformed (no address, too many, an empty one,
/// truncation). Returns the list and the bytes it took.
pub(crate) fn decode_addrs(b: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    let n = *b.first()? as usize;
    if n == 0 || n > MAX_ENDPOINTS {
        return None;
    }
    let mut at = 1;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = *b.get(at)? as usize;
        if len == 0 {
            return None;
        }
        out.push(b.get(at + 1..at + 1 + len)?.to_vec());
        at += 1 + len;
    }
    Some((out, at))
}

/// How long a receiver keeps progressing after its peer's process is found gone, for what the
/// peer sent before it exited (on an error path only).
pub(crate) const DEAD_PEER_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// Most endpoints per rank (`OXCCL_NET_ENDPOINTS`).
pub const MAX_ENDPOINTS: usize = 4;

/// A NOTIFY, CREDIT or ABORT message: kind, the connection it is for, a value (message index,
/// consumed count) and, for ABORT, whom it is for (0: a receiver, 1: a sender).
pub(crate) fn control(kind: u8, id: u32, value: u64, to_sender: bool) -> [u8; 17] {
    let mut m = [0u8; 17];
    m[0] = kind;
    m[4..8].copy_from_slice(&id.to_le_bytes());
    m[8..16].copy_from_slice(&value.to_le_bytes());
    m[16] = to_sender as u8;
    m
}

pub(crate) fn hello_context(comm: u64, token: &[u8; 16], word: &[u8]) -> Vec<u8> {
    let mut c = b"oxccl-rdma-hello".to_vec();
    c.extend_from_slice(&comm.to_le_bytes());
    c.extend_from_slice(token);
    c.extend_from_slice(word);
    c
}

/// What makes a connection unique (its keys and its encryption word): communicator and token.
pub(crate) fn conn_context(comm: u64, token: &[u8; 16]) -> Vec<u8> {
    let mut c = b"rdma".to_vec();
    c.extend_from_slice(&comm.to_le_bytes());
    c.extend_from_slice(token);
    c
}

/// The setup blob: what the sender needs to reach the receiver's ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Receiver's endpoint addresses (one per endpoint).
    pub addrs: Vec<Vec<u8>>,
    /// Receiver's connection id.
    pub id: u32,
    /// Remote address of the ring.
    pub raddr: u64,
    /// Remote key of the ring.
    pub key: u64,
    /// Slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
    /// The token the HELLO must prove.
    pub token: [u8; 16],
    /// The receiver's encryption word (mode and key check).
    pub word: [u8; oxccl_transport::seal::WORD_BYTES],
}

impl Blob {
    /// Encode: fixed fields, then the address list.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&BLOB_MAGIC.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.raddr.to_le_bytes());
        b.extend_from_slice(&self.key.to_le_bytes());
        b.extend_from_slice(&self.slots.to_le_bytes());
        b.extend_from_slice(&self.slot_bytes.to_le_bytes());
        b.extend_from_slice(&self.token);
        b.extend_from_slice(&self.word);
        b.extend_from_slice(&encode_addrs(&self.addrs));
        b
    }
    /// Decode, refusing anything malformed: wrong magic, truncation, trailing bytes, zero or
    /// absurd ring shapes, an address list that is empty, too long or longer than a HELLO can
    /// carry back.
    pub fn decode(b: &[u8]) -> Result<Blob> {
        let bad = |why: &str| Error::remote(format!("malformed RDMA setup blob: {why}"));
        const ADDRS: usize = 48 + oxccl_transport::seal::WORD_BYTES;
        if b.len() < ADDRS + 2 {
            return Err(bad("too short"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(0) != BLOB_MAGIC {
            return Err(bad("bad magic"));
        }
        let (addrs, used) = decode_addrs(&b[ADDRS..]).ok_or_else(|| bad("bad address list"))?;
        if ADDRS + used != b.len() {
            return Err(bad("length does not match the address list"));
        }
        if used > MSG_BYTES - HELLO_ADDRS {
            return Err(bad("address list too long"));
        }
        let (slots, slot_bytes) = (u32_at(24), u32_at(28));
        if slots == 0
            || slots > 4096
            || slot_bytes as usize <= SLOT_HEADER
            || slot_bytes > 1 << 30
            || slots as u64 * slot_bytes as u64 > 4 << 30
        {
            return Err(bad("ring shape out of range"));
        }
        Ok(Blob {
            id: u32_at(4),
            raddr: u64_at(8),
            key: u64_at(16),
            slots,
            slot_bytes,
            token: b[32..48].try_into().unwrap(),
            word: b[48..ADDRS].try_into().unwrap(),
            addrs,
        })
    }
}
