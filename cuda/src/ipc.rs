//! The CUDA IPC executor: one device *window* per rank, which every rank of the host maps once,
//! and one-shot collectives that go through the windows in rounds.
//!
//! The windows are made at the communicator's first one-shot collective, by the calling thread,
//! before that call parks its stream (see [`create`]). Nothing in an operation then opens or
//! exports an IPC handle: `cuIpcOpenMemHandle` can wait for the device, and an operation's
//! worker runs while the caller's stream is parked in the operation's gate (on a GPU, PyTorch's
//! DDP hung so, with both ranks' workers inside the driver).
//!
//! A round, on every rank: copy this rank's share of the input into its own window (its
//! stream), meet (a host barrier), compute this rank's output from the windows (a reduce kernel
//! over every rank's window, or copies from them), meet again (nobody refills its window while a
//! peer may still read it). Every write goes to the rank's own window or own output; inputs are
//! folded in rank order, so results are bit-identical to the host reference.

use crate::driver::{self, DeviceBuffer, Module, Stream};
use crate::kernels::{self, KernelArgs};
use crate::phases::{self, Phase};
use crate::DevMem;
use oxccl::{Coll, Communicator, Error, OpDesc, ReduceOp, Result};
use std::time::Instant;

/// This rank's window and every rank's, mapped here.
pub(crate) struct Window {
    local: DeviceBuffer,
    /// Each rank's window address in this process (this rank's is `local`).
    peers: Vec<u64>,
    /// The mappings this process opened (closed on drop).
    opened: Vec<u64>,
}

impl Drop for Window {
    fn drop(&mut self) {
        for &p in &self.opened {
            driver::ipc_close(p);
        }
    }
}

const REC: usize = 4 + 4 + 4 + 4 + 64 + 8;

/// Make the windows, collectively: every rank of the communicator calls it at the same
/// collective, with no operation of this communicator in flight. `None`: some rank could not
/// export or map a window, and every rank knows it (they stage instead).
pub(crate) fn create(comm: &Communicator, device: i32, size: usize) -> Result<Option<Window>> {
    let n = comm.size();
    driver::set_device(device)?;
    let local = DeviceBuffer::uninit(size);
    let mut rec = [0u8; REC];
    rec[0..4].copy_from_slice(&std::process::id().to_le_bytes());
    rec[4..8].copy_from_slice(&device.to_le_bytes());
    let exported = match &local {
        Ok(b) => driver::ipc_handle(b.ptr()).map(|h| (b.ptr(), h)),
        Err(e) => Err(e.clone()),
    };
    match exported {
        Ok((p, (h, 0))) => {
            rec[8..12].copy_from_slice(&1u32.to_le_bytes());
            rec[16..80].copy_from_slice(&h);
            rec[80..88].copy_from_slice(&p.to_le_bytes());
        }
        Ok(_) => tracing::debug!("the CUDA IPC window is not its allocation's start; staging"),
        Err(e) => tracing::debug!("no CUDA IPC window here ({e}); staging"),
    }
    let mut all = vec![0u8; REC * n];
    comm.all_gather(&rec, &mut all)?;
    let f = |q: usize, at: usize, len: usize| &all[q * REC + at..q * REC + at + len];
    let u32_at = |q: usize, at: usize| u32::from_le_bytes(f(q, at, 4).try_into().unwrap());
    // every rank evaluates the same predicate on the same records
    let usable = (0..n).all(|q| u32_at(q, 8) == 1)
        && (0..n).all(|a| (0..n).all(|b| u32_at(a, 0) != u32_at(b, 0) || u32_at(a, 4) == u32_at(b, 4)));
    let mut win = match (usable, local) {
        (true, Ok(local)) => Some(Window { local, peers: Vec::with_capacity(n), opened: Vec::new() }),
        _ => None,
    };
    let mut mapped = win.is_some();
    if let Some(w) = win.as_mut() {
        for q in 0..n {
            if u32_at(q, 0) == std::process::id() {
                w.peers.push(u64::from_le_bytes(f(q, 80, 8).try_into().unwrap()));
                continue;
            }
            match driver::ipc_open(f(q, 16, 64).try_into().unwrap()) {
                Ok(p) => {
                    w.opened.push(p);
                    w.peers.push(p);
                }
                Err(e) => {
                    tracing::debug!("cannot map rank {q}'s CUDA IPC window ({e}); staging");
                    mapped = false;
                    break;
                }
            }
        }
    }
    // agree that everyone mapped everything (the same answer on every rank)
    let mut flag = [u8::from(mapped)];
    comm.all_reduce_inplace(&mut flag, ReduceOp::Min)?;
    Ok(if flag[0] == 1 { win } else { None })
}

/// Meet every rank, carrying whether this rank's step went well; an error if any rank's failed.
fn meet(comm: &Communicator, d: &OpDesc, mine: Result<()>) -> Result<()> {
    let t = Instant::now();
    let mut flag = [u8::from(mine.is_ok())];
    let agreed = comm.all_reduce_inplace(&mut flag, ReduceOp::Min);
    phases::add(Phase::Barrier, t);
    mine?;
    agreed?;
    if flag[0] == 1 {
        Ok(())
    } else {
        Err(Error::remote(format!("{}: a peer's CUDA IPC step failed", d.coll.name())).with_rank(comm.rank()))
    }
}

