//! Device buffers on the caller's stream.
//!
//! [`DeviceComm::enqueue`] follows NCCL's stream semantics: it records an event on the caller's
//! stream (the operation's inputs are ready when it fires), enqueues a *gate* on the same stream
//! (work enqueued after the call waits for the operation), hands the job to the communicator's
//! worker thread and returns at once. The gate is a `cuStreamWaitValue32` on a word of pinned
//! host memory: job k waits until the word reaches k. The worker waits for the event (polling
//! it for 50 µs, then sleeping on it: `CU_EVENT_BLOCKING_SYNC`, no busy loop), runs the
//! operation, then stores k. CUDA work
//! before the call is therefore ordered before it and work after it is ordered after it;
//! completion is observed by synchronising the stream. (A blocking CUDA host function would not
//! do as the gate: the driver runs every stream's host functions on one thread, so one rank's
//! parked gate would stop another rank's stream in the same process.)
//!
//! Two executors, chosen identically by every rank (the choice is agreed on by the ranks):
//! - **CUDA IPC** (all ranks on one host, at most 8, all-reduce, reduce-scatter, all-gather,
//!   broadcast, reduce): through device windows that every rank maps once (`ipc.rs`;
//!   same-process ranks use the pointers directly; several ranks may share one GPU, unlike
//!   NCCL). Inputs are folded in rank order, so the result is bit-identical to the host
//!   reference whatever the rank count.
//! - **Staging** (everything else; ranks on several hosts; send/recv groups): the inputs are
//!   copied to pinned host memory on an internal non-blocking stream, the host communicator runs
//!   the operation with the same schedules, tuner and transports as host buffers (TCP between
//!   hosts), and the outputs are copied back.
//!
//! Graph capture: a call on a stream that is being captured returns `InvalidUsage` (the gate and
//! the worker's hand-off cannot be replayed by a graph).

use crate::driver::{self, Event, Memory, Pinned, Stream};
use crate::ipc;
use crate::kernels::MAX_PTRS;
use crate::phases::{self, Phase};
use oxccl::OpMem;
use oxccl::{CallOptions, Coll, Communicator, Error, ErrorKind, Group, OpDesc, ReduceOp, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The host communicator a [`DeviceComm`] runs on (implemented by [`Communicator`]; the C ABI
/// implements it for its handle table entries).
pub trait HostComm: Send + Sync + 'static {
    /// The communicator.
    fn comm(&self) -> &Communicator;
}

impl HostComm for Communicator {
    fn comm(&self) -> &Communicator {
        self
    }
}

impl HostComm for Arc<Communicator> {
    fn comm(&self) -> &Communicator {
        self
    }
}

/// An operation's device buffers (device addresses), in the two shapes NCCL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevMem {
    /// Separate send and receive buffers (either may be empty).
    Split {
        /// Send buffer address.
        send: u64,
        /// Its length in bytes.
        send_len: usize,
        /// Receive buffer address.
        recv: u64,
        /// Its length in bytes.
        recv_len: usize,
    },
    /// One buffer holding both windows (NCCL's in-place forms).
    InPlace {
        /// The buffer.
        base: u64,
        /// Its length.
        len: usize,
        /// Offset of the input window.
        in_off: usize,
        /// Offset of the output window.
        out_off: usize,
    },
}

impl DevMem {
    pub(crate) fn input(&self, in_len: usize) -> (u64, usize) {
        match *self {
            DevMem::Split { send, send_len, .. } => (send, send_len),
            DevMem::InPlace { base, in_off, .. } => (base + in_off as u64, in_len),
        }
    }
    pub(crate) fn output(&self, out_len: usize) -> (u64, usize) {
        match *self {
            DevMem::Split { recv, recv_len, .. } => (recv, recv_len),
            DevMem::InPlace { base, out_off, .. } => (base + out_off as u64, out_len),
        }
    }
    fn pinned_len(&self) -> usize {
        match *self {
            DevMem::Split { send_len, recv_len, .. } => send_len.div_ceil(64) * 64 + recv_len,
            DevMem::InPlace { len, .. } => len,
        }
    }
    fn pointers(&self) -> [u64; 2] {
        match *self {
            DevMem::Split { send, recv, .. } => [send, recv],
            DevMem::InPlace { base, .. } => [base, base],
        }
    }
}

