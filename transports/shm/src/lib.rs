//! # oxccl-transport-shm: shared memory between processes on one host
//!
//! Each directed connection is a single-producer single-consumer ring of `nslots` slots in a
//! segment owned by the receiver. The segment is a `memfd` (never a name in `/dev/shm`): the
//! sender opens it through `/proc/<pid>/fd/<n>` and maps it, after which the receiver closes its
//! descriptor. Nothing survives the processes, even after `kill -9`, and the 64 MiB `/dev/shm` of
//! containers does not limit it.
//!
//! Each slot has a header line (64 bytes: frame header, a payload of up to 16 bytes inline, and a
//! flag naming the message the slot holds). The receiver polls the flag of its next slot, so a
//! small message costs it one cache line (LL-style: data and flag together); the sender keeps a
//! cached copy of the receiver's tail and rereads it only when the ring looks full.
//! Waits spin in the executor, then block: the waiting side sets a `waiting` flag and polls its
//! process's doorbell (a pipe); the other side rings it only when the flag is set, so no system
//! call is made on the fast path when nobody sleeps.
//!
//! Safety: all `unsafe` is in `segment.rs` (mmap, atomics and slices in the mapping).

mod placement;
mod probe;
mod segment;

pub use probe::{copy_probe, CopyProbe, FORWARD_MIN_RATIO};

use oxccl_transport::wait::{ring_fd, Doorbell, WaitSource};
use oxccl_transport::{
    check_alive, Error, Forwarding, Header, PeerInfo, PendingRecv, RecvConn, Result, SendConn, Transport, TransportCtx,
    HEADER_BYTES,
};
use segment::*;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ring geometry.
#[derive(Debug, Clone, Copy)]
pub struct ShmConfig {
    /// Slots per ring.
    pub slots: usize,
    /// Payload bytes per slot (a multiple of 64).
    pub slot_bytes: usize,
    /// Allow single-copy messages by reference (`process_vm_readv`) when the kernel permits.
    pub cma: bool,
    /// ... in operations of at least this many bytes.
    pub cma_min_op: usize,
    /// ... and, in operations of `cma_forward_min..cma_forward_max` bytes (default 32 KiB..32
    /// MiB), the messages that only pass the sender's input on
    /// ([`SendConn::borrow_forward`]; the executor narrows it by the rank's role).
    pub cma_forward_min: usize,
    /// See [`ShmConfig::cma_forward_min`].
    pub cma_forward_max: usize,
    /// ... but, whatever the sending rank's role ([`Forwarding::any_role`]), only while the
    /// receiver measures the two processes far apart (`placement.rs`), and between close cores
    /// in operations of one message ([`NEAR_FORWARD_MAX_OP`]): where the kernel's copy is slow
    /// ([`copy_probe`]), two copies through the slots win between close cores once they
    /// pipeline, and lose between cores far apart.
    pub cma_forward_far_only: bool,
    /// While the two processes run far apart, operations of at least this many bytes (default
    /// 64 KiB) send every value that stays unchanged by reference, to a receiver that combines
    /// it too ([`Forwarding::stable_min_op`]): every byte through a slot crosses between the
    /// cores twice (the sender's write takes the line, the receiver's read takes it back), a
    /// byte read through the kernel once.
    pub cma_far_min_op: usize,
    /// Whether the two processes run far apart: measured by the receiver (the default), or
    /// taken as given.
    pub placement: Placement,
}

/// Where the kernel's copy is slow ([`ShmConfig::cma_forward_far_only`]) and the two cores are
/// close, inputs are still forwarded by reference, whatever the rank's role, in operations of
/// `cma_forward_min` up to this many bytes (at most a slot's): one message, whose two copies
/// through the slots cannot overlap. On the AMD EPYC VM of bench/RESULTS.md ("One message by
/// reference between close cores") a 64 KiB broadcast took 6.5–7.1 µs that way against 8.4–9.0
/// through the slots, and Open MPI (which reads it through the kernel too) 6.3–7.2; from two
/// messages on the slots pipeline the copies.
pub const NEAR_FORWARD_MAX_OP: usize = 128 << 10;

