//! # oxccl-ffi: NCCL's C ABI over oxccl (`libnccl.so.2`)
//!
//! `cargo build --release` produces `target/release/libnccl.so` with SONAME `libnccl.so.2` (and a
//! `libnccl.so.2` link beside it). A program written against NCCL's `nccl.h` (or oxccl's copy in
//! `ffi/include/nccl.h`) links with it unchanged. The library exports every function of NCCL
//! 2.32.3's `libnccl.so.2` (`nccl.h` and the host side of `nccl_device.h`) as `ncclX` and
//! `pncclX`, and nothing else (`libnccl.map`).
//!
//! What works (host memory; see `docs/pytorch.md` and `docs/errors.md`):
//! - every collective, send/recv and groups (`ncclGroupStart`/`End` nest; one thread may drive
//!   many communicators in a group) on host buffers with a NULL stream: the call completes
//!   before it returns. A non-NULL stream is refused with `ncclInvalidUsage` until the CUDA path
//!   exists;
//! - `ncclCommInitRank`, `ncclCommInitRankConfig` (every historic `ncclConfig_t` layout, parsed
//!   from the caller's `size`/`version`; `blocking = 0` makes init and collectives asynchronous,
//!   polled with `ncclCommGetAsyncError`), `ncclCommInitRankScalable` with one id,
//!   `ncclCommInitAll`, `ncclCommSplit`, `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`
//!   (from any thread), the queries, `ncclRedOpCreatePreMulSum`/`Destroy`, `ncclMemAlloc`/`Free`
//!   (host memory) and `ncclCommRegister`/`Deregister` (host memory needs no registration);
//! - functions oxccl does not implement yet exist, return `ncclInvalidUsage` and say so by name
//!   in `ncclGetLastError`.
//!
//! Every entry point checks its arguments (null pointers, unknown or destroyed communicators,
//! types, ops, roots, peers, byte sizes that overflow) and runs behind a panic boundary: a bad
//! argument gets `ncclInvalidArgument` and a message, never a crash.
//!
//! All `unsafe` of this crate is the C boundary itself: reading and writing the caller's
//! pointers, each with a `// SAFETY:` comment stating NCCL's contract it relies on.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use libc::{c_char, c_int, c_void, size_t};
use oxccl::exec::{HostBuf, OpMem};
use oxccl::schedule::inplace_layout;
use oxccl::{CallOptions, Coll, Communicator, Config, DataType, Error, ErrorKind, OpDesc, ReduceOp, Request, UniqueId};
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

// ---- types and constants (nccl.h) ---------------------------------------------------------

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// `ncclSuccess`
pub const ncclSuccess: ncclResult_t = 0;
/// `ncclUnhandledCudaError`
pub const ncclUnhandledCudaError: ncclResult_t = 1;
/// `ncclSystemError`
pub const ncclSystemError: ncclResult_t = 2;
/// `ncclInternalError`
pub const ncclInternalError: ncclResult_t = 3;
/// `ncclInvalidArgument`
pub const ncclInvalidArgument: ncclResult_t = 4;
/// `ncclInvalidUsage`
pub const ncclInvalidUsage: ncclResult_t = 5;
/// `ncclRemoteError`
pub const ncclRemoteError: ncclResult_t = 6;
/// `ncclInProgress`
pub const ncclInProgress: ncclResult_t = 7;
/// `ncclTimeout`
pub const ncclTimeout: ncclResult_t = 8;
/// `ncclNumResults`
pub const ncclNumResults: ncclResult_t = 9;

/// The NCCL version this library reports (`NCCL_VERSION_CODE` of the header it implements).
pub const NCCL_VERSION_CODE: c_int = 23203;
/// `NCCL_API_MAGIC`: the magic of versioned structs (`ncclConfig_t`).
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_SPLIT_NOCOLOR`
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_CONFIG_UNDEF_INT`
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `ncclNumOps`: user-created reduction ops are numbered from here.
pub const ncclNumOps: c_int = 5;
/// `ncclNumTypes`
pub const ncclNumTypes: c_int = 12;

/// The opaque communicator (`struct ncclComm`); handles are never dereferenced.
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
/// `ncclComm_t`
pub type ncclComm_t = *mut ncclComm;
/// The opaque window (`struct ncclWindow_vidmem`).
#[repr(C)]
pub struct ncclWindow_vidmem {
    _opaque: [u8; 0],
}
/// `ncclWindow_t`
pub type ncclWindow_t = *mut ncclWindow_vidmem;
/// The opaque CUDA stream (`struct CUstream_st`).
#[repr(C)]
pub struct CUstream_st {
    _opaque: [u8; 0],
}
/// `cudaStream_t`
pub type cudaStream_t = *mut CUstream_st;
/// `ncclParamHandle_t` (opaque).
pub type ncclParamHandle_t = *mut c_void;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The bytes (oxccl's own layout: address and secret of the rendezvous).
    pub internal: [c_char; 128],
}

/// `ncclSimInfo_t`
#[repr(C)]
pub struct ncclSimInfo_t {
    /// Caller's struct size.
    pub size: size_t,
    /// Magic.
    pub magic: u32,
    /// Caller's version.
    pub version: u32,
    /// Estimated time (µs).
    pub estimatedTime: f32,
}

/// `ncclWaitSignalDesc_t`
#[repr(C)]
pub struct ncclWaitSignalDesc_t {
    /// Operation count.
    pub opCnt: c_int,
    /// Peer.
    pub peer: c_int,
    /// Signal index.
    pub sigIdx: c_int,
    /// Context.
    pub ctx: c_int,
}

