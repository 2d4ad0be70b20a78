//! The executor: drives schedules over connections.
//!
//! [`apply_step`] is the one data-path function: it resolves a step's slices in the user buffers
//! and runs the fused copy/reduce kernel, reading the received message in place and writing
//! straight into the send slot. The simulator's numeric mode calls the same function.
//!
//! [`OpRun`] is one operation's state machine; [`drive`] progresses a set of them (a group, or a
//! single blocking call) until all finish: it polls each op as far as it can go, spins briefly
//! when nothing moves, then arms every connection it waits on and sleeps in `poll(2)`.

use crate::reduce::{combine, combine_inplace};
use crate::schedule::{Buf, Fingerprint, Schedule, Slice, Step};
use crate::types::{DataType, ReduceOp};
use crate::{Error, Result};
use oxccl_transport::wait::{wait_any, WaitSource};
use oxccl_transport::{ErrorKind, Header, RecvConn, SendConn};
use std::time::{Duration, Instant};

/// An owned host buffer an asynchronous operation carries (a `Vec<T>` of any element type).
pub trait HostBuf: Send + 'static {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// For handing the buffer back with its type.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

impl<T: crate::types::Element> HostBuf for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// The user buffers of one operation, in bytes.
pub enum OpMem<'a> {
    /// Separate input and output (either may be empty).
    Split {
        /// Send buffer.
        input: &'a [u8],
        /// Receive buffer.
        output: &'a mut [u8],
    },
    /// One allocation holding both windows (NCCL's in-place forms).
    InPlace {
        /// The allocation.
        buf: &'a mut [u8],
        /// Byte offset of the input window.
        in_off: usize,
        /// Byte offset of the output window.
        out_off: usize,
    },
    /// Owned separate buffers (asynchronous operations).
    OwnedSplit {
        /// Send buffer.
        input: Box<dyn HostBuf>,
        /// Receive buffer.
        output: Box<dyn HostBuf>,
    },
    /// One owned allocation holding both windows (asynchronous in-place operations).
    OwnedInPlace {
        /// The allocation.
        buf: Box<dyn HostBuf>,
        /// Byte offset of the input window.
        in_off: usize,
        /// Byte offset of the output window.
        out_off: usize,
    },
}

impl OpMem<'_> {
    /// A borrowed view (owned variants become their borrowed forms).
    pub fn view(&mut self) -> OpMem<'_> {
        match self {
            OpMem::Split { input, output } => OpMem::Split { input, output },
            OpMem::InPlace { buf, in_off, out_off } => OpMem::InPlace { buf, in_off: *in_off, out_off: *out_off },
            OpMem::OwnedSplit { input, output } => OpMem::Split { input: input.bytes(), output: output.bytes_mut() },
            OpMem::OwnedInPlace { buf, in_off, out_off } => {
                OpMem::InPlace { buf: buf.bytes_mut(), in_off: *in_off, out_off: *out_off }
            }
        }
    }
}

fn oob() -> Error {
    Error::internal("schedule step outside the user buffer")
}

