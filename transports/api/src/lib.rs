//! # oxccl-transport: the transport contract
//!
//! This small crate is what every oxccl transport implements and what the core crate drives.
//! It holds:
//! - [`Error`]/[`ErrorKind`], the one error type of oxccl (re-exported by `oxccl`);
//! - [`Header`], the frame header every message carries (communicator, sequence number and
//!   fingerprint, so a mismatch is detected where it arrives);
//! - the connection traits [`SendConn`]/[`RecvConn`] and the factory trait [`Transport`];
//! - [`wait`], doorbells and `poll(2)` so that waits block instead of spinning;
//! - [`proof`], the secret-keyed connection proof every transport uses.
//!
//! ## The contract
//! A transport is chosen per peer pair with [`Transport::can_connect`]. The receiving side calls
//! [`Transport::setup_recv`], which allocates what the receiver owns and returns an opaque blob; the
//! blob travels to the sender over the bootstrap store; the sender calls
//! [`Transport::connect_send`] with it; finally the receiver calls [`PendingRecv::accept`].
//!
//! A connection is a FIFO of messages of at most [`SendConn::max_message`] bytes, used in a
//! non-blocking post/test style, like NCCL's primitives over connection FIFOs:
//! - send: [`SendConn::reserve`] a slot (or learn there is none yet), write into it, then
//!   [`SendConn::commit`] it with its header; [`SendConn::progress`] pushes data out and
//!   [`SendConn::pending`] tells whether anything is still unflushed;
//! - receive: [`RecvConn::peek`] the next message (or learn there is none yet), read it in
//!   place, then [`RecvConn::consume`] it.
//!
//! Reading and writing in place lets the executor reduce straight from a peer's shared-memory slot
//! into the next peer's slot (NCCL's fused recvReduceSend) with no intermediate copy.
//! Nothing blocks: to sleep, the executor asks each connection to [`SendConn::arm`] /
//! [`RecvConn::arm`], which returns what to poll (or `None` if it became ready meanwhile), and
//! then calls [`wait::wait_any`].
//!
//! This crate contains `unsafe` only in [`wait`] (poll, pipe2, read, write), [`fork`]
//! (pthread_atfork), [`thread`] (gettid), [`deepen_backlog`] (listen) and [`set_rcvlowat`]
//! (setsockopt), each with a `// SAFETY:` comment.

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod cpus;
mod error;
pub mod fork;
pub mod mem;
pub mod seal;
pub mod thread;
pub mod wait;

pub use error::{Cause, Error, ErrorKind, Result};
use std::time::Instant;

/// Bytes of an encoded [`Header`].
pub const HEADER_BYTES: usize = 40;
/// Magic (and version) of every frame header.
pub const HEADER_MAGIC: u32 = 0x0CC1_0001;

/// Message text of the error a rank sees when its peer closed its connections because of a
/// failure of its own (a cascade, not a root cause).
pub const PEER_ABORTED: &str = "aborted its connections after a failure of its own";

/// `step` value of the frame a rank sends before it closes a connection because it failed.
pub const ABORT_STEP: u32 = u32::MAX;

/// Header of every message on every transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Payload length in bytes.
    pub len: u32,
    /// Communicator id (a hash of its namespace).
    pub comm: u64,
    /// The communicator's operation sequence number.
    pub seq: u64,
    /// Fingerprint of the operation, part 1: its element count.
    pub count: u64,
    /// Index of the message within the operation on this connection.
    pub step: u32,
    /// Fingerprint of the operation, part 2: (op, type, reduce op, root) packed by the core.
    /// With `count` it identifies the call exactly, so a mismatch message can show both calls.
    pub call: u32,
}

