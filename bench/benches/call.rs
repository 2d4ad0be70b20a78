//! Per-call overhead of a blocking 8 B all-reduce: on a 1-rank communicator (what the library
//! itself costs per call: checks, tuner, schedule cache, the lone call's inline polls, step,
//! flight record; no peer to wait for), and
//! on 2 ranks as threads over shared memory (one exchange each way). `bench/RESULTS.md` gives
//! the instruction counts behind the first (callgrind), which are stable where times are not.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{criterion_group, criterion_main, Criterion};
use oxccl::{Communicator, ReduceOp};
use std::time::{Duration, Instant};

fn one_rank(c: &mut Criterion) {
    let comm = Communicator::init_all(1).unwrap().pop().unwrap();
    let (a, mut b) = ([1.0f32, 2.0], [0.0f32; 2]);
    comm.all_reduce(&a, &mut b, ReduceOp::Sum).unwrap();
    c.bench_function("allreduce_8B_1rank", |bench| {
        bench.iter(|| comm.all_reduce(std::hint::black_box(&a), &mut b, ReduceOp::Sum).unwrap())
    });
    assert_eq!(b, a);
}

/// `iters` all-reduces on every rank at once; the slowest rank's time.
fn rounds(comms: &[Communicator], iters: u64) -> Duration {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let (a, mut b) = ([c.rank() as f32, 1.0], [0.0f32; 2]);
                    let t = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce(&a, &mut b, ReduceOp::Sum).unwrap();
                    }
                    assert_eq!(b, [1.0, 2.0]);
                    t.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    })
}

fn two_ranks(c: &mut Criterion) {
    let comms = Communicator::init_all(2).unwrap();
    rounds(&comms, 100); // connections
    c.bench_function("allreduce_8B_2ranks_shm", |bench| bench.iter_custom(|iters| rounds(&comms, iters)));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = one_rank, two_ranks
}
criterion_main!(benches);