/// Run one step's data movement. `recv` is the received payload, `slot` the send slot.
#[allow(clippy::too_many_arguments)]
pub fn apply_step(
    step: &Step,
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    mem: &mut OpMem<'_>,
    recv: Option<&[u8]>,
    slot: Option<&mut [u8]>,
) -> Result<()> {
    let es = dt.size();
    let len = step.count * es;
    let post = step.post.then_some(nranks);
    if recv.is_some_and(|r| r.len() != len) {
        return Err(Error::internal("received message size does not match the step"));
    }
    let byte_range = |s: Slice| (s.buf, s.offset * es, s.offset * es + len);
    if matches!(mem, OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. }) {
        return apply_step(step, dt, op, nranks, &mut mem.view(), recv, slot);
    }
    // The pre-multiplier (pre-multiplied sum) applies to reads of the input buffer only: those
    // are a rank's own contributions; the output buffer holds partial results.
    let op_for = |src: Option<Slice>| match (op, src) {
        (ReduceOp::PreMulSum(_), Some(Slice { buf: Buf::Output, .. })) => ReduceOp::Sum,
        _ => op,
    };
    let op = op_for(step.src);
    match mem {
        OpMem::Split { input, output } => {
            match (step.src.map(byte_range), step.dst.map(byte_range)) {
                // output read and written: the one-buffer rules
                (Some((Buf::Output, sa, sb)), dst) => {
                    let dst = match dst {
                        Some((Buf::Output, a, b)) => Some((a, b)),
                        Some(_) => return Err(Error::internal("schedule writes the input buffer")),
                        None => None,
                    };
                    one_buffer(dt, op, output, (sa, sb), dst, recv, slot, post, len)?;
                }
                (src, dst) => {
                    let src = match src {
                        Some((_, a, b)) => Some(input.get(a..b).ok_or_else(oob)?),
                        None => None,
                    };
                    match (dst, slot) {
                        (Some((Buf::Output, a, b)), slot) => {
                            let d = output.get_mut(a..b).ok_or_else(oob)?;
                            combine_to_both(dt, op, d, recv, src, post, slot.map(|s| &mut s[..len]));
                        }
                        (Some((Buf::Input, _, _)), _) => {
                            return Err(Error::internal("schedule writes the input buffer"))
                        }
                        (None, Some(s)) => combine(dt, op, &mut s[..len], recv, src, post),
                        (None, None) => {}
                    }
                }
            }
        }
        OpMem::InPlace { buf, in_off, out_off } => {
            let abs = |s: Slice| {
                let (b, x, y) = byte_range(s);
                let base = if b == Buf::Input { *in_off } else { *out_off };
                (base + x, base + y)
            };
            match step.src.map(abs) {
                Some(src) => one_buffer(dt, op, buf, src, step.dst.map(abs), recv, slot, post, len)?,
                None => match (step.dst.map(abs), slot) {
                    (Some((a, b)), slot) => {
                        let d = buf.get_mut(a..b).ok_or_else(oob)?;
                        combine_to_both(dt, op, d, recv, None, post, slot.map(|s| &mut s[..len]));
                    }
                    (None, Some(s)) => combine(dt, op, &mut s[..len], recv, None, post),
                    (None, None) => {}
                },
            }
        }
        OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// Bytes per tile when a step writes both a destination and a send slot: the slot copy reads
/// the tile while it is still in L1 instead of making a second pass over the chunk.
const TILE: usize = 16 << 10;

/// `d = recv ⊕ pre(src)` (then `/ post`), also copied into `slot`, tile by tile.
#[allow(clippy::too_many_arguments)]
fn combine_to_both(
    dt: DataType,
    op: ReduceOp,
    d: &mut [u8],
    recv: Option<&[u8]>,
    src: Option<&[u8]>,
    post: Option<usize>,
    slot: Option<&mut [u8]>,
) {
    let Some(slot) = slot else {
        combine(dt, op, d, recv, src, post);
        return;
    };
    let tile = TILE - TILE % dt.size();
    let mut off = 0;
    while off < d.len() {
        let end = (off + tile).min(d.len());
        let dd = &mut d[off..end];
        combine(dt, op, dd, recv.map(|r| &r[off..end]), src.map(|x| &x[off..end]), post);
        slot[off..end].copy_from_slice(dd);
        off = end;
    }
}

/// [`combine_inplace`] on `d`, also copied into `slot`, tile by tile.
fn combine_inplace_to_both(
    dt: DataType,
    op: ReduceOp,
    d: &mut [u8],
    recv: Option<&[u8]>,
    post: Option<usize>,
    slot: Option<&mut [u8]>,
) {
    let Some(slot) = slot else {
        combine_inplace(dt, op, d, recv, post);
        return;
    };
    let tile = TILE - TILE % dt.size();
    let mut off = 0;
    while off < d.len() {
        let end = (off + tile).min(d.len());
        combine_inplace(dt, op, &mut d[off..end], recv.map(|r| &r[off..end]), post);
        slot[off..end].copy_from_slice(&d[off..end]);
        off = end;
    }
}

/// A step whose source (byte range `src`) and destination (`dst`) lie in one buffer.
#[allow(clippy::too_many_arguments)]
fn one_buffer(
    dt: DataType,
    op: ReduceOp,
    buf: &mut [u8],
    (sa, sb): (usize, usize),
    dst: Option<(usize, usize)>,
    recv: Option<&[u8]>,
    slot: Option<&mut [u8]>,
    post: Option<usize>,
    len: usize,
) -> Result<()> {
    if sb > buf.len() || dst.is_some_and(|(_, b)| b > buf.len()) {
        return Err(oob());
    }
    match dst {
        Some((a, b)) => {
            let slot = slot.map(|s| &mut s[..len]);
            if sa == a {
                combine_inplace_to_both(dt, op, &mut buf[a..b], recv, post, slot);
            } else if sb <= a || sa >= b {
                let (d, s) = if sb <= a {
                    let (lo, hi) = buf.split_at_mut(a);
                    (&mut hi[..len], &lo[sa..sb])
                } else {
                    let (lo, hi) = buf.split_at_mut(sa);
                    (&mut lo[a..b], &hi[..len])
                };
                combine_to_both(dt, op, d, recv, Some(s), post, slot);
            } else {
                return Err(Error::internal("partially overlapping step slices"));
            }
        }
        None => {
            if let Some(s) = slot {
                combine(dt, op, &mut s[..len], recv, Some(&buf[sa..sb]), post);
            }
        }
    }
    Ok(())
}

/// A communicator's connections, indexed by peer rank.
#[derive(Default)]
pub struct Conns {
    /// Sending halves.
    pub send: Vec<Option<Box<dyn SendConn>>>,
    /// Receiving halves.
    pub recv: Vec<Option<Box<dyn RecvConn>>>,
}

impl Conns {
    /// Empty connection tables for `n` peers.
    pub fn new(n: usize) -> Self {
        Conns { send: (0..n).map(|_| None).collect(), recv: (0..n).map(|_| None).collect() }
    }
    /// Tell every peer this rank is closing its connections because it failed or was aborted.
    pub fn abort_all(&mut self) {
        self.send.iter_mut().flatten().for_each(|c| c.abort());
        self.recv.iter_mut().flatten().for_each(|c| c.abort());
    }
}

/// What an op is blocked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Waiting for a message from this peer.
    Recv(usize),
    /// Waiting for room towards this peer.
    Send(usize),
}

