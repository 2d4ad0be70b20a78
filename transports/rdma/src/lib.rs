//! # oxccl-transport-rdma: one-sided RDMA between hosts
//!
//! One protocol over a small backend trait ([`Fabric`]): libfabric RDM endpoints ([`ofi`],
//! tested here with `tcp;ofi_rxm`) and InfiniBand/RoCE verbs ([`verbs`]: reliable-connected
//! queue pairs, tested on simulated devices; nothing has run on RDMA hardware, see
//! `docs/transports.md`).
//!
//! ## The protocol (per connection, sender → receiver)
//! - The receiver registers a ring of `slots` slots of `64 + max_message` bytes and publishes,
//!   in the setup blob, its endpoint address, a connection id, the ring's remote address and
//!   key, and a fresh token.
//! - The sender inserts that address, registers a staging ring of the same shape, and sends a
//!   HELLO message carrying its own address, its connection id and a proof (keyed by the job
//!   secret) over the token; the receiver accepts only a valid proof for a token it issued.
//! - A message: the sender writes header + payload into its staging slot and RDMA-writes the
//!   slot into the receiver's slot `index % slots` (one-sided). The write carries its own
//!   notification where the backend offers it (verbs' write with immediate, libfabric's remote
//!   CQ data: connection id and slot); otherwise a NOTIFY message with the index follows it on
//!   the same endpoint pair, and send-after-write ordering (`FI_ORDER_SAW`, requested from the
//!   provider; in order on an RC queue pair) makes the payload visible before the notification.
//!   Large messages of large operations are written from the user's buffer through the
//!   registration cache ([`regcache`], [`memmon`]) instead of being copied first.
//! - Credits: the receiver returns the number of messages it consumed in CREDIT messages; the
//!   sender never has more than `slots` messages unconsumed, so a slot is never overwritten
//!   before it was read.
//! - Closing: a connection closed with messages its receiver has not credited yet sends a FLUSH
//!   on each endpoint pair those messages took; the receiver answers FLUSHED once it has read
//!   the FLUSH, so after every message before it on that pair. The endpoint is closed only
//!   when every FLUSH was answered (or its peer is gone, or after `OXCCL_NET_LINGER_MS`): a
//!   completion at the sender can mean only that the bytes left this process (a software
//!   provider's socket), and closing a socket with unread data resets it, dropping what its
//!   send queue still held. A rank that finished and exited must not take its last messages
//!   with it. Closing after a failure or an abort does not wait.
//! - Completions: one completion queue per endpoint with a file descriptor; the executor sleeps
//!   in `poll(2)` on it after `fi_trywait` says nothing is pending, so an idle rank does not
//!   spin. Error completions become `Remote`/`System` errors naming the peer rank, the provider,
//!   the device and the status.
//!
//! `unsafe` is limited to the FFI of the backends and the raw ring memory handed to them, each
//! with a `// SAFETY:` comment.

pub mod memmon;
pub mod ofi;
pub mod regcache;
pub mod verbs;

use oxccl_transport::wait::WaitSource;
use oxccl_transport::{
    proof, random_bytes, verify_proof, Error, ErrorKind, Header, PeerInfo, PendingRecv, RecvConn, Result, SendConn,
    Transport, TransportCtx, HEADER_BYTES,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A memory registration.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    /// The backend's handle.
    pub handle: usize,
    /// Local descriptor passed with local buffers.
    pub desc: usize,
    /// Remote key.
    pub key: u64,
    /// Remote address of the region's first byte (its virtual address, or 0 for offset-based
    /// providers).
    pub remote_base: u64,
}

/// One completion.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The token given when the operation was posted.
    pub token: u64,
    /// Bytes received (receives).
    pub len: usize,
    /// The status of an error completion.
    pub error: Option<String>,
    /// The notification of a peer's [`Fabric::write`] that landed here (its token is the
    /// receive it consumed, if the backend consumes one, else 0).
    pub data: Option<u32>,
}

/// What the protocol needs from an RDMA backend: one endpoint with an address vector and a
/// completion queue that has a file descriptor.
pub trait Fabric: Send + Sync {
    /// Provider name (`tcp;ofi_rxm`, `efa`, `verbs`).
    fn provider(&self) -> &str;
    /// Device or domain name (`mlx5_0`, `lo`).
    fn device(&self) -> &str;
    /// Endpoints of this rank (messages are striped across them; they share one completion
    /// queue).
    fn endpoints(&self) -> usize;
    /// Endpoint `ep`'s address, for peers.
    fn address(&self, ep: usize) -> Result<Vec<u8>>;
    /// Make a peer's address usable as a destination.
    fn insert_peer(&self, addr: &[u8]) -> Result<u64>;
    /// Register memory for local use and remote writes.
    ///
    /// # Safety
    /// `[buf, buf+len)` is mapped now, and no operation uses the registration after that
    /// memory is unmapped (it may be deregistered after: the registration cache deregisters
    /// user memory once its unmapping was seen).
    unsafe fn register(&self, buf: *mut u8, len: usize) -> Result<Region>;
    /// Register device memory exported by the GPU driver as a dma-buf (`fd`, `offset` into it,
    /// `len` bytes, mapped at `iova` in this process): GPUDirect RDMA. `Unavailable` where the
    /// backend or the driver does not offer it (then device memory is staged through pinned
    /// host memory).
    fn register_dmabuf(&self, _fd: i32, _offset: u64, _len: usize, _iova: u64) -> Result<Region> {
        Err(Error::new(ErrorKind::Unavailable, format!("{} cannot register device memory (dma-buf)", self.provider())))
    }
    /// Drop a registration.
    fn deregister(&self, r: &Region);
    /// One-sided write; `Ok(false)`: retry after progress. With `notify` (only where
    /// [`Fabric::notify_writes`]), the target also gets a completion carrying that value once
    /// the bytes are in place: the write and its notification in one operation.
    ///
    /// # Safety
    /// The buffer stays unchanged until the completion with `token`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn write(
        &self,
        ep: usize,
        buf: *const u8,
        len: usize,
        desc: usize,
        dest: u64,
        raddr: u64,
        key: u64,
        notify: Option<u32>,
        token: u64,
    ) -> Result<bool>;
    /// Whether [`Fabric::write`] takes a notification (verbs: write with immediate; libfabric:
    /// remote CQ data).
    fn notify_writes(&self) -> bool {
        false
    }
    /// Send a message; `Ok(false)`: retry after progress.
    ///
    /// # Safety
    /// As for [`Fabric::write`].
    unsafe fn send(&self, ep: usize, buf: *const u8, len: usize, desc: usize, dest: u64, token: u64) -> Result<bool>;
    /// Post a receive buffer; `Ok(false)`: retry after progress.
    ///
    /// # Safety
    /// The buffer stays allocated until its completion.
    unsafe fn post_recv(&self, ep: usize, buf: *mut u8, len: usize, desc: usize, token: u64) -> Result<bool>;
    /// Drive progress and collect completions.
    fn poll(&self, out: &mut Vec<Completion>) -> Result<()>;
    /// The completion queue's file descriptor.
    fn wait_fd(&self) -> i32;
    /// Whether sleeping on [`Fabric::wait_fd`] is safe now (nothing pending inside the provider).
    fn try_wait(&self) -> bool;
}

/// Which network a communicator uses between hosts: `OXCCL_NET` (or NCCL's `NCCL_NET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetChoice {
    /// oxccl's TCP sockets (the default).
    Socket,
    /// libfabric, with an optional provider (`OXCCL_OFI_PROVIDER`, default `tcp;ofi_rxm`... any).
    Ofi(String),
    /// InfiniBand/RoCE verbs.
    Ib,
}

impl NetChoice {
    /// From `OXCCL_NET`/`NCCL_NET` (`socket`, `ofi`/`libfabric`/`aws-ofi-nccl`, `ib`/`verbs`),
    /// case-insensitive; unset: socket. `OXCCL_OFI_PROVIDER` (or `FI_PROVIDER`) picks the
    /// libfabric provider.
    pub fn from_env() -> Result<NetChoice> {
        let v = std::env::var("OXCCL_NET").or_else(|_| std::env::var("NCCL_NET")).unwrap_or_default();
        let prov = std::env::var("OXCCL_OFI_PROVIDER").or_else(|_| std::env::var("FI_PROVIDER")).unwrap_or_default();
        NetChoice::parse(&v, &prov)
    }
    /// Parse a value of `OXCCL_NET` with a provider name.
    pub fn parse(v: &str, provider: &str) -> Result<NetChoice> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "socket" | "tcp" => Ok(NetChoice::Socket),
            "ofi" | "libfabric" | "aws-ofi-nccl" | "aws libfabric" => Ok(NetChoice::Ofi(provider.to_string())),
            "ib" | "verbs" | "ibverbs" => Ok(NetChoice::Ib),
            other => Err(Error::invalid_argument(format!(
                "OXCCL_NET={other:?} is not a network oxccl knows (socket, ofi, ib)"
            ))),
        }
    }
}

