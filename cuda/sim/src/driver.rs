//! The driver API entry points (`cu*`): what oxccl, its C ABI and its tests call.

use crate::stream::{self, Event};
use crate::{
    config, entry, kernels, mem, put, CUresult, Fail, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
};
use libc::{c_char, c_int, c_uint, c_void};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

static INIT: AtomicBool = AtomicBool::new(false);

thread_local!(static CURRENT: Cell<Option<i32>> = const { Cell::new(None) });

fn initialised() -> Result<(), Fail> {
    if INIT.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(Fail::new(CUDA_ERROR_NOT_INITIALIZED, "cuInit was not called"))
    }
}

/// The current thread's device (its context), as CUDA requires one for allocations and streams.
pub(crate) fn current() -> Result<i32, Fail> {
    initialised()?;
    CURRENT.with(Cell::get).ok_or_else(|| {
        Fail::new(
            CUDA_ERROR_INVALID_CONTEXT,
            "no current context on this thread (cuCtxSetCurrent or cudaSetDevice first)",
        )
    })
}

pub(crate) fn set_current(dev: i32) {
    CURRENT.with(|c| c.set(Some(dev)));
}

fn device(d: c_int) -> Result<i32, Fail> {
    initialised()?;
    if (0..config().devices).contains(&d) {
        Ok(d)
    } else {
        Err(Fail::new(CUDA_ERROR_INVALID_DEVICE, format!("device {d} does not exist ({} simulated)", config().devices)))
    }
}

/// Pinned host allocations (`cuMemHostAlloc`): start → length.
static PINNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// The pinned allocations made with `CU_MEMHOSTALLOC_DEVICEMAP` (their starts).
static DEVICEMAP: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 2;

fn pinned(p: usize) -> bool {
    PINNED.lock().unwrap().range(..=p).next_back().is_some_and(|(&b, &l)| p < b + l)
}

/// Whether `[p, p + n)` lies in a pinned allocation mapped for the device.
fn device_mapped(p: usize, n: usize) -> bool {
    let start = PINNED.lock().unwrap().range(..=p).next_back().filter(|(&b, &l)| p + n <= b + l).map(|(&b, _)| b);
    start.is_some_and(|b| DEVICEMAP.lock().unwrap().contains(&b))
}

static EVENTS: Mutex<Option<HashMap<usize, Arc<Event>>>> = Mutex::new(None);
static NEXT_EVENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x6000_0000);

pub(crate) fn event(h: usize) -> Result<Arc<Event>, Fail> {
    EVENTS.lock().unwrap().get_or_insert_with(HashMap::new).get(&h).cloned().ok_or_else(|| {
        Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("event {h:#x} does not exist (never created, or destroyed)"))
    })
}

pub(crate) fn event_create() -> usize {
    let h = NEXT_EVENT.fetch_add(0x40, Ordering::Relaxed);
    EVENTS.lock().unwrap().get_or_insert_with(HashMap::new).insert(h, Arc::new(Event::default()));
    h
}

pub(crate) fn event_destroy(h: usize) -> Result<(), Fail> {
    EVENTS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .remove(&h)
        .map(|_| ())
        .ok_or_else(|| Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("event {h:#x} does not exist (double destroy?)")))
}

/// Enqueue a copy between host and device memory (`to_dev`: host → device). The device window
/// is checked now; the host window is the caller's until the stream reaches the copy.
pub(crate) fn copy_async(
    dev: u64,
    host: usize,
    n: usize,
    to_dev: bool,
    s: usize,
    what: &'static str,
) -> Result<(), Fail> {
    current()?;
    mem::shadow(dev, n, what)?;
    let st = stream::get(s)?;
    st.push(Box::new(move || {
        let sh = mem::shadow(dev, n, what)? as usize;
        // SAFETY: the shadow covers n bytes (checked now, the allocation may have been freed
        // since); the host buffer is the caller's, valid until the copy ran (CUDA's contract).
        unsafe {
            if to_dev {
                std::ptr::copy_nonoverlapping(host as *const u8, sh as *mut u8, n)
            } else {
                std::ptr::copy_nonoverlapping(sh as *const u8, host as *mut u8, n)
            }
        };
        Ok(())
    }));
    Ok(())
}