/// A typed device buffer: an address and an element count. Creating one is `unsafe` (the
/// address must be device memory of the communicator's GPU, valid for `len` elements while
/// operations that use it are in flight).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSlice<T> {
    ptr: u64,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: oxccl::Element> DeviceSlice<T> {
    /// Wrap a device address.
    ///
    /// # Safety
    /// `ptr` is device memory valid for `len` elements of `T` for as long as operations using
    /// this slice are in flight on their stream.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceSlice { ptr, len, _t: std::marker::PhantomData }
    }
    /// The address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

/// A CUDA stream of the caller's (a `CUstream`/`cudaStream_t`; NULL is the legacy default
/// stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserStream(pub usize);

struct Job {
    ops: Vec<(OpDesc, CallOptions, DevMem)>,
    ready: Event,
    /// The gate value that releases the caller's stream once the job is done.
    seq: u32,
    /// When it was enqueued.
    queued: Instant,
}

/// The worker's queue and what it is doing, under one lock (`drain` and the worker read both).
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// The worker holds a job it took from `jobs`.
    busy: bool,
    shutdown: bool,
    /// The gate value of the job enqueued last.
    last_seq: u32,
}

struct Inner {
    host: Arc<dyn HostComm>,
    device: i32,
    /// The kernels on `device`, loaded at creation.
    module: &'static driver::Module,
    /// The IPC one-shot path may be used: all ranks on one host, at most [`MAX_PTRS`] of them,
    /// `OXCCL_CUDA_IPC` not `0` (fixed for the communicator's life, so every rank decides alike).
    ipc_allowed: bool,
    queue: Mutex<Queue>,
    /// The callers' streams wait on it; the worker stores each finished job's `seq`.
    gate: driver::GateWord,
    /// The CUDA IPC windows: made by the caller of the first eligible operation.
    window: Mutex<WindowState>,
    /// The staged path's pinned memory, grown by callers before they park their streams.
    staging: Mutex<Staging>,
    /// Signalled when a job is queued or shutdown is asked (the worker waits on it).
    work: Condvar,
    /// Signalled when the worker finishes a job (`drain` waits on it).
    idle: Condvar,
    error: Mutex<Option<Error>>,
}

/// Whether the CUDA IPC windows exist (the same answer on every rank, agreed when made).
enum WindowState {
    Untried,
    Off,
    On(Arc<ipc::Window>),
}

/// Jobs a communicator holds at most (queued or running); `enqueue` waits for room. Each holds
/// a parked wait on its caller's stream, and a stream's queue of commands is finite.
const MAX_JOBS: usize = 16;

impl Inner {
    /// Whether a job runs on the CUDA IPC path (when the windows exist): one collective the
    /// one-shot path implements, with no algorithm restriction. Every rank decides alike.
    fn ipc_eligible(&self, ops: &[(OpDesc, CallOptions, DevMem)]) -> bool {
        self.ipc_allowed && ops.len() == 1 && one_shot(ops[0].0.coll) && !ops[0].1.algos.is_restricted()
    }

    /// Grow the staging buffer for a job that will be staged, in the caller's thread before its
    /// stream is parked: the worker allocates nothing while a stream waits on it (allocating
    /// page-locked memory is one of the calls CUDA may order after other streams' work).
    fn ensure_staging(&self, ops: &[(OpDesc, CallOptions, DevMem)]) -> Result<()> {
        let total = staging_bytes(ops);
        let mut st = self.staging.lock().unwrap();
        if st.current.as_ref().is_none_or(|p| p.len() < total) {
            let p = Arc::new(Pinned::new(total.next_power_of_two())?);
            if let Some(old) = st.current.replace(p) {
                st.retired.push(old);
            }
        }
        Ok(())
    }