/// Run a one-shot collective (all-reduce, reduce, reduce-scatter, all-gather, broadcast)
/// through the windows, in as many rounds as its size needs.
pub(crate) fn run(comm: &Communicator, module: &Module, s: &Stream, w: &Window, d: &OpDesc, m: &DevMem) -> Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let es = d.dtype.size();
    let (ni, no) = d.coll.buffer_counts(n, r, d.count, d.root);
    let ip = m.input(ni * es).0;
    let op = m.output(no * es).0;
    // a round's elements: whole 16-byte vectors, and for reduce-scatter n blocks per window
    let unit = (16 / es.min(16)).max(1);
    let blocks = if d.coll == Coll::ReduceScatter { n } else { 1 };
    let most = (w.local.len() / (blocks * es)) / unit * unit;
    let mut a = 0;
    while a < d.count {
        // `l` elements this round; reduce-scatter's blocks sit `l` rounded up to a vector apart
        let l = most.min(d.count - a);
        let t = Instant::now();
        let filled = fill(s, w, d, r, ip, a, l);
        phases::add(Phase::Window, t);
        meet(comm, d, filled)?;
        let t = Instant::now();
        let done = compute(module, s, w, d, r, op, a, l);
        phases::add(Phase::Kernel, t);
        meet(comm, d, done)?;
        a += l;
    }
    Ok(())
}

/// The distance in elements between reduce-scatter's blocks of `l` elements in a window:
/// whole 16-byte vectors, so that every block starts aligned.
fn stride(l: u64, es: u64) -> u64 {
    let unit = (16 / es.min(16)).max(1);
    l.div_ceil(unit) * unit
}

/// `bytes` from `src` to `dst` on `s` (device addresses: windows, mapped windows, or the
/// operation's buffers, each sized for the round by [`run`]).
fn copy(s: &Stream, dst: u64, src: u64, bytes: u64) -> Result<()> {
    // SAFETY: both ranges are device memory of this round (`run` sized the rounds to the
    // windows, and the operation's buffers hold its elements: enqueue's contract); our stream,
    // which is synchronised before the round's memory is reused.
    unsafe { driver::copy_d2d(dst, src, bytes as usize, s.raw()) }
}

/// Copy this rank's share of elements `[a, a + l)` into its window, and wait for the copy.
fn fill(s: &Stream, w: &Window, d: &OpDesc, r: usize, ip: u64, a: usize, l: usize) -> Result<()> {
    let es = d.dtype.size() as u64;
    let (a, l) = (a as u64, l as u64);
    let win = w.local.ptr();
    match d.coll {
        Coll::AllReduce | Coll::Reduce | Coll::AllGather => copy(s, win, ip + a * es, l * es)?,
        Coll::Broadcast if r == d.root => copy(s, win, ip + a * es, l * es)?,
        Coll::Broadcast => {}
        Coll::ReduceScatter => {
            let count = d.count as u64;
            for b in 0..w.peers.len() as u64 {
                copy(s, win + b * stride(l, es) * es, ip + (b * count + a) * es, l * es)?;
            }
        }
        _ => return Err(Error::new(oxccl::ErrorKind::Internal, "not a one-shot collective")),
    }
    s.sync()
}

/// Elements `[a, a + l)` of this rank's output, from the windows; waits for the device.
#[allow(clippy::too_many_arguments)]
fn compute(module: &Module, s: &Stream, w: &Window, d: &OpDesc, r: usize, op: u64, a: usize, l: usize) -> Result<()> {
    let n = w.peers.len();
    let es = d.dtype.size() as u64;
    let (a, l) = (a as u64, l as u64);
    let reduce_into = |skip: u64, out: u64| -> Result<()> {
        let mut k = KernelArgs::default();
        if let ReduceOp::PreMulSum(b) = d.op {
            k.scalar = u64::from_le_bytes(b);
        }
        for (q, &p) in w.peers.iter().enumerate() {
            k.inputs[q] = p + skip;
        }
        k.nin = n as u32;
        k.outputs[0] = out;
        k.nout = 1;
        k.n = l;
        k.post = if d.op == ReduceOp::Avg { n as u32 } else { 0 };
        // SAFETY: every window is mapped here and holds the round; the output window holds the
        // operation's elements; our own stream.
        unsafe { module.launch(&kernels::reduce_kernel_name(d.dtype, d.op), &k, es as usize, s.raw()) }
    };
    match d.coll {
        Coll::AllReduce => reduce_into(0, op + a * es)?,
        Coll::Reduce if r == d.root => reduce_into(0, op + a * es)?,
        Coll::Reduce => {}
        Coll::ReduceScatter => reduce_into(r as u64 * stride(l, es) * es, op + a * es)?,
        Coll::AllGather => {
            let count = d.count as u64;
            for (q, &p) in w.peers.iter().enumerate() {
                copy(s, op + (q as u64 * count + a) * es, p, l * es)?;
            }
        }
        Coll::Broadcast => copy(s, op + a * es, w.peers[d.root], l * es)?,
        _ => return Err(Error::new(oxccl::ErrorKind::Internal, "not a one-shot collective")),
    }
    s.sync()
}
