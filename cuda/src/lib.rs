//! # oxccl-cuda: oxccl on NVIDIA GPUs
//!
//! - [`kernels`]: the copy, reduce and fused copy-reduce kernels, generated as CUDA C from one
//!   table of every type and op, checked bit for bit against the host reductions on the host.
//! - [`nvrtc`]: run-time compilation with NVRTC (cached per device and architecture), with the
//!   PTX embedded as the fallback.
//! - [`driver`]: the CUDA driver, probed before the first call: a machine without `libcuda`
//!   gets [`oxccl::ErrorKind::Unavailable`], never a panic (cudarc's bindings panic on a missing
//!   library or symbol; every entry of this crate probes first and runs the bindings behind
//!   `catch_unwind`).
//! - [`device`]: device buffers on the caller's stream ([`device::DeviceComm`]), executed by
//!   CUDA IPC one-shot kernels between ranks of one host and by staging through pinned host
//!   memory over oxccl's host transports otherwise.
//!
//! Dependencies: `cudarc` (raw `sys` bindings with dynamic loading; see Cargo.toml for why),
//! `libc` (dlopen of an explicit NVRTC path, `pid` checks), the core `oxccl` (schedules, tuner
//! and host transports that the staged path runs on).
//!
//! `unsafe` is confined to this leaf crate's FFI calls, each with a `// SAFETY:` comment.

pub mod bench;
pub mod device;
pub mod driver;
mod ipc;
pub mod kernels;
pub mod nvrtc;
pub mod phases;

pub use device::{DevMem, DeviceComm, DeviceSlice, HostComm, UserStream};
pub use driver::{classify, probe, Memory};

#[cfg(test)]
mod tests {
    /// On a machine without a GPU (CI), every entry fails cleanly with `Unavailable`; with one,
    /// the probe succeeds. Either way nothing panics.
    #[test]
    fn the_probe_is_clean_either_way() {
        match super::probe() {
            Ok(()) => eprintln!("CUDA is available here"),
            Err(e) => {
                assert_eq!(e.kind, oxccl::ErrorKind::Unavailable, "{e}");
                assert!(e.message.contains("CUDA is unavailable"), "{e}");
                // pointers are host memory when there is no CUDA
                assert_eq!(super::classify(0x7f00_0000_0000), super::Memory::Host);
                let c = oxccl::Communicator::init_all(1).unwrap().pop().unwrap();
                let err = super::DeviceComm::new(std::sync::Arc::new(c), 0).err().expect("no device here");
                assert_eq!(err.kind, oxccl::ErrorKind::Unavailable);
                assert!(super::driver::driver_version().is_err());
                // no GPUDirect RDMA export without a driver: a clean error
                let e = super::driver::dmabuf_export(0x7f00_0000_0000, 4096).expect_err("exported");
                assert!(matches!(e.kind, oxccl::ErrorKind::InvalidArgument | oxccl::ErrorKind::Unavailable), "{e}");
            }
        }
    }
}
