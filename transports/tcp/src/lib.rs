//! # oxccl-transport-tcp: sockets between hosts
//!
//! Each directed peer pair uses `lanes` TCP connections (`OXCCL_NSOCKS`/`NCCL_NSOCKS_PERTHREAD`,
//! default 1), frames striped over them round robin (frame i on lane i mod lanes), so the
//! kernel works on several streams at once and a lost segment stalls one lane, not the pair. The
//! receiver owns a listening socket per communicator rank; its setup blob carries the address, a
//! fresh 16-byte token and the lane count. The sender connects each lane and, before anything
//! else, sends a 76-byte hello: magic, version, the lane's token, its encryption word and a keyed
//! BLAKE3 proof of the job secret over (purpose, communicator, token, encryption word).
//!
//! **Encryption** ([`TcpConfig::encrypt`]): every frame after the hello is sealed with AES-256-GCM
//! (`oxccl_transport::seal`) under a key of its own lane, derived from the job's master key and
//! the lane's fresh token. The encryption word (mode and a key check, in the receiver's blob and
//! the sender's hello) makes ranks that disagree (one encrypts, the other does not, or their keys
//! differ) fail at connection setup on both sides, naming the peer.
//!
//! The [`acceptor`](Acceptor) reads hellos without blocking, with a per-socket deadline, so a
//! silent, slow, garbage-sending or oversized stranger is dropped without delaying anyone; it never
//! allocates based on what a stranger sends.
//!
//! Data moves as frames (a [`Header`](oxccl_transport::Header) then the payload). The send side copies into one of its
//! slots and flushes with non-blocking writes; the receive side reads ahead into a buffer and
//! hands out complete frames in place. Before it sleeps on a large frame, the receive side sets
//! the socket's low mark (`SO_RCVLOWAT`) to the rest of the frame: one wake-up per frame, and
//! Linux ACKs the frame as it arrives rather than when the reader wakes. This crate has no
//! `unsafe` (the one socket option std and nix lack is set by the contract crate).

#![forbid(unsafe_code)]

mod conn;
pub mod netif;
mod recv;

use conn::{StripedSend, TcpSend};
use recv::{StripedRecv, TcpRecv};

use oxccl_transport::seal::{derive, mode_mismatch, mode_word, MasterKey, Opener, Sealer, WORD_BYTES};
use oxccl_transport::wait::{wait_any, WaitSource};
use oxccl_transport::{
    proof, random_bytes, verify_proof, Cause, Error, PeerInfo, PendingRecv, RecvConn, Result, SendConn, Transport,
    TransportCtx,
};
use std::collections::HashMap;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HELLO_MAGIC: u32 = 0x4F58_4354; // "OXCT"
const HELLO_VERSION: u32 = 2;
const HELLO_BYTES: usize = 76;
/// Bytes of the encryption word: mode (u32 LE, 0 plain, 1 AES-256-GCM) and a 16-byte key check.
const CRYPT_BYTES: usize = WORD_BYTES;
type CryptWord = [u8; CRYPT_BYTES];
/// How long a connecting socket may take to send its hello before it is dropped.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a data connection to be answered (SYN retries: 1, 3, 7, 15 s).
const CONNECT_LIMIT: Duration = Duration::from_secs(15);

