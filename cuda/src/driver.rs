//! The CUDA driver: probe, pointer classification, streams, events, pinned memory, the kernel
//! module, IPC handles. Thin wrappers over cudarc's raw bindings; every call's status becomes an
//! [`oxccl::Error`] naming the call and CUDA's own error name.

use crate::{kernels, nvrtc};
use cudarc::driver::sys as cu;
use oxccl::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

pub use cu::{CUdeviceptr, CUstream};

/// Turn a driver status into a result naming the call.
pub(crate) fn check(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut s: *const libc::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it NULL).
    unsafe { cu::cuGetErrorName(r, &mut s) };
    let name = if s.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    Err(Error::new(ErrorKind::UnhandledCuda, format!("{what} failed: {name}")))
}

/// Whether the CUDA driver in this process is oxccl's simulator (`cuda/sim`, which exports
/// `cuOxcclSimulated`): its times are never GPU figures.
pub fn simulated() -> bool {
    if probe().is_err() {
        return false;
    }
    // SAFETY: dlopen/dlsym with NUL-terminated names; RTLD_NOLOAD only finds the driver the
    // process already loaded.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        !h.is_null() && !libc::dlsym(h, c"cuOxcclSimulated".as_ptr()).is_null()
    }
}

/// Probe the driver once: `libcuda` present, `cuInit` succeeds, at least one device. Never
/// panics; the error is `Unavailable` with the reason.
pub fn probe() -> Result<()> {
    // (fork generation of the probe, its result)
    static P: OnceLock<(u64, std::result::Result<(), String>)> = OnceLock::new();
    let (gen, res) = P.get_or_init(|| (oxccl::fork_generation(), probe_once()));
    if *gen != oxccl::fork_generation() && res.is_ok() {
        // CUDA's own rule: a child of a process that initialised CUDA cannot use it
        return Err(Error::new(
            ErrorKind::Unavailable,
            "CUDA is unavailable: the CUDA driver was initialised in this process's parent before fork(), \
             and CUDA cannot be used in a child of such a process (initialise CUDA after fork, or use spawn)",
        ));
    }
    res.clone().map_err(|m| Error::new(ErrorKind::Unavailable, format!("CUDA is unavailable: {m}")))
}

fn probe_once() -> std::result::Result<(), String> {
    {
        // SAFETY: only tries to dlopen libcuda's candidate names.
        let present = std::panic::catch_unwind(|| unsafe { cu::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("the CUDA driver (libcuda.so.1) is not installed on this machine".into());
        }
        let r = std::panic::catch_unwind(|| {
            let mut n = 0;
            // SAFETY: cuInit has no pointer arguments; cuDeviceGetCount writes one int.
            unsafe {
                check(cu::cuInit(0), "cuInit")?;
                check(cu::cuDeviceGetCount(&mut n), "cuDeviceGetCount")?;
            }
            if n == 0 {
                return Err(Error::new(ErrorKind::Unavailable, "the CUDA driver reports no device"));
            }
            Ok(())
        });
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.message),
            Err(_) => Err("the CUDA driver lacks a required symbol (driver too old?)".into()),
        }
    }
}

/// Run driver calls behind a panic boundary (cudarc panics on a missing symbol).
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    probe()?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::new(ErrorKind::UnhandledCuda, format!("{what}: a CUDA driver call panicked (missing symbol?)")))
    })
}

/// Where a pointer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Device memory of this device ordinal.
    Device(i32),
    /// Host memory (pageable, pinned or managed memory the host can touch), or unknown to CUDA.
    Host,
}

