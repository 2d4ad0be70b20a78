//! The protocol engine of one rank: the fabric, the state of every connection, progress (completions,
//! control messages, queued work), closing.

use super::*;
use oxccl_transport::wait::WaitSource;
use oxccl_transport::{verify_proof, Error, ErrorKind, Result, TransportCtx};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod closing;
mod control;

/// 8-byte-aligned heap memory that stays put when its owner moves (rings and message pools are
/// registered).
pub(crate) struct Mem {
    pub(crate) buf: Vec<u64>,
}

impl Mem {
    pub(crate) fn new(bytes: usize) -> Mem {
        Mem { buf: vec![0u64; bytes.div_ceil(8).max(1)] }
    }
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().cast()
    }
    pub(crate) fn len(&self) -> usize {
        self.buf.len() * 8
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the Vec's memory viewed as bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len()) }
    }
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the Vec's memory viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len()) }
    }
}

#[derive(Default)]
pub(crate) struct RecvSide {
    pub(crate) token: [u8; 16],
    /// This side's encryption word, which the HELLO's must equal.
    pub(crate) word: [u8; oxccl_transport::seal::WORD_BYTES],
    /// (sender's destinations, one per sender endpoint; sender's connection id) once HELLO
    /// arrived.
    pub(crate) hello: Option<(Vec<u64>, u32)>,
    /// Per slot: 1 + the index of the message notified in it (NOTIFYs of messages striped over
    /// several endpoints may arrive out of order).
    pub(crate) notified: Vec<u64>,
    pub(crate) aborted: bool,
    /// The sender closed its half normally after posting this many messages.
    pub(crate) closed_after: Option<u64>,
    /// The sender's rank.
    pub(crate) peer: usize,
    /// A control message of this connection (CREDIT, ABORT) failed.
    pub(crate) error: Option<Error>,
    /// The control keys of an encrypted connection.
    pub(crate) ctl: Option<CtlKeys>,
}

impl RecvSide {
    /// Whether message `index` is in place (its notification arrived).
    pub(crate) fn arrived(&self, index: u64) -> bool {
        self.notified[(index % self.notified.len() as u64) as usize] == index + 1
    }
}

#[derive(Default)]
pub(crate) struct SendSide {
    pub(crate) peer: usize,
    /// Messages the receiver has consumed.
    pub(crate) credits: u64,
    /// Writes posted and not yet completed locally, per staging slot (two for a message sent
    /// from user memory: its header, then its payload).
    pub(crate) busy: Vec<u8>,
    /// Per staging slot: the registration cache entry a payload write from user memory holds.
    pub(crate) held: Vec<Option<u64>>,
    pub(crate) aborted: bool,
    pub(crate) error: Option<Error>,
    /// The receiver closed its half (it reads nothing more): closing this one waits for nothing.
    pub(crate) receiver_closed: bool,
    /// The control keys of an encrypted connection.
    pub(crate) ctl: Option<CtlKeys>,
}