    /// Make the windows at the first eligible operation, in the caller's thread, before its
    /// stream is parked: collectively (every rank reaches the same operation), with this
    /// communicator's earlier jobs done so the host communicator is free.
    fn ensure_window(&self) -> Result<()> {
        if !matches!(*self.window.lock().unwrap(), WindowState::Untried) {
            return Ok(());
        }
        // (not under the window's lock: the worker takes it for eligible jobs)
        let mut q = self.queue.lock().unwrap();
        while q.busy || !q.jobs.is_empty() {
            q = self.idle.wait(q).unwrap();
        }
        drop(q);
        let mut st = self.window.lock().unwrap();
        let comm = self.host.comm();
        let made = ipc::create(comm, self.device, comm.config().cuda_ipc_window);
        *st = match made {
            Ok(Some(w)) => WindowState::On(Arc::new(w)),
            Ok(None) => WindowState::Off,
            Err(e) => {
                *st = WindowState::Off;
                return Err(e);
            }
        };
        Ok(())
    }
}

/// A communicator for device buffers (see the module docs).
pub struct DeviceComm {
    inner: Arc<Inner>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// The fork generation that started the worker (in a `fork` child it does not exist).
    generation: u64,
}

/// How the last operations ran (for tests and `gpu-check.sh`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PathCounts {
    /// Operations run by the IPC one-shot kernels.
    pub ipc: u64,
    /// Operations run by staging through host memory.
    pub staged: u64,
}

static COUNTS: Mutex<PathCounts> = Mutex::new(PathCounts { ipc: 0, staged: 0 });

/// Operations run by each executor in this process so far.
pub fn path_counts() -> PathCounts {
    *COUNTS.lock().unwrap()
}