/// Classify a pointer with `cuPointerGetAttribute` (host if CUDA is unavailable).
pub fn classify(ptr: u64) -> Memory {
    if ptr == 0 || probe().is_err() {
        return Memory::Host;
    }
    guarded("cuPointerGetAttributes", || {
        // one call for both attributes; unlike the singular form it succeeds for memory CUDA
        // does not know, leaving the memory type 0 (not device)
        let mut kind: u32 = 0;
        let mut ord: i32 = -1;
        let mut attrs = [
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data = [(&mut kind as *mut u32).cast::<libc::c_void>(), (&mut ord as *mut i32).cast()];
        // SAFETY: two attributes with out-pointers of their types (a 32-bit CUmemorytype and an
        // int); the driver only looks the address up.
        let r = unsafe { cu::cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
        check(r, "cuPointerGetAttributes")?;
        Ok(if kind == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 { Memory::Device(ord) } else { Memory::Host })
    })
    .unwrap_or(Memory::Host)
}

/// Make device `ord`'s primary context current on this thread.
pub fn set_device(ord: i32) -> Result<()> {
    guarded("cuCtxSetCurrent", || {
        static CTX: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
        let mut m = CTX.get_or_init(Default::default).lock().unwrap();
        let ctx = match m.get(&ord) {
            Some(&c) => c as cu::CUcontext,
            None => {
                let mut dev = 0;
                let mut ctx: cu::CUcontext = std::ptr::null_mut();
                // SAFETY: out-pointers; the retained primary context lives for the process.
                unsafe {
                    check(cu::cuDeviceGet(&mut dev, ord), "cuDeviceGet")?;
                    check(cu::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
                }
                m.insert(ord, ctx as usize);
                ctx
            }
        };
        // SAFETY: a retained context.
        check(unsafe { cu::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
    })
}

/// A device attribute of `ord`.
pub fn attribute(ord: i32, a: cu::CUdevice_attribute) -> Result<i32> {
    guarded("cuDeviceGetAttribute", || {
        let (mut dev, mut v) = (0, 0);
        // SAFETY: out-pointers.
        unsafe {
            check(cu::cuDeviceGet(&mut dev, ord), "cuDeviceGet")?;
            check(cu::cuDeviceGetAttribute(&mut v, a, dev), "cuDeviceGetAttribute")?;
        }
        Ok(v)
    })
}

/// Whether `stream` is being captured into a CUDA graph.
///
/// # Safety
/// `stream` is a live stream or NULL.
pub unsafe fn is_capturing(stream: CUstream) -> Result<bool> {
    let mut st = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle from the caller (NULL is the legacy default stream) and an out-pointer.
    check(unsafe { cu::cuStreamIsCapturing(stream, &mut st) }, "cuStreamIsCapturing")?;
    Ok(st != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// An event that blocks (sleeps) its waiter instead of spinning.
pub struct Event(pub(crate) cu::CUevent);
// SAFETY: CUDA events may be used from any thread of the process.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// A blocking-sync event without timing.
    pub fn new() -> Result<Event> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        let flags =
            cu::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32 | cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer; flags are valid.
        check(unsafe { cu::cuEventCreate(&mut e, flags) }, "cuEventCreate")?;
        Ok(Event(e))
    }
    /// Record on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream or NULL.
    pub unsafe fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: a live event and the caller's stream.
        check(unsafe { cu::cuEventRecord(self.0, stream) }, "cuEventRecord")
    }
    /// Wait until the recorded work is done: polling for a few tens of microseconds (short
    /// kernels and copies end within them; a blocking-sync wake-up took about 100 µs on a GPU
    /// virtual machine), then sleeping.
    pub fn wait(&self) -> Result<()> {
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_micros(50) {
            // SAFETY: a live event.
            match unsafe { cu::cuEventQuery(self.0) } {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
                r => return check(r, "cuEventQuery"),
            }
        }
        // SAFETY: a live event.
        check(unsafe { cu::cuEventSynchronize(self.0) }, "cuEventSynchronize")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroyed once; the driver defers destruction until pending records finish.
        unsafe { cu::cuEventDestroy_v2(self.0) };
    }
}

/// A stream of oxccl's own, non-blocking with respect to the legacy default stream (so it never
/// waits on a user stream that is parked in an oxccl gate).
pub struct Stream {
    raw: CUstream,
    /// Recorded and waited on by [`Stream::sync`] (one event for the stream's life).
    done: Event,
}
// SAFETY: CUDA streams may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream on the current context.
    pub fn new() -> Result<Stream> {
        let done = Event::new()?;
        let mut s: CUstream = std::ptr::null_mut();
        check(
            // SAFETY: out-pointer, valid flag.
            unsafe { cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        Ok(Stream { raw: s, done })
    }
    /// The raw handle.
    pub fn raw(&self) -> CUstream {
        self.raw
    }
    /// Wait for everything enqueued so far, sleeping on a blocking-sync event.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: our own live stream.
        unsafe { self.done.record(self.raw)? };
        self.done.wait()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        unsafe { cu::cuStreamDestroy_v2(self.raw) };
    }
}

/// Page-locked host memory (staging buffers). Never freed while operations may be in flight:
/// `cuMemFreeHost` synchronises the device, which would deadlock against a user stream parked in
/// a gate; the owner frees it when the communicator is dropped.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: plain host memory.
unsafe impl Send for Pinned {}
// SAFETY: shared only as an address: the device worker alone reads and writes the bytes.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `len` bytes (at least 1).
    pub fn new(len: usize) -> Result<Pinned> {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: out-pointer; portable pinned memory.
        check(unsafe { cu::cuMemHostAlloc(&mut p, len.max(1), cu::CU_MEMHOSTALLOC_PORTABLE) }, "cuMemHostAlloc")?;
        Ok(Pinned { ptr: p.cast(), len })
    }
    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The host address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe { cu::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// A word of pinned host memory that the GPU reads: a stream waits on it with
/// `cuStreamWaitValue32` until it reaches a value, and a host thread releases the wait with a
/// plain store. No CUDA host function is involved: those run on one driver thread per process,
/// in no mandated order, so a host function that blocks would hold back every other stream's
/// (the deadlock of several ranks' gates in one process).
pub struct GateWord {
    mem: Pinned,
    dev: CUdeviceptr,
}
// SAFETY: the word is only accessed atomically; CUDA calls may come from any thread.
unsafe impl Sync for GateWord {}

impl GateWord {
    /// A word holding 0, mapped for the device. Fails clearly where the driver has no stream
    /// memory operations (tried once on a stream of its own).
    pub fn new() -> Result<GateWord> {
        let g = guarded("cuMemHostAlloc", GateWord::alloc)?;
        guarded("cuStreamWaitValue32", || {
            let s = Stream::new()?;
            // SAFETY: our own live stream; the word holds 0, so the wait is met at once.
            unsafe { g.wait(s.raw(), 0) }.map_err(|e| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("this CUDA driver cannot make a stream wait on a memory word, which oxccl's stream gate needs: {e}"),
                )
            })?;
            s.sync()
        })?;
        Ok(g)
    }
    fn alloc() -> Result<GateWord> {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: out-pointer; 64 bytes (a cache line of its own), zeroed by us below.
        check(unsafe { cu::cuMemHostAlloc(&mut p, 64, flags) }, "cuMemHostAlloc")?;
        let mem = Pinned { ptr: p.cast(), len: 64 };
        // SAFETY: 64 writable bytes just allocated.
        unsafe { std::ptr::write_bytes(mem.ptr, 0, 64) };
        let mut dev: CUdeviceptr = 0;
        // SAFETY: out-pointer; memory of cuMemHostAlloc with DEVICEMAP; flags must be 0.
        check(unsafe { cu::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) }, "cuMemHostGetDevicePointer")?;
        Ok(GateWord { mem, dev })
    }
    fn word(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: 64-byte aligned pinned memory that lives as long as self; only accessed
        // atomically by the host (the device only reads it).
        unsafe { &*(self.mem.ptr as *const std::sync::atomic::AtomicU32) }
    }
    /// Make `stream` wait until the word is at least `value` (a cyclic comparison: wrapping
    /// past 2^32 is fine while fewer than 2^31 values are outstanding).
    ///
    /// # Safety
    /// `stream` is a live stream of the current context (or NULL); the word outlives the wait.
    pub unsafe fn wait(&self, stream: CUstream, value: u32) -> Result<()> {
        let geq = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the caller's stream; the device address of our mapped word.
        check(unsafe { cu::cuStreamWaitValue32_v2(stream, self.dev, value, geq) }, "cuStreamWaitValue32")
    }
    /// Store `value`: the waits for it and for smaller values go on.
    pub fn set(&self, value: u32) {
        self.word().store(value, std::sync::atomic::Ordering::Release);
    }
    /// The value stored last.
    pub fn get(&self) -> u32 {
        self.word().load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Copy device → host on `stream` (asynchronous).
///
/// # Safety
/// `dst` must be valid for `len` bytes until the copy completes.
pub unsafe fn copy_d2h(dst: *mut u8, src: u64, len: usize, stream: CUstream) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    check(unsafe { cu::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream) }, "cuMemcpyDtoHAsync")
}

/// Copy host → device on `stream` (asynchronous).
///
/// # Safety
/// `src` must be valid for `len` bytes until the copy completes.
pub unsafe fn copy_h2d(dst: u64, src: *const u8, len: usize, stream: CUstream) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    check(unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream) }, "cuMemcpyHtoDAsync")
}

