//! Device bandwidth probes for `oxccl-perf --device` and `gpu-check.sh`: device-to-device memcpy
//! and the reduce kernel on the same buffers, so the kernel is reported as a fraction of memcpy.

use crate::driver::{self, DeviceBuffer, Stream};
use crate::kernels::{self, KernelArgs};
use oxccl::{DataType, ReduceOp, Result};
use std::time::Instant;

/// Bandwidths in GB/s, counting bytes read plus bytes written.
#[derive(Debug, Clone, Copy)]
pub struct KernelBw {
    /// `cuMemcpyDtoDAsync` of `bytes` (2 × bytes moved).
    pub memcpy: f64,
    /// `out = a + b` by oxccl's reduce kernel (3 × bytes moved).
    pub reduce: f64,
}

/// Measure memcpy and the `dtype` sum kernel on `bytes`-sized buffers of device `ord`.
pub fn kernel_bandwidth(ord: i32, dtype: DataType, bytes: usize, iters: usize) -> Result<KernelBw> {
    driver::set_device(ord)?;
    let md = driver::module(ord)?;
    let s = Stream::new()?;
    let (a, b, c) = (DeviceBuffer::zeroed(bytes)?, DeviceBuffer::zeroed(bytes)?, DeviceBuffer::zeroed(bytes)?);
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        f()?;
        s.sync()?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        s.sync()?;
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    };
    // SAFETY: three allocations of `bytes` on this device, and our own stream.
    let t_copy = time(&|| unsafe { driver::copy_d2d(c.ptr(), a.ptr(), bytes, s.raw()) })?;
    let mut args = KernelArgs { nin: 2, nout: 1, ..KernelArgs::default() };
    args.inputs[0] = a.ptr();
    args.inputs[1] = b.ptr();
    args.outputs[0] = c.ptr();
    args.n = (bytes / dtype.size()) as u64;
    let name = kernels::reduce_kernel_name(dtype, ReduceOp::Sum);
    // SAFETY: as above; n elements fit each buffer.
    let t_red = time(&|| unsafe { md.launch(&name, &args, dtype.size(), s.raw()) })?;
    Ok(KernelBw { memcpy: 2.0 * bytes as f64 / t_copy / 1e9, reduce: 3.0 * bytes as f64 / t_red / 1e9 })
}
