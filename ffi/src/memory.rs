//! Buffers: host and device pointers, in-place layouts, data types and reduction ops.

use super::*;
use oxccl::inplace_layout;
use oxccl::{Coll, Communicator, DataType, Error, OpDesc, ReduceOp};
use oxccl::{HostBuf, OpMem};
use std::sync::{Mutex, OnceLock};

// ---- buffers -----------------------------------------------------------------------------------

/// A caller's buffer, for non-blocking operations (the caller keeps it alive until completion,
/// NCCL's contract for enqueued operations).
pub(crate) struct RawBuf {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
}

impl HostBuf for RawBuf {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller passed a buffer of at least `len` bytes and keeps it alive and
        // untouched until the operation completes (NCCL's contract).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; the operation is the buffer's only user while it runs.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        Box::new(())
    }
}

/// Where an operation's buffers are: separate, or NCCL's in-place form of one allocation.
#[derive(Clone, Copy)]
pub(crate) enum Layout {
    Split { send: usize, send_len: usize, recv: usize, recv_len: usize },
    InPlace { base: usize, len: usize, in_off: usize, out_off: usize },
}

// ---- device pointers ----------------------------------------------------------------------

/// `cuPointerGetAttribute` from the CUDA driver, if this process can load it.
pub(crate) type CuPointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

pub(crate) fn cu_pointer_get_attribute() -> Option<CuPointerGetAttribute> {
    // found once: kept; not found: looked up again at most every 50 ms (a program may load CUDA
    // after its first host-buffer call)
    static F: OnceLock<usize> = OnceLock::new();
    static LAST_MISS: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    if let Some(&f) = F.get() {
        // SAFETY: the symbol has this signature in every CUDA driver API version.
        return Some(unsafe { std::mem::transmute::<usize, CuPointerGetAttribute>(f) });
    }
    {
        let mut last = LAST_MISS.lock().unwrap();
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(50)) {
            return None;
        }
        *last = Some(std::time::Instant::now());
    }
    let f: Option<usize> = {
        // SAFETY: dlopen/dlsym with NUL-terminated names; RTLD_NOLOAD: only a driver the process
        // already loaded (a process that never loaded CUDA cannot hold device pointers), so
        // nothing is initialised behind the caller's back.
        unsafe {
            let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NOLOAD);
            if h.is_null() {
                return None;
            }
            let f = libc::dlsym(h, c"cuPointerGetAttribute".as_ptr());
            (!f.is_null()).then_some(f as usize)
        }
    };
    let f = *F.get_or_init(|| f.unwrap_or(0));
    // SAFETY: the symbol has this signature in every CUDA driver API version.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, CuPointerGetAttribute>(f) })
}

/// Check an operation's arguments and locate its buffers.
pub(crate) fn layout(comm: &Communicator, d: &OpDesc, send: *const c_void, recv: *mut c_void) -> Result<Layout, Error> {
    let (n, r) = (comm.size(), comm.rank());
    let es = d.dtype.size();
    let (mut ni, no) = d.coll.buffer_counts(n, r, d.count, d.root);
    if d.coll == Coll::Broadcast && r != d.root {
        ni = 0; // only the root's send buffer is read
    }
    let bytes = |elems: usize, what: &str| {
        elems
            .checked_mul(es)
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| arg(format!("{what} of {elems} elements of {} overflows the address space", d.dtype.name())))
    };
    let (ib, ob) = (bytes(ni, "send buffer")?, bytes(no, "receive buffer")?);
    let (s, rv) = (send as usize, recv as usize);
    if ib > 0 && s == 0 {
        return Err(arg(format!("sendbuff is NULL for {} of {} bytes", d.coll.name(), ib)));
    }
    if ob > 0 && rv == 0 {
        return Err(arg(format!("recvbuff is NULL for {} of {} bytes", d.coll.name(), ob)));
    }
    if s.checked_add(ib).is_none() || rv.checked_add(ob).is_none() {
        return Err(arg("buffer wraps around the address space"));
    }
    let overlap = ib > 0 && ob > 0 && s < rv + ob && rv < s + ib;
    if !overlap && !(s == rv && s != 0 && (ib == 0 || ob == 0) && d.coll != Coll::Broadcast) {
        return Ok(Layout::Split { send: s, send_len: ib, recv: rv, recv_len: ob });
    }
    // NCCL's in-place forms: both windows of one allocation at fixed offsets
    let Some((io, oo, len)) = inplace_layout(d.coll, n, r, d.count, d.root) else {
        return Err(arg(format!("send and receive buffers overlap, and {} has no in-place form", d.coll.name())));
    };
    let (io, oo, len) = (io * es, oo * es, bytes(len, "in-place buffer")?);
    match (s.checked_sub(io), rv.checked_sub(oo)) {
        (Some(a), Some(b)) if a == b => Ok(Layout::InPlace { base: a, len, in_off: io, out_off: oo }),
        _ => Err(arg(format!(
            "send and receive buffers overlap but are not {}'s in-place layout (sendbuff must be recvbuff + {io} bytes... see nccl.h)",
            d.coll.name()
        ))),
    }
}