/// The running state of one operation on one rank.
pub struct OpRun<'a> {
    /// Index of the communicator in the `drive` call.
    pub comm: usize,
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Communicator id (frame header).
    pub comm_id: u64,
    /// Sequence number (collective counter, or per-peer counter for point to point).
    pub seq: u64,
    /// What the operation is.
    pub fp: Fingerprint,
    /// The steps (shared with the communicator's schedule cache).
    pub sched: std::sync::Arc<Schedule>,
    /// Next step.
    pub pc: usize,
    /// Buffers.
    pub mem: OpMem<'a>,
    tx_idx: Vec<u32>,
    rx_idx: Vec<u32>,
    /// What the op waits on, if it is blocked.
    pub blocked: Option<Blocked>,
}

/// Messages of at least this many bytes are sent by reference (single copy) where the
/// schedule, the transport and the operation's size (count × type size, at least the
/// connection's [`oxccl_transport::SendConn::borrow_min_op`]) allow.
const BORROW_MIN: usize = 4096;

impl<'a> OpRun<'a> {
    /// The peers whose messages of this op have arrived: they reached it.
    pub fn heard_from(&self) -> Vec<usize> {
        self.rx_idx.iter().enumerate().filter(|(_, &n)| n > 0).map(|(p, _)| p).collect()
    }