/// `ncclConfig_t` as NCCL 2.32.3 lays it out (120 bytes); callers may pass any historic prefix.
#[repr(C)]
pub struct ncclConfig_t {
    /// Caller's `sizeof(ncclConfig_t)`.
    pub size: size_t,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// Caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// 1 blocking (default), 0 non-blocking.
    pub blocking: c_int,
    /// CGA cluster size (GPU only; ignored).
    pub cgaClusterSize: c_int,
    /// Minimum CTAs (GPU only; ignored).
    pub minCTAs: c_int,
    /// Maximum CTAs (GPU only; ignored).
    pub maxCTAs: c_int,
    /// Network plugin name (ignored).
    pub netName: *const c_char,
    /// Share the parent's resources on split (ignored).
    pub splitShare: c_int,
    /// Traffic class (ignored).
    pub trafficClass: c_int,
    /// Name for logs.
    pub commName: *const c_char,
    /// CollNet (ignored).
    pub collnetEnable: c_int,
    /// CTA policy (ignored).
    pub CTAPolicy: c_int,
    /// Shrink share (ignored).
    pub shrinkShare: c_int,
    /// NVLS CTAs (ignored).
    pub nvlsCTAs: c_int,
    /// Channels per net peer (ignored).
    pub nChannelsPerNetPeer: c_int,
    /// NVLink-centric scheduling (ignored).
    pub nvlinkCentricSched: c_int,
    /// Graph usage mode (ignored).
    pub graphUsageMode: c_int,
    /// RMA contexts (ignored).
    pub numRmaCtx: c_int,
    /// Max P2P peers (ignored).
    pub maxP2pPeers: c_int,
    /// Graph stream ordering (ignored).
    pub graphStreamOrdering: c_int,
    /// Implicit launch order (2.31; ignored: host operations complete in call order).
    pub launchOrderImplicit: c_int,
    /// RMA signals (2.31; ignored).
    pub numRmaSig: c_int,
    /// Eager RMA initialisation (2.31; ignored).
    pub rmaEagerInit: c_int,
    /// Host CFT mode (2.32; ignored).
    pub hostCftMode: c_int,
    /// Host NVLS components (2.32; ignored: no NVLS).
    pub nvlsHostMode: c_int,
}

// ---- errors and the panic boundary ----------------------------------------------------------

mod last_error;
use last_error::set_last_error;

/// The `ncclResult_t` of an oxccl error.
pub fn result_of(e: &Error) -> ncclResult_t {
    match e.kind {
        ErrorKind::UnhandledCuda => ncclUnhandledCudaError,
        ErrorKind::System => ncclSystemError,
        ErrorKind::Internal => ncclInternalError,
        ErrorKind::InvalidArgument => ncclInvalidArgument,
        ErrorKind::InvalidUsage => ncclInvalidUsage,
        // a library, device or kernel feature this system lacks (what oxccl does not implement
        // is InvalidUsage, named as such)
        ErrorKind::Unavailable => ncclSystemError,
        ErrorKind::Remote => ncclRemoteError,
        ErrorKind::InProgress => ncclInProgress,
        ErrorKind::Timeout => ncclTimeout,
        _ => ncclInternalError,
    }
}

type R = Result<ncclResult_t, Error>;

/// Run an entry point: errors become their code plus `ncclGetLastError`'s text; a panic never
/// crosses into C.
fn boundary(name: &str, f: impl FnOnce() -> R) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let code = result_of(&e);
            if e.kind != ErrorKind::InProgress {
                // ncclGetErrorString keeps NCCL's text for the code; the detail says whose bug it is
                let whose = if code == ncclInternalError { REPORT } else { "" };
                set_last_error(&format!("{name}: {e}{whose}"));
                oxccl_log(&format!("{name}: {e}{whose}"), e.rank);
            }
            code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error (panic caught at the C boundary): {what}{REPORT}"));
            ncclInternalError
        }
    }
}

/// Appended to the detail of internal errors: they are oxccl's bugs, not NCCL's.
const REPORT: &str = " (a bug in oxccl, not NCCL: please report it to the oxccl project with this message and the \
                      NCCL_DEBUG=INFO output)";

/// A refused call, as a `NCCL WARN` line of oxccl's logger (`NCCL_DEBUG=WARN` or more).
fn oxccl_log(msg: &str, rank: Option<usize>) {
    oxccl::config::init_logging();
    match rank {
        Some(r) => tracing::warn!(target: "CALL", rank = r, "{msg}"),
        None => tracing::warn!(target: "CALL", "{msg}"),
    }
}

fn arg(msg: impl Into<String>) -> Error {
    Error::invalid_argument(msg)
}

fn not_implemented(name: &str) -> R {
    Err(Error::invalid_usage(format!(
        "{name} is not implemented by oxccl yet (host-memory collectives, groups, split and the queries are; see docs/pytorch.md)"
    )))
}

