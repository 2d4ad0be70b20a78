//! Receive from any source, with threads as ranks: matching, data, order with collectives,
//! fairness, large messages, shm and TCP, and every error.

mod common;
use common::on_all;

use oxccl::{Communicator, Config, ErrorKind, ReduceOp};
use std::time::{Duration, Instant};

fn cfg(shm: bool) -> Config {
    Config { timeout: Duration::from_secs(60), chunk_bytes: 4096, shm_disable: !shm, ..Default::default() }
}

/// What rank `r` sends in round `k`: a value no other rank or round sends.
fn payload(r: usize, k: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| (r as u32) << 24 | (k as u32) << 16 | (i as u32 & 0xFFFF)).collect()
}

/// Every other rank sends to rank 0 (fresh communicators: no connection exists yet), which
/// receives from any source; each message is matched once, in its sender's order, and is exact.
/// Then collectives and directed p2p still work on the connections the offers made.
fn gather_by_any_source(n: usize, len: usize, rounds: usize, shm: bool) {
    let comms = Communicator::init_all_with_config(n, cfg(shm)).unwrap();
    on_all(comms, |c| {
        let r = c.rank();
        if r == 0 {
            // a sender may be rounds ahead of another; each one's messages arrive in its order
            let mut got = vec![0usize; n];
            for _ in 0..rounds * (n - 1) {
                let mut buf = vec![0u32; len];
                let src = c.recv_any(&mut buf, &[]).unwrap();
                assert!(src != 0 && got[src] < rounds, "rank {src} matched once too often");
                assert!(buf == payload(src, got[src], len), "message {} from rank {src} is wrong", got[src]);
                got[src] += 1;
            }
        } else {
            (0..rounds).for_each(|k| c.send(&payload(r, k, len), 0).unwrap());
        }
        let mut x = [r as u64 + 1];
        c.all_reduce_inplace(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0], (n * (n + 1) / 2) as u64);
        // directed, the other way
        if r == 0 {
            (1..n).for_each(|p| c.send(&payload(0, p, 10), p).unwrap());
        } else {
            let mut b = vec![0u32; 10];
            c.recv(&mut b, 0).unwrap();
            assert_eq!(b, payload(0, r, 10));
        }
    });
}

#[test]
fn any_source_receives_each_sender_exactly_over_shm() {
    gather_by_any_source(4, 1000, 3, true);
}

#[test]
fn any_source_receives_each_sender_exactly_over_tcp() {
    gather_by_any_source(3, 1000, 3, false);
}

/// Messages larger than a connection's buffering: each sender waits for its receive.
#[test]
fn any_source_with_messages_larger_than_the_buffering() {
    gather_by_any_source(3, 1 << 20, 2, true);
    gather_by_any_source(3, 300_000, 1, false);
}

/// Eight ranks on two cores: seven senders per round, all matched.
#[test]
fn any_source_oversubscribed() {
    gather_by_any_source(8, 64, 5, true);
}

/// Candidates restrict the match; a send from a rank outside them waits for its own receive.
/// A send that follows a collective is matched after it, in order.
#[test]
fn candidates_restrict_the_match_and_order_with_collectives_holds() {
    let comms = Communicator::init_all_with_config(3, cfg(true)).unwrap();
    on_all(comms, |c| {
        let r = c.rank();
        if r != 0 {
            c.send(&payload(r, 0, 100), 0).unwrap();
        } else {
            // rank 1's send may arrive first: only rank 2 is a candidate
            std::thread::sleep(Duration::from_millis(100));
            let mut b = vec![0u32; 100];
            assert_eq!(c.recv_any(&mut b, &[2]).unwrap(), 2);
            assert_eq!(b, payload(2, 0, 100));
            c.recv(&mut b, 1).unwrap();
            assert_eq!(b, payload(1, 0, 100));
        }
        c.barrier().unwrap();
        if r == 1 {
            c.send(&payload(1, 1, 7), 0).unwrap();
        } else if r == 0 {
            let mut b = vec![0u32; 7];
            assert_eq!(c.recv_any(&mut b, &[1, 2]).unwrap(), 1);
            assert_eq!(b, payload(1, 1, 7));
        }
    });
}

/// Bad arguments are refused before anything happens, and the communicator stays usable.
#[test]
fn bad_any_source_arguments_are_refused_and_lose_nothing() {
    let comms = Communicator::init_all_with_config(3, cfg(true)).unwrap();
    let c = &comms[0];
    let mut b = [0u32; 4];
    for (peers, says) in [
        (&[0usize][..], "rank 0 is this rank"),
        (&[1, 3][..], "rank 3 is out of range (the communicator has 3)"),
        (&[2, 1, 2][..], "rank 2 is listed twice"),
    ] {
        let e = c.recv_any(&mut b, peers).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    let e = c.recv_any(&mut [0u32; 0], &[]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("at least one element"), "{e}");
    let one = Communicator::init_all_with_config(1, cfg(true)).unwrap();
    let e = one[0].recv_any(&mut b, &[]).unwrap_err();
    assert!(e.to_string().contains("has no source"), "{e}");
    on_all(comms, |c| c.barrier().unwrap());
}

/// A timeout names the candidates and leaves the communicator usable: the send that comes
/// later is received by the next call.
#[test]
fn a_timeout_names_the_candidates_and_leaves_the_communicator_usable() {
    let mut cf = cfg(true);
    cf.timeout = Duration::from_millis(800);
    let comms = Communicator::init_all_with_config(2, cf).unwrap();
    on_all(comms, |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1200));
            c.send(&[42u64], 0).unwrap();
        } else {
            let mut b = [0u64];
            let t = Instant::now();
            let e = c.recv_any(&mut b, &[]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
            assert!(e.to_string().contains("no message from any of ranks [1]"), "{e}");
            assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
            assert_eq!(c.recv_any(&mut b, &[]).unwrap(), 1);
            assert_eq!(b, [42]);
        }
    });
}

/// Abort from another thread ends a waiting any-source receive promptly, before and after
/// its candidates are connected.
#[test]
fn abort_ends_a_waiting_any_source_receive() {
    for connected in [false, true] {
        let comms = Communicator::init_all_with_config(2, cfg(true)).unwrap();
        let c0 = &comms[0];
        if connected {
            std::thread::scope(|s| {
                s.spawn(|| comms[1].barrier().unwrap());
                c0.barrier().unwrap();
            });
        }
        let h = c0.abort_handle();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                h.abort();
            });
            let t = Instant::now();
            let e = c0.recv_any(&mut [0u8; 4], &[]).unwrap_err();
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
            assert_eq!(e.cause, Some(oxccl::Cause::Aborted), "{e}");
        });
    }
}

/// A peer that fails while a receive from any source waits on it fails the receive, naming it.
#[test]
fn a_failed_candidate_fails_the_receive_and_names_it() {
    let mut comms = Communicator::init_all_with_config(2, cfg(true)).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| comms[1].barrier().unwrap());
        comms[0].barrier().unwrap();
    });
    let c1 = comms.pop().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            c1.abort_handle().abort();
            drop(c1); // an aborted communicator tells its peers when it is closed
        });
        let t = Instant::now();
        let e = comms[0].recv_any(&mut [0u8; 4], &[]).unwrap_err();
        assert_eq!(e.peer, Some(1), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    });
    assert!(comms[0].barrier().is_err(), "the communicator failed");
}