impl DeviceComm {
    /// A device communicator over `host` for buffers on device `device`. Fails with
    /// `Unavailable` when CUDA is not usable here.
    pub fn new(host: Arc<dyn HostComm>, device: i32) -> Result<DeviceComm> {
        driver::probe()?;
        driver::set_device(device)?;
        let module = driver::module(device)?; // compile or load the kernels now, not in the first call
        let comm = host.comm();
        let one_host = comm.peers().iter().all(|p| p.host_id == comm.peers()[0].host_id);
        let ipc_allowed = comm.config().cuda_ipc && one_host && comm.size() <= MAX_PTRS;
        let inner = Arc::new(Inner {
            host,
            device,
            module,
            ipc_allowed,
            queue: Mutex::new(Queue::default()),
            gate: driver::GateWord::new()?,
            window: Mutex::new(WindowState::Untried),
            staging: Mutex::new(Staging::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            error: Mutex::new(None),
        });
        let w = inner.clone();
        let worker = std::thread::Builder::new()
            .name(format!("oxccl-cuda-{}", inner.host.comm().rank()))
            .spawn(move || worker_main(w))
            .map_err(|e| Error::system("spawning the device worker thread", &e))?;
        Ok(DeviceComm { inner, worker: Some(worker), generation: oxccl::fork_generation() })
    }

    /// The host communicator.
    pub fn host(&self) -> &Communicator {
        self.inner.host.comm()
    }

    /// The first error of an earlier asynchronous operation, if any (NCCL's async error).
    pub fn error(&self) -> Option<Error> {
        self.inner.error.lock().unwrap().clone()
    }

    /// Wait until every enqueued operation has run (their inputs became ready and they finished).
    pub fn drain(&self) {
        let mut q = self.inner.queue.lock().unwrap();
        while q.busy || !q.jobs.is_empty() {
            q = self.inner.idle.wait(q).unwrap();
        }
    }

    /// Enqueue operations (several: one group, run together) on `stream` and return at once.
    ///
    /// # Safety
    /// The buffers are device memory of this communicator's GPU, valid until the operation has
    /// completed on `stream`; `stream` is a live stream of the current context (or NULL).
    pub unsafe fn enqueue(&self, ops: Vec<(OpDesc, DevMem)>, stream: UserStream) -> Result<()> {
        let ops = ops.into_iter().map(|(d, m)| (d, CallOptions::default(), m)).collect();
        // SAFETY: the caller's contract, unchanged.
        unsafe { self.enqueue_with(ops, stream) }
    }

    /// [`DeviceComm::enqueue`] with per-call options (algorithm selection, profiler tag). A
    /// restricted selection takes the staged path, whose schedules honour it (the one-shot
    /// kernels are an algorithm of their own).
    ///
    /// # Safety
    /// As for [`DeviceComm::enqueue`].
    pub unsafe fn enqueue_with(&self, ops: Vec<(OpDesc, CallOptions, DevMem)>, stream: UserStream) -> Result<()> {
        let rank = self.host().rank();
        if let Some(e) = self.error() {
            return Err(e);
        }
        let stream = stream.0 as driver::CUstream;
        driver::guarded("enqueue", || {
            driver::set_device(self.inner.device)?;
            // SAFETY: the caller's contract: a live stream.
            if unsafe { driver::is_capturing(stream)? } {
                return Err(Error::invalid_usage(
                    "the stream is being captured into a CUDA graph: oxccl does not support graph capture of \
                     collectives yet (call it outside the capture)",
                )
                .with_rank(rank));
            }
            for (d, _, m) in &ops {
                for p in m.pointers() {
                    if p != 0 && driver::classify(p) != Memory::Device(self.inner.device) {
                        return Err(Error::invalid_argument(format!(
                            "{}: buffer {p:#x} is not device memory of GPU {} (a communicator's device buffers must \
                             live on its GPU)",
                            d.coll.name(),
                            self.inner.device
                        ))
                        .with_rank(rank));
                    }
                }
            }
            if self.inner.ipc_eligible(&ops) {
                self.inner.ensure_window()?;
            }
            let windowed =
                self.inner.ipc_eligible(&ops) && matches!(*self.inner.window.lock().unwrap(), WindowState::On(_));
            if !windowed {
                self.inner.ensure_staging(&ops)?;
            }
            let ready = Event::new()?;
            // SAFETY: as above.
            unsafe { ready.record(stream)? };
            // the gate values follow the queue's order (taken under its lock), so the worker
            // stores them in increasing order
            let mut q = self.inner.queue.lock().unwrap();
            while q.jobs.len() + usize::from(q.busy) >= MAX_JOBS {
                q = self.inner.idle.wait(q).unwrap();
            }
            let seq = q.last_seq.wrapping_add(1);
            // SAFETY: as above; the word lives as long as `inner`, which outlives the worker.
            unsafe { self.inner.gate.wait(stream, seq)? };
            q.last_seq = seq;
            q.jobs.push_back(Job { ops, ready, seq, queued: Instant::now() });
            drop(q);
            self.inner.work.notify_one();
            Ok(())
        })
    }

    /// [`DeviceComm::enqueue`] on oxccl-owned buffers and stream, safe: every window must lie
    /// inside one of `buffers` (checked). The buffers' and stream's drops wait for the device
    /// (`cuMemFree` and stream destruction synchronise), so they outlive the operation.
    pub fn enqueue_on(
        &self,
        ops: Vec<(OpDesc, DevMem)>,
        buffers: &[&driver::DeviceBuffer],
        stream: &Stream,
    ) -> Result<()> {
        let host = self.host();
        let inside = |p: u64, len: usize| {
            len == 0 || buffers.iter().any(|b| p >= b.ptr() && p + len as u64 <= b.ptr() + b.len() as u64)
        };
        for (d, m) in &ops {
            let es = d.dtype.size();
            let (ni, no) = d.coll.buffer_counts(host.size(), host.rank(), d.count, d.root);
            let ok = match *m {
                DevMem::Split { send, send_len, recv, recv_len } => {
                    inside(send, send_len) && inside(recv, recv_len) && send_len <= ni * es && recv_len <= no * es
                }
                DevMem::InPlace { base, len, in_off, out_off } => {
                    inside(base, len) && in_off + ni * es <= len && out_off + no * es <= len
                }
            };
            if !ok {
                return Err(Error::invalid_argument(format!(
                    "{}: a buffer window lies outside the given device buffers or its sizes do not match",
                    d.coll.name()
                )));
            }
        }
        // SAFETY: every window lies in a live oxccl allocation of this process (checked above),
        // which cannot be freed before the device is done with it; `stream` is live.
        unsafe { self.enqueue(ops, UserStream(stream.raw() as usize)) }
    }

    /// All-reduce of device buffers on `stream` (returns at once).
    ///
    /// # Safety
    /// See [`DeviceComm::enqueue`].
    pub unsafe fn all_reduce<T: oxccl::Element>(
        &self,
        send: &DeviceSlice<T>,
        recv: &DeviceSlice<T>,
        op: ReduceOp,
        stream: UserStream,
    ) -> Result<()> {
        let d = OpDesc { coll: Coll::AllReduce, dtype: T::DTYPE, op, count: send.len, root: 0 };
        // SAFETY: the caller's contract.
        unsafe { self.typed(d, send, recv, stream) }
    }

    /// Any collective on typed device slices (counts in NCCL's convention: `count` is `desc.count`).
    ///
    /// # Safety
    /// See [`DeviceComm::enqueue`].
    pub unsafe fn typed<T: oxccl::Element>(
        &self,
        desc: OpDesc,
        send: &DeviceSlice<T>,
        recv: &DeviceSlice<T>,
        stream: UserStream,
    ) -> Result<()> {
        let host = self.host();
        let (ni, no) = desc.coll.buffer_counts(host.size(), host.rank(), desc.count, desc.root);
        if send.len < ni || recv.len < no {
            return Err(Error::invalid_argument(format!(
                "{}: buffers of {} and {} elements, {ni} and {no} needed",
                desc.coll.name(),
                send.len,
                recv.len
            )));
        }
        let es = std::mem::size_of::<T>();
        let mem = if send.ptr == recv.ptr && send.ptr != 0 {
            let (io, oo, len) = oxccl::inplace_layout(desc.coll, host.size(), host.rank(), desc.count, desc.root)
                .ok_or_else(|| Error::invalid_argument(format!("{} has no in-place form", desc.coll.name())))?;
            DevMem::InPlace { base: send.ptr, len: len * es, in_off: io * es, out_off: oo * es }
        } else {
            DevMem::Split { send: send.ptr, send_len: send.bytes().min(ni * es), recv: recv.ptr, recv_len: no * es }
        };
        // SAFETY: the caller's contract.
        unsafe { self.enqueue(vec![(desc, mem)], stream) }
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        if self.generation != oxccl::fork_generation() {
            // inherited through fork: the worker thread exists in the parent only, and CUDA
            // cannot be used here to free the gate's memory
            std::mem::forget(self.worker.take());
            std::mem::forget(self.inner.clone());
            return;
        }
        self.inner.queue.lock().unwrap().shutdown = true;
        self.inner.work.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Worker state: its stream.
struct Worker {
    stream: Stream,
}

/// The staged path's pinned memory: the current buffer, and those it replaced (never freed
/// while operations may be in flight: `cuMemFreeHost` synchronises the device).
#[derive(Default)]
struct Staging {
    current: Option<Arc<Pinned>>,
    retired: Vec<Arc<Pinned>>,
}

fn worker_main(inner: Arc<Inner>) {
    let init = driver::set_device(inner.device).and_then(|_| Stream::new());
    // without a stream the worker still serves the queue: every job fails (the error is
    // recorded) and its gate opens, so no stream and no `drain` waits for it
    let mut w = match init {
        Ok(stream) => Some(Worker { stream }),
        Err(e) => {
            *inner.error.lock().unwrap() = Some(e);
            None
        }
    };
    loop {
        let job = {
            let mut q = inner.queue.lock().unwrap();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    q.busy = true;
                    break Some(j);
                }
                if q.shutdown {
                    break None;
                }
                q = inner.work.wait(q).unwrap();
            }
        };
        let Some(job) = job else { break };
        phases::add(Phase::Queue, job.queued);
        let already_failed = inner.error.lock().unwrap().is_some();
        let r = match w.as_mut() {
            Some(w) if !already_failed => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_job(&inner, w, &job))).unwrap_or_else(
                    |_| {
                        Err(Error::new(ErrorKind::Internal, "the device worker panicked")
                            .with_rank(inner.host.comm().rank()))
                    },
                )
            }
            _ => Ok(()), // an earlier error stands; the job is skipped
        };
        if let Err(e) = r {
            tracing::error!("oxccl device operation failed: {e}");
            inner.error.lock().unwrap().get_or_insert(e);
        }
        inner.gate.set(job.seq);
        inner.queue.lock().unwrap().busy = false;
        inner.idle.notify_all();
    }
}

