//! Depth 2: threads as ranks in one process, over the real shm (and tcp) transports.

mod common;
use common::on_all;

use oxccl::{Coll, Communicator, Config, DataType, ErrorKind, Group, OpDesc, OpMem, ReduceOp};
use std::time::{Duration, Instant};

fn cfg() -> Config {
    // small slots: many chunks even for small counts
    Config { timeout: Duration::from_secs(60), chunk_bytes: 4096, ..Default::default() }
}

const COLLS: [Coll; 8] = Coll::COLLECTIVES;

/// Run `coll` through the untyped API and check it bit for bit.
fn check(c: &Communicator, coll: Coll, dt: DataType, op: ReduceOp, count: usize, root: usize, inplace: bool) {
    let wrong = common::run_and_count_wrong(c, coll, dt, op, count, root, inplace, 3);
    assert_eq!(wrong, 0, "rank {}: {coll:?} {dt:?} {op:?} count {count} root {root} inplace {inplace}", c.rank());
}

#[test]
fn every_collective_type_and_op_on_threads() {
    for n in [1, 2, 3, 4] {
        let comms = Communicator::init_all_with_config(n, cfg()).unwrap();
        on_all(comms, |c| {
            for coll in COLLS {
                for dt in DataType::ALL {
                    for op in oxccl::exact::ops_for(coll, dt) {
                        for count in [0, 1, 1000 + n] {
                            let root = count % n;
                            check(c, coll, dt, op, count, root, false);
                            if oxccl::schedule::inplace_layout(coll, 2, 0, 1, 0).is_some() {
                                check(c, coll, dt, op, count, root, true);
                            }
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn eight_ranks_large_messages_over_shm_and_tcp() {
    // shm; TCP with one socket per peer; TCP with frames striped over 3 sockets and set buffers
    for (shm, nsocks, buffer) in [(true, 1, None), (false, 1, None), (false, 3, Some(1 << 20))] {
        let mut cf = cfg();
        cf.chunk_bytes = 64 << 10;
        cf.shm_disable = !shm;
        cf.nsocks = nsocks;
        cf.socket_buffer = buffer;
        let comms = Communicator::init_all_with_config(8, cf).unwrap();
        on_all(comms, |c| {
            for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll, Coll::Broadcast] {
                check(c, coll, DataType::F32, ReduceOp::Sum, 100_003, 5, false);
            }
            check(c, Coll::AllReduce, DataType::BF16, ReduceOp::Avg, 77_777, 0, true);
        });
    }
}

/// An out-of-place all-reduce whose output is at least `STREAM_MIN` bytes and which the schedule
/// never reads back (2 ranks: recursive doubling) writes it with streaming stores, exactly (when
/// it does not stream is `exec::step`'s unit test: other tests run alongside this one).
#[test]
fn large_outputs_are_streamed_exactly() {
    use oxccl::exec::{streamed_bytes, STREAM_MIN};
    let mut cf = cfg();
    cf.chunk_bytes = 1 << 20;
    let count = STREAM_MIN / 4 + 1001;
    let before = streamed_bytes();
    let comms = Communicator::init_all_with_config(2, cf).unwrap();
    on_all(comms, |c| {
        check(c, Coll::AllReduce, DataType::F32, ReduceOp::Sum, count, 0, true);
        check(c, Coll::AllReduce, DataType::F32, ReduceOp::Sum, count, 0, false);
        check(c, Coll::AllReduce, DataType::BF16, ReduceOp::Avg, 2 * count + 3, 0, false);
    });
    // each rank streams its whole output, for both calls (other tests may stream meanwhile)
    assert!(streamed_bytes() - before >= 2 * 2 * (4 * count) as u64, "the output was not streamed");
}

#[test]
fn typed_api() {
    let comms = Communicator::init_all_with_config(3, cfg()).unwrap();
    on_all(comms, |c| {
        let (n, r) = (c.size(), c.rank());
        let mut v: Vec<f32> = (0..10).map(|i| (r * 10 + i) as f32).collect();
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        let want: Vec<f32> = (0..10).map(|i| (0..n).map(|q| (q * 10 + i) as f32).sum()).collect();
        assert_eq!(v, want);

        let mut g = vec![0i64; 2 * n];
        c.all_gather(&[r as i64, -(r as i64)], &mut g).unwrap();
        assert_eq!(g, (0..n).flat_map(|q| [q as i64, -(q as i64)]).collect::<Vec<_>>());

        let mut b = vec![r as u8; 5];
        c.broadcast(&mut b, 2).unwrap();
        // out of place: only the root's send buffer is read, the others pass none
        let mut o = vec![0i32; 3];
        let send: Vec<i32> = if r == 1 { vec![7, 8, 9] } else { vec![] };
        c.broadcast_from(&send, &mut o, 1).unwrap();
        assert_eq!(o, [7, 8, 9]);
        assert_eq!(b, vec![2u8; 5]);

        let mut out = if r == 1 { vec![0u32; 4] } else { vec![] };
        c.reduce(&[r as u32 + 1; 4], &mut out, ReduceOp::Prod, 1).unwrap();
        if r == 1 {
            assert_eq!(out, vec![6u32; 4]);
        }

        let mut x = vec![half::f16::from_f32(1.5); 7];
        c.all_reduce_inplace(&mut x, ReduceOp::Max).unwrap();
        assert_eq!(x[0].to_f32(), 1.5);
        c.barrier().unwrap();

        // count 0 is a no-op
        c.all_reduce::<f64>(&[], &mut [], ReduceOp::Sum).unwrap();
    });
}

#[test]
fn groups_make_send_recv_rings_and_self_sends_work() {
    let n = 4;
    let comms = Communicator::init_all_with_config(n, cfg()).unwrap();
    on_all(comms, |c| {
        let (n, r) = (c.size(), c.rank());
        // a ring of sends larger than the connection buffering: needs the group
        let a: Vec<u32> = (0..50_000).map(|i| (r * 1_000_000 + i) as u32).collect();
        let mut b = vec![0u32; 50_000];
        let mut s = vec![0u32; 3];
        let mut g = Group::new();
        g.send(c, &a, (r + 1) % n).unwrap();
        g.recv(c, &mut b, (r + n - 1) % n).unwrap();
        g.send(c, &a[..3], r).unwrap();
        g.recv(c, &mut s, r).unwrap();
        g.run().unwrap();
        let p = (r + n - 1) % n;
        assert_eq!(b, (0..50_000).map(|i| (p * 1_000_000 + i) as u32).collect::<Vec<_>>());
        assert_eq!(s, a[..3]);
    });
}

#[test]
fn one_thread_drives_all_ranks_in_a_group() {
    // NCCL's single-process pattern: ncclCommInitAll, then one thread issues every rank's call
    let comms = Communicator::init_all_with_config(4, cfg()).unwrap();
    let ins: Vec<Vec<i32>> = (0..4i32).map(|r| vec![r + 1; 100_000]).collect();
    let mut outs: Vec<Vec<i32>> = (0..4).map(|_| vec![0; 100_000]).collect();
    let mut g = Group::new();
    for ((c, i), o) in comms.iter().zip(&ins).zip(outs.iter_mut()) {
        g.all_reduce(c, i, o, ReduceOp::Sum).unwrap();
    }
    g.run().unwrap();
    for o in outs {
        assert!(o.iter().all(|&x| x == 10));
    }
}

#[test]
fn split_by_color_and_key() {
    let comms = Communicator::init_all_with_config(6, cfg()).unwrap();
    on_all(comms, |c| {
        let r = c.rank();
        let color = if r == 5 { -1 } else { (r % 2) as i32 };
        let sub = c.split(color, -(r as i32)).unwrap();
        if r == 5 {
            assert!(sub.is_none());
            // the parent still works
        } else {
            let sub = sub.unwrap();
            let members: Vec<usize> = (0..5).filter(|q| q % 2 == r % 2).rev().collect();
            assert_eq!(sub.size(), members.len());
            assert_eq!(sub.rank(), members.iter().position(|&q| q == r).unwrap());
            let mut v = vec![r as i32];
            sub.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v[0], members.iter().map(|&q| q as i32).sum::<i32>());
        }
        let mut v = [1u8];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], 6);
    });
}

#[test]
fn bad_arguments_are_refused_without_side_effects() {
    let comms = Communicator::init_all_with_config(2, cfg()).unwrap();
    on_all(comms, |c| {
        let e = c.all_gather(&[1.0f32; 3], &mut [0.0f32; 5]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("receive buffer"), "{e}");
        let e = c.broadcast(&mut [0u8; 3], 7).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("root 7"), "{e}");
        let e = c.send(&[1u8], 2).unwrap_err();
        assert!(e.to_string().contains("peer 2"), "{e}");
        let e = c.all_to_all(&[0u8; 3], &mut [0u8; 3]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = c
            .run(
                OpDesc { coll: Coll::AllToAll, dtype: DataType::U8, op: ReduceOp::Sum, count: 1, root: 0 },
                OpMem::InPlace { buf: &mut [0u8; 2], in_off: 0, out_off: 0 },
            )
            .unwrap_err();
        assert!(e.to_string().contains("in-place"), "{e}");
        let e = c
            .run(
                OpDesc {
                    coll: Coll::AllReduce,
                    dtype: DataType::F64,
                    op: ReduceOp::Sum,
                    count: usize::MAX / 4,
                    root: 0,
                },
                OpMem::Split { input: &[], output: &mut [] },
            )
            .unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        // the communicator is still healthy: bad input lost nothing
        let mut v = [c.rank() as u32 + 1];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], 3);
    });
}

#[test]
fn mismatched_collectives_fail_loudly_on_both_ranks() {
    let mut cf = cfg();
    cf.timeout = Duration::from_secs(20);
    let comms = Communicator::init_all_with_config(2, cf).unwrap();
    on_all(comms, |c| {
        let t = Instant::now();
        let e = if c.rank() == 0 {
            c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Sum).unwrap_err()
        } else {
            c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Max).unwrap_err()
        };
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert_eq!(e.cause, Some(oxccl::Cause::Mismatch), "{e}");
        let s = e.to_string();
        assert!(s.contains("op=sum") && s.contains("op=max"), "both calls shown: {s}");
        assert!(t.elapsed() < Duration::from_secs(10));
        // sticky
        assert!(c.barrier().is_err());
    });
}