pub(crate) fn copy_d2d_async(dst: u64, src: u64, n: usize, s: usize) -> Result<(), Fail> {
    current()?;
    mem::shadow(dst, n, "cuMemcpyDtoD destination")?;
    mem::shadow(src, n, "cuMemcpyDtoD source")?;
    stream::get(s)?.push(Box::new(move || {
        let d = mem::shadow(dst, n, "cuMemcpyDtoD destination")?;
        let s = mem::shadow(src, n, "cuMemcpyDtoD source")?;
        // SAFETY: both shadows cover n bytes; copy (not copy_nonoverlapping): they may overlap.
        unsafe { std::ptr::copy(s, d, n) };
        Ok(())
    }));
    Ok(())
}

pub(crate) fn memset_async(dev: u64, v: u8, n: usize, s: usize) -> Result<(), Fail> {
    current()?;
    mem::shadow(dev, n, "cuMemsetD8")?;
    stream::get(s)?.push(Box::new(move || {
        let d = mem::shadow(dev, n, "cuMemsetD8")?;
        // SAFETY: the shadow covers n bytes.
        unsafe { std::ptr::write_bytes(d, v, n) };
        Ok(())
    }));
    Ok(())
}

/// The synchronous host-to-device copy (`cuMemcpyHtoD`, `cudaMemcpy`), by CUDA's rules: from
/// pinned memory it is synchronous; from pageable memory it returns once the source is staged,
/// before the data reaches the device (the write is queued on the legacy stream), so work on
/// other streams must be ordered after it by the caller.
pub(crate) fn copy_h2d_sync(dst: u64, src: usize, n: usize, what: &'static str) -> Result<(), Fail> {
    if pinned(src) {
        return copy_async(dst, src, n, true, 0, what).and_then(|_| sync_default());
    }
    current()?;
    mem::shadow(dst, n, what)?;
    // SAFETY: CUDA's contract: the caller's host buffer holds n bytes (staged now).
    let staged = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
    stream::get(0)?.push(Box::new(move || {
        let sh = mem::shadow(dst, n, what)?;
        // SAFETY: the shadow covers n bytes (checked again: it may have been freed since).
        unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), sh, n) };
        Ok(())
    }));
    Ok(())
}

/// The synchronous memset of device memory (`cuMemsetD8`, `cudaMemset`): asynchronous with
/// respect to the host, by CUDA's rules (queued on the legacy stream).
pub(crate) fn memset_sync(dst: u64, v: u8, n: usize) -> Result<(), Fail> {
    memset_async(dst, v, n, 0)
}

/// Run on the default stream and wait: the synchronous copies and memsets.
pub(crate) fn sync_default() -> Result<(), Fail> {
    stream::get(0)?.sync()
}

pub(crate) fn free(dev: u64) -> Result<(), Fail> {
    current()?;
    // cuMemFree synchronises the device, as CUDA's does
    stream::sync_all()?;
    mem::free(dev, false)
}

pub(crate) fn alloc(len: usize) -> Result<u64, Fail> {
    let d = current()?;
    if len == 0 {
        return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes"));
    }
    mem::alloc(len, d)
}

