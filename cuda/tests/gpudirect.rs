//! GPUDirect RDMA, for a machine with a GPU and an RDMA device (`transports/rdma/hw-check.sh`
//! runs it): device memory exported as a dma-buf, registered with the verbs backend, and
//! RDMA-written by the adapter straight from the GPU into host memory over a queue pair to this
//! process. Skipped where either is missing (here: both), unless `OXCCL_REQUIRE_GPUDIRECT`.

use oxccl_cuda::driver;
use oxccl_transport_rdma::{verbs, Completion};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

fn skip(why: &str) {
    assert!(std::env::var_os("OXCCL_REQUIRE_GPUDIRECT").is_none(), "GPUDirect RDMA required: {why}");
    eprintln!("skipped: {why}");
}

#[test]
fn the_adapter_reads_device_memory() {
    if let Err(e) = driver::probe() {
        return skip(&e.to_string());
    }
    let fab = match verbs::open_ib(1, "127.0.0.1".parse().unwrap(), [1; 32], &oxccl::Config::from_env().rdma.ib) {
        Ok(f) => f,
        Err(e) => return skip(&e.to_string()),
    };
    driver::set_device(0).unwrap();
    let n = 1 << 20;
    let pattern: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let dev = driver::DeviceBuffer::from_host(&pattern).unwrap();
    let (fd, offset, _) = match driver::dmabuf_export(dev.ptr(), n) {
        Ok(x) => x,
        Err(e) => return skip(&e.to_string()),
    };
    let src = match fab.register_dmabuf(fd.as_raw_fd(), offset, n, dev.ptr()) {
        Ok(r) => r,
        Err(e) => return skip(&e.to_string()),
    };
    let mut host = vec![0u8; n];
    // SAFETY: `host` outlives its registration (deregistered below, before it is dropped).
    let dst = unsafe { fab.register(host.as_mut_ptr(), n) }.unwrap();
    let dest = fab.insert_peer(&fab.address(0).unwrap()).unwrap();
    // SAFETY: the device buffer stays allocated until the write's completion is read.
    let posted = unsafe { fab.write(0, dev.ptr() as *const u8, n, src.desc, dest, dst.remote_base, dst.key, None, 42) };
    assert!(posted.unwrap(), "the send queue is empty, yet full");
    let t = Instant::now();
    let mut done: Vec<Completion> = Vec::new();
    while !done.iter().any(|c| c.token == 42) {
        fab.poll(&mut done).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "no completion");
    }
    let c = done.iter().find(|c| c.token == 42).unwrap();
    assert!(c.error.is_none(), "{:?}", c.error);
    fab.deregister(&src);
    fab.deregister(&dst);
    assert!(host == pattern, "the bytes the adapter wrote differ from the device buffer's");
}
