//! A minimal CUDA runtime (`cuda*`, exported as `libcudart.so.12` too) over the simulated
//! driver, for C test programs: devices, memory, copies, memsets, streams, events, errors.
//! The runtime's error codes are the driver's for every case it reports.

use crate::driver::{
    self, alloc, copy_async, copy_d2d_async, current, event, event_create, event_destroy, memset_async, set_current,
    sync_default,
};
use crate::stream;
use crate::{config, entry, mem, put, CUresult, Fail, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE};
use libc::{c_char, c_float, c_int, c_uint, c_void};
use std::cell::Cell;

thread_local!(static LAST: Cell<CUresult> = const { Cell::new(0) });

/// Run a runtime call: initialise lazily (device 0 current if none is), remember the error for
/// `cudaGetLastError`.
fn rt(name: &str, f: impl FnOnce() -> Result<(), Fail>) -> CUresult {
    let code = entry(name, || {
        // SAFETY: cuInit has no pointer arguments.
        unsafe { driver::cuInit(0) };
        if current().is_err() {
            set_current(0);
        }
        f()
    });
    if code != 0 {
        LAST.with(|l| l.set(code));
    }
    code
}

#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(d: c_int) -> CUresult {
    rt("cudaSetDevice", || {
        if !(0..config().devices).contains(&d) {
            return Err(Fail::new(CUDA_ERROR_INVALID_DEVICE, format!("device {d} does not exist")));
        }
        set_current(d);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(d: *mut c_int) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    rt("cudaGetDevice", || current().and_then(|c| unsafe { put(d, c, "device") }))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(n: *mut c_int) -> CUresult {
    // SAFETY: as above.
    rt("cudaGetDeviceCount", || unsafe { put(n, config().devices, "count") })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(p: *mut *mut c_void, n: usize) -> CUresult {
    // SAFETY: as above.
    rt("cudaMalloc", || alloc(n).and_then(|d| unsafe { put(p, d as *mut c_void, "devPtr") }))
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(p: *mut c_void) -> CUresult {
    rt("cudaFree", || if p.is_null() { Ok(()) } else { driver::free(p as u64) })
}

/// `kind`, with 4 (`cudaMemcpyDefault`) resolved from the pointers.
fn resolve(dst: *mut c_void, src: *const c_void, kind: c_int) -> c_int {
    let dev = |p: usize| mem::range(p as u64).is_some();
    if kind != 4 {
        return kind;
    }
    match (dev(src as usize), dev(dst as usize)) {
        (false, false) => 0,
        (false, true) => 1,
        (true, false) => 2,
        (true, true) => 3,
    }
}

/// A copy of `kind` (0 host→host, 1 host→device, 2 device→host, 3 device→device, 4 inferred).
fn copy(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int, s: usize) -> Result<(), Fail> {
    match resolve(dst, src, kind) {
        0 => {
            stream::get(s)?.sync()?;
            // SAFETY: CUDA's contract: host buffers of n bytes.
            unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), n) };
            Ok(())
        }
        1 => copy_async(dst as u64, src as usize, n, true, s, "cudaMemcpy (host to device)"),
        2 => copy_async(src as u64, dst as usize, n, false, s, "cudaMemcpy (device to host)"),
        3 => copy_d2d_async(dst as u64, src as u64, n, s),
        k => Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("cudaMemcpyKind {k}"))),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int) -> CUresult {
    rt("cudaMemcpy", || match resolve(dst, src, kind) {
        // from pageable memory it returns before the data reaches the device, as CUDA's does
        1 => driver::copy_h2d_sync(dst as u64, src as usize, n, "cudaMemcpy (host to device)"),
        _ => copy(dst, src, n, kind, 0).and_then(|_| sync_default()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    s: usize,
) -> CUresult {
    rt("cudaMemcpyAsync", || copy(dst, src, n, kind, s))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemset(p: *mut c_void, v: c_int, n: usize) -> CUresult {
    rt("cudaMemset", || driver::memset_sync(p as u64, v as u8, n))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync(p: *mut c_void, v: c_int, n: usize, s: usize) -> CUresult {
    rt("cudaMemsetAsync", || memset_async(p as u64, v as u8, n, s))
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(s: *mut usize) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    rt("cudaStreamCreate", || unsafe { put(s, stream::create(0), "stream") })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(s: *mut usize, flags: c_uint) -> CUresult {
    // SAFETY: as above.
    rt("cudaStreamCreateWithFlags", || unsafe { put(s, stream::create(flags), "stream") })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(s: usize) -> CUresult {
    rt("cudaStreamSynchronize", || stream::get(s)?.sync())
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(s: usize) -> CUresult {
    rt("cudaStreamDestroy", || stream::destroy(s))
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(e: *mut usize) -> CUresult {
    // SAFETY: CUDA's contract for the out-pointer.
    rt("cudaEventCreate", || unsafe { put(e, event_create(), "event") })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(e: *mut usize, _flags: c_uint) -> CUresult {
    // SAFETY: as above.
    rt("cudaEventCreateWithFlags", || unsafe { put(e, event_create(), "event") })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventRecord(e: usize, s: usize) -> CUresult {
    rt("cudaEventRecord", || {
        event(e)?.record(&*stream::get(s)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventSynchronize(e: usize) -> CUresult {
    rt("cudaEventSynchronize", || event(e)?.sync())
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventDestroy(e: usize) -> CUresult {
    rt("cudaEventDestroy", || event_destroy(e))
}

/// Elapsed time between two reached events, in ms (of the simulator's clock: never a GPU figure).
#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(ms: *mut c_float, a: usize, b: usize) -> CUresult {
    rt("cudaEventElapsedTime", || {
        let (ta, tb) = (event(a)?.time(), event(b)?.time());
        let (Some(ta), Some(tb)) = (ta, tb) else {
            return Err(Fail::new(crate::CUDA_ERROR_NOT_READY, "an event was not reached yet"));
        };
        let d = if tb >= ta { (tb - ta).as_secs_f32() } else { -(ta - tb).as_secs_f32() };
        // SAFETY: CUDA's contract for the out-pointer.
        unsafe { put(ms, d * 1e3, "ms") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> CUresult {
    rt("cudaDeviceSynchronize", stream::sync_all)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetLastError() -> CUresult {
    LAST.with(|l| l.replace(0))
}

#[no_mangle]
pub unsafe extern "C" fn cudaPeekAtLastError() -> CUresult {
    LAST.with(Cell::get)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorString(code: CUresult) -> *const c_char {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: an out-pointer of ours.
    unsafe { driver::cuGetErrorName(code, &mut p) };
    p
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorName(code: CUresult) -> *const c_char {
    // SAFETY: as above.
    unsafe { cudaGetErrorString(code) }
}