#[test]
fn abort_from_another_thread_unblocks_a_waiting_rank() {
    let comms = Communicator::init_all_with_config(2, cfg()).unwrap();
    let c0 = &comms[0];
    let h = c0.abort_handle();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            h.abort();
        });
        let t = Instant::now();
        // rank 1 never joins: rank 0 would wait for the timeout
        let e = c0.all_reduce_inplace(&mut [1f32; 8], ReduceOp::Sum).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(e.to_string().contains("abort"), "{e}");
        assert_eq!(e.cause, Some(oxccl::Cause::Aborted), "{e}");
    });
    assert!(c0.barrier().is_err(), "aborted stays aborted");
}

#[test]
fn timeout_names_the_missing_peer() {
    let mut cf = cfg();
    cf.timeout = Duration::from_millis(1500);
    let comms = Communicator::init_all_with_config(3, cf).unwrap();
    // connect everyone first
    on_all(comms, |c| {
        c.barrier().unwrap();
        if c.rank() != 2 {
            let t = Instant::now();
            let e = c.all_reduce_inplace(&mut [1i32; 4], ReduceOp::Sum).unwrap_err();
            // the first rank to time out reports Timeout; the other, woken by its abort, a remote
            // error quoting it: both name the missing rank
            assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote), "{e}");
            assert!(t.elapsed() < Duration::from_secs(5));
            assert!(
                e.to_string().contains("ranks [2] did not answer the timeout census: they never reached op #1"),
                "{e}"
            );
        }
    });
}

