//! `--device`: the same table on GPU buffers, through oxccl-cuda's `DeviceComm` (feature
//! `cuda`; without it `--device` is a clean Unavailable naming the feature).

#[cfg(feature = "cuda")]
pub(crate) use with_cuda::*;
#[cfg(not(feature = "cuda"))]
pub(crate) use without_cuda::*;

#[cfg(not(feature = "cuda"))]
mod without_cuda {
    use super::super::{Opts, Result1};
    use oxccl::{Communicator, DataType, Error, ErrorKind, ReduceOp};

    /// No device context exists without CUDA: [`DevCtx::new`] always refuses.
    pub(crate) enum DevCtx {}

    impl DevCtx {
        pub(crate) fn new(_comm: &std::sync::Arc<Communicator>, _o: &Opts) -> oxccl::Result<DevCtx> {
            Err(Error::new(ErrorKind::Unavailable, "this oxccl-perf was built without the `cuda` feature"))
        }
        pub(crate) fn phases(&self) -> String {
            match *self {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bench_device(
        d: &DevCtx,
        _c: &Communicator,
        _o: &Opts,
        _name: &str,
        _dt: DataType,
        _op: ReduceOp,
        _count: usize,
        _root: usize,
        _inplace: bool,
    ) -> oxccl::Result<Option<Result1>> {
        match *d {}
    }
}

#[cfg(feature = "cuda")]
mod with_cuda {
    use super::super::*;

    /// Device buffers for `--device`: one device communicator, a stream, buffers for the largest size.
    pub(crate) struct DevCtx {
        dc: oxccl_cuda::DeviceComm,
        stream: oxccl_cuda::driver::Stream,
        a: oxccl_cuda::driver::DeviceBuffer,
        b: oxccl_cuda::driver::DeviceBuffer,
    }

    impl DevCtx {
        pub(crate) fn new(comm: &std::sync::Arc<Communicator>, o: &Opts) -> oxccl::Result<DevCtx> {
            // ranks share the GPUs round-robin (several ranks per GPU is allowed)
            oxccl_cuda::probe()?;
            let ngpu = std::env::var("OXCCL_PERF_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(1).max(1);
            let ord = (comm.rank() % ngpu) as i32;
            let dc = oxccl_cuda::DeviceComm::new(std::sync::Arc::new(comm.clone()), ord)?;
            oxccl_cuda::driver::set_device(ord)?;
            let bytes = o.max + 4096;
            if comm.rank() == 0 {
                let bw = oxccl_cuda::bench::kernel_bandwidth(ord, DataType::F32, o.max.max(1 << 20), 20)?;
                let bw16 = oxccl_cuda::bench::kernel_bandwidth(ord, DataType::BF16, o.max.max(1 << 20), 20)?;
                println!(
                "# Device {ord}: memcpy {:.1} GB/s; reduce kernel f32 sum {:.1} GB/s ({:.0}% of memcpy), bf16 sum {:.1} GB/s ({:.0}%) at {} bytes",
                bw.memcpy,
                bw.reduce,
                100.0 * bw.reduce / bw.memcpy,
                bw16.reduce,
                100.0 * bw16.reduce / bw16.memcpy,
                o.max.max(1 << 20)
            );
                if oxccl_cuda::driver::simulated() {
                    println!(
                    "# Device {ord}: SIMULATED (oxccl's simulated CUDA driver, cuda/sim): these bandwidths and the table's \
                     times are the simulator's, never GPU figures; the #wrong column is what it proves"
                );
                }
            }
            Ok(DevCtx {
                dc,
                stream: oxccl_cuda::driver::Stream::new()?,
                a: oxccl_cuda::driver::DeviceBuffer::zeroed(bytes)?,
                b: oxccl_cuda::driver::DeviceBuffer::zeroed(bytes)?,
            })
        }
    }

    impl DevCtx {
        /// Where this process's device worker spent its time (mean per operation, per phase).
        pub(crate) fn phases(&self) -> String {
            oxccl_cuda::phases::report()
        }
    }

    /// The device twin of `bench_one`: the same operation on device buffers, through `DeviceComm`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bench_device(
        d: &DevCtx,
        c: &Communicator,
        o: &Opts,
        name: &str,
        dt: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
        inplace: bool,
    ) -> oxccl::Result<Option<Result1>> {
        use oxccl_cuda::DevMem;
        let (n, r) = (c.size(), c.rank());
        let es = dt.size();
        let ops: Vec<(OpDesc, DevMem)>;
        let (input, want, out_at): (Vec<u8>, Vec<u8>, usize);
        if name == "sendrecv" {
            if inplace {
                return Ok(None);
            }
            input = coll_input(Coll::Send, dt, op, n, r, count, r, 1);
            want = coll_input(Coll::Send, dt, op, n, (r + n - 1) % n, count, 0, 1);
            out_at = 0;
            ops = vec![
                (
                    OpDesc { coll: Coll::Send, dtype: dt, op: ReduceOp::Sum, count, root: (r + 1) % n },
                    DevMem::Split { send: d.a.ptr(), send_len: count * es, recv: 0, recv_len: 0 },
                ),
                (
                    OpDesc { coll: Coll::Recv, dtype: dt, op: ReduceOp::Sum, count, root: (r + n - 1) % n },
                    DevMem::Split { send: 0, send_len: 0, recv: d.b.ptr(), recv_len: count * es },
                ),
            ];
        } else {
            let coll = coll_of(name);
            let (ni, no) = coll.buffer_counts(n, r, count, root);
            input = coll_input(coll, dt, op, n, r, count, root, 1);
            want = expected_output(coll, dt, op, n, r, count, root, 1);
            let desc = OpDesc { coll, dtype: dt, op, count, root };
            if inplace {
                let Some((io, oo, len)) = inplace_layout(coll, n, r, count, root) else { return Ok(None) };
                out_at = oo * es;
                ops =
                    vec![(desc, DevMem::InPlace { base: d.a.ptr(), len: len * es, in_off: io * es, out_off: oo * es })];
            } else {
                out_at = 0;
                ops = vec![(
                    desc,
                    DevMem::Split { send: d.a.ptr(), send_len: ni * es, recv: d.b.ptr(), recv_len: no * es },
                )];
            }
        }
        let in_at = match ops[0].1 {
            DevMem::InPlace { in_off, .. } => in_off,
            _ => 0,
        };
        let load = || -> oxccl::Result<()> {
            let mut buf = vec![0u8; in_at + input.len()];
            buf[in_at..].copy_from_slice(&input);
            d.a.load(&buf)?;
            d.b.load(&[])
        };
        load()?;
        let run = || d.dc.enqueue_on(ops.clone(), &[&d.a, &d.b], &d.stream);
        let us_per = timed(c, o, run, || d.stream.sync())?;
        if let Some(e) = d.dc.error() {
            return Err(e);
        }
        let mut wrong = 0;
        if o.check {
            load()?;
            run()?;
            d.stream.sync()?;
            if let Some(e) = d.dc.error() {
                return Err(e);
            }
            let got = if inplace { d.a.to_host()? } else { d.b.to_host()? };
            wrong = count_wrong(dt, &got[out_at..out_at + want.len()], &want);
        }
        Ok(Some(Result1 { us: us_per, wrong }))
    }
}