    /// A new op at step 0.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        comm: usize,
        rank: usize,
        nranks: usize,
        comm_id: u64,
        seq: u64,
        fp: Fingerprint,
        sched: std::sync::Arc<Schedule>,
        mem: OpMem<'a>,
    ) -> Self {
        OpRun {
            comm,
            rank,
            nranks,
            comm_id,
            seq,
            fp,
            sched,
            pc: 0,
            mem,
            tx_idx: vec![0; nranks],
            rx_idx: vec![0; nranks],
            blocked: None,
        }
    }

    /// The same op with owned buffers, detached from any borrow (`None` if its buffers are
    /// borrowed).
    pub fn into_static(self) -> Option<OpRun<'static>> {
        let mem: OpMem<'static> = match self.mem {
            OpMem::OwnedSplit { input, output } => OpMem::OwnedSplit { input, output },
            OpMem::OwnedInPlace { buf, in_off, out_off } => OpMem::OwnedInPlace { buf, in_off, out_off },
            _ => return None,
        };
        Some(OpRun {
            comm: self.comm,
            rank: self.rank,
            nranks: self.nranks,
            comm_id: self.comm_id,
            seq: self.seq,
            fp: self.fp,
            sched: self.sched,
            pc: self.pc,
            mem,
            tx_idx: self.tx_idx,
            rx_idx: self.rx_idx,
            blocked: self.blocked,
        })
    }

    /// Whether every step ran.
    pub fn done(&self) -> bool {
        self.pc >= self.sched.steps.len()
    }

    fn context(&self, e: Error) -> Error {
        e.with_rank(self.rank).with_op(self.fp.to_string()).with_seq(self.seq)
    }

    /// Run as many steps as possible without blocking. Returns whether any step ran.
    pub fn poll(&mut self, conns: &mut Conns) -> Result<bool> {
        let mut progressed = false;
        self.blocked = None;
        while let Some(step) = self.sched.steps.get(self.pc).copied() {
            match self.try_step(self.pc, &step, conns) {
                Ok(true) => {
                    self.pc += 1;
                    progressed = true;
                }
                Ok(false) => break,
                Err(e) => return Err(self.context(e)),
            }
        }
        Ok(progressed)
    }

    fn try_step(&mut self, pc: usize, step: &Step, conns: &mut Conns) -> Result<bool> {
        let es = self.fp.dtype.size();
        let len = step.count * es;
        let Conns { send, recv } = conns;
        let split = matches!(self.mem, OpMem::Split { .. } | OpMem::OwnedSplit { .. });
        // 1. the send side first, so nothing is received that could not be passed on
        let mut borrowed: Option<Slice> = None;
        let mut slot = None;
        if let Some(q) = step.send {
            let c = send[q].as_mut().ok_or_else(|| Error::internal("no send connection").with_peer(q))?;
            if c.max_message() < len {
                return Err(Error::internal("step larger than the connection's messages"));
            }
            let premul_input = |v: Slice| matches!(self.fp.op, ReduceOp::PreMulSum(_)) && v.buf == Buf::Input;
            let op_bytes = self.fp.count * es;
            let candidate = (split && len >= BORROW_MIN && op_bytes >= c.borrow_min_op())
                .then(|| self.sched.stable_send(pc))
                .flatten()
                .filter(|v| !(premul_input(*v) && step.dst.is_none()));
            if let Some(v) = candidate {
                match c.borrow_ready(len).map_err(|e| e.with_peer(q))? {
                    None => {
                        self.blocked = Some(Blocked::Send(q));
                        return Ok(false);
                    }
                    Some(true) => borrowed = Some(v),
                    Some(false) => {}
                }
            }
            if borrowed.is_none() {
                match c.reserve().map_err(|e| e.with_peer(q))? {
                    None => {
                        self.blocked = Some(Blocked::Send(q));
                        return Ok(false);
                    }
                    Some(s) => slot = Some(s),
                }
            }
        }
        // 2. the receive side: a pure copy of a message sent by reference goes straight from
        // the peer's memory into the destination (single copy)
        let mut direct = false;
        if let (Some(p), None, Some(d), false, true) = (step.recv, step.src, step.dst, step.post, split) {
            let c = recv[p].as_mut().ok_or_else(|| Error::internal("no receive connection").with_peer(p))?;
            let expect = Expect::of(self, p, len);
            let dst = output_window(&mut self.mem, d.offset * es, len)?;
            if c.take_into(dst, &|h| expect.check(h)).map_err(|e| e.with_peer(p))?.is_some() {
                direct = true;
                RECEIVED_DIRECT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(s) = slot.as_deref_mut() {
                    s[..len].copy_from_slice(dst);
                }
            }
        }
        if !direct {
            let msg = match step.recv {
                Some(p) => {
                    let c = recv[p].as_mut().ok_or_else(|| Error::internal("no receive connection").with_peer(p))?;
                    match c.peek().map_err(|e| e.with_peer(p))? {
                        None => {
                            self.blocked = Some(Blocked::Recv(p));
                            return Ok(false);
                        }
                        Some((h, data)) => {
                            Expect::of(self, p, len).check(&h)?;
                            Some(data)
                        }
                    }
                }
                None => None,
            };
            apply_step(step, self.fp.dtype, self.fp.op, self.nranks, &mut self.mem, msg, slot)?;
        }
        if let Some(q) = step.send {
            let h = Header {
                len: len as u32,
                comm: self.comm_id,
                seq: self.seq,
                count: self.fp.count_word(),
                step: self.tx_idx[q],
                call: self.fp.call_word(),
            };
            self.tx_idx[q] += 1;
            let c = send[q].as_mut().unwrap();
            match borrowed {
                Some(v) => {
                    SENT_BY_REFERENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    c.commit_borrowed(h, window_addr(&self.mem, v, es, len)?)
                }
                None => c.commit(h),
            }
            .map_err(|e| e.with_peer(q))?;
        }
        if let Some(p) = step.recv {
            self.rx_idx[p] += 1;
            recv[p].as_mut().unwrap().consume().map_err(|e| e.with_peer(p))?;
        }
        Ok(true)
    }
}

static SENT_BY_REFERENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static RECEIVED_DIRECT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Single-copy counters of this process: (messages sent by reference, messages copied straight
/// from a sender's memory into their destination).
pub fn single_copy_counts() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (SENT_BY_REFERENCE.load(Relaxed), RECEIVED_DIRECT.load(Relaxed))
}

