//! The shared transport conformance suite, over TCP sockets on loopback (one and several lanes).

use oxccl_transport::{conformance, Transport, TransportCtx};
use oxccl_transport_tcp::{TcpConfig, TcpTransport};

fn make(cfg: TcpConfig) -> impl Fn() -> conformance::Instances {
    move || {
        let ctx = |rank| TransportCtx { rank, nranks: 2, comm_id: 12, secret: [4; 32], peers: vec![] };
        let lo = "127.0.0.1".parse().unwrap();
        let a: Box<dyn Transport> = Box::new(TcpTransport::new(ctx(0), cfg, lo));
        let b: Box<dyn Transport> = Box::new(TcpTransport::new(ctx(1), cfg, lo));
        Some((a, b))
    }
}

#[test]
fn tcp_conforms() {
    let cfg = TcpConfig { slots: 4, slot_bytes: 4096, lanes: 1, socket_buffer: Some(1 << 16), encrypt: None };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
}

#[test]
fn tcp_with_three_lanes_conforms() {
    let cfg = TcpConfig { slots: 6, slot_bytes: 1000, lanes: 3, socket_buffer: None, encrypt: None };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
}

#[test]
fn encrypted_tcp_conforms() {
    let key = Some(oxccl_transport::seal::MasterKey([9; 32]));
    let cfg = TcpConfig { slots: 4, slot_bytes: 4096, lanes: 1, socket_buffer: Some(1 << 16), encrypt: key };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
    let cfg = TcpConfig { slots: 6, slot_bytes: 1000, lanes: 3, socket_buffer: None, encrypt: key };
    assert_eq!(conformance::run_all(&make(cfg)), conformance::CHECKS.len());
}