const MSG_BYTES: usize = 256;
/// Where a HELLO's address list starts.
const HELLO_ADDRS: usize = 60;
const RX_BUFS: usize = 256;
const TX_BUFS: usize = 256;
const SLOT_HEADER: usize = 64;
const BLOB_MAGIC: u32 = 0x0CC1_0F10;

const T_HELLO: u8 = 1;
const T_NOTIFY: u8 = 2;
const T_CREDIT: u8 = 3;
const T_ABORT: u8 = 4;
const T_FLUSH: u8 = 5;
const T_FLUSHED: u8 = 6;
const T_CLOSED: u8 = 7;

// completion tokens: kind in the top byte
const K_RX: u64 = 1 << 56;
const K_TXMSG: u64 = 2 << 56;
const K_WRITE: u64 = 3 << 56;
/// Write tokens: connection id << 24, a flag for payload writes from user memory, the slot.
const USER_WRITE: u64 = 1 << 20;
const SLOT_MASK: u64 = USER_WRITE - 1;

/// Bounds of the registration cache of user memory.
const USER_CACHE_ENTRIES: usize = 256;

/// `OXCCL_NET_REG_CACHE_BYTES`: most bytes of user memory kept registered (default 8 GiB).
fn user_cache_bytes() -> usize {
    std::env::var("OXCCL_NET_REG_CACHE_BYTES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(8 << 30)
}

/// 8-byte-aligned heap memory that stays put when its owner moves (rings and message pools are
/// registered).
struct Mem {
    buf: Vec<u64>,
}

impl Mem {
    fn new(bytes: usize) -> Mem {
        Mem { buf: vec![0u64; bytes.div_ceil(8).max(1)] }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        self.buf.len() * 8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the Vec's memory viewed as bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len()) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the Vec's memory viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len()) }
    }
}

#[derive(Default)]
struct RecvSide {
    token: [u8; 16],
    /// (sender's destinations, one per sender endpoint; sender's connection id) once HELLO
    /// arrived.
    hello: Option<(Vec<u64>, u32)>,
    /// Per slot: 1 + the index of the message notified in it (NOTIFYs of messages striped over
    /// several endpoints may arrive out of order).
    notified: Vec<u64>,
    aborted: bool,
    /// The sender closed its half normally after posting this many messages.
    closed_after: Option<u64>,
    /// The sender's rank.
    peer: usize,
    /// A control message of this connection (CREDIT, ABORT) failed.
    error: Option<Error>,
}

impl RecvSide {
    /// Whether message `index` is in place (its notification arrived).
    fn arrived(&self, index: u64) -> bool {
        self.notified[(index % self.notified.len() as u64) as usize] == index + 1
    }
}

#[derive(Default)]
struct SendSide {
    peer: usize,
    /// Messages the receiver has consumed.
    credits: u64,
    /// Writes posted and not yet completed locally, per staging slot (two for a message sent
    /// from user memory: its header, then its payload).
    busy: Vec<u8>,
    /// Per staging slot: the registration cache entry a payload write from user memory holds.
    held: Vec<Option<u64>>,
    aborted: bool,
    error: Option<Error>,
    /// The receiver closed its half (it reads nothing more): closing this one waits for nothing.
    receiver_closed: bool,
}

/// Work the provider could not take yet (EAGAIN), posted in order by the next progress: the
/// protocol never blocks inside a call, and queued items keep their order (write, then its
/// NOTIFY).
enum Outgoing {
    /// Re-post receive buffer `i`.
    Recv(usize),
    /// A control message, and the connection it belongs to.
    Msg { ep: usize, dest: u64, bytes: Vec<u8>, owner: Owner },
    /// An RDMA write of a staging slot (the slot stays busy until its completion), with the
    /// notification the target gets, if the write carries it.
    Write {
        ep: usize,
        src: usize,
        len: usize,
        desc: usize,
        dest: u64,
        raddr: u64,
        key: u64,
        token: u64,
        notify: Option<u32>,
    },
}

/// The connection a control message belongs to (its failure is reported there).
#[derive(Debug, Clone, Copy)]
enum Owner {
    /// Sending half `id` (HELLO, NOTIFY, its ABORT).
    Send(u32),
    /// Receiving half `id` (CREDIT, its ABORT).
    Recv(u32),
    /// The FLUSH with this nonce, of a connection being closed.
    Flush(u64),
    /// A FLUSHED answer (nobody waits for it).
    Reply,
}

struct NetState {
    next_id: u32,
    outbox: std::collections::VecDeque<Outgoing>,
    recvs: HashMap<u32, RecvSide>,
    sends: HashMap<u32, SendSide>,
    rx: Mem,
    rx_region: Region,
    tx: Mem,
    tx_region: Region,
    tx_free: Vec<usize>,
    /// Per message buffer in flight: whose message it carries.
    tx_owner: Vec<Option<Owner>>,
    error: Option<Error>,
    /// Receiving halves already closed, with their sender's destinations and connection id: a
    /// FLUSH for one is still answered.
    closed_recvs: HashMap<u32, (Vec<u64>, u32)>,
    /// FLUSHes not answered yet: nonce → (peer rank, sending half's id).
    flushes: HashMap<u64, (usize, u32)>,
    next_flush: u64,
    /// A connection was aborted (the communicator failed or was aborted): closing waits for
    /// nothing.
    abandoned: bool,
}

/// One endpoint shared by every connection of a transport instance.
struct Net {
    fab: Box<dyn Fabric>,
    ctx: TransportCtx,
    st: Mutex<NetState>,
    /// Registrations of user memory (large messages are written from where they lie).
    user: std::sync::OnceLock<Option<memmon::Watched<Region>>>,
    /// Messages go as one write carrying its notification (the backend offers it, and
    /// `OXCCL_NET_WRITE_NOTIFY` is not `0`).
    write_notify: bool,
    /// Longest wait for FLUSH answers when closing.
    linger: std::time::Duration,
}

impl Net {
    fn open(fab: Box<dyn Fabric>, ctx: TransportCtx, linger: std::time::Duration) -> Result<Arc<Net>> {
        let mut rx = Mem::new(MSG_BYTES * RX_BUFS * fab.endpoints());
        let mut tx = Mem::new(MSG_BYTES * TX_BUFS);
        // SAFETY: both pools live in NetState, inside the Net that owns the fabric, and are
        // deregistered in Net's Drop before they are freed.
        let (rx_region, tx_region) = unsafe { (fab.register(rx.ptr(), rx.len())?, fab.register(tx.ptr(), tx.len())?) };
        let write_notify =
            fab.notify_writes() && std::env::var("OXCCL_NET_WRITE_NOTIFY").map_or(true, |v| v.trim() != "0");
        let net = Arc::new(Net {
            fab,
            ctx,
            user: std::sync::OnceLock::new(),
            write_notify,
            linger,
            st: Mutex::new(NetState {
                next_id: 1,
                outbox: std::collections::VecDeque::new(),
                recvs: HashMap::new(),
                sends: HashMap::new(),
                rx,
                rx_region,
                tx,
                tx_region,
                tx_free: (0..TX_BUFS).collect(),
                tx_owner: vec![None; TX_BUFS],
                error: None,
                closed_recvs: HashMap::new(),
                flushes: HashMap::new(),
                next_flush: 0,
                abandoned: false,
            }),
        });
        {
            let mut st = net.st.lock().unwrap();
            for i in 0..RX_BUFS * net.fab.endpoints() {
                net.post_rx(&mut st, i)?;
            }
        }
        Ok(net)
    }

    fn post_rx(&self, st: &mut NetState, i: usize) -> Result<()> {
        st.outbox.push_back(Outgoing::Recv(i));
        self.flush(st)
    }

    fn where_(&self) -> String {
        format!("{} on {}", self.fab.provider(), self.fab.device())
    }

    /// Queue a small control message to `dest` and post what the provider takes now.
    fn send_msg(&self, st: &mut NetState, ep: usize, dest: u64, msg: &[u8], owner: Owner) -> Result<()> {
        st.outbox.push_back(Outgoing::Msg { ep, dest, bytes: msg.to_vec(), owner });
        self.flush(st)
    }