/// Borrowed buffers for a blocking operation.
///
/// # Safety
/// The layout's addresses are the caller's buffers, valid for their lengths for the duration of
/// the call (NCCL's contract).
pub(crate) unsafe fn borrowed<'a>(l: &Layout) -> OpMem<'a> {
    // SAFETY (all three): the caller's buffers are valid for these lengths during the call;
    // empty windows use no pointer at all.
    unsafe fn sl<'b>(p: usize, n: usize) -> &'b [u8] {
        if n == 0 {
            &[]
        } else {
            // SAFETY: see `borrowed`.
            unsafe { std::slice::from_raw_parts(p as *const u8, n) }
        }
    }
    // SAFETY: as above, for writing; the operation is the only user of the window meanwhile.
    unsafe fn sl_mut<'b>(p: usize, n: usize) -> &'b mut [u8] {
        if n == 0 {
            &mut []
        } else {
            // SAFETY: see `borrowed`.
            unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
        }
    }
    match *l {
        // SAFETY: see the helpers.
        Layout::Split { send, send_len, recv, recv_len } => unsafe {
            OpMem::Split { input: sl(send, send_len), output: sl_mut(recv, recv_len) }
        },
        // SAFETY: see the helpers.
        Layout::InPlace { base, len, in_off, out_off } => unsafe {
            OpMem::InPlace { buf: sl_mut(base, len), in_off, out_off }
        },
    }
}

pub(crate) fn owned(l: &Layout) -> OpMem<'static> {
    match *l {
        Layout::Split { send, send_len, recv, recv_len } => OpMem::OwnedSplit {
            input: Box::new(RawBuf { ptr: send, len: send_len }),
            output: Box::new(RawBuf { ptr: recv, len: recv_len }),
        },
        Layout::InPlace { base, len, in_off, out_off } => {
            OpMem::OwnedInPlace { buf: Box::new(RawBuf { ptr: base, len }), in_off, out_off }
        }
    }
}

pub(crate) fn dtype(t: c_int) -> Result<DataType, Error> {
    DataType::from_raw(t).map_err(|_| arg(format!("datatype {t} is out of range (0..{ncclNumTypes})")))
}

/// The reduction op `op` of communicator `e` for elements of type `dt`.
pub(crate) fn redop(e: &Entry, op: c_int, dt: DataType) -> Result<ReduceOp, Error> {
    if (0..ncclNumOps).contains(&op) {
        return ReduceOp::from_raw(op);
    }
    let idx = usize::try_from(op - ncclNumOps).map_err(|_| arg(format!("reduction op {op} is out of range")))?;
    match e.ops.lock().unwrap().get(idx).copied().flatten() {
        Some((t, _)) if t != dt => Err(arg(format!(
            "reduction op {op} was created for {} and is used with {} (ops are per datatype)",
            t.name(),
            dt.name()
        ))),
        Some((_, Scalar::Value(b))) => Ok(ReduceOp::PreMulSum(b)),
        Some((_, Scalar::Pointer(p))) => {
            let mut b = [0u8; 8];
            // SAFETY: the caller created the op with this scalar pointer and keeps it valid while
            // the op exists (NCCL's contract for ncclScalarDevice).
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, b.as_mut_ptr(), dt.size()) };
            Ok(ReduceOp::PreMulSum(b))
        }
        None => Err(arg(format!("reduction op {op} is not a built-in op nor a live one of this communicator"))),
    }
}