#[test]
fn non_blocking_requests_overlap_and_keep_order() {
    let comms = Communicator::init_all_with_config(3, cfg()).unwrap();
    on_all(comms, |c| {
        let (n, r) = (c.size(), c.rank());
        let a = c.all_reduce_async(vec![r as f32 + 1.0; 200_000], ReduceOp::Sum).unwrap();
        let g = c.all_gather_async(vec![r as u64; 1000]).unwrap();
        let mut rs = c.reduce_scatter_async(vec![1i32; 3 * 5000], ReduceOp::Sum).unwrap();
        // "compute" while the progress thread works
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        while !rs.test() {
            std::thread::yield_now();
        }
        assert_eq!(rs.wait().unwrap(), vec![n as i32; 5000]);
        assert!(a.wait().unwrap().iter().all(|&v| v == 6.0));
        assert_eq!(g.wait().unwrap(), (0..n as u64).flat_map(|q| vec![q; 1000]).collect::<Vec<_>>());
        // a blocking call after async ones runs after them
        let b = c.broadcast_async(vec![r as u8; 10], 1).unwrap();
        let mut v = [1u32];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], 3);
        assert_eq!(b.wait().unwrap(), vec![1u8; 10]);
    });
}

#[test]
fn thousands_of_queued_operations_keep_their_order() {
    // MoE all-to-all and FSDP buckets queue thousands of operations at once: in one group, and
    // on the progress thread across two communicators
    let comms = Communicator::init_all_with_config(3, cfg()).unwrap();
    on_all(comms, |c| {
        let (n, r) = (c.size(), c.rank());
        let twin = c.split(0, r as i32).unwrap().unwrap();
        let k = 3000usize;
        let sends: Vec<[u32; 2]> = (0..k).map(|i| [(i * 7 + r) as u32, r as u32]).collect();
        let mut sums = vec![[0u32; 2]; k];
        let mut got = vec![[0u32; 2]; k];
        let mut g = Group::new();
        for (a, b) in sends.iter().zip(sums.iter_mut()) {
            g.all_reduce(c, a, b, ReduceOp::Sum).unwrap();
        }
        for (i, b) in got.iter_mut().enumerate() {
            g.send(c, &sends[i], (r + 1) % n).unwrap();
            g.recv(c, b, (r + n - 1) % n).unwrap();
        }
        g.run().unwrap();
        let all: u32 = (0..n as u32).sum();
        for i in 0..k {
            assert_eq!(sums[i], [(i * 7 * n) as u32 + all, all], "all-reduce {i}");
            let p = (r + n - 1) % n;
            assert_eq!(got[i], [(i * 7 + p) as u32, p as u32], "message {i}");
        }
        let reqs: Vec<_> = (0..k)
            .map(|i| {
                let on = if i % 2 == 0 { c } else { &twin };
                on.all_reduce_async(vec![(i + r) as u64; 3], ReduceOp::Sum).unwrap()
            })
            .collect();
        for (i, q) in reqs.into_iter().enumerate() {
            assert_eq!(q.wait().unwrap(), vec![(i * n) as u64 + all as u64; 3], "async {i}");
        }
    });
}