/// How a connection knows whether its two processes run on cores far apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Placement {
    /// The receiver measures it all along (`placement.rs`); its verdict counts only where the
    /// kernel's copy is slow ([`ShmConfig::cma_forward_far_only`]).
    #[default]
    Measured,
    /// Taken as close: nothing goes by reference for being far apart.
    Near,
    /// Taken as far apart, whatever the kernel's copy costs (as when measured far, one message
    /// in 16 that could go by reference still goes through the slots).
    Far,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            slots: 4,
            slot_bytes: 256 << 10,
            cma: true,
            cma_min_op: 32 << 20,
            cma_forward_min: 32 << 10,
            cma_forward_max: 32 << 20,
            cma_forward_far_only: false,
            cma_far_min_op: 64 << 10,
            placement: Placement::Measured,
        }
    }
}

/// The shared-memory transport of one communicator rank.
pub struct ShmTransport {
    ctx: TransportCtx,
    cfg: ShmConfig,
    doorbell: Arc<Doorbell>,
}

impl ShmTransport {
    /// A transport for `ctx`'s rank.
    pub fn new(ctx: TransportCtx, cfg: ShmConfig) -> Result<Self> {
        if !(2..=MAX_SLOTS).contains(&cfg.slots) || cfg.slot_bytes == 0 || cfg.slot_bytes % 64 != 0 {
            return Err(Error::invalid_argument(format!(
                "shm ring geometry {} slots x {} bytes: slots must be 2..={MAX_SLOTS} (a fused receive-and-send step holds one slot while it needs another), bytes a non-zero multiple of 64",
                cfg.slots, cfg.slot_bytes
            )));
        }
        Ok(ShmTransport { ctx, cfg, doorbell: Arc::new(Doorbell::new()?) })
    }
}

fn seg_len(cfg: &ShmConfig) -> usize {
    OFF_PAYLOAD + cfg.slots * cfg.slot_bytes
}

fn put_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn get_u64(b: &[u8], i: usize) -> Result<u64> {
    b.get(i * 8..i * 8 + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| Error::remote("truncated shm setup blob"))
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "SHM"
    }

    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        // the segment is opened through /proc/<pid>: the peer's pid must mean the same here
        me.host_id == peer.host_id && me.machine == peer.machine
    }

    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)> {
        let len = seg_len(&self.cfg);
        let (seg, fd) = Segment::create(len).map_err(|e| e.with_peer(peer))?;
        seg.u32_at(OFF_MAGIC).store(MAGIC, Ordering::Relaxed);
        let mut blob = Vec::with_capacity(48);
        for x in [
            std::process::id() as u64,
            fd.as_raw_fd() as u64,
            self.cfg.slots as u64,
            self.cfg.slot_bytes as u64,
            self.doorbell.write_fd() as u64,
            self.ctx.comm_id,
        ] {
            put_u64(&mut blob, x);
        }
        Ok((Box::new(PendingShm { seg, fd, cfg: self.cfg, doorbell: self.doorbell.clone(), peer }), blob))
    }

    fn connect_send(&self, peer: usize, blob: &[u8], _deadline: Instant) -> Result<Box<dyn SendConn>> {
        let pid = get_u64(blob, 0)? as u32;
        let fd = get_u64(blob, 1)? as i32;
        let slots = get_u64(blob, 2)? as usize;
        let slot_bytes = get_u64(blob, 3)? as usize;
        let peer_bell = get_u64(blob, 4)? as i32;
        let comm = get_u64(blob, 5)?;
        if comm != self.ctx.comm_id || !(2..=MAX_SLOTS).contains(&slots) || slot_bytes % 64 != 0 {
            return Err(Error::remote("shm setup blob does not match this communicator").with_peer(peer));
        }
        let cfg = ShmConfig { slots, slot_bytes, ..self.cfg };
        let seg = Segment::open(pid, fd, seg_len(&cfg)).map_err(|e| e.with_peer(peer))?;
        if seg.u32_at(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(Error::remote("peer's shm segment has a bad magic").with_peer(peer));
        }
        let peer_doorbell = open_doorbell(pid, peer_bell).map_err(|e| e.with_peer(peer))?;
        seg.u32_at(OFF_SENDER_PID).store(std::process::id(), Ordering::Relaxed);
        seg.u32_at(OFF_SENDER_DOORBELL).store(self.doorbell.write_fd() as u32, Ordering::Relaxed);
        seg.u64_at(OFF_SENDER_PROBE).store(&CMA_PROBE as *const u64 as u64, Ordering::Relaxed);
        seg.u32_at(OFF_ATTACHED).store(1, Ordering::Release);
        Ok(Box::new(ShmSend {
            peer_pid: pid,
            peer,
            seg,
            cfg,
            head: 0,
            tail_seen: 0,
            borrowed_until: 0,
            want_room: false,
            far_asked: std::cell::Cell::new(0),
            doorbell: self.doorbell.clone(),
            peer_doorbell,
        }))
    }
}

