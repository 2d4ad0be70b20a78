//! Encrypted traffic between ranks (issue 21), over TCP on loopback: results exact with every
//! key source, and ranks that disagree on encryption or key fail at setup on both sides,
//! promptly, naming the peer. (The capture and tampering tests between namespace hosts are in
//! tests/procs.rs's netns suite and transports/tcp's tests.)

mod common;

use common::{on_all, run_and_count_wrong};
use oxccl::{Cause, Coll, Communicator, Config, DataType, Encryption, ErrorKind, ReduceOp};
use std::time::{Duration, Instant};

fn tcp(e: Encryption) -> Config {
    Config {
        timeout: Duration::from_secs(60),
        chunk_bytes: 64 << 10,
        shm_disable: true,
        socket_ifname: Some("lo".into()),
        encryption: e,
        ..Default::default()
    }
}

#[test]
fn encrypted_collectives_are_exact_with_every_key_source() {
    let file = std::env::temp_dir().join(format!("oxccl-test-psk-{}", std::process::id()));
    std::fs::write(&file, "a pre-shared key of at least thirty-two bytes\n").unwrap();
    for e in [Encryption::Psk(vec![0x5a; 48]), Encryption::PskFile(file.clone()), Encryption::UniqueId] {
        let comms = Communicator::init_all_with_config(4, tcp(e.clone())).unwrap();
        on_all(comms, |c| {
            for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::AllToAll] {
                for count in [1, 1000, 300_001] {
                    let wrong = run_and_count_wrong(c, coll, DataType::F32, ReduceOp::Sum, count, 1, false, 3);
                    assert_eq!(wrong, 0, "{e:?} {coll:?} {count}");
                }
            }
        });
    }
    std::fs::remove_file(file).unwrap();
}

#[test]
fn a_short_or_missing_key_is_refused_at_init() {
    for e in [Encryption::Psk(vec![1; 31]), Encryption::PskFile("/nonexistent/oxccl.psk".into())] {
        let Err(err) = Communicator::init_all_with_config(2, tcp(e)) else { panic!("accepted") };
        assert!(matches!(err.kind, ErrorKind::InvalidArgument | ErrorKind::System), "{err}");
    }
    assert_eq!(oxccl::set_encryption(Encryption::Psk(vec![1; 8])).unwrap_err().kind, ErrorKind::InvalidArgument);
}

/// A job whose unique id (and rank 0) uses `a`, and rank 1 `b`: rank 1 is refused by the sealed
/// store at init (or, with the same store mode, at its first data connection), rank 0 fails at
/// once with the reason rank 1 left; both within seconds, never at the timeout.
fn disagree(a: Encryption, b: Encryption, what: [&str; 2]) {
    let cf = tcp(a.clone());
    let id = oxccl::UniqueId::with_config(&cf).unwrap();
    std::thread::scope(|s| {
        for (rank, e) in [(0, a), (1, b)] {
            let (id, cf) = (&id, &cf);
            s.spawn(move || {
                let t = Instant::now();
                let err = match Communicator::init_with_config(id, 2, rank, Config { encryption: e, ..cf.clone() }) {
                    Err(e) => e,
                    Ok(c) => c.all_reduce_inplace(&mut [1i32; 4], ReduceOp::Sum).unwrap_err(),
                };
                assert!(t.elapsed() < Duration::from_secs(10), "rank {rank}: {:?}", t.elapsed());
                assert!(err.to_string().contains(what[rank]), "rank {rank}: {err}");
                if rank == 1 {
                    assert_eq!(err.cause, Some(Cause::Mismatch), "{err}");
                }
            });
        }
    });
}

#[test]
fn ranks_that_disagree_on_encryption_fail_on_both_sides() {
    let other = "encryption setting or key differs";
    disagree(Encryption::Off, Encryption::UniqueId, ["differs", "does not encrypt its traffic and this process does"]);
    disagree(Encryption::UniqueId, Encryption::Off, [other, "encrypts its traffic and this process does not"]);
    disagree(Encryption::Psk(vec![1; 32]), Encryption::Psk(vec![2; 32]), [other, "different key"]);
}

/// A unique id made with encryption on serves a sealed store: ranks with the same key get
/// through init and their collectives; a rank with another key is refused at init, at once.
#[test]
fn the_unique_ids_store_is_sealed_and_refuses_another_key() {
    let cf = tcp(Encryption::Psk(vec![9; 32]));
    let id = oxccl::UniqueId::with_config(&cf).unwrap();
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (id, cf) = (&id, &cf);
            s.spawn(move || {
                let c = Communicator::init_with_config(id, 2, rank, cf.clone()).unwrap();
                let mut v = [rank as i32 + 1; 1000];
                c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|&x| x == 3));
            });
        }
    });
    let id = oxccl::UniqueId::with_config(&cf).unwrap();
    let t = Instant::now();
    let Err(e) = Communicator::init_with_config(&id, 2, 1, tcp(Encryption::Psk(vec![8; 32]))) else {
        panic!("a rank with another key got through init")
    };
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.cause, Some(Cause::Mismatch), "{e}");
    assert!(e.to_string().contains("bootstrap store") && e.to_string().contains("different key"), "{e}");
}

/// Over the RDMA protocol (libfabric's TCP emulation here), encryption seals each message in
/// its staging slot and opens it in the receiver's ring: collectives stay exact. Skipped where
/// libfabric does not open, unless `OXCCL_REQUIRE_OFI` is set (CI sets it).
#[cfg(feature = "rdma")]
#[test]
fn encrypted_collectives_over_libfabric_are_exact() {
    let cf = Config { net: Some("ofi".into()), ofi_provider: "tcp;ofi_rxm".into(), ..tcp(Encryption::UniqueId) };
    let Some(comms) = common::init_ofi_or_skip(3, cf) else { return };
    on_all(comms, |c| {
        for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter] {
            for count in [1, 5000, 200_001] {
                let wrong = run_and_count_wrong(c, coll, DataType::F32, ReduceOp::Sum, count, 0, false, 5);
                assert_eq!(wrong, 0, "{coll:?} {count}");
            }
        }
    });
}
