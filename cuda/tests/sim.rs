//! What only a device can get wrong, under oxccl's simulated CUDA driver (`cuda/sim`; `.ci/run`
//! puts `target/release/cuda-sim` first on `LD_LIBRARY_PATH`). Without the simulator (no
//! driver, or a real GPU) each test says so and passes: the strictness checks are the
//! simulator's, and `tests/device.rs` is the one that also runs on a GPU.

use cudarc::driver::sys as cu;
use oxccl::exact::{coll_input, expected_output};
use oxccl::{Coll, Communicator, DataType, OpDesc, ReduceOp};
use oxccl_cuda::driver::{self, DeviceBuffer, Stream};
use oxccl_cuda::{DevMem, DeviceComm, HostComm, UserStream};
use std::sync::Arc;

/// Under the simulated driver: the lock that runs this file's tests one at a time (a test that
/// frees memory and checks that using it fails needs nobody else to allocate the same addresses
/// meanwhile); `None` elsewhere (skipped).
fn sim() -> Option<std::sync::MutexGuard<'static, ()>> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !driver::simulated() {
        eprintln!("not under the simulated CUDA driver: skipped");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The test binary re-run as a child with `OXCCL_SIM_CHILD=<what>`.
fn child(what: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([what, "--exact", "--nocapture", "--test-threads=1"])
        .env("OXCCL_SIM_CHILD", what)
        .output()
        .unwrap()
}

#[test]
fn a_host_dereference_of_a_device_pointer_crashes() {
    if std::env::var("OXCCL_SIM_CHILD").as_deref() == Ok("a_host_dereference_of_a_device_pointer_crashes") {
        driver::set_device(0).unwrap();
        let b = DeviceBuffer::zeroed(4096).unwrap();
        // SAFETY: deliberately not: a device address read by host code must fault.
        let v = unsafe { std::ptr::read_volatile(b.ptr() as *const u8) };
        println!("READ {v}");
        return;
    }
    let Some(_serial) = sim() else { return };
    let out = child("a_host_dereference_of_a_device_pointer_crashes");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stdout));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("READ"));
}