/// A peer process that is gone (killed, crashed) closes nothing in shared memory: ask the kernel.
struct PendingShm {
    seg: Segment,
    fd: OwnedFd,
    cfg: ShmConfig,
    doorbell: Arc<Doorbell>,
    peer: usize,
}

impl PendingRecv for PendingShm {
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>> {
        let PendingShm { seg, fd, cfg, doorbell, peer } = *self;
        while seg.u32_at(OFF_ATTACHED).load(Ordering::Acquire) == 0 {
            if Instant::now() >= deadline {
                return Err(Error::timeout("the sender never attached to the shm ring").with_peer(peer));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // The sender has mapped the segment: drop our descriptor; the memory now lives exactly as
        // long as the two mappings.
        drop(fd);
        let pid = seg.u32_at(OFF_SENDER_PID).load(Ordering::Relaxed);
        let bell = seg.u32_at(OFF_SENDER_DOORBELL).load(Ordering::Relaxed) as i32;
        let peer_doorbell = open_doorbell(pid, bell).map_err(|e| e.with_peer(peer))?;
        // can we read the sender's memory? (the sender only sends by reference once we said so)
        let cma_ok = cfg.cma && {
            let probe = seg.u64_at(OFF_SENDER_PROBE).load(Ordering::Relaxed) as usize;
            let mut b = [0u8; 8];
            read_remote(pid, probe, &mut b).is_ok() && u64::from_ne_bytes(b) == CMA_PROBE
        };
        seg.u32_at(OFF_CMA).store(if cma_ok { 1 } else { 2 }, Ordering::Release);
        Ok(Box::new(ShmRecv {
            peer_pid: pid,
            seg,
            cfg,
            tail: 0,
            materialized: None,
            take_missed: false,
            lines: placement::LineTime::default(),
            doorbell,
            peer_doorbell,
            peer,
        }))
    }
}

struct ShmSend {
    peer_pid: u32,
    peer: usize,
    seg: Segment,
    cfg: ShmConfig,
    head: u64,
    /// The receiver's tail as last read (it only grows): rereading it only when the ring looks
    /// full keeps the receiver's line out of the fast path.
    tail_seen: u64,
    /// Messages up to this number were sent by reference: the sender's memory is in use until
    /// the receiver's tail reaches it.
    borrowed_until: u64,
    /// The last attempt to send found the ring full: `arm` then waits for room (otherwise it
    /// waits for messages sent by reference to be consumed).
    want_room: bool,
    /// Messages that could have gone by reference while the receiver measured us far apart
    /// (one in [`placement::PROBE_EVERY`] goes through the slots all the same).
    far_asked: std::cell::Cell<u32>,
    doorbell: Arc<Doorbell>,
    peer_doorbell: OwnedFd,
}

fn header_line(slot: usize) -> usize {
    OFF_SLOT_HEADERS + slot * SLOT_HEADER_STRIDE
}

impl ShmSend {
    /// Whether the two processes run far apart, as far as sending by reference goes: as the
    /// receiver measures it (where the kernel's copy is slow) or as configured, but for one ask
    /// in [`placement::PROBE_EVERY`], which keeps the measurement going.
    fn far_now(&self) -> bool {
        let verdict = match self.cfg.placement {
            Placement::Measured if self.cfg.cma_forward_far_only => {
                self.seg.u32_at(OFF_PLACEMENT).load(Ordering::Relaxed)
            }
            Placement::Measured | Placement::Near => return false,
            Placement::Far => placement::FAR,
        };
        placement::forward_now(verdict, &self.far_asked)
    }

    fn has_room(&mut self) -> bool {
        if self.head - self.tail_seen < self.cfg.slots as u64 {
            return true;
        }
        self.tail_seen = self.seg.u64_at(OFF_TAIL).load(Ordering::Acquire);
        self.head - self.tail_seen < self.cfg.slots as u64
    }

    fn borrowed_pending(&self) -> bool {
        self.borrowed_until > self.tail_seen && self.borrowed_until > self.seg.u64_at(OFF_TAIL).load(Ordering::Acquire)
    }

    fn receiver_closed(&self) -> Result<()> {
        match self.seg.u32_at(OFF_RECEIVER_CLOSED).load(Ordering::Relaxed) {
            0 => Ok(()),
            2 => Err(Error::peer_aborted(self.peer)),
            _ => Err(Error::remote("the receiver closed the shm ring").with_peer(self.peer)),
        }
    }

    /// Write the header line of the next slot and publish it.
    fn publish(&mut self, header: Header, borrowed: Option<usize>) -> Result<()> {
        if header.len as usize > self.cfg.slot_bytes || !self.has_room() {
            return Err(Error::internal("shm commit without a reserved slot"));
        }
        let slot = (self.head % self.cfg.slots as u64) as usize;
        let hb = header.encode();
        let line = header_line(slot);
        self.seg.bytes_mut(line, HEADER_BYTES).copy_from_slice(&hb);
        let len = header.len as usize;
        if len <= INLINE_MAX {
            let mut inline = [0u8; INLINE_MAX];
            inline[..len].copy_from_slice(self.seg.bytes(OFF_PAYLOAD + slot * self.cfg.slot_bytes, len));
            self.seg.bytes_mut(line + SLOT_INLINE, INLINE_MAX).copy_from_slice(&inline);
        } else {
            let (addr, mark) = match borrowed {
                Some(a) => (a as u64, BORROWED_MARK ^ self.head),
                None => (0, 0),
            };
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&addr.to_le_bytes());
            b[8..].copy_from_slice(&mark.to_le_bytes());
            self.seg.bytes_mut(line + SLOT_INLINE, 16).copy_from_slice(&b);
        }
        self.head += 1;
        if borrowed.is_some() {
            self.borrowed_until = self.head;
        }
        self.seg.u64_at(line + SLOT_FLAG).store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.seg.u32_at(OFF_RECEIVER_WAITING).load(Ordering::Relaxed) != 0 {
            ring_fd(self.peer_doorbell.as_raw_fd());
        }
        Ok(())
    }
}

impl SendConn for ShmSend {
    fn max_message(&self) -> usize {
        self.cfg.slot_bytes
    }