impl Header {
    /// Encode little-endian.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..36].copy_from_slice(&self.step.to_le_bytes());
        b[36..40].copy_from_slice(&self.call.to_le_bytes());
        b
    }
    /// Decode, rejecting a wrong magic/version or a payload longer than `max_len`.
    pub fn decode(b: &[u8], max_len: usize) -> Result<Header> {
        if b.len() < HEADER_BYTES {
            return Err(Error::remote(format!("short frame header: {} bytes", b.len())));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let magic = u32_at(0);
        if magic != HEADER_MAGIC {
            return Err(Error::remote(format!(
                "bad frame magic/version {magic:#010x} (expected {HEADER_MAGIC:#010x})"
            )));
        }
        let h = Header {
            len: u32_at(4),
            comm: u64_at(8),
            seq: u64_at(16),
            count: u64_at(24),
            step: u32_at(32),
            call: u32_at(36),
        };
        if h.len as usize > max_len {
            return Err(Error::remote(format!("frame length {} exceeds the connection's maximum {max_len}", h.len)));
        }
        Ok(h)
    }
}

/// What a rank tells its peers about itself at init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Rank in the communicator.
    pub rank: usize,
    /// Host identity (hash of hostname and boot id, or `OXCCL_HOSTID`).
    pub host_id: u64,
    /// Process id.
    pub pid: u32,
    /// Kernel identity (hash of the boot id): ranks in different network namespaces of one
    /// machine have different `host_id`s but share its cores.
    pub machine: u64,
    /// Host name, for messages.
    pub hostname: String,
    /// IP address data connections to this rank should use.
    pub ip: std::net::IpAddr,
    /// TCP port on `ip` of the process's liveness beacon (0: none), which peers on other
    /// machines probe while they wait for this rank outside a data connection.
    pub beacon: u16,
    /// The CPUs this rank's process may run on when it joined ([`cpus::allowed`], sorted;
    /// empty: unknown). The ranks of one machine count the cores they share from these.
    pub cpus: Vec<u32>,
    /// Its CPU quota in whole CPUs where tighter than `cpus` ([`cpus::quota`]; 0: none known).
    pub cpu_quota: u32,
}

impl PeerInfo {
    /// Encode as bytes for the bootstrap store.
    pub fn encode(&self) -> Vec<u8> {
        let (r, h, p, m) = (self.rank, self.host_id, self.pid, self.machine);
        let (ip, b, c, q) = (self.ip, self.beacon, cpus::format_list(&self.cpus), self.cpu_quota);
        format!("{r}\t{h}\t{p}\t{m}\t{ip}\t{b}\t{c}\t{q}\t{}", self.hostname).into_bytes()
    }
    /// Decode what [`PeerInfo::encode`] wrote.
    pub fn decode(b: &[u8]) -> Result<PeerInfo> {
        let bad = || Error::remote("malformed peer info in the bootstrap store");
        let s = std::str::from_utf8(b).map_err(|_| bad())?;
        let mut it = s.splitn(9, '\t');
        let mut next = || it.next().ok_or_else(bad);
        Ok(PeerInfo {
            rank: next()?.parse().map_err(|_| bad())?,
            host_id: next()?.parse().map_err(|_| bad())?,
            pid: next()?.parse().map_err(|_| bad())?,
            machine: next()?.parse().map_err(|_| bad())?,
            ip: next()?.parse().map_err(|_| bad())?,
            beacon: next()?.parse().map_err(|_| bad())?,
            cpus: cpus::parse_list(next()?).ok_or_else(bad)?,
            cpu_quota: next()?.parse().map_err(|_| bad())?,
            hostname: next()?.to_string(),
        })
    }
}

/// What every transport instance of a communicator knows.
#[derive(Debug, Clone)]
pub struct TransportCtx {
    /// This rank.
    pub rank: usize,
    /// Communicator size.
    pub nranks: usize,
    /// Communicator id (hash of its namespace).
    pub comm_id: u64,
    /// The job secret every connection proves it knows.
    pub secret: [u8; 32],
    /// Everyone's info, indexed by rank.
    pub peers: Vec<PeerInfo>,
}