/// Write `v` through the caller's out-pointer `p`.
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (NCCL's contract for out-parameters).
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(arg(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and valid for writes per the function's contract.
    unsafe { p.write(v) };
    Ok(())
}

// ---- communicators ----------------------------------------------------------------------------

/// A user-created reduction op (`ncclRedOpCreatePreMulSum`).
#[derive(Clone, Copy)]
enum Scalar {
    /// Read when the op was created (`ncclScalarHostImmediate`).
    Value([u8; 8]),
    /// Read at each use (`ncclScalarDevice`, here a host pointer the caller keeps alive).
    Pointer(usize),
}

struct Entry {
    comm: OnceLock<Arc<Communicator>>,
    /// The device executor, created by the first call with device buffers.
    dev: Mutex<Option<Arc<oxccl_cuda::DeviceComm>>>,
    init_error: Mutex<Option<Error>>,
    blocking: bool,
    device: c_int,
    ops: Mutex<Vec<Option<(DataType, Scalar)>>>,
    requests: Mutex<Vec<Request<OpMem<'static>>>>,
    async_error: Mutex<Option<Error>>,
    /// The fork generation that made it: a `fork` child cannot use its parent's communicators.
    generation: u64,
}

impl Entry {
    fn new(blocking: bool, device: c_int) -> Arc<Entry> {
        Arc::new(Entry {
            comm: OnceLock::new(),
            dev: Mutex::new(None),
            init_error: Mutex::new(None),
            blocking,
            device,
            ops: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            async_error: Mutex::new(None),
            generation: oxccl::fork_generation(),
        })
    }

    fn ready(&self) -> Result<&Communicator, Error> {
        match self.comm.get() {
            Some(c) => Ok(c.as_ref()),
            None => match &*self.init_error.lock().unwrap() {
                Some(e) => Err(e.clone()),
                None => Err(Error::new(ErrorKind::InProgress, "the communicator is still initializing")),
            },
        }
    }

    /// Finish what completed among the non-blocking operations; `true` while some still run.
    fn poll_requests(&self) -> bool {
        let mut reqs = self.requests.lock().unwrap();
        let mut still = Vec::new();
        for mut r in reqs.drain(..) {
            if r.test() {
                if let Err(e) = r.wait() {
                    self.async_error.lock().unwrap().get_or_insert(e);
                }
            } else {
                still.push(r);
            }
        }
        *reqs = still;
        !reqs.is_empty()
    }

    fn wait_requests(&self) {
        let reqs: Vec<_> = self.requests.lock().unwrap().drain(..).collect();
        for r in reqs {
            if let Err(e) = r.wait() {
                self.async_error.lock().unwrap().get_or_insert(e);
            }
        }
        self.drain_device();
    }

    /// Wait for the device operations enqueued earlier (host calls are ordered after them).
    fn drain_device(&self) {
        let dev = self.dev.lock().unwrap().clone();
        if let Some(d) = dev {
            d.drain();
        }
    }

    /// The device executor for buffers on GPU `ordinal` (created on first use).
    fn device_comm(&self, ordinal: i32) -> Result<Arc<oxccl_cuda::DeviceComm>, Error> {
        let mut dev = self.dev.lock().unwrap();
        if let Some(d) = &*dev {
            return Ok(d.clone());
        }
        let comm = self
            .comm
            .get()
            .ok_or_else(|| Error::new(ErrorKind::InProgress, "the communicator is still initializing"))?;
        let d = Arc::new(oxccl_cuda::DeviceComm::new(Arc::new(comm.clone()), ordinal)?);
        *dev = Some(d.clone());
        Ok(d)
    }

    /// The first asynchronous error of the device executor, if any.
    fn device_error(&self) -> Option<Error> {
        self.dev.lock().unwrap().as_ref().and_then(|d| d.error())
    }
}

static COMMS: Mutex<BTreeMap<usize, Arc<Entry>>> = Mutex::new(BTreeMap::new());
static NEXT_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// A fresh handle: never dereferenced, never reused, so a destroyed one is always recognised.
fn register(e: Arc<Entry>) -> ncclComm_t {
    let id = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let h = 0x0CC1_0000_0000usize + id * 16;
    COMMS.lock().unwrap().insert(h, e);
    h as ncclComm_t
}

fn entry(h: ncclComm_t) -> Result<Arc<Entry>, Error> {
    if h.is_null() {
        return Err(arg("comm is NULL"));
    }
    let e =
        COMMS.lock().unwrap().get(&(h as usize)).cloned().ok_or_else(|| {
            arg(format!("{h:p} is not a communicator (never created, or already destroyed or aborted)"))
        })?;
    if e.generation != oxccl::fork_generation() {
        return Err(Error::invalid_usage(format!(
            "communicator {h:p} was created in the parent process before fork(): a child cannot use it \
             (create communicators after fork; destroying it here only releases the child's copy)"
        )));
    }
    Ok(e)
}

/// Release a communicator this process inherited through `fork` without touching it (its
/// connections are the parent's too); `true` if `h` was one.
fn release_inherited(h: ncclComm_t) -> bool {
    let mut comms = COMMS.lock().unwrap();
    match comms.get(&(h as usize)) {
        Some(e) if e.generation != oxccl::fork_generation() => {
            std::mem::forget(comms.remove(&(h as usize)));
            true
        }
        _ => false,
    }
}

fn unregister(h: ncclComm_t) -> Option<Arc<Entry>> {
    COMMS.lock().unwrap().remove(&(h as usize))
}

// ---- config ---------------------------------------------------------------------------------

/// The settings a caller's `ncclConfig_t` asks for.
struct Parsed {
    blocking: Option<bool>,
}

/// Parse a caller's `ncclConfig_t` of any historic layout (24..=120 bytes): only the fields its
/// `size` and `version` cover are read.
///
/// # Safety
/// `cfg` is NULL or points to at least `cfg->size` readable bytes (NCCL's contract).
unsafe fn parse_config(cfg: *const ncclConfig_t) -> Result<Parsed, Error> {
    let env_blocking = std::env::var("NCCL_COMM_BLOCKING").ok().and_then(|v| v.trim().parse::<i32>().ok());
    if cfg.is_null() {
        return Ok(Parsed { blocking: env_blocking.map(|b| b != 0) });
    }
    // SAFETY: non-null; the first field is the caller's size_t `size`.
    let size = unsafe { std::ptr::read_unaligned(cfg as *const size_t) };
    if size < 16 {
        return Err(arg(format!(
            "ncclConfig_t of {size} bytes is too small (not initialized with NCCL_CONFIG_INITIALIZER?)"
        )));
    }
    let mut raw = [0u8; std::mem::size_of::<ncclConfig_t>()];
    let n = size.min(raw.len());
    // SAFETY: the caller's struct has `size` readable bytes; we copy at most that many.
    unsafe { std::ptr::copy_nonoverlapping(cfg as *const u8, raw.as_mut_ptr(), n) };
    let u32_at = |o: usize| u32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
    let i32_at = |o: usize| i32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
    if u32_at(8) != NCCL_API_MAGIC {
        return Err(arg(format!(
            "ncclConfig_t has magic {:#x}, expected {NCCL_API_MAGIC:#x} (initialize it with NCCL_CONFIG_INITIALIZER)",
            u32_at(8)
        )));
    }
    let version = u32_at(12);
    let blocking = if n >= 20 && version >= 21400 { i32_at(16) } else { NCCL_CONFIG_UNDEF_INT };
    let blocking = match blocking {
        NCCL_CONFIG_UNDEF_INT => None,
        0 => Some(false),
        1 => Some(true),
        b => return Err(arg(format!("ncclConfig_t.blocking is {b}; it must be 0 or 1"))),
    };
    Ok(Parsed { blocking: env_blocking.map(|b| b != 0).or(blocking) })
}

// ---- buffers -----------------------------------------------------------------------------------

/// A caller's buffer, for non-blocking operations (the caller keeps it alive until completion,
/// NCCL's contract for enqueued operations).
struct RawBuf {
    ptr: usize,
    len: usize,
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
enum Layout {
    Split { send: usize, send_len: usize, recv: usize, recv_len: usize },
    InPlace { base: usize, len: usize, in_off: usize, out_off: usize },
}

// ---- device pointers ----------------------------------------------------------------------

/// `cuPointerGetAttribute` from the CUDA driver, if this process can load it.
type CuPointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

fn cu_pointer_get_attribute() -> Option<CuPointerGetAttribute> {
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
fn layout(comm: &Communicator, d: &OpDesc, send: *const c_void, recv: *mut c_void) -> Result<Layout, Error> {
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
unsafe fn borrowed<'a>(l: &Layout) -> OpMem<'a> {
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

fn owned(l: &Layout) -> OpMem<'static> {
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

fn dtype(t: c_int) -> Result<DataType, Error> {
    DataType::from_raw(t).map_err(|_| arg(format!("datatype {t} is out of range (0..{ncclNumTypes})")))
}

/// The reduction op `op` of communicator `e` for elements of type `dt`.
fn redop(e: &Entry, op: c_int, dt: DataType) -> Result<ReduceOp, Error> {
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

// ---- groups ---------------------------------------------------------------------------------------

struct Pending {
    entry: Arc<Entry>,
    desc: OpDesc,
    opts: CallOptions,
    layout: Layout,
    /// Device buffers: the device, and the stream the operation is enqueued on.
    device: Option<(i32, usize)>,
}

fn dev_mem(l: &Layout) -> oxccl_cuda::DevMem {
    match *l {
        Layout::Split { send, send_len, recv, recv_len } => {
            oxccl_cuda::DevMem::Split { send: send as u64, send_len, recv: recv as u64, recv_len }
        }
        Layout::InPlace { base, len, in_off, out_off } => {
            oxccl_cuda::DevMem::InPlace { base: base as u64, len, in_off, out_off }
        }
    }
}

/// Where an operation's buffers live: `Some(device)` for device memory (both windows on one GPU),
/// `None` for host memory; buffers of both kinds in one operation are refused.
fn placement(l: &Layout, name: &str) -> Result<Option<i32>, Error> {
    use oxccl_cuda::Memory;
    let (a, alen, b, blen) = match *l {
        Layout::Split { send, send_len, recv, recv_len } => (send, send_len, recv, recv_len),
        Layout::InPlace { base, len, .. } => (base, len, base, len),
    };
    // device memory only exists in a process that loaded the CUDA driver
    let cuda = cu_pointer_get_attribute().is_some();
    let memory_of = |p: usize, len: usize| {
        if cuda && p != 0 && len > 0 {
            oxccl_cuda::classify(p as u64)
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
    static GROUP: std::cell::RefCell<(usize, Vec<Pending>)> = const { std::cell::RefCell::new((0, Vec::new())) };
}

/// Run, record (inside a group) or submit (non-blocking communicator) one operation.
#[allow(clippy::too_many_arguments)] // NCCL's own argument list
fn enqueue(
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
fn enqueue_with(
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
        unsafe { dc.enqueue_with(vec![(desc, opts, dev_mem(&layout))], oxccl_cuda::UserStream(stream))? };
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
fn host_after_stream(stream: cudaStream_t, name: &str) -> Result<(), Error> {
    if stream.is_null() {
        return Ok(());
    }
    if cu_pointer_get_attribute().is_none() {
        return Err(Error::invalid_usage(format!(
            "{name}: a CUDA stream was given, but CUDA is not loaded in this process (host buffers take a NULL stream)"
        )));
    }
    // SAFETY: NCCL's contract: a live stream of the caller's.
    unsafe { oxccl_cuda::driver::sync_user_stream(stream.cast()) }
}

fn group_end() -> R {
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
    type DeviceJob = (Arc<Entry>, i32, usize, Vec<(OpDesc, CallOptions, oxccl_cuda::DevMem)>);
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
        unsafe { dc.enqueue_with(list, oxccl_cuda::UserStream(stream))? };
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

// ---- the exported functions --------------------------------------------------------------------

macro_rules! export {
    ($list:ident; $( $(#[$m:meta])* fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) -> $ret:ty $body:block )*) => {
        $(
            $(#[$m])*
            ///
            /// # Safety
            /// NCCL's contract: pointers are NULL or valid for what `nccl.h` says they point to.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> $ret $body

            #[doc = concat!("`p", stringify!($name), "`: NCCL's profiling twin of [`", stringify!($name), "`].")]
            ///
            /// # Safety
            /// As for the function it forwards to.
            #[no_mangle]
            pub unsafe extern "C" fn $pname($($a: $t),*) -> $ret {
                // SAFETY: same contract as the function it forwards to.
                unsafe { $name($($a),*) }
            }
        )*
        /// The functions this invocation exports (each also with a `p` prefix), for the header test.
        pub const $list: &[&str] = &[$(stringify!($name)),*];
    };
}

mod access;
mod collconfig;
mod devapi;
mod encryption;
mod probe;

/// Every exported function name (each also exported with a `p` prefix), for the header tests.
pub fn exported() -> Vec<&'static str> {
    [EXPORTED_CORE, collconfig::EXPORTED, devapi::EXPORTED, encryption::EXPORTED].concat()
}

static ERROR_STRINGS: [&CStr; 10] = [
    c"no error",
    c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
    c"internal error - please report this issue to the NCCL developers",
    c"invalid argument (run with NCCL_DEBUG=WARN for details)",
    c"invalid usage (run with NCCL_DEBUG=WARN for details)",
    c"remote process exited or there was a network error",
    c"NCCL operation in progress",
    c"timeout",
    c"unknown result code",
];

fn init_rank(comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int, cfg: Parsed) -> R {
    if comm.is_null() {
        return Err(arg("comm (the out-pointer) is NULL"));
    }
    let n =
        usize::try_from(nranks).ok().filter(|&n| n >= 1).ok_or_else(|| arg(format!("nranks {nranks} must be >= 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| arg(format!("rank {rank} is out of range for {nranks} ranks")))?;
    let bytes: [u8; 128] = id.internal.map(|c| c as u8);
    let uid = UniqueId(bytes);
    uid.validate().map_err(|e| arg(format!("the unique id is not one from ncclGetUniqueId: {e}")))?;
    let blocking = cfg.blocking.unwrap_or(true);
    let e = Entry::new(blocking, 0);
    if blocking {
        let c = Communicator::init_with_config(&uid, n, r, Config::from_env())?;
        let _ = e.comm.set(Arc::new(c));
        // SAFETY: checked non-null above; the caller's out-pointer.
        unsafe { put(comm, register(e), "comm")? };
        return Ok(ncclSuccess);
    }
    let h = register(e.clone());
    // SAFETY: checked non-null above.
    unsafe { put(comm, h, "comm")? };
    std::thread::Builder::new()
        .name("oxccl-init".into())
        .spawn(move || match Communicator::init_with_config(&uid, n, r, Config::from_env()) {
            Ok(c) => {
                let _ = e.comm.set(Arc::new(c));
            }
            Err(err) => *e.init_error.lock().unwrap() = Some(err),
        })
        .map_err(|err| Error::system("spawning the init thread", &err))?;
    Ok(ncclInProgress)
}

export! {
    EXPORTED_CORE;

    /// `ncclGetVersion`: NCCL_VERSION_CODE of the ABI implemented (2.32.3).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        // SAFETY: NCCL's contract for the out-pointer.
        boundary("ncclGetVersion", || unsafe { put(version, NCCL_VERSION_CODE, "version").map(|_| ncclSuccess) })
    }

    /// `ncclGetUniqueId`: a new id; its rendezvous is served by this process.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        boundary("ncclGetUniqueId", || {
            if uniqueId.is_null() {
                return Err(arg("uniqueId is NULL"));
            }
            let id = UniqueId::new()?;
            let out = ncclUniqueId { internal: id.0.map(|b| b as c_char) };
            // SAFETY: non-null, NCCL's contract.
            unsafe { put(uniqueId, out, "uniqueId")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommInitRank`
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t {
        boundary("ncclCommInitRank", || init_rank(comm, nranks, commId, rank, Parsed { blocking: Some(true) }))
    }

    /// `ncclCommInitRankConfig`: `config` may be NULL or any historic `ncclConfig_t` layout.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommInitRankConfig", || {
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            init_rank(comm, nranks, commId, rank, cfg)
        })
    }

    /// `ncclCommInitRankScalable`: with one id, the same as `ncclCommInitRankConfig`.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommInitRankScalable", || {
            if commIds.is_null() {
                return Err(arg("commIds is NULL"));
            }
            if nId != 1 {
                return Err(Error::invalid_usage(format!("ncclCommInitRankScalable with {nId} ids: oxccl implements one id only (its rendezvous already scales)")));
            }
            // SAFETY: non-null, at least nId = 1 ids (NCCL's contract).
            let id = unsafe { *commIds };
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            init_rank(newcomm, nranks, id, myrank, cfg)
        })
    }

    /// `ncclCommInitAll`: `ndev` communicators of one process (threads as ranks).
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        boundary("ncclCommInitAll", || {
            if comm.is_null() {
                return Err(arg("comm (the out-array) is NULL"));
            }
            let n = usize::try_from(ndev).ok().filter(|&n| n >= 1).ok_or_else(|| arg(format!("ndev {ndev} must be >= 1")))?;
            let comms = Communicator::init_all(n)?;
            for (i, c) in comms.into_iter().enumerate() {
                let dev = if devlist.is_null() {
                    i as c_int
                } else {
                    // SAFETY: devlist has ndev entries (NCCL's contract).
                    unsafe { *devlist.add(i) }
                };
                let e = Entry::new(true, dev);
                let _ = e.comm.set(Arc::new(c));
                // SAFETY: comm has room for ndev handles (NCCL's contract).
                unsafe { comm.add(i).write(register(e)) };
            }
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommSplit`: `NCCL_SPLIT_NOCOLOR` gives `*newcomm = NULL`.
    fn ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        boundary("ncclCommSplit", || {
            let e = entry(comm)?;
            if newcomm.is_null() {
                return Err(arg("newcomm is NULL"));
            }
            if color < 0 && color != NCCL_SPLIT_NOCOLOR {
                return Err(arg(format!("color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR")));
            }
            // SAFETY: NCCL's contract for `config`.
            let cfg = unsafe { parse_config(config)? };
            e.wait_requests();
            let parent = e.ready()?;
            let child = parent.split(color, key)?;
            let h = match child {
                Some(c) => {
                    let ne = Entry::new(cfg.blocking.unwrap_or(e.blocking), e.device);
                    let _ = ne.comm.set(Arc::new(c));
                    register(ne)
                }
                None => std::ptr::null_mut(),
            };
            // SAFETY: checked non-null.
            unsafe { put(newcomm, h, "newcomm")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommShrink` (not implemented yet; `ncclCommSplit` excluding ranks does the same on a healthy communicator).
    fn ncclCommShrink / pncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) -> ncclResult_t {
        let _ = (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
        boundary("ncclCommShrink", || not_implemented("ncclCommShrink"))
    }

    /// `ncclCommGetUniqueId` (not implemented yet).
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        let _ = (comm, uniqueId);
        boundary("ncclCommGetUniqueId", || not_implemented("ncclCommGetUniqueId"))
    }

    /// `ncclCommGrow` (not implemented yet).
    fn ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        let _ = (comm, nRanks, uniqueId, rank, newcomm, config);
        boundary("ncclCommGrow", || not_implemented("ncclCommGrow"))
    }

    /// `ncclCommFinalize`: completes every operation of the communicator.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommFinalize", || {
            let e = entry(comm)?;
            e.ready()?;
            e.wait_requests();
            let err = e.async_error.lock().unwrap().clone();
            match err {
                Some(err) => Err(err),
                None => Ok(ncclSuccess),
            }
        })
    }

    /// `ncclCommDestroy`: releases everything; the handle is invalid afterwards.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommDestroy", || {
            if release_inherited(comm) {
                return Ok(ncclSuccess);
            }
            entry(comm)?;
            if let Some(e) = unregister(comm) {
                e.wait_requests();
            }
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommAbort`: from any thread; operations in flight fail at once, then everything is released.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclCommAbort", || {
            if release_inherited(comm) {
                return Ok(ncclSuccess);
            }
            let e = entry(comm)?;
            if let Some(c) = e.comm.get() {
                c.abort();
            }
            unregister(comm);
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommRevoke` (not implemented yet).
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        let _ = (comm, revokeFlags);
        boundary("ncclCommRevoke", || not_implemented("ncclCommRevoke"))
    }

    /// `ncclCommSuspend` (not implemented yet).
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        let _ = (comm, flags);
        boundary("ncclCommSuspend", || not_implemented("ncclCommSuspend"))
    }

    /// `ncclCommResume` (not implemented yet).
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        let _ = comm;
        boundary("ncclCommResume", || not_implemented("ncclCommResume"))
    }

    /// `ncclCommMemStats` (not implemented yet).
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t {
        let _ = (comm, stat, value);
        boundary("ncclCommMemStats", || not_implemented("ncclCommMemStats"))
    }

    /// `ncclGetErrorString`: NCCL's exact texts.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        let i = usize::try_from(result).ok().filter(|&i| i < 9).unwrap_or(9);
        ERROR_STRINGS[i].as_ptr()
    }

    /// `ncclGetLastError`: the last error's detailed text (process-wide, as in NCCL): rank, peer, operation.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        last_error::current()
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while initialization or non-blocking operations run.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        boundary("ncclCommGetAsyncError", || {
            let e = entry(comm)?;
            if asyncError.is_null() {
                return Err(arg("asyncError is NULL"));
            }
            let state = match e.ready() {
                Err(err) => result_of(&err),
                Ok(c) => {
                    if e.poll_requests() {
                        ncclInProgress
                    } else if let Some(err) =
                        e.async_error.lock().unwrap().clone().or_else(|| e.device_error()).or_else(|| c.error())
                    {
                        set_last_error(&err.to_string());
                        result_of(&err)
                    } else {
                        ncclSuccess
                    }
                }
            };
            // SAFETY: checked non-null.
            unsafe { put(asyncError, state, "asyncError")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommCount`
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        boundary("ncclCommCount", || {
            let n = entry(comm)?.ready()?.size() as c_int;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(count, n, "count")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommCuDevice`: the device given to `ncclCommInitAll` (its index without a devlist), 0 otherwise.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        boundary("ncclCommCuDevice", || {
            let e = entry(comm)?;
            e.ready()?;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(device, e.device, "device")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommUserRank`
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        boundary("ncclCommUserRank", || {
            let r = entry(comm)?.ready()?.rank() as c_int;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(rank, r, "rank")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclMemAlloc`: page-aligned host memory (the host path needs nothing else).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: size_t) -> ncclResult_t {
        boundary("ncclMemAlloc", || {
            if ptr.is_null() {
                return Err(arg("ptr is NULL"));
            }
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: posix_memalign writes the allocation into `p`.
            let rc = unsafe { libc::posix_memalign(&mut p, 4096, size.max(1)) };
            if rc != 0 {
                return Err(Error::system(format!("allocating {size} bytes"), &std::io::Error::from_raw_os_error(rc)));
            }
            // SAFETY: checked non-null.
            unsafe { put(ptr, p, "ptr")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclMemFree`: frees what `ncclMemAlloc` returned.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        boundary("ncclMemFree", || {
            // SAFETY: `ptr` came from ncclMemAlloc (posix_memalign) or is NULL (NCCL's contract).
            unsafe { libc::free(ptr) };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommRegister`: host memory needs no registration; the handle records the range.
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: size_t, handle: *mut *mut c_void) -> ncclResult_t {
        boundary("ncclCommRegister", || {
            entry(comm)?;
            if buff.is_null() && size > 0 {
                return Err(arg("buff is NULL"));
            }
            let h = Box::into_raw(Box::new((buff as usize, size))) as *mut c_void;
            // SAFETY: NCCL's contract for the out-pointer.
            unsafe { put(handle, h, "handle")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommDeregister`
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        boundary("ncclCommDeregister", || {
            entry(comm)?;
            if handle.is_null() {
                return Err(arg("handle is NULL"));
            }
            // SAFETY: a handle from ncclCommRegister (NCCL's contract), freed once.
            drop(unsafe { Box::from_raw(handle as *mut (usize, usize)) });
            Ok(ncclSuccess)
        })
    }

    /// `ncclCommWindowRegister` (not implemented yet).
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: size_t, win: *mut ncclWindow_t, winFlags: c_int) -> ncclResult_t {
        let _ = (comm, buff, size, win, winFlags);
        boundary("ncclCommWindowRegister", || not_implemented("ncclCommWindowRegister"))
    }

    /// `ncclCommWindowDeregister` (not implemented yet).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        let _ = (comm, win);
        boundary("ncclCommWindowDeregister", || not_implemented("ncclCommWindowDeregister"))
    }

    /// `ncclWinGetUserPtr` (not implemented yet).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (comm, win, outUserPtr);
        boundary("ncclWinGetUserPtr", || not_implemented("ncclWinGetUserPtr"))
    }

    /// `ncclRedOpCreatePreMulSum`: `scalar` is read now (`ncclScalarHostImmediate`) or at each use (`ncclScalarDevice`, a host pointer here).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclRedOpCreatePreMulSum", || {
            let e = entry(comm)?;
            let dt = dtype(datatype)?;
            if op.is_null() || scalar.is_null() {
                return Err(arg("op or scalar is NULL"));
            }
            let s = match residence {
                0 => Scalar::Pointer(scalar as usize),
                1 => {
                    let mut b = [0u8; 8];
                    // SAFETY: scalar points to one value of `datatype` (NCCL's contract).
                    unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), dt.size()) };
                    Scalar::Value(b)
                }
                r => return Err(arg(format!("scalar residence {r} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)"))),
            };
            let mut ops = e.ops.lock().unwrap();
            let idx = match ops.iter().position(|o| o.is_none()) {
                Some(i) => {
                    ops[i] = Some((dt, s));
                    i
                }
                None => {
                    ops.push(Some((dt, s)));
                    ops.len() - 1
                }
            };
            // SAFETY: checked non-null.
            unsafe { put(op, ncclNumOps + idx as c_int, "op")? };
            Ok(ncclSuccess)
        })
    }

    /// `ncclRedOpDestroy`: built-in ops cannot be destroyed.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        boundary("ncclRedOpDestroy", || {
            let e = entry(comm)?;
            if op < ncclNumOps {
                return Err(arg(format!("reduction op {op} is built in and cannot be destroyed")));
            }
            let mut ops = e.ops.lock().unwrap();
            match ops.get_mut((op - ncclNumOps) as usize) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    Ok(ncclSuccess)
                }
                _ => Err(arg(format!("reduction op {op} is not a live op of this communicator"))),
            }
        })
    }

    /// `ncclReduce`: `recvbuff` may be NULL on ranks other than the root.
    fn ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclReduce", || enqueue(comm, Coll::Reduce, sendbuff, recvbuff, count, datatype, op, root, stream))
    }

    /// `ncclBcast`: in-place broadcast.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclBcast", || enqueue(comm, Coll::Broadcast, buff, buff, count, datatype, 0, root, stream))
    }

    /// `ncclBroadcast`
    fn ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclBroadcast", || enqueue(comm, Coll::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclAllReduce`
    fn ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAllReduce", || enqueue(comm, Coll::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, stream))
    }

    /// `ncclReduceScatter`: `recvcount` elements per rank.
    fn ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: size_t, datatype: c_int, op: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclReduceScatter", || enqueue(comm, Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream))
    }

    /// `ncclAllGather`: `sendcount` elements per rank.
    fn ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAllGather", || enqueue(comm, Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, stream))
    }

    /// `ncclAlltoAll`: `count` elements to and from each rank.
    fn ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclAlltoAll", || enqueue(comm, Coll::AllToAll, sendbuff, recvbuff, count, datatype, 0, 0, stream))
    }

    /// `ncclGather`
    fn ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclGather", || enqueue(comm, Coll::Gather, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclScatter`
    fn ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: size_t, datatype: c_int, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclScatter", || enqueue(comm, Coll::Scatter, sendbuff, recvbuff, count, datatype, 0, root, stream))
    }

    /// `ncclSend`: pair it with the peer's `ncclRecv` (in a group when both directions are used).
    fn ncclSend / pncclSend(sendbuff: *const c_void, count: size_t, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclSend", || enqueue(comm, Coll::Send, sendbuff, std::ptr::null_mut(), count, datatype, 0, peer, stream))
    }

    /// `ncclRecv`
    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: size_t, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        boundary("ncclRecv", || enqueue(comm, Coll::Recv, std::ptr::null(), recvbuff, count, datatype, 0, peer, stream))
    }

    /// `ncclPutSignal` (not implemented yet).
    fn ncclPutSignal / pncclPutSignal(localbuff: *const c_void, count: size_t, datatype: c_int, peer: c_int, peerWin: ncclWindow_t, peerWinOffset: size_t, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream);
        boundary("ncclPutSignal", || not_implemented("ncclPutSignal"))
    }

    /// `ncclSignal` (not implemented yet).
    fn ncclSignal / pncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: u32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (peer, sigIdx, ctx, flags, comm, stream);
        boundary("ncclSignal", || not_implemented("ncclSignal"))
    }

    /// `ncclWaitSignal` (not implemented yet).
    fn ncclWaitSignal / pncclWaitSignal(nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let _ = (nDesc, signalDescs, comm, stream);
        boundary("ncclWaitSignal", || not_implemented("ncclWaitSignal"))
    }

    /// `ncclGroupStart`: groups nest; operations are recorded until the outermost `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        boundary("ncclGroupStart", || {
            GROUP.with(|g| g.borrow_mut().0 += 1);
            Ok(ncclSuccess)
        })
    }

    /// `ncclGroupEnd`: the outermost one runs every recorded operation, on every communicator, together.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        boundary("ncclGroupEnd", group_end)
    }

    /// `ncclGroupSimulateEnd` (not implemented yet).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        let _ = simInfo;
        boundary("ncclGroupSimulateEnd", || not_implemented("ncclGroupSimulateEnd"))
    }

    /// `ncclParamBind` (not implemented yet).
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
        let _ = (out, key);
        boundary("ncclParamBind", || not_implemented("ncclParamBind"))
    }

    /// `ncclParamGetI8` (not implemented yet).
    fn ncclParamGetI8 / pncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI8", || not_implemented("ncclParamGetI8"))
    }

    /// `ncclParamGetU8` (not implemented yet).
    fn ncclParamGetU8 / pncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU8", || not_implemented("ncclParamGetU8"))
    }

    /// `ncclParamGetI16` (not implemented yet).
    fn ncclParamGetI16 / pncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI16", || not_implemented("ncclParamGetI16"))
    }

    /// `ncclParamGetU16` (not implemented yet).
    fn ncclParamGetU16 / pncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU16", || not_implemented("ncclParamGetU16"))
    }

    /// `ncclParamGetI32` (not implemented yet).
    fn ncclParamGetI32 / pncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI32", || not_implemented("ncclParamGetI32"))
    }

    /// `ncclParamGetU32` (not implemented yet).
    fn ncclParamGetU32 / pncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU32", || not_implemented("ncclParamGetU32"))
    }

    /// `ncclParamGetI64` (not implemented yet).
    fn ncclParamGetI64 / pncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetI64", || not_implemented("ncclParamGetI64"))
    }

    /// `ncclParamGetU64` (not implemented yet).
    fn ncclParamGetU64 / pncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetU64", || not_implemented("ncclParamGetU64"))
    }

    /// `ncclParamGetStr` (not implemented yet).
    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
        let _ = (h, out);
        boundary("ncclParamGetStr", || not_implemented("ncclParamGetStr"))
    }

    /// `ncclParamGet` (not implemented yet).
    fn ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) -> ncclResult_t {
        let _ = (h, out, maxLen, len);
        boundary("ncclParamGet", || not_implemented("ncclParamGet"))
    }

    /// `ncclParamGetParameter` (not implemented yet).
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char, valueLen: *mut c_int) -> ncclResult_t {
        let _ = (key, value, valueLen);
        boundary("ncclParamGetParameter", || not_implemented("ncclParamGetParameter"))
    }

    /// `ncclParamGetAllParameterKeys` (not implemented yet).
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *mut *const c_char, tableLen: *mut c_int) -> ncclResult_t {
        let _ = (table, tableLen);
        boundary("ncclParamGetAllParameterKeys", || not_implemented("ncclParamGetAllParameterKeys"))
    }

    /// `ncclParamDumpAll` (not implemented yet: it prints nothing and sets `ncclGetLastError`).
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        let _ = boundary("ncclParamDumpAll", || not_implemented("ncclParamDumpAll"));
    }

    /// `ncclResetDebugInit` (deprecated in NCCL; nothing to reset here).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {}

    /// `ncclResetDebugInitInternal`: what `ncclResetDebugInit` calls in NCCL (likewise nothing here).
    fn ncclResetDebugInitInternal / pncclResetDebugInitInternal() -> () {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header declares exactly the exported functions, with NCCL's enum values, so the two
    /// cannot drift.
    #[test]
    fn header_matches_the_library() {
        let h = include_str!("../include/nccl.h");
        let dev = include_str!("../include/nccl_device.h");
        let mut declared: Vec<&str> = h
            .lines()
            .chain(dev.lines())
            .filter_map(|l| {
                let l = l.trim();
                let rest = ["ncclResult_t ", "const char* ", "void ", "ncclTeam_t ", "int "]
                    .iter()
                    .find_map(|p| l.strip_prefix(p))?;
                let name = rest.split('(').next()?.trim();
                (name.starts_with("nccl") && rest.contains('(')).then_some(name)
            })
            .collect();
        declared.sort_unstable();
        declared.dedup();
        let mut exported: Vec<&str> = exported();
        exported.sort_unstable();
        assert_eq!(declared, exported, "nccl.h and the library declare different functions");
        for (name, v) in [
            ("ncclSuccess", 0),
            ("ncclUnhandledCudaError", 1),
            ("ncclSystemError", 2),
            ("ncclInternalError", 3),
            ("ncclInvalidArgument", 4),
            ("ncclInvalidUsage", 5),
            ("ncclRemoteError", 6),
            ("ncclInProgress", 7),
            ("ncclTimeout", 8),
            ("ncclNumResults", 9),
            ("ncclInt8", DataType::I8 as i32),
            ("ncclUint8", DataType::U8 as i32),
            ("ncclInt32", DataType::I32 as i32),
            ("ncclUint32", DataType::U32 as i32),
            ("ncclInt64", DataType::I64 as i32),
            ("ncclUint64", DataType::U64 as i32),
            ("ncclFloat16", DataType::F16 as i32),
            ("ncclFloat32", DataType::F32 as i32),
            ("ncclFloat64", DataType::F64 as i32),
            ("ncclBfloat16", DataType::BF16 as i32),
            ("ncclFloat8e4m3", DataType::F8E4M3 as i32),
            ("ncclFloat8e5m2", DataType::F8E5M2 as i32),
            ("ncclNumTypes", ncclNumTypes),
            ("ncclSum", 0),
            ("ncclProd", 1),
            ("ncclMax", 2),
            ("ncclMin", 3),
            ("ncclAvg", 4),
            ("ncclNumOps", ncclNumOps),
        ] {
            let needle = format!("{name} = {v},");
            assert!(h.contains(&needle), "nccl.h lacks `{needle}`");
        }
        assert!(h.contains(&format!("#define NCCL_VERSION_CODE {NCCL_VERSION_CODE}")));
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 120);
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
    }

    #[test]
    fn internal_errors_point_to_this_project() {
        let _g = last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let code = boundary("ncclTest", || panic!("boom"));
        assert_eq!(code, ncclInternalError);
        // SAFETY: a static buffer, NUL-terminated.
        let msg = unsafe { CStr::from_ptr(last_error::current()) }.to_string_lossy().into_owned();
        assert!(msg.contains("boom") && msg.contains("oxccl project"), "{msg}");
        boundary("ncclTest", || Err(Error::internal("invariant")));
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(last_error::current()) }.to_string_lossy().into_owned();
        assert!(msg.contains("invariant") && msg.contains("not NCCL"), "{msg}");
    }

    #[test]
    fn error_strings_are_nccls() {
        // SAFETY: valid result codes and out of range ones; the strings are static.
        let s = |r| unsafe { CStr::from_ptr(ncclGetErrorString(r)) }.to_str().unwrap().to_string();
        assert_eq!(s(0), "no error");
        assert_eq!(s(4), "invalid argument (run with NCCL_DEBUG=WARN for details)");
        assert_eq!(s(7), "NCCL operation in progress");
        assert_eq!(s(42), "unknown result code");
        assert_eq!(s(-1), "unknown result code");
    }
}