    /// Post queued work in order until the provider says EAGAIN (or no message buffer is free).
    fn flush(&self, st: &mut NetState) -> Result<()> {
        while let Some(item) = st.outbox.front() {
            let posted = match item {
                &Outgoing::Recv(i) => {
                    let p = st.rx.ptr();
                    // SAFETY: buffer i of the pool, MSG_BYTES long; the pool outlives the
                    // endpoint's use (deregistered in Net's Drop).
                    unsafe {
                        self.fab.post_recv(
                            i / RX_BUFS,
                            p.add(i * MSG_BYTES),
                            MSG_BYTES,
                            st.rx_region.desc,
                            K_RX | i as u64,
                        )?
                    }
                }
                Outgoing::Msg { ep, dest, bytes, owner } => {
                    let Some(i) = st.tx_free.pop() else { return Ok(()) };
                    st.tx_owner[i] = Some(*owner);
                    let len = bytes.len();
                    st.tx.bytes_mut()[i * MSG_BYTES..i * MSG_BYTES + len].copy_from_slice(bytes);
                    let p = st.tx.ptr();
                    // SAFETY: pool buffer i stays reserved (not in tx_free) until its completion.
                    let ok = unsafe {
                        self.fab.send(*ep, p.add(i * MSG_BYTES), len, st.tx_region.desc, *dest, K_TXMSG | i as u64)?
                    };
                    if !ok {
                        st.tx_free.push(i);
                    }
                    ok
                }
                &Outgoing::Write { ep, src, len, desc, dest, raddr, key, token, notify } => {
                    // SAFETY: a staging slot marked busy until this write's completion; its ring
                    // is deregistered and freed only after the busy flags cleared.
                    unsafe { self.fab.write(ep, src as *const u8, len, desc, dest, raddr, key, notify, token)? }
                }
            };
            if !posted {
                return Ok(());
            }
            st.outbox.pop_front();
        }
        Ok(())
    }

    fn progress(&self) -> Result<()> {
        let mut st = self.st.lock().unwrap();
        self.progress_locked(&mut st)
    }

    /// Read completions and apply them.
    fn progress_locked(&self, st: &mut NetState) -> Result<()> {
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        self.flush(st)?;
        let mut done = Vec::new();
        self.fab.poll(&mut done)?;
        for c in done {
            let kind = c.token & (0xff << 56);
            let low = c.token & ((1 << 56) - 1);
            if let Some(status) = &c.error {
                match kind {
                    K_WRITE => {
                        let id = (low >> 24) as u32;
                        if let Some(s) = st.sends.get_mut(&id) {
                            let e = Error::remote(format!(
                                "RDMA write to rank {} failed ({}): {status}",
                                s.peer,
                                self.where_()
                            ))
                            .with_peer(s.peer);
                            s.error.get_or_insert(e);
                        }
                    }
                    K_TXMSG => {
                        let i = low as usize;
                        st.tx_free.push(i);
                        // the message's connection fails, naming the peer (a lost NOTIFY or
                        // CREDIT would otherwise show only as a timeout)
                        let what = |peer: usize| {
                            Error::remote(format!("RDMA message to rank {peer} failed ({}): {status}", self.where_()))
                                .with_peer(peer)
                        };
                        match st.tx_owner.get_mut(i).and_then(Option::take) {
                            Some(Owner::Send(id)) => {
                                if let Some(s) = st.sends.get_mut(&id) {
                                    let e = what(s.peer);
                                    s.error.get_or_insert(e);
                                }
                            }
                            Some(Owner::Recv(id)) => {
                                if let Some(r) = st.recvs.get_mut(&id) {
                                    let e = what(r.peer);
                                    r.error.get_or_insert(e);
                                }
                            }
                            Some(Owner::Flush(n)) => {
                                if let Some((peer, _)) = st.flushes.remove(&n) {
                                    tracing::info!("{}: closing, its FLUSH was lost", what(peer));
                                }
                            }
                            Some(Owner::Reply) | None => {}
                        }
                    }
                    _ => {
                        let e =
                            Error::new(ErrorKind::System, format!("RDMA receive failed ({}): {status}", self.where_()));
                        st.error.get_or_insert(e.clone());
                        return Err(e);
                    }
                }
                continue;
            }
            if let Some(n) = c.data {
                // a peer's write with notification landed (on verbs it consumed a receive)
                if kind == K_RX {
                    self.post_rx(st, low as usize)?;
                }
                notified_slot(st, n >> 16, (n & 0xffff) as usize);
                continue;
            }
            match kind {
                K_WRITE => {
                    let (id, slot) = ((low >> 24) as u32, (low & SLOT_MASK) as usize);
                    let Some(s) = st.sends.get_mut(&id) else { continue };
                    if let Some(b) = s.busy.get_mut(slot) {
                        *b = b.saturating_sub(1);
                    }
                    if low & USER_WRITE != 0 {
                        if let (Some(held), Some(user)) = (s.held.get_mut(slot).and_then(Option::take), self.user()) {
                            user.release(held);
                        }
                    }
                }
                K_TXMSG => st.tx_free.push(low as usize),
                K_RX => {
                    let i = low as usize;
                    let m: [u8; MSG_BYTES] = st.rx.bytes()[i * MSG_BYTES..(i + 1) * MSG_BYTES].try_into().unwrap();
                    self.post_rx(st, i)?;
                    self.dispatch(st, &m[..c.len.min(MSG_BYTES)]);
                }
                _ => {}
            }
        }
        if let Some(user) = self.user() {
            for r in user.take_dead() {
                self.fab.deregister(&r);
            }
        }
        self.flush(st)
    }

    /// The registration cache of user memory, once a message was sent from user memory.
    fn user(&self) -> Option<&memmon::Watched<Region>> {
        self.user.get().and_then(Option::as_ref)
    }