/// A connection's answer to [`SendConn::borrow_forward`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarding {
    /// Operations (count × type size) in this range forward by reference. That pays while the
    /// operation fits in the caches; from [`SendConn::borrow_min_op`] on, the sender's copy runs
    /// first and leaves the bytes in the shared cache for the reader. Empty: never.
    pub ops: std::ops::Range<usize>,
    /// The executor narrows `ops` by the sending rank's role (`src/exec/byref.rs`), unless this
    /// is set: the connection's own copies are slow just now (shared memory between cores far
    /// apart), and sending by reference pays whatever the role.
    pub any_role: bool,
    /// Operations of at least this many bytes also send by reference, for this message, every
    /// value that stays unchanged until the operation ends, whatever the receiver does with it
    /// (combining included): beyond what [`SendConn::borrow_min_op`] and
    /// [`SendConn::borrow_for_combining`] allow at other times. Set while the connection's own
    /// copies are slow (shared memory between cores far apart: one crossing through the kernel
    /// beats two through the slots); `usize::MAX`: nothing more.
    pub stable_min_op: usize,
}

impl Default for Forwarding {
    /// Nothing forwards, nothing more goes by reference.
    fn default() -> Self {
        Forwarding { ops: 0..0, any_role: false, stable_min_op: usize::MAX }
    }
}

/// The sending half of a connection: a FIFO of messages with in-place slots.
pub trait SendConn: Send {
    /// Largest payload of one message.
    fn max_message(&self) -> usize;
    /// A writable slot of [`SendConn::max_message`] bytes for the next message, or `None` while the
    /// FIFO is full. Calling it again before `commit` returns the same slot.
    fn reserve(&mut self) -> Result<Option<&mut [u8]>>;
    /// Publish the reserved slot; `header.len` bytes of it are the payload.
    fn commit(&mut self, header: Header) -> Result<()>;
    /// Push committed data towards the peer without blocking.
    fn progress(&mut self) -> Result<()>;
    /// Whether committed data is still waiting to leave this process.
    fn pending(&self) -> bool;
    /// Prepare to sleep until there is room or data can be flushed. Returns the source to poll,
    /// or `None` if progress is possible right now.
    fn arm(&mut self) -> Result<Option<wait::WaitSource>>;
    /// Undo [`SendConn::arm`] after waking.
    fn disarm(&mut self);
    /// Bytes of memory this half owns (buffers; shared segments are counted by their owner).
    fn memory(&self) -> usize {
        0
    }
    /// Whether the peer is still there, for transports that cannot see a dead peer otherwise
    /// (shared memory: a killed process closes nothing). Called when a wait wakes.
    fn check_peer(&self) -> Result<()> {
        Ok(())
    }
    /// Tell the peer, best effort and without blocking, that this rank is closing the
    /// connection because it failed (its next receive reports [`PEER_ABORTED`]).
    fn abort(&mut self) {}
    /// Single copy (optional): whether the next message of `len` bytes may be sent by
    /// reference with [`SendConn::commit_borrowed`]. `Ok(None)`: the FIFO is full (wait, as for
    /// `reserve`); `Ok(Some(false))`: not possible here (send it the ordinary way).
    fn borrow_ready(&mut self, _len: usize) -> Result<Option<bool>> {
        Ok(Some(false))
    }
    /// Single copy (optional): the smallest operation (count × type size) whose messages this
    /// connection wants to send by reference; `usize::MAX`: never.
    fn borrow_min_op(&self) -> usize {
        usize::MAX
    }
    /// Single copy (optional): which operations also send by reference the messages that only
    /// pass the sender's unchanged input on, committed before the sender's own copy so that the
    /// receiver's read overlaps it, and what more goes by reference just now ([`Forwarding`]).
    /// Asked once per message that may go by reference, before the others of its step.
    fn borrow_forward(&self) -> Forwarding {
        Forwarding::default()
    }
    /// Single copy (optional): whether sending by reference still pays when the receiver
    /// combines the message with its own data rather than only copying it. Shared memory: no
    /// (the receiver would first copy it into a slot, with the kernel's slower copy, where the
    /// sender's own copy would do); RDMA: yes (it saves the sender's staging copy whatever the
    /// receiver does).
    fn borrow_for_combining(&self) -> bool {
        true
    }
    /// Single copy (optional): publish a message whose `header.len` bytes stay in this process
    /// at address `addr`; the transport reads them from there (shared memory: the receiver
    /// copies them with `process_vm_readv`; RDMA: they are written from a registration of that
    /// memory). The caller
    /// keeps that memory unchanged until [`SendConn::pending`] turns false, which it does once
    /// the receiver consumed every message sent this way.
    fn commit_borrowed(&mut self, _header: Header, _addr: usize) -> Result<()> {
        Err(Error::new(ErrorKind::Unavailable, "this transport cannot send by reference"))
    }
}

