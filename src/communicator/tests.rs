//! Unit tests that need a communicator assembled by hand: peers that are not really there.

use super::*;
use crate::runtime::CONNECTING;
use crate::store::{MemStore, Store};
use crate::Config;
use oxccl_transport::Cause;
use oxccl_transport::PeerInfo;
use std::time::{Duration, Instant};

/// A pid no process of this machine has. Found without forking: a child holds a copy of every
/// descriptor until it execs, which would keep the process-wide beacon's socket open while
/// `beacon::tests` checks that dropping it closes it.
fn dead_pid() -> u32 {
    let max: u32 =
        std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(32768);
    (300..max).rev().find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).expect("a free pid")
}

/// Rank 0 of 2 over a store of its own, rank 1 on this machine with the process `pid1`.
fn pair_with(pid1: u32) -> (Communicator, Arc<MemStore>) {
    pair_on(pid1, [vec![], vec![]])
}

/// [`pair_with`], the ranks' processes allowed on `cpus`.
fn pair_on(pid1: u32, cpus: [Vec<u32>; 2]) -> (Communicator, Arc<MemStore>) {
    let peer = |rank: usize, pid| PeerInfo {
        rank,
        host_id: 1,
        pid,
        machine: 7,
        hostname: "here".into(),
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        beacon: 0,
        cpus: cpus[rank].clone(),
        cpu_quota: 0,
    };
    let store = MemStore::new();
    let peers = vec![peer(0, std::process::id()), peer(1, pid1)];
    let cfg = Config { timeout: Duration::from_secs(30), ..Default::default() };
    let c = Communicator::assemble(store.clone(), "t".into(), [0; 32], Default::default(), 0, peers, cfg)
        .expect("assemble");
    (c, store)
}

#[test]
fn a_peer_that_published_then_exited_is_not_dead_to_a_late_waiter() {
    // lifetimes.c failed CI this way: rank 1, alone in its split colour, published its record,
    // finished and exited before rank 2 looked for that record
    let (c, store) = pair_with(dead_pid());
    store.set("t/k/1", b"record").unwrap();
    let got = c.sh.wait_key_for("t/k/1", Instant::now() + Duration::from_secs(30), 1, None, &CONNECTING);
    assert_eq!(got.unwrap(), b"record");
}

#[test]
fn a_peer_that_died_without_publishing_is_named_at_once() {
    let (c, _store) = pair_with(dead_pid());
    let t = Instant::now();
    let e = c.sh.wait_key_for("t/k/1", Instant::now() + Duration::from_secs(30), 1, None, &CONNECTING).unwrap_err();
    assert_eq!(e.cause, Some(Cause::PeerDied), "{e}");
    assert!(e.to_string().contains("rank 1 (pid") && e.to_string().contains("died"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn ranks_bound_to_cores_of_their_own_are_not_oversubscribed() {
    // each process sees one CPU; the machine's count is what the two of them share
    let (c, _store) = pair_on(dead_pid(), [vec![0], vec![1]]);
    assert_eq!(c.sh.spin, Duration::from_micros(50), "two ranks on two cores spin");
    assert_eq!(c.sh.oversub, 1.0);
    let (c, _store) = pair_on(dead_pid(), [vec![1], vec![1]]);
    assert_eq!(c.sh.spin, Duration::ZERO, "two ranks on one core do not spin");
    assert_eq!(c.sh.oversub, 2.0);
}