fn run_job(inner: &Inner, w: &mut Worker, job: &Job) -> Result<()> {
    let comm = inner.host.comm();
    let t = Instant::now();
    job.ready.wait()?;
    phases::add(Phase::Ready, t);
    if inner.ipc_eligible(&job.ops) {
        let win = match &*inner.window.lock().unwrap() {
            WindowState::On(win) => Some(win.clone()),
            _ => None,
        };
        if let Some(win) = win {
            let (d, _, m) = &job.ops[0];
            ipc::run(comm, inner.module, &w.stream, &win, d, m)?;
            COUNTS.lock().unwrap().ipc += 1;
            return Ok(());
        }
    }
    staged(inner, w, &job.ops)?;
    COUNTS.lock().unwrap().staged += 1;
    Ok(())
}

/// The collectives the IPC one-shot kernels implement.
fn one_shot(coll: Coll) -> bool {
    matches!(coll, Coll::AllReduce | Coll::ReduceScatter | Coll::AllGather | Coll::Broadcast | Coll::Reduce)
}

/// Where an operation's windows sit in its pinned region: (input offset, output offset), and
/// the region's size rounded to 64 bytes (regions are laid out back to back).
fn pinned_layout(m: &DevMem) -> (usize, usize, usize) {
    let (i, o) = match *m {
        DevMem::Split { send_len, .. } => (0, send_len.div_ceil(64) * 64),
        DevMem::InPlace { in_off, out_off, .. } => (in_off, out_off),
    };
    (i, o, m.pinned_len().div_ceil(64) * 64)
}