    /// The registration cache, started on first use; `None` where memory cannot be watched
    /// (then nothing is sent from user memory).
    fn user_cache(&self) -> Option<&memmon::Watched<Region>> {
        self.user
            .get_or_init(|| match memmon::Watched::new(USER_CACHE_ENTRIES, user_cache_bytes()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::info!("NET/OFI: messages are copied through staging rings: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// Apply one control message. Malformed or unknown ones are dropped (a stranger's bytes
    /// change nothing: HELLO needs a proof, the others a connection id that was accepted).
    fn dispatch(&self, st: &mut NetState, m: &[u8]) {
        if m.len() < 16 {
            return;
        }
        let id = u32::from_le_bytes(m[4..8].try_into().unwrap());
        let v = u64::from_le_bytes(m[8..16].try_into().unwrap());
        match m[0] {
            T_HELLO => {
                let Some(r) = st.recvs.get_mut(&id) else { return };
                if r.hello.is_some() || m.len() < HELLO_ADDRS + 2 {
                    return;
                }
                let sender_id = u32::from_le_bytes(m[8..12].try_into().unwrap());
                let token: [u8; 16] = m[12..28].try_into().unwrap();
                if token != r.token
                    || !verify_proof(&self.ctx.secret, &hello_context(self.ctx.comm_id, &token), &m[28..60])
                {
                    tracing::warn!("dropped an RDMA hello with a bad proof for connection {id}");
                    return;
                }
                let Some((addrs, _)) = decode_addrs(&m[HELLO_ADDRS..]) else { return };
                match addrs.iter().map(|a| self.fab.insert_peer(a)).collect::<Result<Vec<u64>>>() {
                    Ok(dests) => r.hello = Some((dests, sender_id)),
                    Err(e) => tracing::warn!("dropped an RDMA hello: {e}"),
                }
            }
            T_NOTIFY => {
                // not filtered on HELLO: with striping, a NOTIFY travels on another endpoint pair
                // than the HELLO and may overtake it (the slot's header is checked when read)
                if let Some(r) = st.recvs.get_mut(&id) {
                    let slots = r.notified.len() as u64;
                    r.notified[(v % slots) as usize] = v + 1;
                }
            }
            T_CREDIT => {
                if let Some(s) = st.sends.get_mut(&id) {
                    s.credits = s.credits.max(v);
                }
            }
            T_FLUSH => {
                // answered for an accepted connection only (open or closed), to the sender's
                // own endpoint from its HELLO: a stranger's FLUSH gets nothing
                let to = match st.recvs.get(&id).and_then(|r| r.hello.clone()) {
                    Some(h) => Some(h),
                    None => st.closed_recvs.get(&id).cloned(),
                };
                if let Some((dests, sender_id)) = to {
                    let m = control(T_FLUSHED, sender_id, v, true);
                    if let Err(e) = self.send_msg(st, 0, dests[0], &m, Owner::Reply) {
                        tracing::info!("could not answer a FLUSH: {e}");
                    }
                }
            }
            T_FLUSHED => {
                st.flushes.remove(&v);
            }
            T_CLOSED if m.len() > 16 && m[16] == 0 => {
                // the sender closed after `v` messages: once they are read, nothing more comes
                if let Some(r) = st.recvs.get_mut(&id).filter(|r| r.hello.is_some()) {
                    r.closed_after = Some(v);
                }
            }
            T_CLOSED => {
                // the receiver closed: it will read nothing more, nor answer
                st.flushes.retain(|_, f| f.1 != id);
                if let Some(s) = st.sends.get_mut(&id) {
                    s.receiver_closed = true;
                }
            }
            T_ABORT if m.len() > 16 => {
                if m[16] == 0 {
                    if let Some(r) = st.recvs.get_mut(&id).filter(|r| r.hello.is_some()) {
                        r.aborted = true;
                    }
                } else if let Some(s) = st.sends.get_mut(&id) {
                    s.aborted = true;
                }
            }
            _ => {}
        }
    }

    /// A dead peer on this machine (another network namespace of it, or the same host) is seen
    /// from its process; across machines a dead peer shows as an error completion of a write
    /// to it or, for a receiver, as the communicator's bounded wait expiring.
    fn check_peer(&self, peer: usize) -> Result<()> {
        let (Some(me), Some(p)) = (self.ctx.peers.get(self.ctx.rank), self.ctx.peers.get(peer)) else { return Ok(()) };
        if p.machine == me.machine {
            oxccl_transport::check_alive(peer, p.pid)?;
        }
        Ok(())
    }

    /// What to poll to sleep, or `None` if completions are pending (progress first).
    fn arm(&self) -> Result<Option<WaitSource>> {
        let _st = self.st.lock().unwrap();
        Ok(self.fab.try_wait().then(|| WaitSource::read(self.fab.wait_fd())))
    }
}

impl Net {
    /// Wait (at most `linger`) until every FLUSH of the closed connections was answered, or its
    /// peer is known to be gone; nothing after an abort.
    fn linger(&self) {
        let deadline = Instant::now() + self.linger;
        let mut st = self.st.lock().unwrap();
        if st.abandoned {
            return;
        }
        // senders to this rank stop waiting for answers to their FLUSHes (best effort: a
        // FLUSH that comes later than this is not answered)
        let closed: Vec<(u64, u32)> = st.closed_recvs.values().map(|(d, id)| (d[0], *id)).collect();
        for (dest, id) in closed {
            let _ = self.send_msg(&mut st, 0, dest, &control(T_CLOSED, id, 0, true), Owner::Reply);
        }
        while !st.flushes.is_empty() {
            if self.progress_locked(&mut st).is_err() {
                return;
            }
            if st.flushes.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let mut peers: Vec<usize> = st.flushes.values().map(|f| f.0).collect();
                peers.sort_unstable();
                peers.dedup();
                tracing::warn!(
                    "NET ({}): closing although rank(s) {peers:?} did not confirm receiving this rank's last messages within {:?} (OXCCL_NET_LINGER_MS)",
                    self.where_(),
                    self.linger
                );
                break;
            }
            drop(st);
            let fd = self.fab.try_wait().then(|| WaitSource::read(self.fab.wait_fd()));
            let slept = match fd {
                Some(src) => {
                    oxccl_transport::wait::wait_any(&[src], std::time::Duration::from_millis(10)).unwrap_or(false)
                }
                None => true,
            };
            st = self.st.lock().unwrap();
            if !slept {
                // a quiet 10 ms: a peer on this machine that is gone will not answer
                st.flushes.retain(|_, f| self.check_peer(f.0).is_ok());
            }
        }
        // the CLOSED and FLUSHED messages leave before the endpoint closes (briefly)
        let until = Instant::now() + std::time::Duration::from_millis(100);
        while (!st.outbox.is_empty() || st.tx_free.len() < TX_BUFS) && Instant::now() < until {
            if self.progress_locked(&mut st).is_err() {
                return;
            }
            if st.tx_free.len() < TX_BUFS {
                drop(st);
                std::thread::sleep(std::time::Duration::from_micros(200));
                st = self.st.lock().unwrap();
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.linger();
        if let Some(user) = self.user.take().flatten() {
            for r in user.drain() {
                self.fab.deregister(&r);
            }
        }
        let st = self.st.get_mut().unwrap();
        self.fab.deregister(&st.rx_region);
        self.fab.deregister(&st.tx_region);
    }
}

/// Message `v` of receiving connection `id` is in slot `slot`, known from a write with
/// notification, which carries the slot, not the index: the slot's previous message was index
/// `prev` (or none), and a slot is written again only after its previous message was consumed,
/// so this one is `prev + slots` (or `slot`, the first time).
fn notified_slot(st: &mut NetState, id: u32, slot: usize) {
    if let Some(r) = st.recvs.get_mut(&id) {
        let slots = r.notified.len();
        if let Some(prev) = r.notified.get(slot).copied() {
            let v = if prev == 0 { slot as u64 } else { prev - 1 + slots as u64 };
            r.notified[slot] = v + 1;
        }
    }
}

/// A list of endpoint addresses: a count, then each address as a length byte and its bytes.
fn encode_addrs(addrs: &[Vec<u8>]) -> Vec<u8> {
    let mut b = vec![addrs.len() as u8];
    for a in addrs {
        b.push(a.len() as u8);
        b.extend_from_slice(a);
    }
    b
}

/// Decode an address list; `None` if malformed (no address, too many, an empty one,
/// truncation). Returns the list and the bytes it took.
fn decode_addrs(b: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
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
const DEAD_PEER_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// Most endpoints per rank (`OXCCL_NET_ENDPOINTS`).
pub const MAX_ENDPOINTS: usize = 4;

/// A NOTIFY, CREDIT or ABORT message: kind, the connection it is for, a value (message index,
/// consumed count) and, for ABORT, whom it is for (0: a receiver, 1: a sender).
fn control(kind: u8, id: u32, value: u64, to_sender: bool) -> [u8; 17] {
    let mut m = [0u8; 17];
    m[0] = kind;
    m[4..8].copy_from_slice(&id.to_le_bytes());
    m[8..16].copy_from_slice(&value.to_le_bytes());
    m[16] = to_sender as u8;
    m
}

fn hello_context(comm: u64, token: &[u8; 16]) -> Vec<u8> {
    let mut c = b"oxccl-rdma-hello".to_vec();
    c.extend_from_slice(&comm.to_le_bytes());
    c.extend_from_slice(token);
    c
}

/// Settings of the RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Slots per connection ring.
    pub slots: usize,
    /// Largest payload of one message.
    pub max_message: usize,
    /// Endpoints per rank; a connection's messages are striped across them (NCCL's
    /// `NCCL_IB_QPS_PER_CONNECTION`; `OXCCL_NET_ENDPOINTS`), 1..=[`MAX_ENDPOINTS`].
    pub endpoints: usize,
    /// Messages of operations of at least this size (count × type size) are written from the
    /// user's buffer, registered through the registration cache, instead of being copied into
    /// a staging ring first (`usize::MAX`: never). `None`: 1 MiB with a hardware provider,
    /// never with a software emulation (measured no faster there: bench/RESULTS.md). From
    /// `OXCCL_NET_ZERO_COPY` (`0` off, `1` on) and `OXCCL_NET_ZERO_COPY_MIN_BYTES` (sets it).
    pub zero_copy_min_op: Option<usize>,
    /// Longest wait, when closing, for receivers to confirm they have read this rank's last
    /// messages (`OXCCL_NET_LINGER_MS`, default 5 s); see the crate docs (Closing).
    pub linger: std::time::Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            slots: 8,
            max_message: 512 << 10,
            endpoints: endpoints_from_env(),
            zero_copy_min_op: zero_copy_min_from_env(),
            linger: std::time::Duration::from_millis(
                std::env::var("OXCCL_NET_LINGER_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(5000),
            ),
        }
    }
}

/// `OXCCL_NET_ZERO_COPY` (`0` off, `1` on) and `OXCCL_NET_ZERO_COPY_MIN_BYTES`; `None`: decide
/// by provider.
pub fn zero_copy_min_from_env() -> Option<usize> {
    let min = std::env::var("OXCCL_NET_ZERO_COPY_MIN_BYTES").ok().and_then(|v| v.trim().parse().ok());
    match std::env::var("OXCCL_NET_ZERO_COPY").map(|v| v.trim().to_string()).as_deref() {
        Ok("0") => Some(usize::MAX),
        Ok("1") => Some(min.unwrap_or(ZERO_COPY_MIN)),
        _ => min,
    }
}

/// Default smallest operation sent from user memory (hardware providers).
const ZERO_COPY_MIN: usize = 1 << 20;

/// `OXCCL_NET_ENDPOINTS` (or `NCCL_IB_QPS_PER_CONNECTION`), clamped to 1..=[`MAX_ENDPOINTS`];
/// default 1.
pub fn endpoints_from_env() -> usize {
    std::env::var("OXCCL_NET_ENDPOINTS")
        .or_else(|_| std::env::var("NCCL_IB_QPS_PER_CONNECTION"))
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, MAX_ENDPOINTS)
}

/// The RDMA transport of one rank.
pub struct RdmaTransport {
    net: Arc<Net>,
    cfg: RdmaConfig,
}

impl RdmaTransport {
    /// Open the network `choice` for this rank, bound to `ip`.
    pub fn open(choice: &NetChoice, ctx: TransportCtx, ip: std::net::IpAddr, cfg: RdmaConfig) -> Result<RdmaTransport> {
        let fab: Box<dyn Fabric> = match choice {
            NetChoice::Ofi(provider) => open_ofi(provider, &ip, cfg.endpoints)?,
            NetChoice::Ib => verbs::open_ib(cfg.endpoints, ip, ctx.secret)?,
            NetChoice::Socket => return Err(Error::invalid_argument("the socket network is oxccl's TCP transport")),
        };
        tracing::info!("NET: provider {} on {}", fab.provider(), fab.device());
        Ok(RdmaTransport { net: Net::open(fab, ctx, cfg.linger)?, cfg })
    }

    /// Provider and device, for logs.
    pub fn describe(&self) -> String {
        self.net.where_()
    }

    /// Whether the provider is libfabric's software emulation over TCP or UDP sockets (tested
    /// here, but no faster than oxccl's own TCP transport).
    pub fn is_software(&self) -> bool {
        is_software_provider(self.net.fab.provider())
    }
}

/// Whether libfabric offers a hardware provider here (its first RDM provider with RMA is not a
/// TCP/UDP/sockets emulation). Probed once per process; false without libfabric.
pub fn hardware_provider_available() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        open_ofi("", &std::net::IpAddr::from([0, 0, 0, 0]), 1)
            .map(|f| !is_software_provider(f.provider()))
            .unwrap_or(false)
    })
}

