//! The in-memory transport: connections between ranks of one process as bounded queues, with
//! doorbells for sleeping. No OS resources beyond two pipes per connection, so the executor and
//! the conformance suite can be tested without shared memory segments or sockets.
//!
//! A receive side registers its queue under a fresh token (its setup blob); the sender finds it
//! by that token. Closing or aborting either half is seen by the other at its next call.

use crate::wait::{Doorbell, WaitSource};
use crate::{Error, ErrorKind, Header, PeerInfo, PendingRecv, RecvConn, Result, SendConn, Transport, TransportCtx};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// How a half of a connection ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Closed,
    Aborted,
}

struct Queue {
    msgs: VecDeque<(Header, Vec<u8>)>,
    sender: End,
    receiver: End,
    /// Whether a sender connected (a token is used once).
    taken: bool,
}

/// One connection: the queue, rung on every change each side may wait for.
struct Chan {
    q: Mutex<Queue>,
    slots: usize,
    max: usize,
    /// Rung for the receiver: a message, or the sender's end.
    to_recv: Doorbell,
    /// Rung for the sender: room, or the receiver's end.
    to_send: Doorbell,
}

impl Chan {
    /// The sending (`sender`) or receiving half ends `how` (an abort overrides a close, a close
    /// does not override an abort); the other half is woken to see it.
    fn end(&self, sender: bool, how: End) {
        let mut q = self.q.lock().unwrap();
        let side = if sender { &mut q.sender } else { &mut q.receiver };
        if how == End::Aborted || *side == End::Open {
            *side = how;
        }
        drop(q);
        if sender { &self.to_recv } else { &self.to_send }.ring();
    }
}

/// The receive sides waiting for their senders, by token.
fn registry() -> &'static Mutex<HashMap<u64, Arc<Chan>>> {
    static R: OnceLock<Mutex<HashMap<u64, Arc<Chan>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Settings of the in-memory transport.
#[derive(Debug, Clone, Copy)]
pub struct MemConfig {
    /// Messages a connection holds before the sender must wait.
    pub slots: usize,
    /// Largest payload of one message.
    pub max_message: usize,
}

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig { slots: 4, max_message: 64 << 10 }
    }
}

/// The in-memory transport of one rank.
pub struct MemTransport {
    ctx: TransportCtx,
    cfg: MemConfig,
}

impl MemTransport {
    /// The transport of rank `ctx.rank`.
    pub fn new(ctx: TransportCtx, cfg: MemConfig) -> Self {
        MemTransport { ctx, cfg: MemConfig { slots: cfg.slots.max(1), max_message: cfg.max_message.max(1) } }
    }
}

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "MEM"
    }
    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.machine == peer.machine && me.pid == peer.pid
    }
    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let q = Queue { msgs: VecDeque::new(), sender: End::Open, receiver: End::Open, taken: false };
        let chan = Arc::new(Chan {
            q: Mutex::new(q),
            slots: self.cfg.slots,
            max: self.cfg.max_message,
            to_recv: Doorbell::new()?,
            to_send: Doorbell::new()?,
        });
        registry().lock().unwrap().insert(token, chan.clone());
        let mut blob = b"MEM1".to_vec();
        blob.extend_from_slice(&token.to_le_bytes());
        blob.extend_from_slice(&self.ctx.comm_id.to_le_bytes());
        Ok((Box::new(Pending { chan, token, peer }), blob))
    }
    fn connect_send(&self, peer: usize, blob: &[u8], _deadline: Instant) -> Result<Box<dyn SendConn>> {
        let bad = || Error::new(ErrorKind::InvalidArgument, "MEM: malformed setup blob").with_peer(peer);
        if blob.len() != 20 || &blob[..4] != b"MEM1" {
            return Err(bad());
        }
        let token = u64::from_le_bytes(blob[4..12].try_into().unwrap());
        let comm = u64::from_le_bytes(blob[12..20].try_into().unwrap());
        if comm != self.ctx.comm_id {
            return Err(bad());
        }
        let chan = registry().lock().unwrap().get(&token).cloned().ok_or_else(bad)?;
        {
            let mut q = chan.q.lock().unwrap();
            if q.taken {
                return Err(bad());
            }
            q.taken = true;
        }
        chan.to_recv.ring();
        Ok(Box::new(MemSend { chan, reserved: None }))
    }
}

struct Pending {
    chan: Arc<Chan>,
    token: u64,
    peer: usize,
}

