//! # oxccl-cuda-sim: a strict simulated CUDA driver for testing oxccl without a GPU
//!
//! Built as `liboxccl_cuda_sim.so` (SONAME `libcuda.so.1`); put `target/<profile>/cuda-sim` first on
//! `LD_LIBRARY_PATH` and a process loads it in place of NVIDIA's driver. It implements the driver
//! entry points oxccl and the C ABI call, and a minimal runtime (`cuda*`, also exported as
//! `libcudart.so.12`) for C test programs. It proves oxccl's logic (stream order, the event gate,
//! host-function hand-offs, IPC handle exchange, staging, the one-shot kernels), never its speed:
//! nothing may quote a GPU figure from it.
//!
//! Strict where a GPU is:
//! - device memory is mapped `PROT_NONE` at its device address, so host code that dereferences a
//!   device pointer crashes (the copy engine and kernels reach it through a second mapping);
//! - every stream is an in-order queue with its own worker thread: copies, kernels, host
//!   functions and event records run later than the calls that enqueue them
//!   (`OXCCL_CUDA_SIM_DELAY_US=N` adds a random delay of up to N µs before each);
//! - the legacy default stream synchronises implicitly with blocking streams, and the
//!   "synchronous" `cuMemcpyHtoD` from pageable memory and `cuMemsetD8` return before the device
//!   has the data (queued on the legacy stream), as CUDA's do;
//! - host functions of every stream run on one thread, one at a time (so one that blocks holds
//!   back the others, as on a GPU);
//! - `cuStreamWaitValue32` waits on device or mapped pinned memory, and `cuIpcOpenMemHandle` is
//!   an error while such a wait is pending in the process (the driver may wait for the device
//!   there: the deadlock PyTorch's DDP hit on an H200);
//! - kernels are the host build of oxccl's generated kernel source (`cuda/kernels/
//!   oxccl_kernels.cu`), looked up by name in the module `cuModuleLoadData` accepted;
//! - use after free, double free, an IPC handle opened twice in one process and copies out of
//!   bounds are errors that name the address;
//! - allocations are memfds, so `cuIpcGetMemHandle`/`cuIpcOpenMemHandle` map another process's
//!   memory (through `/proc/<pid>/fd`), as forked ranks on a GPU do.
//!
//! Settings: `OXCCL_CUDA_SIM_DEVICES` (default 1), `OXCCL_CUDA_SIM_MEM` (bytes per device,
//! default 4 GiB), `OXCCL_CUDA_SIM_CC` (compute capability, default `9.0`),
//! `OXCCL_CUDA_SIM_SMS` (multiprocessors, default 4), `OXCCL_CUDA_SIM_DELAY_US`.
//! An entry point it does not implement is a missing symbol: the loader, or cudarc, names it.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // every export's contract is CUDA's, stated on each

mod driver;
mod kernels;
mod mem;
mod runtime;
mod stream;

use std::sync::OnceLock;

pub(crate) type CUresult = i32;
pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub(crate) const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_ALREADY_MAPPED: CUresult = 208;
pub(crate) const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub(crate) const CUDA_ERROR_NOT_READY: CUresult = 600;
pub(crate) const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub(crate) const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub(crate) const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;

/// A failed call or device task: CUDA's code and what went wrong.
#[derive(Clone, Debug)]
pub(crate) struct Fail {
    pub code: CUresult,
    pub message: String,
}

impl Fail {
    pub fn new(code: CUresult, message: impl Into<String>) -> Fail {
        Fail { code, message: message.into() }
    }
}

