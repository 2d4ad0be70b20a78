//! Streams and events: creation, order, queries, capture (refused), memory-value waits and
//! host functions.

use super::memory::device_mapped;
use super::*;

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

/// Waits on a memory value enqueued and not yet met, in this process.
pub(super) static PARKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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
