//! Device buffers end to end: every collective, type and op on 1, 2 and 4 ranks sharing one GPU
//! (threads of this process), plus a send/recv ring as one group, compared bit for bit with
//! exact expected outputs. Needs a GPU: on a machine without one the test says so and passes
//! (the `Unavailable` path is checked by the library's unit tests). `cuda/gpu-check.sh` runs it
//! on a lent GPU. `OXCCL_DEVICE_TEST_RANKS=1,2` narrows the rank counts.

use oxccl::exact::{coll_input, expected_output, ops_for};
use oxccl::{Coll, Communicator, DataType, OpDesc};
use oxccl_cuda::driver::{self, DeviceBuffer, Stream};
use oxccl_cuda::{DevMem, DeviceComm, HostComm, UserStream};
use std::sync::Arc;

fn rank_body(comm: Communicator) -> usize {
    let (n, r) = (comm.size(), comm.rank());
    let comm = Arc::new(comm);
    let dc = DeviceComm::new(Arc::new(comm.clone()) as Arc<dyn HostComm>, 0).expect("device communicator");
    driver::set_device(0).unwrap();
    let stream = Stream::new().unwrap();
    let us = UserStream(stream.raw() as usize);
    // buffers are allocated once and reused: freeing device memory synchronises the device, which
    // would wait for the other ranks' streams parked in their gates (the same hazard as cudaFree
    // during NCCL kernels)
    let max = 65_541 * 8 * n;
    let send = DeviceBuffer::zeroed(max).unwrap();
    let recv = DeviceBuffer::zeroed(max).unwrap();
    let mut checks = 0;
    for coll in Coll::COLLECTIVES {
        for dt in DataType::ALL {
            for op in ops_for(coll, dt) {
                for count in [1usize, 1001, 65_541] {
                    let root = (count + 1) % n;
                    let input = coll_input(coll, dt, op, n, r, count, root, 7);
                    let want = expected_output(coll, dt, op, n, r, count, root, 7);
                    let (_, no) = coll.buffer_counts(n, r, count, root);
                    send.load(&input).unwrap();
                    recv.load(&[]).unwrap();
                    let desc = OpDesc { coll, dtype: dt, op, count, root };
                    let mem = DevMem::Split {
                        send: send.ptr(),
                        send_len: input.len(),
                        recv: recv.ptr(),
                        recv_len: no * dt.size(),
                    };
                    // SAFETY: buffers of this GPU, alive until the stream is synchronised below.
                    unsafe { dc.enqueue(vec![(desc, mem)], us).unwrap() };
                    stream.sync().unwrap();
                    assert!(dc.error().is_none(), "{:?}", dc.error());
                    if !want.is_empty() {
                        let got = recv.to_host().unwrap();
                        assert!(got[want.len()..].iter().all(|&b| b == 0), "{coll:?} wrote past its output");
                        let bad = oxccl::exact::count_wrong(dt, &got[..want.len()], &want);
                        assert_eq!(bad, 0, "rank {r}/{n}: {coll:?} {dt:?} {op:?} count {count}: {bad} elements wrong");
                    }
                    checks += 1;
                }
            }
        }
    }
    // in-place all-reduce, and a send/recv ring as one group (the staged path)
    let dt = DataType::F32;
    let count = 4099;
    let op = oxccl::ReduceOp::Sum;
    let input = coll_input(Coll::AllReduce, dt, op, n, r, count, 0, 3);
    let want = expected_output(Coll::AllReduce, dt, op, n, r, count, 0, 3);
    send.load(&input).unwrap();
    let desc = OpDesc { coll: Coll::AllReduce, dtype: dt, op, count, root: 0 };
    let mem = DevMem::InPlace { base: send.ptr(), len: input.len(), in_off: 0, out_off: 0 };
    // SAFETY: as above.
    unsafe { dc.enqueue(vec![(desc, mem)], us).unwrap() };
    stream.sync().unwrap();
    assert_eq!(send.to_host().unwrap()[..want.len()], want[..], "in-place all-reduce");
    if n > 1 {
        let data: Vec<u8> = (0..4096u32).flat_map(|i| (i * 31 + r as u32).to_le_bytes()).collect();
        let (s, d) = (&send, &recv);
        s.load(&data).unwrap();
        d.load(&[]).unwrap();
        let cnt = data.len() / 4;
        let ops = vec![
            (
                OpDesc { coll: Coll::Send, dtype: DataType::U32, op, count: cnt, root: (r + 1) % n },
                DevMem::Split { send: s.ptr(), send_len: data.len(), recv: 0, recv_len: 0 },
            ),
            (
                OpDesc { coll: Coll::Recv, dtype: DataType::U32, op, count: cnt, root: (r + n - 1) % n },
                DevMem::Split { send: 0, send_len: 0, recv: d.ptr(), recv_len: data.len() },
            ),
        ];
        // SAFETY: as above.
        unsafe { dc.enqueue(ops, us).unwrap() };
        stream.sync().unwrap();
        let from = (r + n - 1) % n;
        let expect: Vec<u8> = (0..4096u32).flat_map(|i| (i * 31 + from as u32).to_le_bytes()).collect();
        assert_eq!(d.to_host().unwrap()[..expect.len()], expect[..], "send/recv ring");
    }
    drop(dc); // joins the worker before the buffers go
    checks
}

#[test]
fn every_collective_type_and_op_on_device_buffers() {
    if let Err(e) = oxccl_cuda::probe() {
        assert!(std::env::var_os("OXCCL_REQUIRE_GPU").is_none(), "OXCCL_REQUIRE_GPU is set, but: {e}");
        eprintln!("skipped: no GPU here ({e})");
        return;
    }
    let ranks: Vec<usize> = std::env::var("OXCCL_DEVICE_TEST_RANKS")
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 2, 4]);
    for n in ranks {
        let before = oxccl_cuda::device::path_counts();
        let comms = Communicator::init_all(n).unwrap();
        let handles: Vec<_> = comms.into_iter().map(|c| std::thread::spawn(move || rank_body(c))).collect();
        let checks: Vec<usize> = handles.into_iter().map(|h| h.join().expect("rank panicked")).collect();
        let after = oxccl_cuda::device::path_counts();
        println!(
            "{n} ranks on one GPU: {} checks per rank passed bit for bit (IPC one-shot {} ops, staged {} ops)",
            checks[0],
            after.ipc - before.ipc,
            after.staged - before.staged
        );
        assert!(after.ipc > before.ipc || std::env::var("OXCCL_CUDA_IPC").is_ok_and(|v| v == "0"));
    }
}