/// The pinned bytes a staged job needs.
fn staging_bytes(ops: &[(OpDesc, CallOptions, DevMem)]) -> usize {
    ops.iter().map(|(_, _, m)| pinned_layout(m).2).sum()
}

/// The staged path: device → pinned host → host collective(s) → device.
fn staged(inner: &Inner, w: &Worker, ops: &[(OpDesc, CallOptions, DevMem)]) -> Result<()> {
    let comm = inner.host.comm();
    let (n, r) = (comm.size(), comm.rank());
    let total = staging_bytes(ops);
    // sized by the caller before it parked its stream (`Inner::ensure_staging`)
    let staging = inner.staging.lock().unwrap().current.clone().filter(|p| p.len() >= total);
    let Some(staging) = staging else {
        return Err(Error::new(ErrorKind::Internal, "the staging buffer was not sized before the operation"));
    };
    let pin = staging.ptr();
    // per op: its region's offset, and the pinned and device windows of its input and output
    let mut at = 0usize;
    let mut regions = Vec::with_capacity(ops.len());
    for (d, _, m) in ops {
        let es = d.dtype.size();
        let (ni, no) = d.coll.buffer_counts(n, r, d.count, d.root);
        let (pi, po, size) = pinned_layout(m);
        regions.push((at, at + pi, m.input(ni * es), at + po, m.output(no * es)));
        at += size;
    }
    let t = Instant::now();
    for &(_, pi, (ip, il), ..) in &regions {
        // SAFETY: pinned memory of `total` bytes holds every window; the device addresses are
        // the caller's (enqueue's contract).
        unsafe { driver::copy_d2h(pin.add(pi), ip, il, w.stream.raw())? };
    }
    w.stream.sync()?;
    let t = phases::add(Phase::CopyIn, t);
    let mut g = Group::new();
    for ((d, o, m), &(base, ..)) in ops.iter().zip(&regions) {
        // SAFETY: each operation gets a disjoint region of the pinned buffer, which only this
        // thread touches until the copies back are done.
        let region = unsafe { std::slice::from_raw_parts_mut(pin.add(base), m.pinned_len()) };
        let mem = match *m {
            DevMem::Split { send_len, recv_len, .. } => {
                let (a, b) = region.split_at_mut(pinned_layout(m).1);
                OpMem::Split { input: &a[..send_len], output: &mut b[..recv_len] }
            }
            DevMem::InPlace { in_off, out_off, .. } => OpMem::InPlace { buf: region, in_off, out_off },
        };
        g.add_with(comm, *d, *o, mem)?;
    }
    g.run()?;
    let t = phases::add(Phase::Host, t);
    for &(.., po, (op, ol)) in &regions {
        // SAFETY: as for the copies in.
        unsafe { driver::copy_h2d(op, pin.add(po), ol, w.stream.raw())? };
    }
    w.stream.sync()?;
    phases::add(Phase::CopyOut, t);
    Ok(())
}
