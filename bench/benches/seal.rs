//! The cipher's single-core throughput (AES-256-GCM through `oxccl_transport::seal`), sealing and
//! opening 256 KiB frames in place: the bound on encrypted TCP's bandwidth per core.
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxccl_transport::seal::{Opener, Sealer, TAG_BYTES};

fn seal(c: &mut Criterion) {
    let mut g = c.benchmark_group("seal");
    let key = [7u8; 32];
    for bytes in [4usize << 10, 256 << 10] {
        let mut buf = vec![1u8; bytes + TAG_BYTES];
        g.throughput(Throughput::Bytes(bytes as u64));
        let mut s = Sealer::new(&key);
        g.bench_with_input(BenchmarkId::new("seal", bytes), &bytes, |x, _| {
            x.iter(|| s.seal(b"len!", &mut buf[..bytes]).unwrap())
        });
        // seal then open (one frame each way): what a byte costs end to end
        let (mut s, mut o) = (Sealer::new(&key), Opener::new(&key));
        g.bench_with_input(BenchmarkId::new("seal_open", bytes), &bytes, |x, _| {
            x.iter(|| {
                let tag = s.seal(b"len!", &mut buf[..bytes]).unwrap();
                buf[bytes..].copy_from_slice(&tag);
                o.open(b"len!", &mut buf).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = seal
}
criterion_main!(benches);
