//! Group size: n all-reduces of one `f32` in one group (`ncclGroupStart`/`End`), 2 ranks as
//! threads over shared memory. Throughput is in operations, so linear cost shows as a flat
//! line from 1,000 to 100,000 operations (the pairwise ordering rule this replaced was
//! quadratic: 8,000 operations took 32 s).
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxccl::{Communicator, Group, ReduceOp};

/// Every rank runs one group of `n` all-reduces; returns when all have.
fn grouped(comms: &[Communicator], n: usize) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let send: Vec<[f32; 1]> = (0..n).map(|i| [(i % 1000) as f32]).collect();
                let mut recv = vec![[0f32; 1]; n];
                let mut g = Group::new();
                for (a, b) in send.iter().zip(recv.iter_mut()) {
                    g.all_reduce(c, a, b, ReduceOp::Sum).unwrap();
                }
                g.run().unwrap();
                let want = comms.len() as f32;
                assert!(recv.iter().enumerate().all(|(i, r)| r[0] == want * (i % 1000) as f32));
            });
        }
    });
}

fn group_size(c: &mut Criterion) {
    let comms = Communicator::init_all(2).unwrap();
    grouped(&comms, 16); // connections
    let mut g = c.benchmark_group("group_allreduce_2ranks");
    for n in [1_000usize, 10_000, 100_000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| b.iter(|| grouped(&comms, n)));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(3));
    targets = group_size
}
criterion_main!(benches);