impl Drop for Pending {
    fn drop(&mut self) {
        registry().lock().unwrap().remove(&self.token);
    }
}

impl PendingRecv for Pending {
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>> {
        loop {
            if self.chan.q.lock().unwrap().taken {
                return Ok(Box::new(MemRecv { chan: self.chan.clone(), peeked: None }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(ErrorKind::Timeout, "MEM: the sender did not connect").with_peer(self.peer));
            }
            crate::wait::wait_any(&[WaitSource::doorbell(self.chan.to_recv.read_fd())], left)?;
        }
    }
}

fn ended(end: End, who: &str) -> Error {
    match end {
        End::Aborted => {
            Error::remote(format!("the {who} {}", crate::PEER_ABORTED)).with_cause(crate::Cause::PeerAborted)
        }
        _ => Error::remote(format!("the {who} closed the connection")).with_cause(crate::Cause::PeerClosed),
    }
}

struct MemSend {
    chan: Arc<Chan>,
    reserved: Option<Vec<u8>>,
}

impl SendConn for MemSend {
    fn max_message(&self) -> usize {
        self.chan.max
    }
    fn reserve(&mut self) -> Result<Option<&mut [u8]>> {
        let q = self.chan.q.lock().unwrap();
        if q.receiver != End::Open {
            return Err(ended(q.receiver, "receiver"));
        }
        if self.reserved.is_none() && q.msgs.len() >= self.chan.slots {
            return Ok(None);
        }
        drop(q);
        Ok(Some(self.reserved.get_or_insert_with(|| vec![0; self.chan.max]).as_mut_slice()))
    }
    fn commit(&mut self, header: Header) -> Result<()> {
        let mut buf = self.reserved.take().ok_or_else(|| Error::internal("MEM: commit without reserve"))?;
        if header.len as usize > self.chan.max {
            return Err(Error::invalid_argument(format!(
                "MEM: message of {} bytes over {}",
                header.len, self.chan.max
            )));
        }
        buf.truncate(header.len as usize);
        self.chan.q.lock().unwrap().msgs.push_back((header, buf));
        self.chan.to_recv.ring();
        Ok(())
    }
    fn progress(&mut self) -> Result<()> {
        let q = self.chan.q.lock().unwrap();
        match q.receiver {
            End::Open => Ok(()),
            e => Err(ended(e, "receiver")),
        }
    }
    fn pending(&self) -> bool {
        false // a committed message is in the queue, not in this half
    }
    fn arm(&mut self) -> Result<Option<WaitSource>> {
        let q = self.chan.q.lock().unwrap();
        if q.receiver != End::Open || q.msgs.len() < self.chan.slots {
            return Ok(None);
        }
        Ok(Some(WaitSource::doorbell(self.chan.to_send.read_fd())))
    }
    fn disarm(&mut self) {}
    fn abort(&mut self) {
        self.chan.end(true, End::Aborted);
    }
}

impl Drop for MemSend {
    fn drop(&mut self) {
        self.chan.end(true, End::Closed);
    }
}

struct MemRecv {
    chan: Arc<Chan>,
    peeked: Option<(Header, Vec<u8>)>,
}

impl RecvConn for MemRecv {
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>> {
        if self.peeked.is_none() {
            let mut q = self.chan.q.lock().unwrap();
            match q.msgs.pop_front() {
                Some(m) => self.peeked = Some(m),
                None if q.sender != End::Open => return Err(ended(q.sender, "sender")),
                None => return Ok(None),
            }
        }
        Ok(self.peeked.as_ref().map(|(h, b)| (*h, b.as_slice())))
    }
    fn consume(&mut self) -> Result<()> {
        self.peeked.take().ok_or_else(|| Error::internal("MEM: consume without a message"))?;
        self.chan.to_send.ring();
        Ok(())
    }
    fn arm(&mut self) -> Result<Option<WaitSource>> {
        let q = self.chan.q.lock().unwrap();
        if self.peeked.is_some() || !q.msgs.is_empty() || q.sender != End::Open {
            return Ok(None);
        }
        Ok(Some(WaitSource::doorbell(self.chan.to_recv.read_fd())))
    }
    fn disarm(&mut self) {}
    fn abort(&mut self) {
        self.chan.end(false, End::Aborted);
    }
}

impl Drop for MemRecv {
    fn drop(&mut self) {
        self.chan.end(false, End::Closed);
    }
}