fn is_software_provider(p: &str) -> bool {
    p.split(';').next().is_some_and(|core| matches!(core, "tcp" | "sockets" | "udp" | "shm" | "net"))
}

/// The libfabric backend (`Unavailable` in builds without libfabric's headers).
fn open_ofi(provider: &str, ip: &std::net::IpAddr, endpoints: usize) -> Result<Box<dyn Fabric>> {
    let node = (!ip.is_unspecified()).then(|| ip.to_string());
    let ofi = ofi::Ofi::open(provider, node.as_deref(), endpoints)?;
    #[cfg(oxccl_ofi)]
    return Ok(Box::new(ofi));
    #[cfg(not(oxccl_ofi))]
    {
        drop(ofi);
        Err(Error::internal("libfabric opened in a build without its backend"))
    }
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
        b.extend_from_slice(&encode_addrs(&self.addrs));
        b
    }
    /// Decode, refusing anything malformed: wrong magic, truncation, trailing bytes, zero or
    /// absurd ring shapes, an address list that is empty, too long or longer than a HELLO can
    /// carry back.
    pub fn decode(b: &[u8]) -> Result<Blob> {
        let bad = |why: &str| Error::remote(format!("malformed RDMA setup blob: {why}"));
        if b.len() < 50 {
            return Err(bad("too short"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(0) != BLOB_MAGIC {
            return Err(bad("bad magic"));
        }
        let (addrs, used) = decode_addrs(&b[48..]).ok_or_else(|| bad("bad address list"))?;
        if 48 + used != b.len() {
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
            addrs,
        })
    }
}

/// This rank's endpoint addresses.
fn addresses(fab: &dyn Fabric) -> Result<Vec<Vec<u8>>> {
    (0..fab.endpoints()).map(|e| fab.address(e)).collect()
}

struct RdmaPending {
    net: Arc<Net>,
    id: u32,
    peer: usize,
    ring: Option<(Mem, Region)>,
    slots: usize,
    slot_bytes: usize,
    max_message: usize,
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        if self.net.fab.provider() == "verbs" {
            "NET/IB"
        } else {
            "NET/OFI"
        }
    }
    fn can_connect(&self, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        true
    }
    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)> {
        let slot_bytes = SLOT_HEADER + self.cfg.max_message;
        let mut ring = Mem::new(slot_bytes * self.cfg.slots);
        // SAFETY: the ring moves into the pending/receiving half, which deregisters it in Drop
        // before freeing it; Mem's heap buffer does not move when the Mem value does.
        let region = unsafe { self.net.fab.register(ring.ptr(), ring.len())? };
        let mut token = [0u8; 16];
        random_bytes(&mut token)?;
        let id = {
            let mut st = self.net.st.lock().unwrap();
            let id = st.next_id;
            st.next_id += 1;
            st.recvs.insert(id, RecvSide { token, notified: vec![0; self.cfg.slots], peer, ..Default::default() });
            id
        };
        let blob = Blob {
            addrs: addresses(self.net.fab.as_ref())?,
            id,
            raddr: region.remote_base,
            key: region.key,
            slots: self.cfg.slots as u32,
            slot_bytes: slot_bytes as u32,
            token,
        };
        let p = RdmaPending {
            net: self.net.clone(),
            id,
            peer,
            ring: Some((ring, region)),
            slots: self.cfg.slots,
            slot_bytes,
            max_message: self.cfg.max_message,
        };
        Ok((Box::new(p), blob.encode()))
    }

    fn connect_send(&self, peer: usize, blob: &[u8], _deadline: Instant) -> Result<Box<dyn SendConn>> {
        let b = Blob::decode(blob).map_err(|e| e.with_peer(peer))?;
        let dests: Vec<u64> = b
            .addrs
            .iter()
            .map(|a| self.net.fab.insert_peer(a))
            .collect::<Result<_>>()
            .map_err(|e| e.with_peer(peer))?;
        let slots = b.slots as usize;
        let slot_bytes = b.slot_bytes as usize;
        let mut ring = Mem::new(slot_bytes * slots);
        // SAFETY: as in setup_recv: deregistered by the sending half's Drop.
        let region = unsafe { self.net.fab.register(ring.ptr(), ring.len())? };
        let my_addrs = encode_addrs(&addresses(self.net.fab.as_ref())?);
        let mut st = self.net.st.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        st.sends.insert(id, SendSide { peer, busy: vec![0; slots], held: vec![None; slots], ..Default::default() });
        let mut hello = vec![0u8; HELLO_ADDRS + my_addrs.len()];
        hello[0] = T_HELLO;
        hello[4..8].copy_from_slice(&b.id.to_le_bytes());
        hello[8..12].copy_from_slice(&id.to_le_bytes());
        hello[12..28].copy_from_slice(&b.token);
        hello[28..60].copy_from_slice(&proof(&self.ctx_secret(), &hello_context(self.net.ctx.comm_id, &b.token)));
        hello[HELLO_ADDRS..].copy_from_slice(&my_addrs);
        self.net.send_msg(&mut st, 0, dests[0], &hello, Owner::Send(id)).map_err(|e| e.with_peer(peer))?;
        drop(st);
        Ok(Box::new(RdmaSend {
            net: self.net.clone(),
            id,
            peer,
            dests,
            remote_id: b.id,
            raddr: b.raddr,
            key: b.key,
            ring: Some((ring, region)),
            slots,
            slot_bytes,
            posted: 0,
            zero_copy_min_op: self.cfg.zero_copy_min_op.unwrap_or(if self.is_software() {
                usize::MAX
            } else {
                ZERO_COPY_MIN
            }),
        }))
    }
}

impl RdmaTransport {
    fn ctx_secret(&self) -> [u8; 32] {
        self.net.ctx.secret
    }
}

impl PendingRecv for RdmaPending {
    fn accept(mut self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>> {
        loop {
            self.net.progress().map_err(|e| e.with_peer(self.peer))?;
            let hello = self.net.st.lock().unwrap().recvs.get(&self.id).and_then(|r| r.hello.clone());
            if let Some((dests, sender_id)) = hello {
                return Ok(Box::new(RdmaRecv {
                    net: self.net.clone(),
                    id: self.id,
                    peer: self.peer,
                    dest: dests[0],
                    sender_id,
                    ring: self.ring.take(),
                    slots: self.slots,
                    slot_bytes: self.slot_bytes,
                    max_message: self.max_message,
                    next: 0,
                    credited: 0,
                    peeked: false,
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "connection setup: rank {} did not connect over {}",
                    self.peer,
                    self.net.where_()
                ))
                .with_peer(self.peer));
            }
            if let Some(src) = self.net.arm()? {
                let left = (deadline - now).min(std::time::Duration::from_millis(100));
                oxccl_transport::wait::wait_any(&[src], left)?;
            }
        }
    }
}

impl Drop for RdmaPending {
    fn drop(&mut self) {
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
            self.net.st.lock().unwrap().recvs.remove(&self.id);
        }
    }
}

struct RdmaSend {
    net: Arc<Net>,
    id: u32,
    peer: usize,
    /// The receiver's endpoints.
    dests: Vec<u64>,
    remote_id: u32,
    raddr: u64,
    key: u64,
    ring: Option<(Mem, Region)>,
    slots: usize,
    slot_bytes: usize,
    posted: u64,
    /// Send from user memory in operations of at least this size (`usize::MAX`: never).
    zero_copy_min_op: usize,
}

impl RdmaSend {
    fn check(&self, st: &NetState) -> Result<()> {
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
    fn room(&self, st: &NetState) -> bool {
        let s = &st.sends[&self.id];
        self.posted - s.credits < self.slots as u64 && s.busy[self.slot()] == 0
    }
}

impl SendConn for RdmaSend {
    fn max_message(&self) -> usize {
        self.slot_bytes - SLOT_HEADER
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
        let m = control(T_ABORT, self.remote_id, 0, false);
        let mut st = self.net.st.lock().unwrap();
        st.abandoned = true;
        let _ = self.net.send_msg(&mut st, 0, self.dests[0], &m, Owner::Send(self.id));
    }
}

impl RdmaSend {
    /// The staging (and remote) slot of the next message.
    fn slot(&self) -> usize {
        (self.posted % self.slots as u64) as usize
    }