/// The receiving half of a connection.
pub trait RecvConn: Send {
    /// The next message, if it has fully arrived: its header and payload, readable in place.
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>>;
    /// Release the message returned by the last `peek`.
    fn consume(&mut self) -> Result<()>;
    /// Prepare to sleep until a message arrives. Returns the source to poll, or `None` if one is
    /// already there.
    fn arm(&mut self) -> Result<Option<wait::WaitSource>>;
    /// Undo [`RecvConn::arm`] after waking.
    fn disarm(&mut self);
    /// Bytes of memory this half owns (buffers, shared segments it allocated).
    fn memory(&self) -> usize {
        0
    }
    /// Whether the peer is still there (see [`SendConn::check_peer`]).
    fn check_peer(&self) -> Result<()> {
        Ok(())
    }
    /// Tell the sender this rank is closing because it failed (see [`SendConn::abort`]).
    fn abort(&mut self) {}
    /// Single copy (optional): if the next message was sent by reference, or (TCP) is still
    /// arriving, check its header with `check` and copy its payload straight into `dst` (which
    /// must be exactly its size); returns the header once all of it is there. `Ok(None)`: no
    /// message yet, an ordinary one (use `peek`), or one that began to arrive into `dst`: then
    /// `peek` answers `None` and the caller calls `take_into` again, with the same `dst`, until
    /// it returns the header. The message still has to be [`RecvConn::consume`]d.
    fn take_into(&mut self, _dst: &mut [u8], _check: &dyn Fn(&Header) -> Result<()>) -> Result<Option<Header>> {
        Ok(None)
    }
}

/// A receive side that has published its setup blob and waits for the sender.
pub trait PendingRecv: Send {
    /// Complete the connection once the sender has connected (bounded by `deadline`).
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>>;
}

/// A transport: a factory of connections between two ranks.
pub trait Transport: Send + Sync {
    /// Name used in logs (`SHM`, `NET/Socket`).
    fn name(&self) -> &'static str;
    /// Whether this transport can connect `me` to `peer`.
    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool;
    /// Receiving side, step 1: allocate what the receiver owns; returns the blob for the sender.
    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)>;
    /// Sending side: connect using the receiver's blob.
    fn connect_send(&self, peer: usize, blob: &[u8], deadline: Instant) -> Result<Box<dyn SendConn>>;
}

/// The proof that a connection knows the job secret: a keyed BLAKE3 hash of a context string
/// (which names the purpose and carries a fresh token, so proofs are not reusable elsewhere).
pub fn proof(secret: &[u8; 32], context: &[u8]) -> [u8; 32] {
    *blake3::keyed_hash(secret, context).as_bytes()
}

/// Constant-time check of a proof.
pub fn verify_proof(secret: &[u8; 32], context: &[u8], claimed: &[u8]) -> bool {
    if claimed.len() != 32 {
        return false;
    }
    let mut c = [0u8; 32];
    c.copy_from_slice(claimed);
    blake3::keyed_hash(secret, context) == blake3::Hash::from(c)
}

