//! Groups: operations queued between `ncclGroupStart` and `ncclGroupEnd`, and stream ordering.

use super::*;
use oxccl::{CallOptions, Coll, Error, OpDesc, ReduceOp};
use std::sync::Arc;

// ---- groups ---------------------------------------------------------------------------------------

pub(crate) struct Pending {
    pub(crate) entry: Arc<Entry>,
    pub(crate) desc: OpDesc,
    pub(crate) opts: CallOptions,
    pub(crate) layout: Layout,
    /// Device buffers: the device, and the stream the operation is enqueued on.
    pub(crate) device: Option<(i32, usize)>,
}

pub(crate) fn dev_mem(l: &Layout) -> device::DevMem {
    match *l {
        Layout::Split { send, send_len, recv, recv_len } => {
            device::DevMem::Split { send: send as u64, send_len, recv: recv as u64, recv_len }
        }
        Layout::InPlace { base, len, in_off, out_off } => {
            device::DevMem::InPlace { base: base as u64, len, in_off, out_off }
        }
    }
}

/// Where an operation's buffers live: `Some(device)` for device memory (both windows on one GPU),
/// `None` for host memory; buffers of both kinds in one operation are refused.
pub(crate) fn placement(l: &Layout, name: &str) -> Result<Option<i32>, Error> {
    use device::Memory;
    let (a, alen, b, blen) = match *l {
        Layout::Split { send, send_len, recv, recv_len } => (send, send_len, recv, recv_len),
        Layout::InPlace { base, len, .. } => (base, len, base, len),
    };
    // device memory only exists in a process that loaded the CUDA driver
    let cuda = cu_pointer_get_attribute().is_some();
    let memory_of = |p: usize, len: usize| {
        if cuda && p != 0 && len > 0 {
            device::classify(p as u64)
        } else {
            Memory::Host
        }
    };
    let (ma, mb) = (memory_of(a, alen), memory_of(b, blen));
    match (ma, mb, alen > 0, blen > 0) {
        (Memory::Device(x), Memory::Device(y), _, _) if x != y => Err(arg(format!(
            "{name}: sendbuff is on GPU {x} and recvbuff on GPU {y}; both must be on the communicator's GPU"
        ))),
        (Memory::Device(x), _, _, false)
        | (_, Memory::Device(x), false, _)
        | (Memory::Device(x), Memory::Device(_), _, _) => Ok(Some(x)),
        (Memory::Device(_), Memory::Host, _, true) | (Memory::Host, Memory::Device(_), true, _) => {
            Err(arg(format!("{name}: one buffer is device memory and the other host memory; both must be of one kind")))
        }
        _ => {
            // host memory: the input readable, the output writable (NCCL's in-place form is one
            // window read and written)
            let inplace = matches!(l, Layout::InPlace { .. });
            access::check(a, alen, inplace && blen > 0, "sendbuff", name, cuda)?;
            if !inplace {
                access::check(b, blen, true, "recvbuff", name, cuda)?;
            }
            Ok(None)
        }
    }
}

thread_local! {
    pub(crate) static GROUP: std::cell::RefCell<(usize, Vec<Pending>)> = const { std::cell::RefCell::new((0, Vec::new())) };
}

/// Run, record (inside a group) or submit (non-blocking communicator) one operation.
#[allow(clippy::too_many_arguments)] // NCCL's own argument list
pub(crate) fn enqueue(
    h: ncclComm_t,
    coll: Coll,
    send: *const c_void,
    recv: *mut c_void,
    count: size_t,
    datatype: c_int,
    op: c_int,
    root: c_int,
    stream: cudaStream_t,
) -> R {
    enqueue_with(h, coll, send, recv, count, datatype, op, root, stream, CallOptions::default())
}

