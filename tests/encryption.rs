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

/// Rank 0 with `a`, rank 1 with `b`: both fail at their first collective, within seconds,
/// naming the other and what differs.
fn disagree(a: Encryption, b: Encryption, what: &str) {
    let lo = tcp(Encryption::Off);
    let id = oxccl::UniqueId::with_config(&lo).unwrap();
    std::thread::scope(|s| {
        for (rank, e) in [(0, a), (1, b)] {
            let (id, lo) = (&id, &lo);
            s.spawn(move || {
                let c = Communicator::init_with_config(id, 2, rank, Config { encryption: e, ..lo.clone() }).unwrap();
                let t = Instant::now();
                let err = c.all_reduce_inplace(&mut [1i32; 4], ReduceOp::Sum).unwrap_err();
                assert!(t.elapsed() < Duration::from_secs(10), "rank {rank}: {:?}", t.elapsed());
                assert_eq!((err.cause, err.peer), (Some(Cause::Mismatch), Some(1 - rank)), "rank {rank}: {err}");
                assert!(err.to_string().contains(what), "rank {rank}: {err}");
            });
        }
    });
}

#[test]
fn ranks_that_disagree_on_encryption_fail_on_both_sides() {
    disagree(Encryption::UniqueId, Encryption::Off, "encrypts its TCP traffic and");
    disagree(Encryption::Psk(vec![1; 32]), Encryption::Psk(vec![2; 32]), "different keys");
}