/// Let `l` queue up to `n` connections not yet accepted (`listen(2)` again; std's default is
/// 128, and the kernel caps it at `net.core.somaxconn`). For a listener that must keep answering
/// while its process is stopped: the kernel completes handshakes into the queue for it.
pub fn deepen_backlog(l: &std::net::TcpListener, n: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a socket this listener owns; no memory is passed.
    let rc = unsafe { libc::listen(l.as_raw_fd(), n) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Make `s` readable (to poll and blocking reads) only once `bytes` have arrived (`SO_RCVLOWAT`;
/// Linux caps it at half the receive buffer and grows the buffer to fit). A non-blocking read
/// still returns whatever is there. While less than `bytes` is unread, Linux acknowledges data as
/// it arrives instead of delaying the ACK until the reader wakes.
pub fn set_rcvlowat(s: &std::net::TcpStream, bytes: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt(2) on a socket `s` owns, reading one c_int that lives across the call.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether process `pid` is alive (exists and is not a zombie), from `/proc/<pid>/stat`.
pub fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(s.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()), Some('Z' | 'X')),
        Err(_) => false,
    }
}

/// `Ok` while rank `peer`'s process `pid` (on this machine) is alive; otherwise the error every
/// transport reports for a dead peer.
pub fn check_alive(peer: usize, pid: u32) -> Result<()> {
    if process_alive(pid) {
        Ok(())
    } else {
        Err(Error::remote(format!("rank {peer} (pid {pid}) died: its process is gone"))
            .with_peer(peer)
            .with_cause(Cause::PeerDied))
    }
}

/// Fill a buffer with OS randomness (`/dev/urandom`).
pub fn random_bytes(buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| Error::system("reading /dev/urandom", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_rejects() {
        let h = Header { len: 77, comm: 1, seq: 2, count: 3, step: 4, call: 5 };
        let b = h.encode();
        assert_eq!(Header::decode(&b, 100).unwrap(), h);
        assert!(Header::decode(&b, 76).is_err(), "oversized length");
        assert!(Header::decode(&b[..39], 100).is_err(), "short");
        let mut bad = b;
        bad[0] ^= 1;
        assert!(Header::decode(&bad, 100).is_err(), "bad magic");
    }

    #[test]
    fn a_deepened_backlog_queues_connections_nobody_accepts() {
        // std's queue holds 128: a listener whose process is stopped must hold more
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        deepen_backlog(&l, 4096).unwrap();
        let cap: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        let n = cap.min(400) - 8;
        let addr = l.local_addr().unwrap();
        let held: Vec<_> = (0..n)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} of {n} not queued: {e}"))
            })
            .collect();
        assert_eq!(held.len(), n);
    }

    #[test]
    fn peer_info_roundtrip() {
        let p = PeerInfo {
            rank: 3,
            host_id: u64::MAX,
            pid: 42,
            machine: 7,
            hostname: "a\tb".into(),
            ip: "10.0.0.1".parse().unwrap(),
            beacon: 4242,
            cpus: vec![0, 1, 2, 5],
            cpu_quota: 2,
        };
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
        let unknown = PeerInfo { cpus: vec![], cpu_quota: 0, ..p.clone() };
        assert_eq!(PeerInfo::decode(&unknown.encode()).unwrap(), unknown);
        assert!(PeerInfo::decode(b"x\ty").is_err());
        let bad_cpus = String::from_utf8(p.encode()).unwrap().replace("0-2,5", "2-0");
        assert!(PeerInfo::decode(bad_cpus.as_bytes()).is_err(), "{bad_cpus}");
    }

    #[test]
    fn proofs() {
        let s = [7u8; 32];
        let p = proof(&s, b"ctx");
        assert!(verify_proof(&s, b"ctx", &p));
        assert!(!verify_proof(&s, b"ctx2", &p));
        assert!(!verify_proof(&[8u8; 32], b"ctx", &p));
        assert!(!verify_proof(&s, b"ctx", &p[..31]));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;

    /// Decoders take any bytes without panicking, and accept only well-formed input.
    #[test]
    fn decoders_survive_random_bytes() {
        let mut z = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        let mut accepted = 0;
        for i in 0..200_000 {
            let len = (next() % 64) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 4 == 0 && b.len() >= 4 {
                b[..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes()); // get past the magic sometimes
            }
            if let Ok(h) = Header::decode(&b, 1 << 20) {
                assert!(h.len <= 1 << 20);
                assert_eq!(Header::decode(&h.encode(), 1 << 20).unwrap(), h);
                accepted += 1;
            }
            let _ = PeerInfo::decode(&b);
        }
        assert!(accepted > 0, "the fuzzer reached the accepting path");
    }
}