    fn reserve(&mut self) -> Result<Option<&mut [u8]>> {
        self.want_room = !self.has_room();
        if self.want_room {
            match self.seg.u32_at(OFF_RECEIVER_CLOSED).load(Ordering::Relaxed) {
                0 => {}
                2 => return Err(Error::peer_aborted(self.peer)),
                _ => return Err(Error::remote("the receiver closed the shm ring").with_peer(self.peer)),
            }
            return Ok(None);
        }
        let slot = (self.head % self.cfg.slots as u64) as usize;
        let off = OFF_PAYLOAD + slot * self.cfg.slot_bytes;
        let n = self.cfg.slot_bytes;
        Ok(Some(self.seg.bytes_mut(off, n)))
    }

    fn commit(&mut self, header: Header) -> Result<()> {
        self.publish(header, None)
    }

    fn borrow_ready(&mut self, len: usize) -> Result<Option<bool>> {
        if len <= INLINE_MAX || len > self.cfg.slot_bytes || self.seg.u32_at(OFF_CMA).load(Ordering::Acquire) != 1 {
            return Ok(Some(false));
        }
        self.want_room = !self.has_room();
        if self.want_room {
            self.receiver_closed()?;
            return Ok(None);
        }
        Ok(Some(true))
    }

    fn borrow_for_combining(&self) -> bool {
        false
    }

    fn borrow_min_op(&self) -> usize {
        if self.cfg.cma {
            self.cfg.cma_min_op
        } else {
            usize::MAX
        }
    }

    fn borrow_forward(&self) -> Forwarding {
        let ops = self.cfg.cma_forward_min..self.cfg.cma_forward_max;
        if !self.cfg.cma {
            return Forwarding::default();
        }
        if self.far_now() {
            // far apart, every byte through the slots crosses between the cores slowly
            return Forwarding { ops, any_role: true, stable_min_op: self.cfg.cma_far_min_op };
        }
        match self.cfg.cma_forward_far_only {
            // close, with the kernel's copy slow: operations of one message only
            true => {
                let ops = ops.start..ops.end.min(NEAR_FORWARD_MAX_OP.min(self.cfg.slot_bytes) + 1);
                Forwarding { ops, any_role: true, ..Forwarding::default() }
            }
            false => Forwarding { ops, ..Forwarding::default() },
        }
    }

