//! One operation's state machine: its steps, run as far as the connections allow.

use super::byref::{forwards, output_window, Role, window_addr, RECEIVED_DIRECT, SENT_BY_REFERENCE};
use super::{apply_step, Blocked, Conns, OpMem};
use crate::schedule::{Buf, Fingerprint, Schedule, Slice, Step};
use crate::types::ReduceOp;
use crate::{Error, Result};
use oxccl_transport::{Header, SendConn};

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
    /// Whether its reductions into the output use streaming stores ([`super::streams_output`]),
    /// decided once from the schedule and the buffers.
    stream: bool,
    /// Per peer: messages of this op sent to it, and received from it (inline up to 16 ranks:
    /// nothing allocated per call).
    tx_idx: PeerCounts,
    rx_idx: PeerCounts,
    /// What the op waits on, if it is blocked.
    pub blocked: Option<Blocked>,
    /// Its notes for watching (waits, lateness, trace).
    pub obs: super::Observe,
}

/// A count per peer, inline for communicators of up to 16 ranks.
type PeerCounts = smallvec::SmallVec<[u32; 16]>;

/// `n` zero counts (inline up to 16: set in place, not pushed one by one).
fn zeros(n: usize) -> PeerCounts {
    match n <= 16 {
        true => PeerCounts::from_buf_and_len([0; 16], n),
        false => smallvec::smallvec![0; n],
    }
}