/// What the next message from a peer must carry.
#[derive(Clone, Copy)]
struct Expect {
    rank: usize,
    peer: usize,
    comm_id: u64,
    seq: u64,
    fp: Fingerprint,
    step: u32,
    len: usize,
}

impl Expect {
    fn of(op: &OpRun<'_>, peer: usize, len: usize) -> Expect {
        Expect { rank: op.rank, peer, comm_id: op.comm_id, seq: op.seq, fp: op.fp, step: op.rx_idx[peer], len }
    }

    fn check(&self, h: &Header) -> Result<()> {
        let (peer, len) = (self.peer, self.len);
        let call = self.fp.call_word();
        if h.comm != self.comm_id || h.seq != self.seq || h.count != self.fp.count_word() || h.call != call {
            return Err(Error::invalid_usage(format!(
                "mismatched operations: rank {} called {} (op #{}) but rank {peer} called {} (op #{}){}",
                self.rank,
                self.fp,
                self.seq,
                Fingerprint::describe_wire(h.count, h.call),
                h.seq,
                if h.comm != self.comm_id { " on another communicator" } else { "" }
            ))
            .with_peer(peer)
            .with_cause(oxccl_transport::Cause::Mismatch));
        }
        if h.step != self.step || h.len as usize != len {
            return Err(Error::internal(format!(
                "message {} of {} bytes from rank {peer}, expected message {} of {len} bytes",
                h.step, h.len, self.step
            ))
            .with_peer(peer));
        }
        Ok(())
    }
}

/// Bytes `[off, off + len)` of the output buffer of an operation with separate buffers.
fn output_window<'m>(mem: &'m mut OpMem<'_>, off: usize, len: usize) -> Result<&'m mut [u8]> {
    let out: &mut [u8] = match mem {
        OpMem::Split { output, .. } => output,
        OpMem::OwnedSplit { output, .. } => output.bytes_mut(),
        _ => return Err(Error::internal("single copy needs separate buffers")),
    };
    out.get_mut(off..off + len).ok_or_else(oob)
}

/// The address of a slice of an operation with separate buffers (a value sent by reference).
fn window_addr(mem: &OpMem<'_>, v: Slice, es: usize, len: usize) -> Result<usize> {
    let (input, output): (&[u8], &[u8]) = match mem {
        OpMem::Split { input, output } => (input, output),
        OpMem::OwnedSplit { input, output } => (input.bytes(), output.bytes()),
        _ => return Err(Error::internal("single copy needs separate buffers")),
    };
    let b = if v.buf == Buf::Input { input } else { output };
    b.get(v.offset * es..v.offset * es + len).map(|x| x.as_ptr() as usize).ok_or_else(oob)
}

/// What [`drive`] needs from each communicator involved.
pub trait DriveComm {
    /// Run `f` with the communicator's connections (locking them as needed).
    fn with_conns<R>(&self, f: impl FnOnce(&mut Conns) -> R) -> R;
    /// Whether the communicator was aborted.
    fn aborted(&self) -> bool;
    /// A doorbell fd rung on abort.
    fn abort_fd(&self) -> i32;
    /// The rank, for messages.
    fn rank(&self) -> usize;
    /// Collective `seq` has waited long and is within [`CENSUS_LEAD`] of its deadline: the
    /// timeout census may begin, so that it is complete at the deadline.
    fn near_deadline(&self, _seq: u64) {}
    /// Whether `peer`, on another machine, is known to be gone (its liveness beacon refuses) or
    /// unreachable (silent for seconds); probed at most once a second per peer. For waits that
    /// stalled: a transport may not notice a host that stopped answering before the timeout.
    fn peer_lost(&self, _peer: usize) -> Option<Error> {
        None
    }
}

/// A wait stalled this long asks whether the peers it waits for on other machines are still there.
pub const STALL: Duration = Duration::from_secs(2);

/// The first peer of the moving ops (blocked on it) that [`DriveComm::peer_lost`] reports.
pub(crate) fn lost_peer<'o, 'm: 'o, C: DriveComm>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
) -> Option<Error> {
    moving.into_iter().filter(|o| !o.done()).find_map(|o| match o.blocked {
        Some(Blocked::Recv(p) | Blocked::Send(p)) => comms[o.comm].peer_lost(p),
        None => None,
    })
}

/// How long before a deadline the timeout census begins (each rank marks the operation it is
/// in, so that at the deadline every rank can read who reached it, without waiting more).
pub const CENSUS_LEAD: Duration = Duration::from_secs(1);