/// Copy device → device on `stream` (asynchronous).
///
/// # Safety
/// Both ranges are device memory of the stream's context; `stream` is live.
pub unsafe fn copy_d2d(dst: u64, src: u64, len: usize, stream: CUstream) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: device addresses the caller owns; the driver checks them.
    check(unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, len, stream) }, "cuMemcpyDtoDAsync")
}

/// The kernels loaded on one device.
pub struct Module {
    funcs: HashMap<String, usize>,
    sms: u32,
    /// How the kernels were obtained (for logs and `gpu-check.sh`).
    pub origin: String,
}

/// The kernel cache ([`oxccl::Config::kernel_cache`]).
fn cache_dir() -> Option<std::path::PathBuf> {
    oxccl::Config::from_env().kernel_cache
}

/// The kernels for device `ord` (current context): compiled with NVRTC for its exact
/// architecture and cached on disk per architecture and source hash; or the embedded PTX when
/// NVRTC is missing or fails.
pub fn module(ord: i32) -> Result<&'static Module> {
    static MODS: OnceLock<Mutex<HashMap<i32, &'static Module>>> = OnceLock::new();
    let mut m = MODS.get_or_init(Default::default).lock().unwrap();
    if let Some(md) = m.get(&ord) {
        return Ok(md);
    }
    set_device(ord)?;
    let major = attribute(ord, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(ord, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attribute(ord, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
    let arch = format!("sm_{major}{minor}");
    let src_hash = fnv1a(&kernels::source());
    let cached = cache_dir().map(|d| d.join(format!("{src_hash:016x}-{arch}.cubin")));
    let mut image: Option<(Vec<u8>, String)> = None;
    if let Some(p) = &cached {
        if let Ok(b) = std::fs::read(p) {
            image = Some((b, format!("cubin for {arch} from the cache {}", p.display())));
        }
    }
    if image.is_none() && nvrtc::available() {
        match nvrtc::compile(&arch) {
            Ok(c) => {
                if let Some(p) = &cached {
                    let _ = std::fs::create_dir_all(p.parent().unwrap());
                    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                    if std::fs::write(&tmp, &c.image).is_ok() {
                        let _ = std::fs::rename(&tmp, p);
                    }
                }
                image = Some((c.image, format!("cubin for {arch} compiled by NVRTC")));
            }
            Err(e) => tracing::warn!("NVRTC failed for {arch}, using the embedded PTX: {e}"),
        }
    }
    let (mut bytes, origin) = image.unwrap_or_else(|| {
        (kernels::EMBEDDED_PTX.as_bytes().to_vec(), format!("embedded compute_80 PTX, JIT-compiled for {arch}"))
    });
    if !origin.starts_with("cubin") {
        bytes.push(0); // PTX must be NUL-terminated
    }
    let mut module: cu::CUmodule = std::ptr::null_mut();
    // SAFETY: a cubin or NUL-terminated PTX image; the module lives for the process.
    check(unsafe { cu::cuModuleLoadData(&mut module, bytes.as_ptr().cast()) }, "cuModuleLoadData")?;
    let mut funcs = HashMap::new();
    for name in kernels::kernel_names() {
        let c = std::ffi::CString::new(name.clone()).unwrap();
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check(unsafe { cu::cuModuleGetFunction(&mut f, module, c.as_ptr()) }, "cuModuleGetFunction")?;
        funcs.insert(name, f as usize);
    }
    tracing::info!("oxccl kernels on device {ord}: {origin}");
    let md: &'static Module = Box::leak(Box::new(Module { funcs, sms, origin }));
    m.insert(ord, md);
    Ok(md)
}

/// FNV-1a of the source (a cache key; not security relevant).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl Module {
    /// Launch kernel `name` over `elems` work items (elements, or bytes for the copy kernel)
    /// with `args` on `stream`.
    ///
    /// # Safety
    /// `args` holds device addresses valid for its element counts; `stream` is live.
    pub unsafe fn launch(
        &self,
        name: &str,
        args: &kernels::KernelArgs,
        elem_size: usize,
        stream: CUstream,
    ) -> Result<()> {
        let f = *self
            .funcs
            .get(name)
            .ok_or_else(|| Error::new(ErrorKind::Internal, format!("kernel {name} is not in the module")))?;
        if args.n == 0 {
            return Ok(());
        }
        // one 16-byte vector per thread per iteration; at most 4 blocks per SM, grid-stride beyond
        let vecs = (args.n as usize * elem_size).div_ceil(16);
        let blocks = vecs.div_ceil(kernels::BLOCK as usize).clamp(1, 4 * self.sms as usize) as u32;
        let mut a = *args;
        let mut params = [(&mut a as *mut kernels::KernelArgs).cast::<libc::c_void>()];
        // SAFETY: `params` holds one pointer to a KernelArgs laid out as the kernel's `struct
        // OxArgs` (checked by a test); the pointers inside it are device addresses the caller
        // vouches for; the driver copies the parameters before returning.
        check(
            unsafe {
                cu::cuLaunchKernel(
                    f as cu::CUfunction,
                    blocks,
                    1,
                    1,
                    kernels::BLOCK,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            name,
        )
    }
}

/// A 64-byte legacy IPC handle of the allocation holding `ptr`, and `ptr`'s offset in it.
pub fn ipc_handle(ptr: u64) -> Result<([u8; 64], u64)> {
    let mut base: u64 = 0;
    let mut size: usize = 0;
    // SAFETY: out-pointers; `ptr` is a device address.
    check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }, "cuMemGetAddressRange")?;
    let mut h = cu::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: out-pointer and the allocation's base.
    check(unsafe { cu::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
    Ok((h.reserved.map(|c| c as u8), ptr - base))
}

/// A dma-buf of the device allocation holding `[ptr, ptr+len)`, for GPUDirect RDMA (an RDMA
/// device registers it: `ibv_reg_dmabuf_mr`): the descriptor (the caller closes it), the
/// offset of `ptr` in it and the allocation's base address. `Unavailable` where the driver or
/// the device does not offer dma-buf export (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; CUDA 11.7
/// and an open kernel module with dma-buf support).
pub fn dmabuf_export(ptr: u64, len: usize) -> Result<(std::os::fd::OwnedFd, u64, u64)> {
    let Memory::Device(ord) = classify(ptr) else {
        return Err(Error::invalid_argument(format!("{ptr:#x} is not device memory")));
    };
    if attribute(ord, cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? != 1 {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("device {ord} does not export dma-bufs (no GPUDirect RDMA)"),
        ));
    }
    guarded("cuMemGetHandleForAddressRange", || {
        let mut base: u64 = 0;
        let mut size: usize = 0;
        // SAFETY: out-pointers; `ptr` is a device address.
        check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }, "cuMemGetAddressRange")?;
        if ptr + len as u64 > base + size as u64 {
            return Err(Error::invalid_argument("the range runs past its allocation"));
        }
        // whole pages of the allocation: dma-buf export works on page-aligned ranges
        let page = 1u64 << 16;
        let start = base & !(page - 1);
        let end = (base + size as u64).div_ceil(page) * page;
        let mut fd: libc::c_int = -1;
        check(
            // SAFETY: an out-pointer for an int descriptor; a range of one allocation.
            unsafe {
                cu::cuMemGetHandleForAddressRange(
                    (&mut fd as *mut libc::c_int).cast(),
                    start,
                    (end - start) as usize,
                    cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            },
            "cuMemGetHandleForAddressRange",
        )?;
        // SAFETY: a new descriptor the driver gave us.
        Ok((unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }, ptr - start, start))
    })
}