/// Work the provider could not take yet (EAGAIN), posted in order by the next progress: the
/// protocol never blocks inside a call, and queued items keep their order (write, then its
/// NOTIFY).
pub(crate) enum Outgoing {
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
pub(crate) enum Owner {
    /// Sending half `id` (HELLO, NOTIFY, its ABORT).
    Send(u32),
    /// Receiving half `id` (CREDIT, its ABORT).
    Recv(u32),
    /// The FLUSH with this nonce, of a connection being closed.
    Flush(u64),
    /// A FLUSHED answer (nobody waits for it).
    Reply,
}

pub(crate) struct NetState {
    pub(crate) next_id: u32,
    pub(crate) outbox: std::collections::VecDeque<Outgoing>,
    pub(crate) recvs: HashMap<u32, RecvSide>,
    pub(crate) sends: HashMap<u32, SendSide>,
    pub(crate) rx: Mem,
    pub(crate) rx_region: Region,
    pub(crate) tx: Mem,
    pub(crate) tx_region: Region,
    pub(crate) tx_free: Vec<usize>,
    /// Per message buffer in flight: whose message it carries.
    pub(crate) tx_owner: Vec<Option<Owner>>,
    pub(crate) error: Option<Error>,
    /// Receiving halves already closed, with their sender's destinations and connection id: a
    /// FLUSH for one is still answered.
    pub(crate) closed_recvs: HashMap<u32, (Vec<u64>, u32, Option<CtlKeys>)>,
    /// FLUSHes not answered yet: nonce → (peer rank, sending half's id).
    pub(crate) flushes: HashMap<u64, (usize, u32)>,
    /// The control keys of encrypted sending halves already closed, for their FLUSHED answers.
    pub(crate) closing_ctl: HashMap<u32, CtlKeys>,
    pub(crate) next_flush: u64,
    /// A connection was aborted (the communicator failed or was aborted): closing waits for
    /// nothing.
    pub(crate) abandoned: bool,
}

/// One endpoint shared by every connection of a transport instance.
pub(crate) struct Net {
    pub(crate) fab: Box<dyn Fabric>,
    pub(crate) ctx: TransportCtx,
    pub(crate) st: Mutex<NetState>,
    /// Registrations of user memory (large messages are written from where they lie).
    pub(crate) user: std::sync::OnceLock<Option<memmon::Watched<Region>>>,
    /// Messages go as one write carrying its notification (the backend offers it, and
    /// [`RdmaConfig::write_notify`] is on).
    pub(crate) write_notify: bool,
    /// Longest wait for FLUSH answers when closing.
    pub(crate) linger: std::time::Duration,
    /// Most bytes of user memory kept registered.
    pub(crate) reg_cache_bytes: usize,
}

impl Net {
    pub(crate) fn open(fab: Box<dyn Fabric>, ctx: TransportCtx, cfg: &RdmaConfig) -> Result<Arc<Net>> {
        let mut rx = Mem::new(MSG_BYTES * RX_BUFS * fab.endpoints());
        let mut tx = Mem::new(MSG_BYTES * TX_BUFS);
        // SAFETY: both pools live in NetState, inside the Net that owns the fabric, and are
        // deregistered in Net's Drop before they are freed.
        let (rx_region, tx_region) = unsafe { (fab.register(rx.ptr(), rx.len())?, fab.register(tx.ptr(), tx.len())?) };
        let write_notify = fab.notify_writes() && cfg.write_notify;
        let net = Arc::new(Net {
            fab,
            ctx,
            user: std::sync::OnceLock::new(),
            write_notify,
            linger: cfg.linger,
            reg_cache_bytes: cfg.reg_cache_bytes,
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
                closing_ctl: HashMap::new(),
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

    pub(crate) fn post_rx(&self, st: &mut NetState, i: usize) -> Result<()> {
        st.outbox.push_back(Outgoing::Recv(i));
        self.flush(st)
    }

    pub(crate) fn where_(&self) -> String {
        format!("{} on {}", self.fab.provider(), self.fab.device())
    }

    /// Queue a small control message to `dest` and post what the provider takes now.
    pub(crate) fn send_msg(&self, st: &mut NetState, ep: usize, dest: u64, msg: &[u8], owner: Owner) -> Result<()> {
        st.outbox.push_back(Outgoing::Msg { ep, dest, bytes: msg.to_vec(), owner });
        self.flush(st)
    }

    /// Post queued work in order until the provider says EAGAIN (or no message buffer is free).
    pub(crate) fn flush(&self, st: &mut NetState) -> Result<()> {
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

    pub(crate) fn progress(&self) -> Result<()> {
        let mut st = self.st.lock().unwrap();
        self.progress_locked(&mut st)
    }

    /// Read completions and apply them.
    pub(crate) fn progress_locked(&self, st: &mut NetState) -> Result<()> {
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
    pub(crate) fn user(&self) -> Option<&memmon::Watched<Region>> {
        self.user.get().and_then(Option::as_ref)
    }

    /// The registration cache, started on first use; `None` where memory cannot be watched
    /// (then nothing is sent from user memory).
    pub(crate) fn user_cache(&self) -> Option<&memmon::Watched<Region>> {
        self.user
            .get_or_init(|| match memmon::Watched::new(USER_CACHE_ENTRIES, self.reg_cache_bytes) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::info!("NET/OFI: messages are copied through staging rings: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// A dead peer on this machine (another network namespace of it, or the same host) is seen
    /// from its process; across machines a dead peer shows as an error completion of a write
    /// to it or, for a receiver, as the communicator's bounded wait expiring.
    pub(crate) fn check_peer(&self, peer: usize) -> Result<()> {
        let (Some(me), Some(p)) = (self.ctx.peers.get(self.ctx.rank), self.ctx.peers.get(peer)) else { return Ok(()) };
        if p.machine == me.machine {
            oxccl_transport::check_alive(peer, p.pid)?;
        }
        Ok(())
    }

    /// What to poll to sleep, or `None` if completions are pending (progress first).
    pub(crate) fn arm(&self) -> Result<Option<WaitSource>> {
        let _st = self.st.lock().unwrap();
        Ok(self.fab.try_wait().then(|| WaitSource::read(self.fab.wait_fd())))
    }
}

/// Message `v` of receiving connection `id` is in slot `slot`, known from a write with
/// notification, which carries the slot, not the index: the slot's previous message was index
/// `prev` (or none), and a slot is written again only after its previous message was consumed,
/// so this one is `prev + slots` (or `slot`, the first time).
pub(crate) fn notified_slot(st: &mut NetState, id: u32, slot: usize) {
    if let Some(r) = st.recvs.get_mut(&id) {
        let slots = r.notified.len();
        if let Some(prev) = r.notified.get(slot).copied() {
            let v = if prev == 0 { slot as u64 } else { prev - 1 + slots as u64 };
            r.notified[slot] = v + 1;
        }
    }
}