    /// Whether the next message has room, after progress if needed.
    fn make_room(&mut self) -> Result<bool> {
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
    fn publish(&mut self, header: Header, user: Option<(usize, usize, u64)>) -> Result<()> {
        let slot = self.slot();
        let sb = self.slot_bytes;
        let (ring, region) = self.ring.as_mut().unwrap();
        ring.bytes_mut()[slot * sb..slot * sb + HEADER_BYTES].copy_from_slice(&header.encode());
        let len = SLOT_HEADER + if user.is_some() { 0 } else { header.len as usize };
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
            let m = control(T_NOTIFY, self.remote_id, self.posted, false);
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
                let m = control(T_FLUSH, self.remote_id, nonce, false);
                if self.net.send_msg(&mut st, ep, dest, &m, Owner::Flush(nonce)).is_err() {
                    st.flushes.remove(&nonce);
                }
            }
            // and say it is closed, after how many messages (best effort: a receiver that
            // misses it waits for the communicator's bound, as for a silent peer)
            let m = control(T_CLOSED, self.remote_id, self.posted, false);
            let _ = self.net.send_msg(&mut st, 0, self.dests[0], &m, Owner::Reply);
        }
        st.sends.remove(&self.id);
        drop(st);
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
        }
    }
}

struct RdmaRecv {
    net: Arc<Net>,
    id: u32,
    peer: usize,
    dest: u64,
    sender_id: u32,
    ring: Option<(Mem, Region)>,
    slots: usize,
    slot_bytes: usize,
    max_message: usize,
    next: u64,
    /// The consumed count last sent in a CREDIT.
    credited: u64,
    peeked: bool,
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
        let slot = (self.next % self.slots as u64) as usize;
        let sb = self.slot_bytes;
        let ring = &self.ring.as_ref().unwrap().0;
        let bytes = &ring.bytes()[slot * sb..(slot + 1) * sb];
        let h = Header::decode(&bytes[..HEADER_BYTES], self.max_message).map_err(|e| e.with_peer(self.peer))?;
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
        let m = control(T_CREDIT, self.sender_id, self.next, false);
        let mut st = self.net.st.lock().unwrap();
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
        let m = control(T_ABORT, self.sender_id, 0, true);
        let mut st = self.net.st.lock().unwrap();
        st.abandoned = true;
        let _ = self.net.send_msg(&mut st, 0, self.dest, &m, Owner::Recv(self.id));
    }
}