/// Map a peer process's allocation (legacy IPC); closed with [`ipc_close`].
pub fn ipc_open(handle: &[u8; 64]) -> Result<u64> {
    let h = cu::CUipcMemHandle_st { reserved: handle.map(|c| c as libc::c_char) };
    let mut p: u64 = 0;
    check(
        // SAFETY: a handle from a peer; out-pointer.
        unsafe { cu::cuIpcOpenMemHandle_v2(&mut p, h, cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32) },
        "cuIpcOpenMemHandle",
    )?;
    Ok(p)
}

/// Unmap a mapping made by [`ipc_open`].
pub fn ipc_close(p: u64) {
    // SAFETY: a pointer returned by cuIpcOpenMemHandle, closed once.
    unsafe { cu::cuIpcCloseMemHandle(p) };
}

/// The driver's version (e.g. 12040), for reports.
pub fn driver_version() -> Result<i32> {
    guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: out-pointer.
        check(unsafe { cu::cuDriverGetVersion(&mut v) }, "cuDriverGetVersion")?;
        Ok(v)
    })
}

/// Wait for everything enqueued on a user stream so far (used when host buffers come with a
/// stream: the host operation then runs after the stream's earlier work, as the caller expects).
///
/// # Safety
/// `stream` is a live stream (or NULL, the legacy default stream).
pub unsafe fn sync_user_stream(stream: CUstream) -> Result<()> {
    guarded("cuStreamSynchronize", || {
        let e = Event::new()?;
        // SAFETY: the caller's contract.
        unsafe { e.record(stream)? };
        e.wait()
    })
}