/// Progress policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Busy-poll this long before blocking.
    pub spin: Duration,
    /// Then yield the CPU (`sched_yield`) this long before blocking: on an oversubscribed host
    /// this hands the core straight to the peer being waited for.
    pub yield_for: Duration,
    /// Give up at this instant.
    pub deadline: Instant,
    /// Say what the wait waits for every this often ([`crate::Config::wait_report`]).
    pub report: Option<Duration>,
    /// When the operations started (the caller's one clock read, which the deadline came from).
    pub started: Instant,
}

thread_local! {
    /// This thread's current busy-poll budget (ns), adapted to how waits actually end.
    static SPIN_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// The busy-poll budget for this thread's next wait: at most `max`, halved each time a wait
/// outlasted its spin (the peer was not running: spinning only stole its core), doubled back
/// (from at least 2 µs) each time a wait ended within the spin or a short yield.
pub(crate) fn adaptive_spin(max: Duration) -> Duration {
    let max_ns = max.as_nanos() as u64;
    Duration::from_nanos(SPIN_NS.with(|c| c.get()).min(max_ns))
}

/// Record how long the last wait took, against the spin it had.
pub(crate) fn record_wait(idle: Duration, spin: Duration, max: Duration) {
    let max_ns = max.as_nanos() as u64;
    SPIN_NS.with(|c| {
        let cur = c.get().min(max_ns);
        let quick = idle <= spin.max(Duration::from_micros(20));
        let next = if quick { (cur * 2).max(2_000) } else { cur / 2 };
        c.set(if next < 1_000 && !quick { 0 } else { next.min(max_ns) });
    });
}

/// Drive `ops` until all are done and their sends flushed. Ops on the same connection run in
/// list order (an op may only use a connection once every earlier op is done with it); the
/// cost of that rule is linear in the ops (one line per connection: `src/order.rs`).
pub fn drive<C: DriveComm>(comms: &[&C], ops: &mut [OpRun<'_>], policy: Policy) -> Result<()> {
    let max_spin = policy.spin;
    let mut policy = policy;
    policy.spin = adaptive_spin(max_spin);
    let scheds: Vec<std::sync::Arc<Schedule>> = ops.iter().map(|o| o.sched.clone()).collect();
    let uses: Vec<(&[usize], &[usize])> = scheds.iter().map(|s| s.peers()).collect();
    let tx_of: Vec<Vec<usize>> = (0..comms.len()).map(|ci| peers_of(ops, &uses, ci).1).collect();
    // one op needs no lines (the fast path allocates nothing for them)
    let mut order = (ops.len() > 1).then(|| {
        let mut o = crate::order::Order::default();
        for (i, (op, u)) in ops.iter().zip(&uses).enumerate() {
            o.push(i as u64, op.comm, u.0, u.1);
        }
        o
    });
    let mut movable: Vec<u64> = Vec::new();
    let mut idle_passes = 0u32;
    let mut idle_since: Option<Instant> = None;
    let started = policy.started;
    let mut next_report = policy.report.map(|r| started + r);
    let mut census_begun = false;
    loop {
        let mut progressed = false;
        let all_done = match order.as_mut() {
            None => {
                for op in ops.iter_mut().filter(|o| !o.done()) {
                    progressed |= comms[op.comm].with_conns(|c| op.poll(c))?;
                }
                ops.iter().all(|o| o.done())
            }
            Some(order) => {
                order.ready_into(&mut movable);
                for &id in &movable {
                    let op = &mut ops[id as usize];
                    progressed |= comms[op.comm].with_conns(|c| op.poll(c))?;
                    if op.done() {
                        order.retire(id);
                    }
                }
                order.len() == 0
            }
        };
        // flush, and find out whether anything is still in flight
        let mut pending = false;
        for (c, tx) in comms.iter().zip(&tx_of) {
            c.with_conns(|conns| -> Result<()> {
                for &q in tx {
                    if let Some(s) = conns.send[q].as_mut() {
                        s.progress().map_err(|e| e.with_peer(q).with_rank(c.rank()))?;
                        pending |= s.pending();
                    }
                }
                Ok(())
            })?;
        }
        if all_done && !pending {
            return Ok(());
        }
        if progressed {
            if let Some(since) = idle_since.take() {
                record_wait(since.elapsed(), policy.spin, max_spin);
                policy.spin = adaptive_spin(max_spin);
            }
            idle_passes = 0;
            continue;
        }
        // idle: spin a while (reading the clock only every 64 passes: short waits, the common
        // case for small messages, never read it), yield a while, then block
        idle_passes += 1;
        if idle_passes % 64 != 0 && !policy.spin.is_zero() {
            std::hint::spin_loop();
            continue;
        }
        for c in comms {
            if c.aborted() {
                return Err(Error::comm_aborted().with_rank(c.rank()));
            }
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        if now >= policy.deadline {
            return Err(hang_report(comms, ops));
        }
        if !census_begun && now + CENSUS_LEAD >= policy.deadline && now - started >= CENSUS_LEAD {
            census_begun = true;
            let p2p = |o: &&OpRun<'_>| matches!(o.fp.coll, crate::Coll::Send | crate::Coll::Recv);
            if let Some(o) = ops.iter().find(|o| !o.done() && !p2p(o)) {
                comms[o.comm].near_deadline(o.seq);
            }
        }
        if now - since < policy.spin {
            continue;
        }
        if now - since < policy.spin + policy.yield_for {
            std::thread::yield_now();
            continue;
        }
        if next_report.is_some_and(|t| now >= t) {
            crate::log::notice(None, &wait_note(comms, ops, now - started, policy.deadline - started));
            next_report = policy.report.map(|r| now + r);
        }
        match order.as_ref() {
            None => block(comms, ops.iter(), &tx_of, policy.deadline, &[])?,
            Some(o) => block(comms, o.ready().map(|id| &ops[id as usize]), &tx_of, policy.deadline, &[])?,
        }
        if now - since >= STALL {
            let lost = match order.as_ref() {
                None => lost_peer(comms, ops.iter()),
                Some(o) => lost_peer(comms, o.ready().map(|id| &ops[id as usize])),
            };
            if let Some(e) = lost {
                return Err(e);
            }
        }
    }
}

pub(crate) fn peers_of(ops: &[OpRun<'_>], uses: &[(&[usize], &[usize])], comm: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rx = vec![];
    let mut tx = vec![];
    for (o, u) in ops.iter().zip(uses) {
        if o.comm == comm {
            rx.extend_from_slice(u.0);
            tx.extend_from_slice(u.1);
        }
    }
    rx.sort_unstable();
    rx.dedup();
    tx.sort_unstable();
    tx.dedup();
    (rx, tx)
}

/// Arm everything the moving ops wait on (their blocking peers, plus sends in `tx_of[comm]` with
/// unflushed data) and sleep until one is ready, or at most 500 ms so the deadline and abort
/// are checked.
pub(crate) fn block<'o, 'm: 'o, C: DriveComm>(
    comms: &[&C],
    moving: impl IntoIterator<Item = &'o OpRun<'m>>,
    tx_of: &[Vec<usize>],
    deadline: Instant,
    extra: &[WaitSource],
) -> Result<()> {
    let mut sources: Vec<WaitSource> = comms.iter().map(|c| WaitSource::doorbell(c.abort_fd())).collect();
    sources.extend_from_slice(extra);
    let mut wanted: Vec<(usize, Blocked)> = vec![];
    let mut any_op = false;
    for o in moving {
        any_op = true;
        if let (false, Some(b)) = (o.done(), o.blocked) {
            wanted.push((o.comm, b));
        }
    }
    for (ci, (c, tx)) in comms.iter().zip(tx_of).enumerate() {
        for &q in tx {
            if c.with_conns(|conns| conns.send[q].as_ref().is_some_and(|s| s.pending())) {
                wanted.push((ci, Blocked::Send(q)));
            }
        }
    }
    wanted.sort_unstable_by_key(|&(ci, b)| {
        (
            ci,
            matches!(b, Blocked::Send(_)),
            match b {
                Blocked::Recv(p) | Blocked::Send(p) => p,
            },
        )
    });
    wanted.dedup();
    if wanted.is_empty() && any_op {
        // what the caller saw still in flight (a send being consumed) finished meanwhile:
        // there is nothing to sleep on, so let it look again
        return Ok(());
    }
    let mut armed = vec![];
    let mut ready = false;
    for &(ci, b) in &wanted {
        let r = comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map(|c| c.arm()),
            Blocked::Send(q) => conns.send[q].as_mut().map(|c| c.arm()),
        });
        armed.push((ci, b));
        match r {
            Some(Ok(Some(src))) => sources.push(src),
            Some(Ok(None)) => ready = true,
            Some(Err(e)) => {
                disarm(comms, &armed);
                return Err(e.with_rank(comms[ci].rank()));
            }
            None => {}
        }
        if ready {
            break;
        }
    }
    if !ready {
        let left = deadline.saturating_duration_since(Instant::now());
        wait_any(&sources, left.min(Duration::from_millis(500)))?;
    }
    disarm(comms, &armed);
    // a peer that died without closing anything (shared memory) is noticed here; a peer that
    // finished and exited normally has already delivered what we wait for, so only a connection
    // that is still not ready counts
    // (the same logic for both halves of a connection: they are different traits)
    macro_rules! dead_and_not_ready {
        ($c:expr) => {
            match $c.check_peer() {
                Ok(()) => Ok(()),
                Err(e) => {
                    let ready = matches!($c.arm(), Ok(None));
                    $c.disarm();
                    if ready {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
            }
        };
    }
    for &(ci, b) in &armed {
        let r = comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => conns.recv[p].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
            Blocked::Send(q) => conns.send[q].as_mut().map_or(Ok(()), |c| dead_and_not_ready!(c)),
        });
        if let Err(e) = r {
            let p = match b {
                Blocked::Recv(p) | Blocked::Send(p) => p,
            };
            return Err(e.with_peer(p).with_rank(comms[ci].rank()));
        }
    }
    Ok(())
}

fn disarm<C: DriveComm>(comms: &[&C], armed: &[(usize, Blocked)]) {
    for &(ci, b) in armed {
        comms[ci].with_conns(|conns| match b {
            Blocked::Recv(p) => {
                if let Some(c) = conns.recv[p].as_mut() {
                    c.disarm()
                }
            }
            Blocked::Send(q) => {
                if let Some(c) = conns.send[q].as_mut() {
                    c.disarm()
                }
            }
        });
    }
}

/// What a long wait waits for, for the periodic report: "rank 0: waiting for ranks [1] in
/// allreduce #12 (float, 4 MiB), 30 of 600 s".
pub(crate) fn wait_note<C: DriveComm>(comms: &[&C], ops: &[OpRun<'_>], waited: Duration, limit: Duration) -> String {
    let rank = ops.first().map(|o| comms[o.comm].rank()).unwrap_or(0);
    let mut peers: Vec<usize> = ops
        .iter()
        .filter(|o| !o.done())
        .filter_map(|o| match o.blocked {
            Some(Blocked::Recv(p) | Blocked::Send(p)) => Some(p),
            None => None,
        })
        .collect();
    peers.sort_unstable();
    peers.dedup();
    let what = match ops.iter().find(|o| !o.done()) {
        Some(o) => {
            let bytes = o.fp.count * o.fp.dtype.size();
            let name =
                if matches!(o.fp.coll, crate::Coll::Send | crate::Coll::Recv) { "send/recv" } else { o.fp.coll.name() };
            format!("{name} #{} ({}, {})", o.seq, o.fp.dtype.name(), human_bytes(bytes))
        }
        None => "flushing the last sends".into(),
    };
    format!(
        "rank {rank}: waiting for ranks {peers:?} in {what}, {:.0} of {:.0} s (OXCCL_WAIT_REPORT=0 silences this)",
        waited.as_secs_f64(),
        limit.as_secs_f64()
    )
}

/// `4 MiB`, `512 B`: sizes for messages.
pub fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

pub(crate) fn hang_report<C: DriveComm>(comms: &[&C], ops: &[OpRun<'_>]) -> Error {
    let mut parts = vec![];
    // the first unfinished ops are the ones that could move; the rest queue behind them
    const NAMED: usize = 8;
    let queued = ops.iter().filter(|o| !o.done()).count().saturating_sub(NAMED);
    for o in ops.iter().filter(|o| !o.done()).take(NAMED) {
        let what = match o.blocked {
            Some(Blocked::Recv(p)) => format!("waiting for data from rank {p}"),
            Some(Blocked::Send(q)) => format!("waiting for rank {q} to drain its receive buffer"),
            None => "waiting for an earlier operation on the same connection".into(),
        };
        parts.push(format!("{} (op #{}) at step {}/{}: {what}", o.fp, o.seq, o.pc, o.sched.steps.len()));
    }
    if parts.is_empty() {
        parts.push("all steps done, waiting for sends to flush".into());
    }
    if queued > 0 {
        parts.push(format!("{queued} more operations queued behind these"));
    }
    let rank = ops.first().map(|o| comms[o.comm].rank()).unwrap_or(0);
    let mut e = Error::new(ErrorKind::Timeout, format!("operation timed out (OXCCL_TIMEOUT): {}", parts.join("; ")))
        .with_rank(rank);
    if let Some(o) = ops.iter().find(|o| !o.done()) {
        e = e.with_op(o.fp.to_string()).with_seq(o.seq);
        if let Some(Blocked::Recv(p) | Blocked::Send(p)) = o.blocked {
            e = e.with_peer(p);
        }
    }
    e
}