#[test]
fn misuse_is_an_error_naming_the_address() {
    let Some(_serial) = sim() else { return };
    driver::set_device(0).unwrap();
    let mut p = 0u64;
    // SAFETY: plain driver calls on memory of this test.
    unsafe {
        assert_eq!(cu::cuMemAlloc_v2(&mut p, 1000), cu::CUresult::CUDA_SUCCESS);
        let host = [7u8; 2000];
        // out of bounds
        assert_eq!(cu::cuMemcpyHtoD_v2(p, host.as_ptr().cast(), 2000), cu::CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cu::cuMemcpyHtoD_v2(p + 500, host.as_ptr().cast(), 500), cu::CUresult::CUDA_SUCCESS);
        // freeing the middle, then twice
        assert_eq!(cu::cuMemFree_v2(p + 8), cu::CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cu::cuMemFree_v2(p), cu::CUresult::CUDA_SUCCESS);
        assert_eq!(cu::cuMemFree_v2(p), cu::CUresult::CUDA_ERROR_INVALID_VALUE);
        // use after free
        let mut back = [0u8; 8];
        assert_eq!(cu::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, 8), cu::CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // an IPC handle of this process's own memory cannot be opened here (CUDA's rule)
    let b = DeviceBuffer::zeroed(4096).unwrap();
    let (h, _) = driver::ipc_handle(b.ptr()).unwrap();
    assert!(driver::ipc_open(&h).is_err());
}

/// A one-rank device communicator over a fresh stream.
fn device_comm(c: Communicator) -> (Arc<DeviceComm>, Stream) {
    let comm = Arc::new(c);
    let dc = Arc::new(DeviceComm::new(Arc::new(comm) as Arc<dyn HostComm>, 0).unwrap());
    driver::set_device(0).unwrap();
    (dc, Stream::new().unwrap())
}

/// Run `body(rank, device communicator, stream)` on 2 ranks of this process, a thread each.
fn two_ranks(body: impl Fn(usize, &DeviceComm, &Stream) + Sync) {
    let comms = Communicator::init_all(2).unwrap();
    std::thread::scope(|s| {
        for c in comms {
            let body = &body;
            s.spawn(move || {
                let r = c.rank();
                let (dc, st) = device_comm(c);
                body(r, &dc, &st);
            });
        }
    });
}

#[test]
fn stream_order_is_kept_before_and_after_a_collective() {
    let Some(_serial) = sim() else { return };
    // 2 ranks on one GPU: each memsets its input on its stream, enqueues the all-reduce and then
    // copies the result out, all without waiting in between: only stream order makes it right
    two_ranks(|r, dc, st| {
        let n = 1 << 16;
        let send = DeviceBuffer::zeroed(n).unwrap();
        let recv = DeviceBuffer::zeroed(n).unwrap();
        let mut out = vec![0u8; n];
        // SAFETY: buffers of this GPU and a host buffer, all alive until the sync below.
        unsafe {
            assert_eq!(cu::cuMemsetD8Async(send.ptr(), r as u8 + 1, n, st.raw()), cu::CUresult::CUDA_SUCCESS);
            let d = OpDesc { coll: Coll::AllReduce, dtype: DataType::U8, op: ReduceOp::Sum, count: n, root: 0 };
            let m = DevMem::Split { send: send.ptr(), send_len: n, recv: recv.ptr(), recv_len: n };
            dc.enqueue(vec![(d, m)], UserStream(st.raw() as usize)).unwrap();
            driver::copy_d2h(out.as_mut_ptr(), recv.ptr(), n, st.raw()).unwrap();
        }
        st.sync().unwrap();
        assert!(out.iter().all(|&b| b == 3), "rank {r}: {:?}", &out[..8]);
    });
}

#[test]
fn two_communicators_on_two_streams() {
    let Some(_serial) = sim() else { return };
    let (a, b) = (Communicator::init_all(2).unwrap(), Communicator::init_all(2).unwrap());
    std::thread::scope(|s| {
        for (ca, cb) in a.into_iter().zip(b) {
            s.spawn(move || {
                let r = ca.rank();
                let (da, sa) = device_comm(ca);
                let (db, sb) = device_comm(cb);
                let n = 4099;
                let (dt, op) = (DataType::F32, ReduceOp::Sum);
                let input = coll_input(Coll::AllReduce, dt, op, 2, r, n, 0, 3);
                let want = expected_output(Coll::AllReduce, dt, op, 2, r, n, 0, 3);
                let bufs: Vec<(DeviceBuffer, DeviceBuffer)> = (0..2)
                    .map(|_| (DeviceBuffer::from_host(&input).unwrap(), DeviceBuffer::zeroed(input.len()).unwrap()))
                    .collect();
                for ((dc, st), (send, recv)) in [(&da, &sa), (&db, &sb)].into_iter().zip(&bufs) {
                    let d = OpDesc { coll: Coll::AllReduce, dtype: dt, op, count: n, root: 0 };
                    let m = DevMem::Split {
                        send: send.ptr(),
                        send_len: input.len(),
                        recv: recv.ptr(),
                        recv_len: input.len(),
                    };
                    // SAFETY: buffers of this GPU, alive until the syncs below.
                    unsafe { dc.enqueue(vec![(d, m)], UserStream(st.raw() as usize)).unwrap() };
                }
                sa.sync().unwrap();
                sb.sync().unwrap();
                for (_, recv) in &bufs {
                    assert_eq!(oxccl::exact::count_wrong(dt, &recv.to_host().unwrap(), &want), 0, "rank {r}");
                }
            });
        }
    });
}

#[test]
fn a_stream_being_captured_is_refused_clearly() {
    let Some(_serial) = sim() else { return };
    let c = Communicator::init_all(1).unwrap().pop().unwrap();
    let (dc, st) = device_comm(c);
    let b = DeviceBuffer::zeroed(64).unwrap();
    // SAFETY: a live stream of this test.
    unsafe {
        assert_eq!(
            cu::cuStreamBeginCapture_v2(st.raw(), cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL),
            cu::CUresult::CUDA_SUCCESS
        );
    }
    let d = OpDesc { coll: Coll::AllReduce, dtype: DataType::F32, op: ReduceOp::Sum, count: 16, root: 0 };
    let m = DevMem::Split { send: b.ptr(), send_len: 64, recv: b.ptr(), recv_len: 64 };
    // SAFETY: a buffer of this GPU.
    let e = unsafe { dc.enqueue(vec![(d, m)], UserStream(st.raw() as usize)) }.unwrap_err();
    assert_eq!(e.kind, oxccl::ErrorKind::InvalidUsage, "{e}");
    assert!(e.to_string().contains("captured"), "{e}");
    let mut g = std::ptr::null_mut();
    // SAFETY: ends the capture begun above.
    unsafe { cu::cuStreamEndCapture(st.raw(), &mut g) };
}

/// Freeing a buffer while a collective on it is enqueued: `cuMemFree` synchronises the device
/// (CUDA's rule), so the free waits until the collective has run, and the collective is right.
/// (Hence the hazard docs/pytorch.md names: a rank that frees while its peer in the same process
/// has not enqueued yet waits for that peer.)
#[test]
fn freeing_a_buffer_with_a_collective_pending_waits_for_it() {
    let Some(_serial) = sim() else { return };
    two_ranks(|r, dc, st| {
        let n = 1 << 14;
        let input = vec![r as u8 + 1; n];
        let send = DeviceBuffer::from_host(&input).unwrap();
        let recv = DeviceBuffer::zeroed(n).unwrap();
        let d = OpDesc { coll: Coll::AllReduce, dtype: DataType::U8, op: ReduceOp::Sum, count: n, root: 0 };
        let m = DevMem::Split { send: send.ptr(), send_len: n, recv: recv.ptr(), recv_len: n };
        // a first collective makes the IPC windows (its call waits for every rank)
        // SAFETY: buffers of this GPU, alive until the sync.
        unsafe { dc.enqueue(vec![(d, m)], UserStream(st.raw() as usize)).unwrap() };
        st.sync().unwrap();
        if r == 1 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        // SAFETY: buffers of this GPU; `send` is freed below while the operation may be
        // pending, which is what is tested: the free waits for it.
        unsafe { dc.enqueue(vec![(d, m)], UserStream(st.raw() as usize)).unwrap() };
        let t = std::time::Instant::now();
        drop(send); // cuMemFree
        if r == 0 {
            assert!(t.elapsed() >= std::time::Duration::from_millis(150), "the free did not wait");
        }
        st.sync().unwrap();
        assert!(recv.to_host().unwrap().iter().all(|&b| b == 3), "rank {r}");
    });
}

/// Another process's allocation opened twice in one process is an error (CUDA's rule; oxccl
/// caches its mappings to open each once), and the mapping shows what the owner wrote.
#[test]
fn an_ipc_handle_opened_twice_in_one_process_is_an_error() {
    const T: &str = "an_ipc_handle_opened_twice_in_one_process_is_an_error";
    if std::env::var("OXCCL_SIM_CHILD").as_deref() == Ok(T) {
        driver::set_device(0).unwrap();
        let hex = std::env::var("OXCCL_SIM_HANDLE").unwrap();
        let h: Vec<u8> = (0..64).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
        let h: [u8; 64] = h.try_into().unwrap();
        let p = driver::ipc_open(&h).expect("first open");
        assert!(driver::ipc_open(&h).is_err(), "a second open of the same allocation succeeded");
        let mut got = [0u8; 4];
        // SAFETY: the mapping opened above holds at least 4 bytes; the default stream is then
        // synchronised before `got` is read.
        unsafe {
            driver::copy_d2h(got.as_mut_ptr(), p, 4, std::ptr::null_mut()).unwrap();
            driver::sync_user_stream(std::ptr::null_mut()).unwrap();
        }
        assert_eq!(got, [9, 8, 7, 6]);
        driver::ipc_close(p);
        println!("CHILD OK");
        return;
    }
    let Some(_serial) = sim() else { return };
    driver::set_device(0).unwrap();
    let b = DeviceBuffer::from_host(&[9, 8, 7, 6]).unwrap();
    let (h, _) = driver::ipc_handle(b.ptr()).unwrap();
    let hex: String = h.iter().map(|x| format!("{x:02x}")).collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([T, "--exact", "--nocapture", "--test-threads=1"])
        .env("OXCCL_SIM_CHILD", T)
        .env("OXCCL_SIM_HANDLE", hex)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && s.contains("CHILD OK"), "{s}\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn synchronous_copies_land_later_and_only_blocking_streams_wait_for_them() {
    let Some(_serial) = sim() else { return };
    driver::set_device(0).unwrap();
    let b = DeviceBuffer::zeroed(64).unwrap();
    let hold = driver::GateWord::new().unwrap();
    // SAFETY: streams and buffers of this test, alive until it has synchronised them; the host
    // buffers outlive the copies (each stream is synchronised before they are read).
    unsafe {
        // the legacy stream is held until the word reaches 1
        hold.wait(std::ptr::null_mut(), 1).unwrap();
        let data = [9u8; 64];
        // from pageable memory: returns once the source is staged, not when the data landed
        assert_eq!(cu::cuMemcpyHtoD_v2(b.ptr(), data.as_ptr().cast(), 64), cu::CUresult::CUDA_SUCCESS);
        // a non-blocking stream does not wait for the legacy stream: it reads the old bytes
        let free = Stream::new().unwrap();
        let mut early = [1u8; 64];
        driver::copy_d2h(early.as_mut_ptr(), b.ptr(), 64, free.raw()).unwrap();
        free.sync().unwrap();
        assert_eq!(early, [0u8; 64], "the copy landed before the legacy stream reached it");
        // a blocking stream waits for the legacy stream's earlier work
        let mut blocking: cu::CUstream = std::ptr::null_mut();
        assert_eq!(cu::cuStreamCreate(&mut blocking, 0), cu::CUresult::CUDA_SUCCESS);
        let mut late = [1u8; 64];
        driver::copy_d2h(late.as_mut_ptr(), b.ptr(), 64, blocking).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(cu::cuStreamQuery(blocking), cu::CUresult::CUDA_ERROR_NOT_READY);
        hold.set(1);
        assert_eq!(cu::cuStreamSynchronize(blocking), cu::CUresult::CUDA_SUCCESS);
        assert_eq!(late, [9u8; 64]);
        assert_eq!(cu::cuStreamDestroy_v2(blocking), cu::CUresult::CUDA_SUCCESS);
    }
}

#[test]
fn host_functions_of_all_streams_run_one_at_a_time() {
    let Some(_serial) = sim() else { return };
    use std::sync::atomic::{AtomicU32, Ordering};
    static STATE: AtomicU32 = AtomicU32::new(0); // 1: B ran; 2: A saw B run while A was running
    unsafe extern "C" fn a(_: *mut libc::c_void) {
        // waits (bounded) for B, which runs on another stream: it cannot run meanwhile
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(300) {
            if STATE.load(Ordering::SeqCst) == 1 {
                STATE.store(2, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    unsafe extern "C" fn b(_: *mut libc::c_void) {
        STATE.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).ok();
    }
    driver::set_device(0).unwrap();
    let (sa, sb) = (Stream::new().unwrap(), Stream::new().unwrap());
    // SAFETY: live streams; the functions take no data and call no CUDA.
    unsafe {
        assert_eq!(cu::cuLaunchHostFunc(sa.raw(), Some(a), std::ptr::null_mut()), cu::CUresult::CUDA_SUCCESS);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(cu::cuLaunchHostFunc(sb.raw(), Some(b), std::ptr::null_mut()), cu::CUresult::CUDA_SUCCESS);
    }
    sa.sync().unwrap();
    sb.sync().unwrap();
    assert_eq!(STATE.load(Ordering::SeqCst), 1, "B ran while A was running: host functions are not serialised");
}

/// Point-to-point first, then collectives without waiting in between: the IPC windows are made
/// at the first collective (a call that waits for every rank, after this communicator's staged
/// sends are done), and a queue deeper than the 16 operations allowed in flight (the later calls
/// wait for room) still completes, in order and right.
#[test]
fn windows_after_point_to_point_and_a_deep_queue() {
    let Some(_serial) = sim() else { return };
    two_ranks(|r, dc, st| {
        let us = UserStream(st.raw() as usize);
        let n = 1000;
        let mine: Vec<u8> = (0..n).map(|i| (i % 251) as u8 ^ r as u8).collect();
        let (send, recv) = (DeviceBuffer::from_host(&mine).unwrap(), DeviceBuffer::zeroed(n).unwrap());
        let p2p = vec![
            (
                OpDesc { coll: Coll::Send, dtype: DataType::U8, op: ReduceOp::Sum, count: n, root: 1 - r },
                DevMem::Split { send: send.ptr(), send_len: n, recv: 0, recv_len: 0 },
            ),
            (
                OpDesc { coll: Coll::Recv, dtype: DataType::U8, op: ReduceOp::Sum, count: n, root: 1 - r },
                DevMem::Split { send: 0, send_len: 0, recv: recv.ptr(), recv_len: n },
            ),
        ];
        let ones: Vec<u8> = (0..n).flat_map(|_| (r as u32 + 1).to_le_bytes()).collect();
        let (a, sum) = (DeviceBuffer::from_host(&ones).unwrap(), DeviceBuffer::zeroed(4 * n).unwrap());
        let d = OpDesc { coll: Coll::AllReduce, dtype: DataType::U32, op: ReduceOp::Sum, count: n, root: 0 };
        let m = DevMem::Split { send: a.ptr(), send_len: 4 * n, recv: sum.ptr(), recv_len: 4 * n };
        let before = oxccl_cuda::device::path_counts();
        // SAFETY: buffers of this GPU, alive until the sync below.
        unsafe {
            dc.enqueue(p2p, us).unwrap();
            for _ in 0..100 {
                dc.enqueue(vec![(d, m)], us).unwrap();
            }
        }
        st.sync().unwrap();
        assert!(dc.error().is_none(), "{:?}", dc.error());
        let theirs: Vec<u8> = (0..n).map(|i| (i % 251) as u8 ^ (1 - r) as u8).collect();
        assert_eq!(recv.to_host().unwrap(), theirs, "rank {r}: send/recv");
        let three: Vec<u8> = (0..n).flat_map(|_| 3u32.to_le_bytes()).collect();
        assert_eq!(sum.to_host().unwrap(), three, "rank {r}: all-reduce");
        assert!(oxccl_cuda::device::path_counts().ipc >= before.ipc + 100, "not through the windows");
    });
}