/// Device memory owned by oxccl (tests, benchmarks): `cuMemAlloc`, freed on drop.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// `len` bytes (at least 1) on the current context's device, zeroed.
    pub fn zeroed(len: usize) -> Result<DeviceBuffer> {
        guarded("cuMemAlloc", || {
            let mut p: u64 = 0;
            // SAFETY: out-pointer; then a memset of the new allocation.
            unsafe {
                check(cu::cuMemAlloc_v2(&mut p, len.max(1)), "cuMemAlloc")?;
                check(cu::cuMemsetD8_v2(p, 0, len.max(1)), "cuMemsetD8")?;
            }
            let b = DeviceBuffer { ptr: p, len };
            b.landed()?;
            Ok(b)
        })
    }
    /// `len` bytes (at least 1) on the current context's device, left as they are (no memset,
    /// so no wait for the legacy stream).
    pub fn uninit(len: usize) -> Result<DeviceBuffer> {
        guarded("cuMemAlloc", || {
            let mut p: u64 = 0;
            // SAFETY: out-pointer.
            check(unsafe { cu::cuMemAlloc_v2(&mut p, len.max(1)) }, "cuMemAlloc")?;
            Ok(DeviceBuffer { ptr: p, len })
        })
    }
    /// Wait until the synchronous copies and memsets made so far have reached the device. CUDA
    /// returns from `cuMemsetD8`, and from `cuMemcpyHtoD` out of pageable memory, before the
    /// device has the data (they are queued on the legacy stream); work on other streams, and in
    /// other processes through CUDA IPC, must not run before they land.
    fn landed(&self) -> Result<()> {
        // SAFETY: NULL is the legacy default stream, always live.
        unsafe { sync_user_stream(std::ptr::null_mut()) }
    }
    /// A copy of `data` in device memory.
    pub fn from_host(data: &[u8]) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::zeroed(data.len())?;
        if !data.is_empty() {
            // SAFETY: the allocation holds data.len() bytes; a synchronous copy.
            check(unsafe { cu::cuMemcpyHtoD_v2(b.ptr, data.as_ptr().cast(), data.len()) }, "cuMemcpyHtoD")?;
        }
        b.landed()?;
        Ok(b)
    }
    /// Overwrite its first `data.len()` bytes and zero the rest (copies on the legacy stream,
    /// which does not wait for oxccl's or other non-blocking streams), and wait until they landed.
    pub fn load(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.len {
            return Err(Error::invalid_argument(format!("{} bytes do not fit in {}", data.len(), self.len)));
        }
        // SAFETY: within the allocation; synchronous.
        unsafe {
            check(cu::cuMemsetD8_v2(self.ptr, 0, self.len.max(1)), "cuMemsetD8")?;
            if !data.is_empty() {
                check(cu::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len()), "cuMemcpyHtoD")?;
            }
        }
        self.landed()
    }
    /// Its contents.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        if self.len > 0 {
            // SAFETY: both sides hold len bytes; a synchronous copy.
            check(unsafe { cu::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.ptr, self.len) }, "cuMemcpyDtoH")?;
        }
        Ok(v)
    }
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc, freed once.
        unsafe { cu::cuMemFree_v2(self.ptr) };
    }
}
