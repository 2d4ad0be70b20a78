//! The shared transport conformance suite, over shared-memory rings (and single copy).

use oxccl_transport::{conformance, Transport, TransportCtx};
use oxccl_transport_shm::{ShmConfig, ShmTransport};

fn ctx(rank: usize) -> TransportCtx {
    TransportCtx { rank, nranks: 2, comm_id: 11, secret: [3; 32], peers: vec![] }
}

fn make(cfg: ShmConfig) -> impl Fn() -> conformance::Instances {
    move || {
        let a: Box<dyn Transport> = Box::new(ShmTransport::new(ctx(0), cfg).unwrap());
        let b: Box<dyn Transport> = Box::new(ShmTransport::new(ctx(1), cfg).unwrap());
        Some((a, b))
    }
}

#[test]
fn shared_memory_conforms() {
    let cfg = ShmConfig { slots: 4, slot_bytes: 4096, cma: true, ..Default::default() };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
}

#[test]
fn shared_memory_with_two_slots_conforms() {
    let cfg = ShmConfig { slots: 2, slot_bytes: 64, cma: false, ..Default::default() };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
}