impl Drop for RdmaRecv {
    fn drop(&mut self) {
        let mut st = self.net.st.lock().unwrap();
        // its sender may still FLUSH it while closing: keep what the answer needs
        if let Some(hello) = st.recvs.remove(&self.id).and_then(|r| r.hello) {
            st.closed_recvs.insert(self.id, hello);
        }
        drop(st);
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ctx(rank: usize) -> TransportCtx {
        TransportCtx { rank, nranks: 2, comm_id: 77, secret: [5; 32], peers: vec![] }
    }

    /// The provider under test: `OXCCL_TEST_PROVIDER` (hw-check.sh sets a hardware one),
    /// default libfabric's TCP emulation.
    fn provider() -> String {
        std::env::var("OXCCL_TEST_PROVIDER").unwrap_or_else(|_| "tcp;ofi_rxm".into())
    }

    fn open(rank: usize, slots: usize, max: usize) -> Option<RdmaTransport> {
        open_eps(rank, slots, max, 1)
    }

    fn open_eps(rank: usize, slots: usize, max: usize, endpoints: usize) -> Option<RdmaTransport> {
        let cfg = RdmaConfig {
            slots,
            max_message: max,
            endpoints,
            zero_copy_min_op: Some(0),
            linger: std::time::Duration::from_secs(5),
        };
        match RdmaTransport::open(&NetChoice::Ofi(provider()), ctx(rank), "127.0.0.1".parse().unwrap(), cfg) {
            Ok(t) => Some(t),
            Err(e) if e.kind == ErrorKind::Unavailable && std::env::var_os("OXCCL_REQUIRE_OFI").is_none() => {
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Connect a → b. Both endpoints need progress while the provider connects (manual data
    /// progress), as two ranks give it: the sender's side runs on a second thread here.
    fn connect(a: &RdmaTransport, b: &RdmaTransport) -> (Box<dyn SendConn>, Box<dyn RecvConn>) {
        let (pending, blob) = b.setup_recv(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = a.connect_send(1, &blob, deadline).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    s.progress().unwrap();
                    std::thread::sleep(Duration::from_micros(200));
                }
                s
            });
            let r = pending.accept(deadline).unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (h.join().unwrap(), r)
        })
    }

    /// Messages cross in order, several times around the ring (credits), with payloads of every
    /// size up to the maximum; an idle receiver can arm and sleep.
    #[test]
    fn messages_cross_in_order_with_credits() {
        let (Some(a), Some(b)) = (open(0, 4, 4096), open(1, 4, 4096)) else { return };
        stream(&a, &b);
    }

    /// Striped over several endpoints, with a different count on each side (2 → 3): messages
    /// still arrive whole and in order.
    #[test]
    fn striped_messages_arrive_in_order() {
        let (Some(a), Some(b)) = (open_eps(0, 4, 4096, 2), open_eps(1, 4, 4096, 3)) else { return };
        stream(&a, &b);
        let (Some(c), Some(d)) = (open_eps(0, 3, 512, 4), open_eps(1, 3, 512, 1)) else { return };
        stream(&c, &d);
    }

    fn stream(a: &RdmaTransport, b: &RdmaTransport) {
        let (mut s, mut r) = connect(a, b);
        let max = s.max_message();
        assert!(r.peek().unwrap().is_none());
        let total = 64u64;
        let mut sent = 0u64;
        let mut got = 0u64;
        let t = Instant::now();
        while got < total {
            assert!(t.elapsed() < Duration::from_secs(20), "stuck at sent {sent} got {got}");
            if sent < total {
                if let Some(slot) = s.reserve().unwrap() {
                    let len = (sent as usize * 61) % (max + 1);
                    for (i, b) in slot[..len].iter_mut().enumerate() {
                        *b = (i as u64 + sent) as u8;
                    }
                    s.commit(Header { len: len as u32, comm: 77, seq: sent, count: 0, step: 0, call: 0 }).unwrap();
                    sent += 1;
                }
            }
            s.progress().unwrap();
            if let Some((h, p)) = r.peek().unwrap() {
                assert_eq!(h.seq, got);
                assert_eq!(p.len(), (got as usize * 61) % (max + 1));
                assert!(p.iter().enumerate().all(|(i, b)| *b == (i as u64 + got) as u8), "payload {got}");
                r.consume().unwrap();
                got += 1;
            } else if sent == total {
                if let Some(src) = r.arm().unwrap() {
                    oxccl_transport::wait::wait_any(&[src], Duration::from_millis(50)).unwrap();
                }
            }
        }
        let t = Instant::now();
        while s.pending() {
            s.progress().unwrap();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
    }

    /// Large messages go from user memory through the registration cache: a second pass over
    /// the same buffer hits the cache; after the buffer is unmapped and new memory is mapped at
    /// the same address, the new bytes arrive (a fresh registration, the old one invalidated
    /// and deregistered).
    #[test]
    fn messages_from_user_memory_follow_unmapping() {
        let (Some(a), Some(b)) = (open(0, 4, 64 << 10), open(1, 4, 64 << 10)) else { return };
        let (mut s, mut r) = connect(&a, &b);
        let chunk = 64 << 10;
        let len = 4 * chunk;
        let map = |at: *mut libc::c_void, fill: u8| {
            let flags =
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at.is_null() { 0 } else { libc::MAP_FIXED_NOREPLACE };
            // SAFETY: a fresh anonymous mapping (never over existing memory: FIXED_NOREPLACE).
            let p = unsafe { libc::mmap(at, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
            assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
            // SAFETY: the mapping is ours and `len` long.
            let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(7) ^ fill;
            }
            p
        };
        let mut seq = 0u64;
        let mut pass = |p: *mut libc::c_void, fill: u8, s: &mut Box<dyn SendConn>, r: &mut Box<dyn RecvConn>| {
            for k in 0..4 {
                let t = Instant::now();
                let ok = loop {
                    match s.borrow_ready(chunk).unwrap() {
                        Some(ok) => break ok,
                        None => assert!(t.elapsed() < Duration::from_secs(10), "no room"),
                    }
                    assert!(r.peek().unwrap().is_none(), "nothing sent yet");
                };
                if !ok {
                    return false;
                }
                let h = Header { len: chunk as u32, comm: 77, seq, count: 0, step: 0, call: 0 };
                s.commit_borrowed(h, p as usize + k * chunk).unwrap();
                let t = Instant::now();
                loop {
                    s.progress().unwrap();
                    if let Some((h, data)) = r.peek().unwrap() {
                        assert_eq!(h.seq, seq);
                        assert!(
                            data.iter().enumerate().all(|(i, x)| *x == ((k * chunk + i) as u8).wrapping_mul(7) ^ fill),
                            "chunk {k} of pass {fill}"
                        );
                        r.consume().unwrap();
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(10), "message {seq} never arrived");
                }
                seq += 1;
            }
            let t = Instant::now();
            while s.pending() {
                s.progress().unwrap();
                assert!(t.elapsed() < Duration::from_secs(5));
            }
            true
        };
        let p = map(std::ptr::null_mut(), 1);
        if !pass(p, 1, &mut s, &mut r) {
            assert!(std::env::var_os("OXCCL_REQUIRE_UFFD").is_none(), "no registration cache");
            eprintln!("skipped: user memory cannot be watched here");
            return;
        }
        let user = a.net.user().unwrap();
        let st1 = user.stats();
        assert!(pass(p, 1, &mut s, &mut r));
        let st2 = user.stats();
        assert_eq!(st2.registrations, st1.registrations, "the second pass registered again");
        assert_eq!(st2.hits, st1.hits + 4);
        assert_eq!(user.ranges().len(), 1, "the chunks merged into one registration");
        // SAFETY: our mapping, no write in flight (pending is false).
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
        assert!(user.ranges().is_empty(), "the unmapped buffer is still cached");
        let q = map(p, 2);
        assert_eq!(q, p, "same address");
        assert!(pass(q, 2, &mut s, &mut r));
        let st3 = user.stats();
        assert!(st3.registrations > st2.registrations && st3.invalidated > st2.invalidated, "{st3:?}");
        // SAFETY: our mapping.
        unsafe { libc::munmap(q, len) };
    }

    /// A HELLO with a wrong proof is ignored: the receiver times out rather than accepting.
    #[test]
    fn a_sender_without_the_secret_is_not_accepted() {
        let (Some(a), Some(b)) = (open(0, 2, 256), open(1, 2, 256)) else { return };
        let mut stranger_ctx = ctx(0);
        stranger_ctx.secret = [6; 32];
        let stranger = RdmaTransport {
            net: Net::open(
                open_ofi(&provider(), &"127.0.0.1".parse().unwrap(), 1).unwrap(),
                stranger_ctx,
                Duration::from_secs(5),
            )
            .unwrap(),
            cfg: RdmaConfig {
                slots: 2,
                max_message: 256,
                endpoints: 1,
                zero_copy_min_op: Some(0),
                linger: std::time::Duration::from_secs(5),
            },
        };
        let (pending, blob) = b.setup_recv(0).unwrap();
        let _s = stranger.connect_send(1, &blob, Instant::now() + Duration::from_secs(2)).unwrap();
        let e = pending.accept(Instant::now() + Duration::from_millis(800)).err().expect("the stranger was accepted");
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        drop(a);
    }

    #[test]
    fn abort_reaches_the_receiver() {
        let (Some(a), Some(b)) = (open(0, 2, 256), open(1, 2, 256)) else { return };
        let (mut s, mut r) = connect(&a, &b);
        s.abort();
        let t = Instant::now();
        loop {
            match r.peek() {
                Err(e) => {
                    assert_eq!(e.cause, Some(oxccl_transport::Cause::PeerAborted), "{e}");
                    break;
                }
                Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "abort never arrived"),
            }
        }
    }

    /// The setup blob decoder takes any bytes without panicking and accepts only well-formed
    /// blobs (fuzzed with random bytes and with mutations of a valid blob).
    #[test]
    fn blob_decoder_survives_random_and_mutated_input() {
        let good = Blob {
            addrs: vec![vec![1, 2, 3, 4, 5, 6, 7, 8], vec![9; 16]],
            id: 3,
            raddr: 4096,
            key: 9,
            slots: 8,
            slot_bytes: 1088,
            token: [7; 16],
        };
        let enc = good.encode();
        assert_eq!(Blob::decode(&enc).unwrap(), good);
        let mut z = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        let mut accepted = 0;
        for i in 0..200_000 {
            let b: Vec<u8> = if i % 2 == 0 {
                let len = (next() % 96) as usize;
                (0..len).map(|_| next() as u8).collect()
            } else {
                let mut b = enc.clone();
                let k = (next() % b.len() as u64) as usize;
                b[k] ^= (next() % 255 + 1) as u8;
                if next() % 4 == 0 {
                    b.truncate((next() % b.len() as u64) as usize);
                }
                b
            };
            if let Ok(x) = Blob::decode(&b) {
                assert!(x.slots > 0 && x.slots <= 4096 && x.slot_bytes as usize > SLOT_HEADER);
                assert!(x.slots as u64 * x.slot_bytes as u64 <= 4 << 30, "a blob may not ask for a huge ring");
                assert!(!x.addrs.is_empty() && x.addrs.len() <= MAX_ENDPOINTS);
                assert!(x.addrs.iter().all(|a| !a.is_empty()));
                assert!(encode_addrs(&x.addrs).len() <= MSG_BYTES - HELLO_ADDRS);
                assert_eq!(Blob::decode(&x.encode()).unwrap(), x);
                accepted += 1;
            }
        }
        assert!(accepted > 0, "mutations that keep a blob valid were accepted");
    }

    /// The protocol over the verbs backend on simulated devices (strict about queue pair states,
    /// keys and ranges): the handshake builds the queue pairs, then the same checks as over
    /// libfabric.
    fn open_sim(rank: usize, slots: usize, max: usize, eps: usize) -> (RdmaTransport, Arc<verbs::sim::SimDevice>) {
        let dev = Arc::new(verbs::sim::SimDevice::new(&format!("sim{rank}"), eps));
        let fab = verbs::fabric::VerbsFabric::new(dev.clone(), "127.0.0.1".parse().unwrap(), ctx(rank).secret).unwrap();
        let cfg = RdmaConfig {
            slots,
            max_message: max,
            endpoints: eps,
            zero_copy_min_op: Some(0),
            linger: std::time::Duration::from_secs(5),
        };
        (RdmaTransport { net: Net::open(Box::new(fab), ctx(rank), cfg.linger).unwrap(), cfg }, dev)
    }

    /// The shared conformance suite over libfabric (skipped where no provider opens, unless
    /// `OXCCL_REQUIRE_OFI` is set, as CI sets it).
    #[test]
    fn ofi_conforms() {
        let make = || match (open(0, 4, 4096), open(1, 4, 4096)) {
            (Some(a), Some(b)) => Some((Box::new(a) as Box<dyn Transport>, Box::new(b) as Box<dyn Transport>)),
            _ => None,
        };
        let ran = oxccl_transport::conformance::run_all(&make);
        assert!(ran == oxccl_transport::conformance::CHECKS.len() || std::env::var_os("OXCCL_REQUIRE_OFI").is_none());
    }

    /// The shared conformance suite over the verbs backend on simulated devices.
    #[test]
    fn verbs_on_simulated_devices_conforms() {
        let make = || {
            let a: Box<dyn Transport> = Box::new(open_sim(0, 4, 4096, 1).0);
            let b: Box<dyn Transport> = Box::new(open_sim(1, 4, 4096, 1).0);
            Some((a, b))
        };
        assert_eq!(oxccl_transport::conformance::run_all(&make), oxccl_transport::conformance::CHECKS.len());
    }

    #[test]
    fn verbs_messages_cross_in_order_with_credits_and_striping() {
        let ((a, _), (b, _)) = (open_sim(0, 4, 4096, 1), open_sim(1, 4, 4096, 1));
        assert_eq!(b.name(), "NET/IB");
        stream(&a, &b);
        // both directions between the same processes reuse one set of queue pairs
        stream(&b, &a);
        let ((c, _), (d, _)) = (open_sim(0, 4, 4096, 2), open_sim(1, 4, 4096, 3));
        stream(&c, &d);
    }

    #[test]
    fn verbs_handshake_refuses_a_stranger() {
        let (b, bdev) = open_sim(1, 2, 256, 1);
        let mut stranger_ctx = ctx(0);
        stranger_ctx.secret = [6; 32];
        let sdev = Arc::new(verbs::sim::SimDevice::new("stranger", 1));
        let fab = verbs::fabric::VerbsFabric::new(sdev, "127.0.0.1".parse().unwrap(), stranger_ctx.secret).unwrap();
        let stranger = RdmaTransport {
            net: Net::open(Box::new(fab), stranger_ctx, Duration::from_secs(5)).unwrap(),
            cfg: RdmaConfig {
                slots: 2,
                max_message: 256,
                endpoints: 1,
                zero_copy_min_op: None,
                linger: Duration::from_secs(5),
            },
        };
        let (pending, blob) = b.setup_recv(0).unwrap();
        let e = stranger.connect_send(1, &blob, Instant::now() + Duration::from_secs(2)).err().expect("connected");
        assert!(e.message.contains("handshake"), "{e}");
        let e = pending.accept(Instant::now() + Duration::from_millis(300)).err().expect("the stranger was accepted");
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        drop(bdev);
    }

    #[test]
    fn verbs_abort_and_user_memory() {
        let ((a, _), (b, _)) = (open_sim(0, 2, 256, 1), open_sim(1, 2, 256, 1));
        let (mut s, mut r) = connect(&a, &b);
        s.abort();
        let t = Instant::now();
        while r.peek().err().is_none() {
            assert!(t.elapsed() < Duration::from_secs(5), "abort never arrived");
        }
        // a message written from (registered, cached) user memory
        let ((c, _), (d, _)) = (open_sim(0, 4, 64 << 10, 1), open_sim(1, 4, 64 << 10, 1));
        let (mut s, mut r) = connect(&c, &d);
        let data: Vec<u8> = (0..(64 << 10)).map(|i| (i * 13) as u8).collect();
        if s.borrow_ready(data.len()).unwrap() == Some(true) {
            let h = Header { len: data.len() as u32, comm: 77, seq: 0, count: 0, step: 0, call: 0 };
            s.commit_borrowed(h, data.as_ptr() as usize).unwrap();
            let t = Instant::now();
            loop {
                s.progress().unwrap();
                if let Some((_, got)) = r.peek().unwrap() {
                    assert!(got == &data[..], "user-memory payload differs");
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(5));
            }
        }
    }

    /// A peer whose device dies: the sender's next write completes with the device's error,
    /// reported naming the peer rank, the provider, the device and the status.
    #[test]
    fn verbs_dead_peer_is_named_with_the_status() {
        let ((a, _), (b, bdev)) = (open_sim(0, 4, 256, 1), open_sim(1, 4, 256, 1));
        let (mut s, _r) = connect(&a, &b);
        bdev.kill();
        let t = Instant::now();
        let e = loop {
            let r = match s.reserve() {
                Ok(Some(_)) => s.commit(Header { len: 8, comm: 77, seq: 0, count: 0, step: 0, call: 0 }),
                Ok(None) => s.progress(),
                Err(e) => Err(e),
            };
            if let Err(e) = r.and_then(|_| s.progress()) {
                break e;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "the dead peer went unnoticed");
        };
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        for part in ["rank 1", "verbs", "sim0", "transport retry counter exceeded"] {
            assert!(e.to_string().contains(part), "{part:?} missing from: {e}");
        }
    }

    /// A control message that fails (here a CREDIT to a sender whose device died) fails its
    /// connection naming the peer, instead of leaving it to a timeout.
    #[test]
    fn verbs_failed_credit_is_named() {
        let ((a, adev), (b, _)) = (open_sim(0, 2, 256, 1), open_sim(1, 2, 256, 1));
        let (mut s, mut r) = connect(&a, &b);
        // two messages arrive, then the sender's device dies before the receiver credits them
        for seq in 0..2u64 {
            let t = Instant::now();
            while s.reserve().unwrap().is_none() {
                assert!(t.elapsed() < Duration::from_secs(5));
            }
            s.commit(Header { len: 8, comm: 77, seq, count: 0, step: 0, call: 0 }).unwrap();
        }
        let t = Instant::now();
        let mut got = 0;
        while got < 2 {
            s.progress().unwrap();
            if r.peek().unwrap().is_some() {
                if got == 1 {
                    adev.kill();
                }
                r.consume().unwrap();
                got += 1;
            }
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        let e = loop {
            match r.peek() {
                Err(e) => break e,
                Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "the failed CREDIT went unnoticed"),
            }
        };
        assert!(e.to_string().contains("rank 0") && e.to_string().contains("transport retry counter exceeded"), "{e}");
    }

    /// A transport over libfabric whose close waits at most `linger` for FLUSH answers.
    fn open_linger(rank: usize, linger: Duration) -> Option<RdmaTransport> {
        let mut t = open(rank, 8, 4096)?;
        t.cfg.linger = linger;
        Arc::get_mut(&mut t.net).unwrap().linger = linger;
        Some(t)
    }

    /// `n` small messages (fewer than a credit batch: none gets credited), flushed out of the
    /// sender.
    fn send_some(s: &mut dyn SendConn, n: u64) {
        let t = Instant::now();
        let mut sent = 0;
        while sent < n || s.pending() {
            if sent < n {
                if let Some(slot) = s.reserve().unwrap() {
                    slot[..8].copy_from_slice(&sent.to_le_bytes());
                    s.commit(Header { len: 8, comm: 77, seq: sent, count: 0, step: 0, call: 0 }).unwrap();
                    sent += 1;
                }
            }
            s.progress().unwrap();
            assert!(t.elapsed() < Duration::from_secs(10), "stuck sending");
        }
    }

    fn read_some(r: &mut dyn RecvConn, n: u64) {
        let t = Instant::now();
        for k in 0..n {
            loop {
                if let Some((h, p)) = r.peek().unwrap() {
                    assert_eq!((h.seq, p), (k, &k.to_le_bytes()[..]));
                    r.consume().unwrap();
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "message {k} did not arrive");
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Closing a rank whose last messages were not credited yet waits until the receiver has
    /// read up to them (a FLUSH answered), not only until they left this process: a rank that
    /// finishes and exits first must not take its last messages with it (a software provider
    /// resets a socket closed with unread data, dropping what its send queue still held).
    fn closing_waits_for_the_receiver(a: RdmaTransport, b: &RdmaTransport) {
        let (mut s, mut r) = connect(&a, b);
        send_some(&mut *s, 3);
        drop(s);
        let t = Instant::now();
        let closer = std::thread::spawn(move || {
            drop(a);
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!closer.is_finished(), "closed before the receiver read the last messages");
        read_some(&mut *r, 3);
        while !closer.is_finished() {
            // nothing more, and once the close is heard, it says so
            match r.peek() {
                Ok(None) => {}
                Err(e) => assert_eq!(e.cause, Some(oxccl_transport::Cause::PeerClosed), "{e}"),
                Ok(Some(_)) => panic!("a message after the last"),
            }
            std::thread::sleep(Duration::from_millis(1));
            assert!(t.elapsed() < Duration::from_secs(4), "the FLUSH was not answered");
        }
        assert!(closer.join().unwrap() < Duration::from_secs(4));
    }

    #[test]
    fn closing_waits_until_the_receiver_read_the_last_messages() {
        let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
        closing_waits_for_the_receiver(a, &b);
    }

    #[test]
    fn closing_waits_for_the_receiver_over_simulated_verbs() {
        let ((a, _), (b, _)) = (open_sim(0, 8, 4096, 2), open_sim(1, 8, 4096, 1));
        closing_waits_for_the_receiver(a, &b);
    }

    /// A receiver that never reads again: closing waits `linger`, then closes anyway (a bounded
    /// wait, with a warning naming the rank).
    #[test]
    fn closing_waits_at_most_the_linger_time() {
        let (Some(a), Some(b)) = (open_linger(0, Duration::from_millis(400)), open(1, 8, 4096)) else { return };
        let (mut s, _r) = connect(&a, &b);
        send_some(&mut *s, 3);
        drop(s);
        let t = Instant::now();
        drop(a);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "{took:?}");
    }

    /// After an abort (the communicator failed), closing waits for nothing.
    #[test]
    fn closing_after_an_abort_does_not_wait() {
        let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
        let (mut s, _r) = connect(&a, &b);
        send_some(&mut *s, 3);
        s.abort();
        drop(s);
        let t = Instant::now();
        drop(a);
        assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    }

    /// A receiver that closed first says so (CLOSED): its sender then closes without waiting
    /// out the linger time, though nobody is left to answer its FLUSH.
    #[test]
    fn a_receiver_that_closed_first_releases_its_sender() {
        let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
        let (mut s, mut r) = connect(&a, &b);
        send_some(&mut *s, 3);
        read_some(&mut *r, 3);
        drop(r);
        drop(b);
        drop(s);
        let t = Instant::now();
        drop(a);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    /// A FLUSH for a connection this rank never accepted is not answered (a stranger learns
    /// nothing and cannot make it send).
    #[test]
    fn a_stranger_flush_gets_no_answer() {
        let Some(b) = open(1, 8, 4096) else { return };
        let before = b.net.st.lock().unwrap().tx_free.len();
        let mut st = b.net.st.lock().unwrap();
        b.net.dispatch(&mut st, &control(T_FLUSH, 4242, 9, false));
        assert!(st.outbox.is_empty() && st.tx_free.len() == before, "answered a stranger");
    }

    #[test]
    fn net_choice_parses() {
        assert_eq!(NetChoice::parse("", "").unwrap(), NetChoice::Socket);
        assert_eq!(NetChoice::parse("OFI", "tcp;ofi_rxm").unwrap(), NetChoice::Ofi("tcp;ofi_rxm".into()));
        assert_eq!(NetChoice::parse("IB", "").unwrap(), NetChoice::Ib);
        assert!(NetChoice::parse("carrier-pigeon", "").is_err());
    }
}
