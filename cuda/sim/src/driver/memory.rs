//! Device and pinned memory: allocation, copies and memsets (queued or synchronous by CUDA's
//! rules), address ranges and pointer attributes.

use super::*;

/// Pinned host allocations (`cuMemHostAlloc`): start → length.
static PINNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// The pinned allocations made with `CU_MEMHOSTALLOC_DEVICEMAP` (their starts).
static DEVICEMAP: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 2;

fn pinned(p: usize) -> bool {
    PINNED.lock().unwrap().range(..=p).next_back().is_some_and(|(&b, &l)| p < b + l)
}

/// Whether `[p, p + n)` lies in a pinned allocation mapped for the device.
pub(super) fn device_mapped(p: usize, n: usize) -> bool {
    let start = PINNED.lock().unwrap().range(..=p).next_back().filter(|(&b, &l)| p + n <= b + l).map(|(&b, _)| b);
    start.is_some_and(|b| DEVICEMAP.lock().unwrap().contains(&b))
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