/// Socket transport settings.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// Send slots per connection (shared by its lanes, at least 2 per lane).
    pub slots: usize,
    /// Payload bytes per frame.
    pub slot_bytes: usize,
    /// Sockets per directed peer pair (1..=16).
    pub lanes: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` of data sockets in bytes; `None` leaves the kernel's autotuning.
    pub socket_buffer: Option<usize>,
    /// Encrypt every frame under keys derived from this master key; `None`: plaintext.
    pub encrypt: Option<MasterKey>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { slots: 4, slot_bytes: 256 << 10, lanes: 1, socket_buffer: None, encrypt: None }
    }
}

/// Most lanes per peer pair.
pub const MAX_LANES: usize = 16;

/// The token of lane `i`: the connection's token with its last byte offset by the lane.
fn lane_token(token: &[u8; 16], i: usize) -> [u8; 16] {
    let mut t = *token;
    t[15] = t[15].wrapping_add(i as u8);
    t
}

/// The socket transport of one communicator rank.
pub struct TcpTransport {
    ctx: TransportCtx,
    cfg: TcpConfig,
    ip: IpAddr,
    acceptor: Mutex<Option<Arc<Mutex<Acceptor>>>>,
}

impl TcpTransport {
    /// A transport that listens on `ip` (the selected interface's address).
    pub fn new(ctx: TransportCtx, mut cfg: TcpConfig, ip: IpAddr) -> Self {
        cfg.lanes = cfg.lanes.clamp(1, MAX_LANES);
        cfg.slots = cfg.slots.max(2);
        TcpTransport { ctx, cfg, ip, acceptor: Mutex::new(None) }
    }

    fn acceptor(&self) -> Result<Arc<Mutex<Acceptor>>> {
        let mut g = self.acceptor.lock().unwrap();
        if let Some(a) = &*g {
            return Ok(a.clone());
        }
        let a = Arc::new(Mutex::new(Acceptor::bind(self.ip, self.ctx.secret, self.ctx.comm_id)?));
        *g = Some(a.clone());
        Ok(a)
    }
}

fn hello_context(comm: u64, token: &[u8; 16], crypt: &CryptWord) -> Vec<u8> {
    let mut c = b"oxccl-tcp-data".to_vec();
    c.extend_from_slice(&comm.to_le_bytes());
    c.extend_from_slice(token);
    c.extend_from_slice(crypt);
    c
}

/// What makes a connection (or a lane) unique: its communicator and token.
fn conn_context(comm: u64, token: &[u8; 16]) -> Vec<u8> {
    let mut c = comm.to_le_bytes().to_vec();
    c.extend_from_slice(token);
    c
}

/// A side's encryption word for the connection with token `token`.
fn crypt_word(master: Option<&MasterKey>, comm: u64, token: &[u8; 16]) -> CryptWord {
    mode_word(master, &conn_context(comm, token))
}

/// The setup error when the peer's encryption word is not this rank's.
fn crypt_mismatch(peer: usize, mine: &CryptWord, theirs: &CryptWord) -> Error {
    mode_mismatch(peer, "TCP", mine, theirs)
}

/// The sealing and opening key of one lane.
fn lane_key(master: &MasterKey, comm: u64, lane_token: &[u8; 16]) -> [u8; 32] {
    derive(&master.0, b"tcp frames", &conn_context(comm, lane_token))
}

/// Accepts authenticated data connections on one listening socket.
pub struct Acceptor {
    listener: TcpListener,
    secret: [u8; 32],
    comm: u64,
    pending: Vec<(TcpStream, Vec<u8>, Instant)>,
    ready: HashMap<[u8; 16], (TcpStream, CryptWord)>,
    /// Connections dropped for a missing or bad proof (for tests and reports).
    pub dropped: usize,
}

impl Acceptor {
    /// Listen on an ephemeral port of `ip`.
    pub fn bind(ip: IpAddr, secret: [u8; 32], comm: u64) -> Result<Acceptor> {
        let listener =
            TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::system(format!("listening on {ip}"), &e))?;
        listener.set_nonblocking(true).map_err(|e| Error::system("set_nonblocking", &e))?;
        Ok(Acceptor { listener, secret, comm, pending: Vec::new(), ready: HashMap::new(), dropped: 0 })
    }

    /// The listening address.
    pub fn addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| Error::system("local_addr", &e))
    }

    /// Make progress without blocking: accept new sockets, read hellos, drop strangers.
    pub fn poll(&mut self) -> Result<()> {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(true);
                    self.pending.push((s, Vec::with_capacity(HELLO_BYTES), Instant::now() + HELLO_TIMEOUT));
                }
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) if e.kind() == IoKind::Interrupted || e.kind() == IoKind::ConnectionAborted => {}
                Err(e) => return Err(Error::system("accept", &e)),
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let (s, buf, dl) = &mut self.pending[i];
            let mut tmp = [0u8; HELLO_BYTES];
            let want = HELLO_BYTES - buf.len();
            let outcome = match s.read(&mut tmp[..want]) {
                Ok(0) => Some(false),
                Ok(n) => {
                    buf.extend_from_slice(&tmp[..n]);
                    if buf.len() == HELLO_BYTES {
                        Some(true)
                    } else {
                        None
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock || e.kind() == IoKind::Interrupted => {
                    if now >= *dl {
                        Some(false)
                    } else {
                        None
                    }
                }
                Err(_) => Some(false),
            };
            match outcome {
                None => i += 1,
                Some(complete) => {
                    let (s, buf, _) = self.pending.swap_remove(i);
                    let peer = s.peer_addr().ok();
                    match complete.then(|| self.check_hello(&buf)).flatten() {
                        Some((token, crypt)) => {
                            self.ready.insert(token, (s, crypt));
                        }
                        None => {
                            self.dropped += 1;
                            tracing::warn!(
                                "oxccl: dropped a connection from {peer:?} without a valid hello (stranger, wrong job, or too slow)"
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn check_hello(&self, b: &[u8]) -> Option<([u8; 16], CryptWord)> {
        let magic = u32::from_le_bytes(b[0..4].try_into().ok()?);
        let version = u32::from_le_bytes(b[4..8].try_into().ok()?);
        if magic != HELLO_MAGIC || version != HELLO_VERSION {
            return None;
        }
        let token: [u8; 16] = b[8..24].try_into().ok()?;
        let crypt: CryptWord = b[24..44].try_into().ok()?;
        verify_proof(&self.secret, &hello_context(self.comm, &token, &crypt), &b[44..76]).then_some((token, crypt))
    }

    /// Take the authenticated connection for `token`, if it has arrived, with the sender's
    /// encryption word.
    fn take(&mut self, token: &[u8; 16]) -> Option<(TcpStream, CryptWord)> {
        self.ready.remove(token)
    }

    /// What to poll while waiting for connections.
    pub fn wait_sources(&self) -> Vec<WaitSource> {
        let mut v = vec![WaitSource::read(self.listener.as_raw_fd())];
        v.extend(self.pending.iter().map(|(s, _, _)| WaitSource::read(s.as_raw_fd())));
        v
    }
}

/// Connect rank `peer`'s data port `addr` and send the hello for `token` and the encryption
/// word `crypt` (bounded by
/// `deadline`). The port was published only once it listened, and it listens for as long as
/// the peer's communicator exists, so a refusal is final: the peer is gone (no retry until the
/// deadline, which was 600 s of waiting for a dead rank).
pub fn connect_with_hello(
    peer: usize,
    addr: SocketAddr,
    secret: &[u8; 32],
    comm: u64,
    token: &[u8; 16],
    crypt: &CryptWord,
    deadline: Instant,
) -> Result<TcpStream> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::timeout(format!("connecting to {addr}")));
    }
    // a host that answers nothing is given the kernel's SYN retries up to 15 s, not the deadline
    let mut s = match TcpStream::connect_timeout(&addr, left.min(CONNECT_LIMIT)) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), IoKind::TimedOut | IoKind::WouldBlock) && left > CONNECT_LIMIT => {
            return Err(Error::remote(format!(
                "rank {peer}'s host stopped answering: its data port {addr} did not answer in {} s",
                CONNECT_LIMIT.as_secs()
            ))
            .with_peer(peer)
            .with_cause(Cause::PeerUnreachable))
        }
        Err(e) if e.kind() == IoKind::ConnectionRefused => {
            return Err(Error::remote(format!(
                "rank {peer} died or left: its data port {addr} refused the connection (its process is gone, or its \
                 communicator was destroyed)"
            ))
            .with_peer(peer)
            .with_cause(Cause::PeerClosed))
        }
        Err(e) => return Err(Error::system(format!("connecting to rank {peer} at {addr}"), &e).with_peer(peer)),
    };
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&HELLO_VERSION.to_le_bytes());
    hello.extend_from_slice(token);
    hello.extend_from_slice(crypt);
    hello.extend_from_slice(&proof(secret, &hello_context(comm, token, crypt)));
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))
        .and_then(|_| s.write_all(&hello))
        .map_err(|e| Error::system(format!("sending hello to {addr}"), &e))?;
    Ok(s)
}

/// A peer's host that stops answering is noticed by the kernel: idle connections send a
/// keepalive probe after this many seconds, then one a second, and give up after this many
/// unanswered (2 + 3 s); data left unacknowledged this long fails the connection too. Either
/// way the next read or write reports `ETIMEDOUT`. (A stopped or busy process does not trip
/// them: its kernel still answers.)
const KEEPALIVE_IDLE_S: u32 = 2;
const KEEPALIVE_PROBES: u32 = 3;
const UNACKED_LIMIT_MS: u32 = 10_000;

fn configure(s: &TcpStream, buffer: Option<usize>) -> Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    s.set_nodelay(true)
        .and_then(|_| s.set_nonblocking(true))
        .map_err(|e| Error::system("configuring a data socket", &e))?;
    setsockopt(s, sockopt::KeepAlive, &true)
        .and_then(|_| setsockopt(s, sockopt::TcpKeepIdle, &KEEPALIVE_IDLE_S))
        .and_then(|_| setsockopt(s, sockopt::TcpKeepInterval, &1))
        .and_then(|_| setsockopt(s, sockopt::TcpKeepCount, &KEEPALIVE_PROBES))
        .and_then(|_| setsockopt(s, sockopt::TcpUserTimeout, &UNACKED_LIMIT_MS))
        .map_err(|e| Error::system("setting keepalive on a data socket", &std::io::Error::from(e)))?;
    if let Some(b) = buffer {
        setsockopt(s, sockopt::SndBuf, &b)
            .and_then(|_| setsockopt(s, sockopt::RcvBuf, &b))
            .map_err(|e| Error::system(format!("setting {b}-byte socket buffers"), &std::io::Error::from(e)))?;
    }
    Ok(())
}

/// What a failed read or write on a data connection says about the peer.
pub(crate) fn lost_how(e: &std::io::Error) -> (&'static str, Cause) {
    if e.kind() == IoKind::TimedOut {
        ("its host stopped answering: no TCP acknowledgement or keepalive reply for seconds", Cause::PeerUnreachable)
    } else {
        ("process died or connection reset", Cause::PeerClosed)
    }
}

/// Slots of each of `lanes` lanes sharing `slots`: at least 2 each.
fn lane_slots(cfg: &TcpConfig) -> usize {
    (cfg.slots / cfg.lanes).max(2)
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "NET/Socket"
    }

    fn can_connect(&self, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        true
    }

    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)> {
        let acc = self.acceptor()?;
        let addr = acc.lock().unwrap().addr()?;
        let mut token = [0u8; 16];
        random_bytes(&mut token)?;
        let mut blob = Vec::new();
        let ip = addr.ip().to_string();
        blob.push(ip.len() as u8);
        blob.extend_from_slice(ip.as_bytes());
        blob.extend_from_slice(&addr.port().to_le_bytes());
        blob.extend_from_slice(&token);
        blob.extend_from_slice(&(self.cfg.slot_bytes as u64).to_le_bytes());
        blob.push(self.cfg.lanes as u8);
        blob.extend_from_slice(&crypt_word(self.cfg.encrypt.as_ref(), self.ctx.comm_id, &token));
        let comm = self.ctx.comm_id;
        Ok((Box::new(PendingTcp { acc, token, peer, comm, cfg: self.cfg, lanes: Vec::new() }), blob))
    }

    fn connect_send(&self, peer: usize, blob: &[u8], deadline: Instant) -> Result<Box<dyn SendConn>> {
        let bad = || Error::remote("malformed TCP setup blob").with_peer(peer);
        let n = *blob.first().ok_or_else(bad)? as usize;
        let ip: IpAddr = std::str::from_utf8(blob.get(1..1 + n).ok_or_else(bad)?)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        let rest = blob.get(1 + n..).ok_or_else(bad)?;
        if rest.len() != 2 + 16 + 8 + 1 + CRYPT_BYTES {
            return Err(bad());
        }
        let port = u16::from_le_bytes([rest[0], rest[1]]);
        let token: [u8; 16] = rest[2..18].try_into().unwrap();
        let max = u64::from_le_bytes(rest[18..26].try_into().unwrap()) as usize;
        let lanes = rest[26] as usize;
        let theirs: CryptWord = rest[27..].try_into().unwrap();
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(bad());
        }
        if max != self.cfg.slot_bytes {
            return Err(Error::invalid_usage(format!(
                "peer uses {max}-byte TCP frames, this rank {} (OXCCL_NET_CHUNK_BYTES must match on all ranks)",
                self.cfg.slot_bytes
            ))
            .with_peer(peer));
        }
        // the receiver's lane count rules (it reads lane i for frame i mod lanes)
        let cfg = TcpConfig { lanes, ..self.cfg };
        let (comm, addr) = (self.ctx.comm_id, SocketAddr::new(ip, port));
        let mine = crypt_word(cfg.encrypt.as_ref(), comm, &token);
        if mine != theirs {
            // the peer learns it from this hello, so both sides fail now, not at a timeout
            let _ = connect_with_hello(peer, addr, &self.ctx.secret, comm, &lane_token(&token, 0), &mine, deadline);
            return Err(crypt_mismatch(peer, &mine, &theirs));
        }
        let mut out = Vec::with_capacity(lanes);
        for i in 0..lanes {
            let t = lane_token(&token, i);
            let s = connect_with_hello(peer, addr, &self.ctx.secret, comm, &t, &mine, deadline)?;
            configure(&s, cfg.socket_buffer)?;
            let seal = cfg.encrypt.map(|m| Sealer::new(&lane_key(&m, comm, &t)));
            out.push(TcpSend::new(s, lane_slots(&cfg), cfg.slot_bytes, peer, seal));
        }
        Ok(Box::new(StripedSend { lanes: out, head: 0 }))
    }
}

struct PendingTcp {
    acc: Arc<Mutex<Acceptor>>,
    token: [u8; 16],
    peer: usize,
    comm: u64,
    cfg: TcpConfig,
    lanes: Vec<TcpRecv>,
}

impl PendingRecv for PendingTcp {
    fn accept(mut self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>> {
        loop {
            let sources = {
                let mut a = self.acc.lock().unwrap();
                a.poll()?;
                while self.lanes.len() < self.cfg.lanes {
                    let t = lane_token(&self.token, self.lanes.len());
                    let Some((s, theirs)) = a.take(&t) else { break };
                    let mine = crypt_word(self.cfg.encrypt.as_ref(), self.comm, &self.token);
                    if theirs != mine {
                        return Err(crypt_mismatch(self.peer, &mine, &theirs));
                    }
                    configure(&s, self.cfg.socket_buffer)?;
                    let open = self.cfg.encrypt.map(|m| Opener::new(&lane_key(&m, self.comm, &t)));
                    self.lanes.push(TcpRecv::new(s, self.cfg.slot_bytes, self.peer, open));
                }
                if self.lanes.len() == self.cfg.lanes {
                    return Ok(Box::new(StripedRecv { lanes: std::mem::take(&mut self.lanes), tail: 0 }));
                }
                a.wait_sources()
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout("the sender never connected over TCP").with_peer(self.peer));
            }
            wait_any(&sources, (deadline - now).min(Duration::from_millis(100)))?;
        }
    }
}

#[cfg(test)]
mod tests;