/// Messages of at least this many bytes are sent by reference (single copy) where the
/// schedule, the transport and the operation's size (count × type size, at least the
/// connection's [`oxccl_transport::SendConn::borrow_min_op`], or in its
/// [`oxccl_transport::SendConn::borrow_forward`] for a step that passes its input on) allow.
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
        let stream = super::streams_output(&sched, &mem);
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
            stream,
            tx_idx: zeros(nranks),
            rx_idx: zeros(nranks),
            blocked: None,
            obs: Default::default(),
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
            stream: self.stream,
            tx_idx: self.tx_idx,
            rx_idx: self.rx_idx,
            blocked: self.blocked,
            obs: self.obs,
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
            self.obs.step_try();
            match self.try_step(self.pc, &step, conns) {
                Ok(true) => {
                    self.obs.step_done(self.pc, &step, self.fp.dtype.size());
                    self.pc += 1;
                    progressed = true;
                }
                Ok(false) => break,
                Err(e) => return Err(self.context(e)),
            }
        }
        Ok(progressed)
    }

    /// A message from `p` came: close the wait for it, if there was one.
    #[inline]
    fn note_received(&mut self, p: usize) {
        if self.obs.waits_for(p) {
            let (rx, sched) = (&self.rx_idx, &self.sched);
            self.obs.received(p, || rx[p] == 0 && sched.clean_peers().contains(&p));
        }
    }

    fn try_step(&mut self, pc: usize, step: &Step, conns: &mut Conns) -> Result<bool> {
        let es = self.fp.dtype.size();
        let len = step.count * es;
        let Conns { send, recv } = conns;
        let split = matches!(self.mem, OpMem::Split { .. } | OpMem::OwnedSplit { .. });
        // 1. the send side first, so nothing is received that could not be passed on
        let mut borrowed: Option<Slice> = None;
        let mut slot = None;
        let mut sent = false;
        if let Some(q) = step.send {
            let c = send[q].as_mut().ok_or_else(|| Error::internal("no send connection").with_peer(q))?;
            if c.max_message() < len {
                return Err(Error::internal("step larger than the connection's messages"));
            }
            let premul_input = |v: Slice| matches!(self.fp.op, ReduceOp::PreMulSum(_)) && v.buf == Buf::Input;
            let op_bytes = self.fp.count * es;
            // in small operations, only a step that passes its input on sends by reference,
            // published before its own copy; in large ones (or while the connection's copies
            // are slow), every stable value, after it
            let role = |any: bool| Role {
                only_input: self.sched.sends_only_input(),
                split,
                receives: !self.sched.peers().0.is_empty(),
                messages: op_bytes.div_ceil(c.max_message().max(1)),
                any,
            };
            let fwd = (len >= BORROW_MIN).then(|| c.borrow_forward());
            // (the connection's copies slow just now: every stable value, whatever the receiver)
            let all_stable = fwd.as_ref().is_some_and(|f| op_bytes >= f.stable_min_op);
            let forwarded = fwd
                .is_some_and(|f| forwards(f.ops, op_bytes, role(f.any_role)))
                .then(|| self.forwarded_input(pc, step))
                .flatten();
            let stable = || {
                (split && (all_stable || op_bytes >= c.borrow_min_op())).then(|| self.sched.stable_send(pc)).flatten()
            };
            let candidate = (len >= BORROW_MIN)
                .then(|| forwarded.or_else(stable))
                .flatten()
                .filter(|_| all_stable || c.borrow_for_combining() || self.sched.peer_copies(pc))
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
            } else if forwarded.is_some() {
                // the step passes its input on: published now, the peer's read of it overlaps
                // the step's own copy
                self.commit_send(q, len, borrowed, c.as_mut())?;
                sent = true;
            }
        }
        // 2. the receive side: a pure copy of a message sent by reference (never one shorter
        // than BORROW_MIN) goes straight from the peer's memory into the destination
        let mut direct = false;
        if let (Some(p), None, Some(d), false, true) = (step.recv, step.src, step.dst, step.post, len >= BORROW_MIN) {
            let c = recv[p].as_mut().ok_or_else(|| Error::internal("no receive connection").with_peer(p))?;
            let expect = Expect::of(self, p, len);
            let dst = output_window(&mut self.mem, d.offset * es, len)?;
            if c.take_into(dst, &|h| expect.check(h)).map_err(|e| e.with_peer(p))?.is_some() {
                direct = true;
                RECEIVED_DIRECT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(s) = slot.as_deref_mut() {
                    oxccl_simd::copy(&mut s[..len], dst);
                }
                self.note_received(p);
            }
        }
        if !direct {
            let msg = match step.recv {
                Some(p) => {
                    let c = recv[p].as_mut().ok_or_else(|| Error::internal("no receive connection").with_peer(p))?;
                    match c.peek().map_err(|e| e.with_peer(p))? {
                        None => {
                            self.blocked = Some(Blocked::Recv(p));
                            self.obs.blocked_on(p);
                            return Ok(false);
                        }
                        Some((h, data)) => {
                            Expect::of(self, p, len).check(&h)?;
                            self.note_received(p);
                            Some(data)
                        }
                    }
                }
                None => None,
            };
            let (dt, op, n) = (self.fp.dtype, self.fp.op, self.nranks);
            apply_step(step, dt, op, n, self.stream, &mut self.mem, msg, slot)?;
        }
        if let (Some(q), false) = (step.send, sent) {
            self.commit_send(q, len, borrowed, send[q].as_mut().unwrap().as_mut())?;
        }
        if let Some(p) = step.recv {
            self.rx_idx[p] += 1;
            recv[p].as_mut().unwrap().consume().map_err(|e| e.with_peer(p))?;
        }
        Ok(true)
    }
}

impl OpRun<'_> {
    /// Commit the step's message of `len` bytes to `q` on `c`: by reference to `borrowed`, or
    /// the slot it reserved.
    fn commit_send(&mut self, q: usize, len: usize, borrowed: Option<Slice>, c: &mut dyn SendConn) -> Result<()> {
        let h = Header {
            len: len as u32,
            comm: self.comm_id,
            seq: self.seq,
            count: self.fp.count_word(),
            step: self.tx_idx[q],
            call: self.fp.call_word(),
        };
        self.tx_idx[q] += 1;
        match borrowed {
            Some(v) => {
                SENT_BY_REFERENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.commit_borrowed(h, window_addr(&self.mem, v, self.fp.dtype.size(), len)?)
            }
            None => c.commit(h),
        }
        .map_err(|e| e.with_peer(q))
    }
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
