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

mod ipc;
mod launch;
mod memory;
mod streams;

pub(crate) use memory::{
    alloc, copy_async, copy_d2d_async, copy_h2d_sync, free, memset_async, memset_sync, sync_default,
};
pub(crate) use streams::{event, event_create, event_destroy};

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