/// CUDA's name of a result code.
pub(crate) fn error_name(code: CUresult) -> &'static str {
    match code {
        CUDA_SUCCESS => "CUDA_SUCCESS",
        CUDA_ERROR_INVALID_VALUE => "CUDA_ERROR_INVALID_VALUE",
        CUDA_ERROR_OUT_OF_MEMORY => "CUDA_ERROR_OUT_OF_MEMORY",
        CUDA_ERROR_NOT_INITIALIZED => "CUDA_ERROR_NOT_INITIALIZED",
        CUDA_ERROR_INVALID_DEVICE => "CUDA_ERROR_INVALID_DEVICE",
        CUDA_ERROR_INVALID_IMAGE => "CUDA_ERROR_INVALID_IMAGE",
        CUDA_ERROR_INVALID_CONTEXT => "CUDA_ERROR_INVALID_CONTEXT",
        CUDA_ERROR_ALREADY_MAPPED => "CUDA_ERROR_ALREADY_MAPPED",
        CUDA_ERROR_INVALID_HANDLE => "CUDA_ERROR_INVALID_HANDLE",
        CUDA_ERROR_NOT_FOUND => "CUDA_ERROR_NOT_FOUND",
        CUDA_ERROR_NOT_READY => "CUDA_ERROR_NOT_READY",
        CUDA_ERROR_ILLEGAL_ADDRESS => "CUDA_ERROR_ILLEGAL_ADDRESS",
        CUDA_ERROR_LAUNCH_FAILED => "CUDA_ERROR_LAUNCH_FAILED",
        CUDA_ERROR_NOT_SUPPORTED => "CUDA_ERROR_NOT_SUPPORTED",
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        _ => "CUDA_ERROR_UNKNOWN",
    }
}

/// The simulated machine.
pub(crate) struct SimConfig {
    pub devices: i32,
    pub mem_bytes: usize,
    pub cc: (i32, i32),
    pub sms: i32,
    pub delay_us: u64,
}

pub(crate) fn config() -> &'static SimConfig {
    static C: OnceLock<SimConfig> = OnceLock::new();
    C.get_or_init(|| {
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<u64>().ok());
        let cc = std::env::var("OXCCL_CUDA_SIM_CC")
            .ok()
            .and_then(|v| {
                let (a, b) = v.trim().split_once('.')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .unwrap_or((9, 0));
        SimConfig {
            devices: num("OXCCL_CUDA_SIM_DEVICES").unwrap_or(1).clamp(1, 64) as i32,
            mem_bytes: num("OXCCL_CUDA_SIM_MEM").unwrap_or(4 << 30) as usize,
            cc,
            sms: num("OXCCL_CUDA_SIM_SMS").unwrap_or(4).clamp(1, 1024) as i32,
            delay_us: num("OXCCL_CUDA_SIM_DELAY_US").unwrap_or(0),
        }
    })
}

/// Run an entry point: its failure is printed (loudly, naming it) and returned as the code; a
/// sticky device failure is returned by every later call; a panic never crosses into C.
pub(crate) fn entry(name: &str, f: impl FnOnce() -> Result<(), Fail>) -> CUresult {
    let queries =
        ["cuGetErrorName", "cuGetErrorString", "cudaGetErrorString", "cudaGetErrorName", "cuDriverGetVersion"];
    if !queries.contains(&name) {
        if let Some(s) = stream::sticky() {
            return s.code;
        }
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(f)) => {
            if f.code != CUDA_ERROR_NOT_READY {
                eprintln!("oxccl-cuda-sim: {name}: {} ({})", f.message, error_name(f.code));
            }
            f.code
        }
        Err(_) => {
            eprintln!("oxccl-cuda-sim: {name}: internal error (panic in the simulator)");
            999
        }
    }
}

/// Write `v` through an out-pointer of the caller.
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (CUDA's contract for out-parameters).
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("{what} is NULL")));
    }
    // SAFETY: non-null, valid for writes per the contract.
    unsafe { p.write(v) };
    Ok(())
}

/// A marker a process can look up to know its CUDA driver is this simulator (oxccl-perf labels
/// its device figures "simulated" then): returns 1.
#[no_mangle]
pub extern "C" fn cuOxcclSimulated() -> i32 {
    1
}
