//! CUDA IPC: memory handles exported, opened in another process and closed.

use super::streams::PARKED;
use super::*;

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