    fn commit_borrowed(&mut self, header: Header, addr: usize) -> Result<()> {
        if self.seg.u32_at(OFF_CMA).load(Ordering::Acquire) != 1 || (header.len as usize) <= INLINE_MAX {
            return Err(Error::internal("shm send by reference that borrow_ready did not allow"));
        }
        self.publish(header, Some(addr))
    }

    fn progress(&mut self) -> Result<()> {
        if self.borrowed_pending() {
            self.receiver_closed()?;
        }
        Ok(())
    }

    fn pending(&self) -> bool {
        self.borrowed_pending()
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        self.seg.u32_at(OFF_SENDER_WAITING).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst); // pairs with the fence in `consume`
        let ready = if self.want_room { self.has_room() } else { !self.borrowed_pending() };
        if ready {
            self.disarm();
            return Ok(None);
        }
        Ok(Some(WaitSource::doorbell(self.doorbell.read_fd())))
    }

    fn disarm(&mut self) {
        self.seg.u32_at(OFF_SENDER_WAITING).store(0, Ordering::Relaxed);
    }

    fn check_peer(&self) -> Result<()> {
        check_alive(self.peer, self.peer_pid)
    }

    fn abort(&mut self) {
        self.seg.u32_at(OFF_SENDER_CLOSED).store(2, Ordering::SeqCst);
        ring_fd(self.peer_doorbell.as_raw_fd());
    }
}

impl Drop for ShmSend {
    fn drop(&mut self) {
        let _ = self.seg.u32_at(OFF_SENDER_CLOSED).compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        ring_fd(self.peer_doorbell.as_raw_fd());
    }
}

struct ShmRecv {
    peer_pid: u32,
    seg: Segment,
    cfg: ShmConfig,
    tail: u64,
    /// The message (by number) sent by reference whose payload `peek` already copied into its
    /// slot.
    materialized: Option<u64>,
    /// `take_into` found no message, and `peek` has not looked since: a message sent by
    /// reference that `peek` finds now came in between, and is left for the next `take_into`
    /// to read straight into its destination (rather than through the slot).
    take_missed: bool,
    /// How far apart the sender's core and ours are (`placement.rs`).
    lines: placement::LineTime,
    doorbell: Arc<Doorbell>,
    peer_doorbell: OwnedFd,
    peer: usize,
}

impl ShmRecv {
    /// Time one load of a line in the middle of the current message (at `off`, `len` bytes),
    /// which the sender has just written, and publish a changed verdict for the sender.
    fn time_line(&mut self, off: usize, len: usize) {
        let line = self.seg.bytes(off + len / 2 / 64 * 64, 1);
        let ticks = oxccl_simd::clock::time(|| {
            std::hint::black_box(std::hint::black_box(line)[0]);
        });
        if let Some((verdict, ns)) = self.lines.timed(self.tail, ticks, oxccl_simd::clock::ticks_per_ns) {
            self.seg.u32_at(OFF_PLACEMENT).store(verdict, Ordering::Relaxed);
            let far = verdict == placement::FAR;
            tracing::info!(
                target: "SHM",
                "SHM from rank {}: a line of its takes {ns:.0} ns to load ({}): unchanged values come {}",
                self.peer,
                if far { "cores far apart" } else { "cores close" },
                if far && self.cfg.cma_forward_far_only { "by reference" } else { "through the slots" }
            );
        }
    }

    fn has_data(&self) -> bool {
        let slot = (self.tail % self.cfg.slots as u64) as usize;
        self.seg.u64_at(header_line(slot) + SLOT_FLAG).load(Ordering::Acquire) == self.tail + 1
    }

    /// The sender's address of the current message if it was sent by reference.
    fn borrowed_addr(&self, line: usize, len: usize) -> Option<usize> {
        if len <= INLINE_MAX {
            return None;
        }
        let b = self.seg.bytes(line + SLOT_INLINE, 16);
        let addr = u64::from_le_bytes(b[..8].try_into().unwrap());
        let mark = u64::from_le_bytes(b[8..].try_into().unwrap());
        (mark == BORROWED_MARK ^ self.tail).then_some(addr as usize)
    }

    /// The outcome of copying a message sent by reference from the sender's memory.
    fn borrowed_read(&self, r: std::io::Result<()>) -> Result<()> {
        // a sender that failed and returned may reuse its buffer: it marks the ring closed
        // first, so a copy that raced with that is caught here
        if self.seg.u32_at(OFF_SENDER_CLOSED).load(Ordering::Acquire) == 2 {
            return Err(Error::peer_aborted(self.peer));
        }
        r.map_err(|e| {
            check_alive(self.peer, self.peer_pid).err().unwrap_or_else(|| {
                Error::system(format!("single-copy read of rank {}'s memory (pid {})", self.peer, self.peer_pid), &e)
                    .with_peer(self.peer)
            })
        })
    }
}