#[test]
fn non_blocking_errors_are_reported_by_wait() {
    let mut cf = cfg();
    cf.timeout = Duration::from_millis(1500);
    let comms = Communicator::init_all_with_config(2, cf).unwrap();
    on_all(comms, |c| {
        c.barrier().unwrap();
        if c.rank() == 0 {
            let req = c.all_reduce_async(vec![1f32; 16], ReduceOp::Sum).unwrap();
            let e = req.wait().unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
            assert!(c.error().is_some(), "sticky");
        }
    });
}

fn noisy_floats(rank: usize, count: usize) -> Vec<f32> {
    let mut z = 0x9E37_79B9u64 ^ (rank as u64 * 0x1234_5678_9ABC);
    (0..count)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = ((z >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            m * 2f32.powi(((z >> 20) % 16) as i32 - 8) // mixed magnitudes: order changes the bits
        })
        .collect()
}

fn allreduce_with(cf: Config, n: usize, count: usize) -> Vec<Vec<f32>> {
    let comms = Communicator::init_all_with_config(n, cf).unwrap();
    let outs = std::sync::Mutex::new(vec![vec![]; n]);
    on_all(comms, |c| {
        let mut v = noisy_floats(c.rank(), count);
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        outs.lock().unwrap()[c.rank()] = v;
    });
    outs.into_inner().unwrap()
}