/// [`enqueue`] with per-call options (`nccl*Config`).
#[allow(clippy::too_many_arguments)] // NCCL's own argument list, and the options
pub(crate) fn enqueue_with(
    h: ncclComm_t,
    coll: Coll,
    send: *const c_void,
    recv: *mut c_void,
    count: size_t,
    datatype: c_int,
    op: c_int,
    root: c_int,
    stream: cudaStream_t,
    opts: CallOptions,
) -> R {
    let e = entry(h)?;
    let dt = dtype(datatype)?;
    let comm = e.ready()?;
    let n = comm.size();
    let op = if coll.reduces() { redop(&e, op, dt)? } else { ReduceOp::Sum };
    let root = if coll.rooted() {
        usize::try_from(root).ok().filter(|&r| r < n).ok_or_else(|| {
            let what = if matches!(coll, Coll::Send | Coll::Recv) { "peer" } else { "root" };
            arg(format!("{what} {root} is out of range for a communicator of {n} ranks"))
        })?
    } else {
        0
    };
    let desc = OpDesc { coll, dtype: dt, op, count, root };
    let layout = layout(comm, &desc, send, recv)?;
    let device = placement(&layout, coll.name())?.map(|d| (d, stream as usize));
    if device.is_none() {
        host_after_stream(stream, coll.name())?;
    }
    let in_group = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push(Pending { entry: e.clone(), desc, opts, layout, device });
            true
        } else {
            false
        }
    });
    if in_group {
        return Ok(ncclSuccess);
    }
    if let Some(err) = e.async_error.lock().unwrap().clone().or_else(|| e.device_error()) {
        return Err(err);
    }
    if let Some((ordinal, stream)) = device {
        // NCCL's stream semantics: enqueue on the stream and return
        let dc = e.device_comm(ordinal)?;
        // SAFETY: NCCL's contract: device buffers of the communicator's GPU, valid until the
        // operation completes on `stream`, a live stream.
        unsafe { dc.enqueue_with(vec![(desc, opts, dev_mem(&layout))], device::UserStream(stream))? };
        return Ok(ncclSuccess);
    }
    e.drain_device();
    if e.blocking {
        // SAFETY: a blocking call: the caller's buffers are valid until it returns.
        comm.run_with(desc, opts, unsafe { borrowed(&layout) })?;
        Ok(ncclSuccess)
    } else {
        let mut req = comm.submit_with(desc, opts, owned(&layout))?;
        if req.test() {
            req.wait()?;
            return Ok(ncclSuccess);
        }
        e.requests.lock().unwrap().push(req);
        Ok(ncclInProgress)
    }
}

/// Host buffers with a CUDA stream: the host operation runs once the stream's earlier work is
/// done (it completes before the call returns, so later stream work is ordered after it).
pub(crate) fn host_after_stream(stream: cudaStream_t, name: &str) -> Result<(), Error> {
    if stream.is_null() {
        return Ok(());
    }
    if cu_pointer_get_attribute().is_none() {
        return Err(Error::invalid_usage(format!(
            "{name}: a CUDA stream was given, but CUDA is not loaded in this process (host buffers take a NULL stream)"
        )));
    }
    // SAFETY: NCCL's contract: a live stream of the caller's.
    unsafe { device::sync_user_stream(stream.cast()) }
}

pub(crate) fn group_end() -> R {
    let ops = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(Error::invalid_usage("ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 { std::mem::take(&mut g.1) } else { Vec::new() })
    })?;
    if ops.is_empty() {
        return Ok(ncclSuccess);
    }
    // earlier non-blocking operations of these communicators go first
    for p in &ops {
        p.entry.wait_requests();
    }
    // device operations: one job per communicator and stream, enqueued together
    type DeviceJob = (Arc<Entry>, i32, usize, Vec<(OpDesc, CallOptions, device::DevMem)>);
    let mut jobs: Vec<DeviceJob> = Vec::new();
    for p in ops.iter().filter(|p| p.device.is_some()) {
        let (ordinal, stream) = p.device.unwrap();
        match jobs.iter_mut().find(|j| Arc::ptr_eq(&j.0, &p.entry) && j.2 == stream) {
            Some(j) => j.3.push((p.desc, p.opts, dev_mem(&p.layout))),
            None => jobs.push((p.entry.clone(), ordinal, stream, vec![(p.desc, p.opts, dev_mem(&p.layout))])),
        }
    }
    for (entry, ordinal, stream, list) in jobs {
        let dc = entry.device_comm(ordinal)?;
        // SAFETY: NCCL's contract for device buffers and streams (see `enqueue`).
        unsafe { dc.enqueue_with(list, device::UserStream(stream))? };
    }
    let mut group = oxccl::Group::new();
    for p in ops.iter().filter(|p| p.device.is_none()) {
        let comm = p.entry.ready()?;
        // SAFETY: the caller's buffers stay valid until ncclGroupEnd returns (NCCL's contract for
        // operations of a group, which we complete before returning).
        group.add_with(comm, p.desc, p.opts, unsafe { borrowed(&p.layout) })?;
    }
    group.run()?;
    Ok(ncclSuccess)
}