impl RecvConn for ShmRecv {
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>> {
        let missed = std::mem::take(&mut self.take_missed);
        if !self.has_data() {
            match self.seg.u32_at(OFF_SENDER_CLOSED).load(Ordering::Acquire) {
                0 => {}
                _ if self.has_data() => {}
                2 => return Err(Error::peer_aborted(self.peer)),
                _ => return Err(Error::remote("the sender closed the shm ring").with_peer(self.peer)),
            }
            return Ok(None);
        }
        let slot = (self.tail % self.cfg.slots as u64) as usize;
        let line = header_line(slot);
        let h = Header::decode(self.seg.bytes(line, HEADER_BYTES), self.cfg.slot_bytes)
            .map_err(|e| e.with_peer(self.peer))?;
        let len = h.len as usize;
        if len <= INLINE_MAX {
            return Ok(Some((h, self.seg.bytes(line + SLOT_INLINE, len))));
        }
        let off = OFF_PAYLOAD + slot * self.cfg.slot_bytes;
        if let Some(addr) = self.borrowed_addr(line, len) {
            if missed {
                return Ok(None); // (see `take_missed`)
            }
            // sent by reference to a step that needs it here: copy it into its slot once
            if self.materialized != Some(self.tail) {
                let r = read_remote(self.peer_pid, addr, self.seg.bytes_mut(off, len));
                self.borrowed_read(r)?;
                self.materialized = Some(self.tail);
            }
        } else if self.lines.wants(self.tail, len) {
            self.time_line(off, len);
        }
        Ok(Some((h, self.seg.bytes(off, len))))
    }

    fn take_into(&mut self, dst: &mut [u8], check: &dyn Fn(&Header) -> Result<()>) -> Result<Option<Header>> {
        if !self.has_data() {
            self.take_missed = true;
            return Ok(None);
        }
        let slot = (self.tail % self.cfg.slots as u64) as usize;
        let line = header_line(slot);
        let h = Header::decode(self.seg.bytes(line, HEADER_BYTES), self.cfg.slot_bytes)
            .map_err(|e| e.with_peer(self.peer))?;
        let Some(addr) = self.borrowed_addr(line, h.len as usize) else { return Ok(None) };
        check(&h)?;
        if dst.len() != h.len as usize {
            return Err(Error::internal("single-copy destination of the wrong size").with_peer(self.peer));
        }
        self.borrowed_read(read_remote(self.peer_pid, addr, dst))?;
        Ok(Some(h))
    }

    fn consume(&mut self) -> Result<()> {
        if !self.has_data() {
            return Err(Error::internal("shm consume without a message"));
        }
        self.tail += 1;
        self.seg.u64_at(OFF_TAIL).store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.seg.u32_at(OFF_SENDER_WAITING).load(Ordering::Relaxed) != 0 {
            ring_fd(self.peer_doorbell.as_raw_fd());
        }
        Ok(())
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        self.seg.u32_at(OFF_RECEIVER_WAITING).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst); // pairs with the fence in `commit`
        if self.has_data() || self.seg.u32_at(OFF_SENDER_CLOSED).load(Ordering::SeqCst) != 0 {
            self.disarm();
            return Ok(None);
        }
        Ok(Some(WaitSource::doorbell(self.doorbell.read_fd())))
    }

    fn disarm(&mut self) {
        self.seg.u32_at(OFF_RECEIVER_WAITING).store(0, Ordering::Relaxed);
    }

    fn memory(&self) -> usize {
        seg_len(&self.cfg)
    }

    fn abort(&mut self) {
        self.seg.u32_at(OFF_RECEIVER_CLOSED).store(2, Ordering::SeqCst);
        ring_fd(self.peer_doorbell.as_raw_fd());
    }

    fn check_peer(&self) -> Result<()> {
        check_alive(self.peer, self.peer_pid)
    }
}

impl Drop for ShmRecv {
    fn drop(&mut self) {
        let _ = self.seg.u32_at(OFF_RECEIVER_CLOSED).compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        ring_fd(self.peer_doorbell.as_raw_fd());
    }
}

#[cfg(test)]
mod tests;