#[test]
fn deterministic_mode_is_bitwise_identical_across_algorithms_and_chunks() {
    let (n, count) = (5, 10_007);
    let ins: Vec<Vec<f32>> = (0..n).map(|r| noisy_floats(r, count)).collect();
    // rank-order left fold: ((x0 + x1) + x2) + ...
    let want: Vec<u32> = (0..count).map(|i| (1..n).fold(ins[0][i], |a, r| a + ins[r][i]).to_bits()).collect();
    for (algo, chunk) in [
        ("ring", 4096),
        ("recdouble", 4096),
        ("ring", 256),
        ("recdouble", 64),
        ("tree", 1024),
        ("rabenseifner", 512),
        ("star", 256),
        ("ring,recdouble", 65536),
    ] {
        let cf = Config { deterministic: true, algo: Some(algo.into()), chunk_bytes: chunk, ..cfg() };
        for (r, out) in allreduce_with(cf, n, count).iter().enumerate() {
            let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "rank {r}, algo {algo}, chunk {chunk}: differs from the rank-order sum");
        }
    }
    // without the mode, the two algorithms round differently (which is why the mode exists)
    let ring = allreduce_with(Config { algo: Some("ring".into()), ..cfg() }, n, count);
    let rd = allreduce_with(Config { algo: Some("recdouble".into()), ..cfg() }, n, count);
    assert_ne!(ring[0], rd[0]);
    assert!(ring.iter().all(|o| o == &ring[0]) && rd.iter().all(|o| o == &rd[0]), "every rank agrees either way");
}

#[test]
fn forced_algorithms_run_every_type_and_op_exactly() {
    for algo in ["recdouble", "ring", "tree", "rabenseifner", "star"] {
        for n in [2, 3, 5, 8] {
            let comms = Communicator::init_all_with_config(n, Config { algo: Some(algo.into()), ..cfg() }).unwrap();
            on_all(comms, |c| {
                for dt in DataType::ALL {
                    for op in oxccl::exact::all_ops(dt) {
                        check(c, Coll::AllReduce, dt, op, 3000 + n, 0, false);
                        check(c, Coll::AllReduce, dt, op, 7, 0, true);
                    }
                }
                // the star broadcasts too (the setting allows no chain), from every root
                for root in 0..n {
                    check(c, Coll::Broadcast, DataType::I32, ReduceOp::Sum, 3000 + n, root, false);
                    check(c, Coll::Broadcast, DataType::F16, ReduceOp::Sum, 7, root, true);
                }
            });
        }
    }
    let e = Communicator::init_all_with_config(2, Config { algo: Some("NVLS".into()), ..cfg() }).unwrap_err();
    assert!(e.to_string().contains("not implemented"), "{e}");
    let e = Communicator::init_all_with_config(2, Config { proto: Some("LL128".into()), ..cfg() }).unwrap_err();
    assert!(e.to_string().contains("Simple"), "{e}");
}

