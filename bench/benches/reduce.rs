//! The fused reduction kernel against memcpy, on cache-resident (256 KiB) and memory-bound
#![allow(missing_docs)] // criterion_group! generates undocumented items
//! (64 MiB) buffers. Bandwidth counts bytes read + written, as `membw.c` does.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxccl::reduce::{combine, combine_inplace};
use oxccl::{DataType, ReduceOp};

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("reduce");
    for bytes in [256usize << 10, 64 << 20] {
        let a = vec![1u8; bytes];
        let b = vec![2u8; bytes];
        let mut out = vec![0u8; bytes];
        g.throughput(Throughput::Bytes(2 * bytes as u64));
        g.bench_with_input(BenchmarkId::new("memcpy", bytes), &bytes, |x, _| x.iter(|| out.copy_from_slice(&a)));
        g.throughput(Throughput::Bytes(3 * bytes as u64));
        for (name, dt) in [
            ("f32_sum", DataType::F32),
            ("bf16_sum", DataType::BF16),
            ("f16_sum", DataType::F16),
            ("i32_sum", DataType::I32),
        ] {
            g.bench_with_input(BenchmarkId::new(name, bytes), &bytes, |x, _| {
                x.iter(|| combine(dt, ReduceOp::Sum, &mut out, Some(&a), Some(&b), None))
            });
        }
        g.bench_with_input(BenchmarkId::new("f32_sum_inplace", bytes), &bytes, |x, _| {
            x.iter(|| combine_inplace(DataType::F32, ReduceOp::Sum, &mut out, Some(&a), None))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = kernels
}
criterion_main!(benches);