// ---- exports -----------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", || {
        if flags != 0 {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "cuInit flags must be 0"));
        }
        INIT.store(true, Ordering::Release);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuDriverGetVersion", || unsafe { put(v, 12040, "version") })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    // SAFETY: as above.
    entry("cuDeviceGetCount", || initialised().and_then(|_| unsafe { put(n, config().devices, "count") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut c_int, ord: c_int) -> CUresult {
    // SAFETY: as above.
    entry("cuDeviceGet", || device(ord).and_then(|o| unsafe { put(d, o, "device") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        device(d)?;
        let c = config();
        let x = match attr {
            16 => c.sms,        // MULTIPROCESSOR_COUNT
            75 => c.cc.0,       // COMPUTE_CAPABILITY_MAJOR
            76 => c.cc.1,       // COMPUTE_CAPABILITY_MINOR
            1 => 1024,          // MAX_THREADS_PER_BLOCK
            2 => 2_147_483_647, // MAX_BLOCK_DIM_X
            5 => 2_147_483_647, // MAX_GRID_DIM_X
            10 => 32,           // WARP_SIZE
            124 => 0,           // DMA_BUF_SUPPORTED: no GPUDirect RDMA here
            41 => 0,            // INTEGRATED
            19 | 89 => 1,       // CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING
            _ => return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("device attribute {attr} is not simulated"))),
        };
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(v, x, "value") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> CUresult {
    entry("cuDeviceGetName", || {
        device(d)?;
        let s = format!("oxccl simulated GPU {d} (not a GPU)\0");
        if name.is_null() || len <= 0 {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "name buffer"));
        }
        let n = s.len().min(len as usize);
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), name.cast(), n);
            *name.add(n - 1) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, d: c_int) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        let o = device(d)?;
        // SAFETY: CUDA's contract for the out-pointer; a context is a tag, never dereferenced.
        unsafe { put(ctx, ((o as usize + 1) << 8) as *mut c_void, "ctx") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> CUresult {
    entry("cuDevicePrimaryCtxRelease", || device(d).map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    entry("cuCtxSetCurrent", || {
        initialised()?;
        let v = ctx as usize;
        if v == 0 {
            CURRENT.with(|c| c.set(None));
            return Ok(());
        }
        let d = (v >> 8) as i32 - 1;
        if v & 0xff != 0 || device(d).is_err() {
            return Err(Fail::new(CUDA_ERROR_INVALID_CONTEXT, format!("{ctx:p} is not a context")));
        }
        set_current(d);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    entry("cuCtxGetCurrent", || {
        let v = CURRENT.with(Cell::get).map_or(0, |d| (d as usize + 1) << 8);
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(ctx, v as *mut c_void, "ctx") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut c_int) -> CUresult {
    // SAFETY: as above.
    entry("cuCtxGetDevice", || current().and_then(|o| unsafe { put(d, o, "device") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || current().and_then(|_| stream::sync_all()))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, len: usize) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuMemAlloc", || alloc(len).and_then(|d| unsafe { put(p, d, "dptr") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(p: u64) -> CUresult {
    entry("cuMemFree", || free(p))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo", || {
        current()?;
        let t = config().mem_bytes;
        // SAFETY: CUDA's contract for the out-pointers.
        unsafe {
            put(free, t.saturating_sub(mem::bytes_in_use()), "free")?;
            put(total, t, "total")
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(p: *mut *mut c_void, len: usize, flags: c_uint) -> CUresult {
    entry("cuMemHostAlloc", || {
        current()?;
        let n = len.max(1);
        // SAFETY: a fresh anonymous mapping (page aligned, zeroed, like pinned memory).
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(Fail::new(crate::CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc"));
        }
        PINNED.lock().unwrap().insert(m as usize, n);
        if flags & CU_MEMHOSTALLOC_DEVICEMAP != 0 {
            DEVICEMAP.lock().unwrap().insert(m as usize);
        }
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(p, m, "pp") }
    })
}

/// The device address of mapped pinned memory (unified addressing: the host address itself).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(d: *mut u64, p: *mut c_void, flags: c_uint) -> CUresult {
    entry("cuMemHostGetDevicePointer", || {
        current()?;
        if flags != 0 {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer: flags must be 0"));
        }
        if !device_mapped(p as usize, 1) {
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("cuMemHostGetDevicePointer({p:p}): not pinned memory allocated with CU_MEMHOSTALLOC_DEVICEMAP"),
            ));
        }
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(d, p as u64, "device pointer") }
    })
}

/// Waits on a memory value enqueued and not yet met, in this process.
static PARKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `cuStreamWaitValue32`: the stream waits until the 32-bit word at `addr` (device memory, or
/// pinned host memory mapped for the device) meets the condition; polled, with the sticky error
/// of the context ending the wait.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32_v2(s: usize, addr: u64, value: u32, flags: c_uint) -> CUresult {
    entry("cuStreamWaitValue32", || {
        current()?;
        if addr % 4 != 0 {
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("cuStreamWaitValue32: {addr:#x} is not 4-byte aligned"),
            ));
        }
        let on_device = mem::range(addr).is_some();
        if on_device {
            mem::shadow(addr, 4, "cuStreamWaitValue32")?;
        } else if !device_mapped(addr as usize, 4) {
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "cuStreamWaitValue32: {addr:#x} is neither device memory nor pinned host memory mapped for the device"
                ),
            ));
        }
        let test: fn(u32, u32) -> bool = match flags & !(1 << 30) {
            0 => |v, want| (v.wrapping_sub(want) as i32) >= 0, // GEQ, cyclic
            1 => |v, want| v == want,
            2 => |v, want| v & want != 0,
            3 => |v, want| !(v | want) != 0,
            f => return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("cuStreamWaitValue32: flags {f:#x}"))),
        };
        let st = stream::get(s)?;
        /// Counts the wait as pending until the task has run or was dropped unrun.
        struct Pending;
        impl Drop for Pending {
            fn drop(&mut self) {
                PARKED.fetch_sub(1, Ordering::SeqCst);
            }
        }
        PARKED.fetch_add(1, Ordering::SeqCst);
        let pending = Pending;
        st.push(Box::new(move || {
            let _pending = pending;
            let mut nap = 1u64;
            loop {
                let p = if on_device { mem::shadow(addr, 4, "cuStreamWaitValue32")? } else { addr as *mut u8 };
                // SAFETY: 4 aligned bytes of live device (shadow) or mapped pinned memory, which
                // other threads and processes write: read atomically.
                let v = unsafe { (*(p as *const std::sync::atomic::AtomicU32)).load(Ordering::Acquire) };
                if test(v, value) {
                    return Ok(());
                }
                if let Some(f) = stream::sticky() {
                    return Err(f);
                }
                std::thread::sleep(std::time::Duration::from_micros(nap));
                nap = (nap * 2).min(1000);
            }
        }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        stream::sync_all()?;
        let n = PINNED.lock().unwrap().remove(&(p as usize)).ok_or_else(|| {
            Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("cuMemFreeHost({p:p}): not pinned memory of cuMemHostAlloc (or freed twice)"),
            )
        })?;
        DEVICEMAP.lock().unwrap().remove(&(p as usize));
        // SAFETY: the mapping made by cuMemHostAlloc for this pointer, unmapped once.
        unsafe { libc::munmap(p, n) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CUresult {
    entry("cuMemcpyHtoD", || copy_h2d_sync(dst, src as usize, n, "cuMemcpyHtoD"))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    entry("cuMemcpyDtoH", || copy_async(src, dst as usize, n, false, 0, "cuMemcpyDtoH").and_then(|_| sync_default()))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: usize) -> CUresult {
    entry("cuMemcpyHtoDAsync", || copy_async(dst, src as usize, n, true, s, "cuMemcpyHtoDAsync"))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: usize) -> CUresult {
    entry("cuMemcpyDtoHAsync", || copy_async(src, dst as usize, n, false, s, "cuMemcpyDtoHAsync"))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: usize) -> CUresult {
    entry("cuMemcpyDtoDAsync", || copy_d2d_async(dst, src, n, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> CUresult {
    entry("cuMemcpyDtoD", || copy_d2d_async(dst, src, n, 0).and_then(|_| sync_default()))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: u64, v: u8, n: usize) -> CUresult {
    entry("cuMemsetD8", || memset_sync(dst, v, n))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: u64, v: u8, n: usize, s: usize) -> CUresult {
    entry("cuMemsetD8Async", || memset_async(dst, v, n, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, p: u64) -> CUresult {
    entry("cuMemGetAddressRange", || {
        current()?;
        let (b, l, _) = mem::range(p)
            .ok_or_else(|| Fail::new(crate::CUDA_ERROR_NOT_FOUND, format!("{p:#x} is not device memory")))?;
        // SAFETY: CUDA's contract: either out-pointer may be NULL.
        unsafe {
            if !base.is_null() {
                base.write(b);
            }
            if !size.is_null() {
                size.write(l);
            }
        }
        Ok(())
    })
}

/// `cuPointerGetAttribute(s)`: memory type 2 (device) with its ordinal for device memory, 1
/// (host) for pinned memory; anything else is unknown to CUDA.
fn attribute(attr: c_int, p: u64, out: *mut c_void, strict: bool) -> Result<(), Fail> {
    let (kind, ord) = match mem::range(p) {
        Some((_, _, d)) => (2u32, d),
        None if pinned(p as usize) => (1, -1),
        None if strict => {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("{p:#x} is not memory CUDA knows")));
        }
        None => (0, -1),
    };
    if out.is_null() {
        return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "attribute out-pointer is NULL"));
    }
    // SAFETY: CUDA's contract: `out` holds the attribute's type (32-bit for these two).
    unsafe {
        match attr {
            2 => out.cast::<u32>().write(kind),
            9 => out.cast::<i32>().write(ord),
            _ => return Err(Fail::new(CUDA_ERROR_NOT_SUPPORTED, format!("pointer attribute {attr} is not simulated"))),
        }
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(out: *mut c_void, attr: c_int, p: u64) -> CUresult {
    entry("cuPointerGetAttribute", || initialised().and_then(|_| attribute(attr, p, out, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *mut c_int,
    data: *mut *mut c_void,
    p: u64,
) -> CUresult {
    entry("cuPointerGetAttributes", || {
        initialised()?;
        for i in 0..n as usize {
            // SAFETY: CUDA's contract: `n` attributes and as many out-pointers.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            attribute(a, p, d, false)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut usize, flags: c_uint) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuStreamCreate", || current().and_then(|_| unsafe { put(s, stream::create(flags), "stream") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: usize) -> CUresult {
    entry("cuStreamDestroy", || stream::destroy(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: usize) -> CUresult {
    entry("cuStreamSynchronize", || stream::get(s)?.sync())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: usize) -> CUresult {
    entry(
        "cuStreamQuery",
        || {
            if stream::get(s)?.idle() {
                Ok(())
            } else {
                Err(Fail::new(CUDA_ERROR_NOT_READY, "busy"))
            }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: usize, status: *mut c_int) -> CUresult {
    entry("cuStreamIsCapturing", || {
        let c = stream::get(s)?.capturing();
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(status, c as c_int, "status") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: usize, _mode: c_int) -> CUresult {
    entry("cuStreamBeginCapture", || {
        if s == 0 {
            return Err(Fail::new(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "the default stream cannot be captured"));
        }
        stream::get(s)?.set_capturing(true);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: usize, graph: *mut *mut c_void) -> CUresult {
    entry("cuStreamEndCapture", || {
        stream::get(s)?.set_capturing(false);
        // the simulator records no graph: an empty one
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(graph, std::ptr::null_mut(), "graph") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: usize, e: usize, _flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent", || {
        let ev = event(e)?;
        stream::get(s)?.push(Box::new(move || ev.sync()));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(e: *mut usize, _flags: c_uint) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuEventCreate", || current().and_then(|_| unsafe { put(e, event_create(), "event") }))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: usize) -> CUresult {
    entry("cuEventDestroy", || event_destroy(e))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(e: usize, s: usize) -> CUresult {
    entry("cuEventRecord", || {
        let ev = event(e)?;
        ev.record(&*stream::get(s)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(e: usize) -> CUresult {
    entry("cuEventSynchronize", || event(e)?.sync())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(e: usize) -> CUresult {
    entry(
        "cuEventQuery",
        || if event(e)?.done() { Ok(()) } else { Err(Fail::new(CUDA_ERROR_NOT_READY, "not reached")) },
    )
}

/// A host function and its argument, handed to a stream worker.
struct HostFn(unsafe extern "C" fn(*mut c_void), usize);

#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: usize,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CUresult {
    entry("cuLaunchHostFunc", || {
        let f = f.ok_or_else(|| Fail::new(CUDA_ERROR_INVALID_VALUE, "the host function is NULL"))?;
        let h = HostFn(f, data as usize);
        stream::get(s)?.push(Box::new(move || {
            stream::host_call(Box::new(move || {
                let h = h;
                // SAFETY: CUDA's contract: the caller's function and its argument, called once
                // when the stream reaches it.
                unsafe { (h.0)(h.1 as *mut c_void) };
            }));
            Ok(())
        }));
        Ok(())
    })
}

/// The one module handle (every accepted image holds the same kernels).
const MODULE: usize = 0x0DD1_0000;

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut usize, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        current()?;
        // SAFETY: CUDA's contract: a module image.
        unsafe { kernels::image_has_kernels(image.cast())? };
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(m, MODULE, "module") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: usize) -> CUresult {
    entry("cuModuleUnload", || {
        if m == MODULE {
            Ok(())
        } else {
            Err(Fail::new(CUDA_ERROR_INVALID_HANDLE, "not a module"))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(f: *mut usize, m: usize, name: *const c_char) -> CUresult {
    entry("cuModuleGetFunction", || {
        if m != MODULE {
            return Err(Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("{m:#x} is not a loaded module")));
        }
        if name.is_null() {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "the kernel name is NULL"));
        }
        // SAFETY: CUDA's contract: a NUL-terminated name.
        let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        let k = kernels::find(&n)?;
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(f, 0x0F00_0000 + k, "function") }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)] // CUDA's signature
pub unsafe extern "C" fn cuLaunchKernel(
    f: usize,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", || {
        current()?;
        let k = f.checked_sub(0x0F00_0000).filter(|k| *k < kernels::TABLE.len()).ok_or_else(|| {
            Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("{f:#x} is not a kernel of the loaded module"))
        })?;
        if gx == 0
            || gy == 0
            || gz == 0
            || bx == 0
            || by == 0
            || bz == 0
            || (bx as u64) * (by as u64) * (bz as u64) > 1024
        {
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("launch configuration {gx}x{gy}x{gz} blocks of {bx}x{by}x{bz}"),
            ));
        }
        if params.is_null() || !extra.is_null() {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "oxccl's kernels take their argument in kernelParams"));
        }
        // SAFETY: CUDA's contract: params[0] points to the kernel's one argument, a struct
        // OxArgs, copied now (a launch captures its arguments).
        let args = unsafe { (*params).cast::<kernels::OxArgs>().read_unaligned() };
        if stream::get(s)?.capturing() {
            return Err(Fail::new(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "launch into a stream being captured"));
        }
        stream::get(s)?.push(Box::new(move || kernels::run(k, args)));
        Ok(())
    })
}

/// `CUipcMemHandle`: 64 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut IpcHandle, p: u64) -> CUresult {
    entry("cuIpcGetMemHandle", || {
        let v = current().and_then(|_| mem::ipc_handle(p))?;
        // SAFETY: CUDA's contract for the out-pointer (a 64-byte CUipcMemHandle).
        unsafe { put(h, IpcHandle { reserved: v }, "handle") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(p: *mut u64, h: IpcHandle, _flags: c_uint) -> CUresult {
    entry("cuIpcOpenMemHandle", || {
        let d = current()?;
        let waits = PARKED.load(Ordering::SeqCst);
        if waits > 0 {
            // strict: mapping memory can wait for the device, which then waits for whoever
            // would release the parked stream (on a GPU, PyTorch's DDP hung so)
            return Err(Fail::new(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "cuIpcOpenMemHandle while {waits} stream wait(s) on a memory value are pending in this process: \
                     the driver may wait for the device here, a deadlock if this thread is to release them"
                ),
            ));
        }
        let dev = mem::ipc_open(&h.reserved, d)?;
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(p, dev, "dptr") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(p: u64) -> CUresult {
    entry("cuIpcCloseMemHandle", || {
        stream::sync_all()?;
        mem::free(p, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    _h: *mut c_void,
    _p: u64,
    _n: usize,
    _t: c_int,
    _f: u64,
) -> CUresult {
    entry("cuMemGetHandleForAddressRange", || {
        Err(Fail::new(CUDA_ERROR_NOT_SUPPORTED, "the simulated driver exports no dma-bufs (no GPUDirect RDMA)"))
    })
}

static NAMES: Mutex<Vec<(CUresult, std::ffi::CString)>> = Mutex::new(Vec::new());

/// A static C string for `code`'s name (made once per code, never freed).
fn name_ptr(code: CUresult) -> *const c_char {
    let mut v = NAMES.lock().unwrap();
    if let Some((_, s)) = v.iter().find(|(c, _)| *c == code) {
        return s.as_ptr();
    }
    v.push((code, std::ffi::CString::new(crate::error_name(code)).unwrap()));
    v.last().unwrap().1.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuGetErrorName", || unsafe { put(out, name_ptr(code), "name") })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    entry("cuGetErrorString", || unsafe { put(out, name_ptr(code), "string") })
}