/// Every kind of mismatch fails on every rank with InvalidUsage, shows both calls, and hangs
/// nobody: operation, type, count, root, reduce op, and a rank that skips a collective.
#[test]
fn each_kind_of_mismatch_is_reported_on_every_rank() {
    type Call = fn(&Communicator, usize) -> oxccl::Result<()>;
    let cases: Vec<(&str, Call, &str)> = vec![
        (
            "operation",
            |c, r| {
                if r == 0 {
                    c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Sum)
                } else {
                    c.broadcast(&mut [0f32; 64], 0)
                }
            },
            "broadcast",
        ),
        (
            "type",
            |c, r| {
                if r == 0 {
                    c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Sum)
                } else {
                    c.all_reduce_inplace(&mut [0i32; 64], ReduceOp::Sum)
                }
            },
            "type=int32",
        ),
        (
            "count",
            |c, r| {
                if r == 0 {
                    c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Sum)
                } else {
                    c.all_reduce_inplace(&mut [0f32; 65], ReduceOp::Sum)
                }
            },
            "count=65",
        ),
        // eager sends can let a chain broadcast with disagreeing roots finish everywhere; the
        // frames it leaves behind are caught by the next operation
        (
            "root",
            |c, r| {
                c.broadcast(&mut [0u8; 64], if r == 0 { 0 } else { 1 })?;
                c.barrier()
            },
            "called broadcast(",
        ),
        (
            "reduce op",
            |c, r| c.all_reduce_inplace(&mut [0f64; 64], if r == 0 { ReduceOp::Sum } else { ReduceOp::Min }),
            "op=min",
        ),
        // rank 0 calls an extra collective first (identical consecutive collectives cannot be
        // told apart on the wire, as in NCCL: that case ends at the timeout, with its report)
        (
            "skipped collective",
            |c, r| {
                if r == 0 {
                    c.all_reduce_inplace(&mut [0f32; 64], ReduceOp::Sum)?;
                }
                c.all_reduce_inplace(&mut [0f32; 128], ReduceOp::Sum)
            },
            "op #0",
        ),
    ];
    for (kind, call, needle) in cases {
        let cf = Config { timeout: Duration::from_secs(20), ..cfg() };
        let comms = Communicator::init_all_with_config(3, cf).unwrap();
        on_all(comms, |c| {
            let t = Instant::now();
            let e = call(c, c.rank()).expect_err(kind);
            assert!(t.elapsed() < Duration::from_secs(10), "{kind}: took {:?}", t.elapsed());
            let s = e.to_string();
            // the rank that detects it says InvalidUsage; the others, woken by its abort, quote it
            assert!(s.contains("mismatched operations"), "{kind}, rank {}: {s}", c.rank());
            assert!(s.contains(needle), "{kind}, rank {}: both calls are shown: {s}", c.rank());
        });
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Communicators release every descriptor (doorbells, memfds, sockets, listeners) and thread
/// when dropped, after success and after failure. (Run alone: other tests open files too.)
#[test]
#[ignore = "counts process-wide descriptors: run alone (.ci/run does)"]
fn nothing_leaks_across_communicator_lifetimes() {
    let (fds0, threads0) = (open_fds(), threads_now());
    for round in 0..3 {
        for shm in [true, false] {
            let cf = Config { shm_disable: !shm, ..cfg() };
            let comms = Communicator::init_all_with_config(4, cf).unwrap();
            on_all(comms, |c| {
                let mut v = vec![1u32; 10_000];
                c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
                let mut g = vec![0u32; 40];
                c.all_gather(&v[..10], &mut g).unwrap();
                c.all_to_all(&[c.rank() as u8; 4], &mut [0u8; 4]).unwrap();
                let sub = c.split((c.rank() % 2) as i32, 0).unwrap().unwrap();
                sub.barrier().unwrap();
            });
        }
        // a failed communicator too
        let cf = Config { timeout: Duration::from_millis(300), ..cfg() };
        let comms = Communicator::init_all_with_config(2, cf).unwrap();
        on_all(comms, |c| {
            c.barrier().unwrap();
            if c.rank() == 0 {
                assert!(c.barrier().is_err());
            }
        });
        std::thread::sleep(Duration::from_millis(100)); // report threads finish
        assert_eq!(open_fds(), fds0, "descriptors after round {round}");
        assert_eq!(threads_now(), threads0, "threads after round {round}");
    }
}

/// Operations on one communicator from two threads at once are refused (the second gets
/// InvalidUsage), and nothing is lost: the first finishes once its peer arrives.
#[test]
fn one_communicator_from_two_threads_at_once_is_refused() {
    let comms = Communicator::init_all_with_config(2, cfg()).unwrap();
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        let first = s.spawn(move || {
            let mut v = [1u32; 16];
            c0.all_reduce_inplace(&mut v, ReduceOp::Sum).map(|_| v[0])
        });
        std::thread::sleep(Duration::from_millis(200)); // the first call is now waiting for rank 1
        let e = c0.barrier().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(e.to_string().contains("two threads"), "{e}");
        let mut v = [1u32; 16];
        c1.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(first.join().unwrap().unwrap(), 2);
    });
}

/// Ranks that disagree on the transport for a pair (here: one with shared memory turned off, one
/// with it on, on one host) fail on both sides at the first collective, promptly, with an error
/// that names both transports and the settings that must agree — not a decoder error or a
/// timeout.
#[test]
fn ranks_that_disagree_on_the_transport_fail_clearly_on_both_sides() {
    let lo = Config { socket_ifname: Some("lo".into()), ..cfg() };
    let id = oxccl::UniqueId::with_config(&lo).unwrap();
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (id, lo) = (&id, &lo);
            s.spawn(move || {
                let cf = Config { shm_disable: rank == 0, ..lo.clone() };
                let c = Communicator::init_with_config(id, 2, rank, cf).unwrap();
                let t = Instant::now();
                let e = c.all_reduce_inplace(&mut [1i32; 4], ReduceOp::Sum).unwrap_err();
                assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
                let m = e.to_string();
                assert!(
                    m.contains("SHM") && m.contains("NET/Socket") && m.contains("NCCL_SHM_DISABLE"),
                    "rank {rank}: {m}"
                );
            });
        }
    });
}
