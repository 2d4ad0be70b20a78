//! Fault tolerance and elasticity: revoke, shrink, grow, suspend and resume. Threads as ranks
//! for the logic; processes (this binary re-executed with a role) for `kill -9` and a newcomer
//! in another process.

mod common;
use common::on_all;

use oxccl::{Cause, Communicator, Config, ErrorKind, ReduceOp, ShrinkMode, UniqueId};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn cfg(timeout_s: u64) -> Config {
    Config { timeout: Duration::from_secs(timeout_s), socket_ifname: Some("lo".into()), ..Config::from_env() }
}

/// An all-reduce whose exact result depends on every member: rank r contributes r + 1 + k.
fn check_allreduce(c: &Communicator, k: u64) {
    let mut v = vec![c.rank() as u64 + 1 + k; 4097];
    c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
    let n = c.size() as u64;
    let want = n * (n + 1) / 2 + n * k;
    assert!(v.iter().all(|&x| x == want), "rank {} of {n}: {} != {want}", c.rank(), v[0]);
}

#[test]
fn revoke_from_another_thread_stops_a_collective_no_one_else_joins() {
    let comms = Communicator::init_all_with_config(2, cfg(60)).unwrap();
    on_all(&comms, |c| check_allreduce(c, 0)); // connected
    let c0 = &comms[0];
    let t = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t = Instant::now();
            let mut v = vec![1u32; 1 << 16];
            let e = c0.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap_err();
            (t.elapsed(), e)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!c0.quiescent(), "a collective is running");
        c0.revoke();
        h.join().unwrap()
    });
    let (took, e) = t;
    assert_eq!(e.cause, Some(Cause::Revoked), "{e}");
    assert!(took < Duration::from_secs(2), "returned {took:?} after start (revoked at 300 ms)");
    assert!(c0.revoked() && c0.quiescent());
    assert_eq!(c0.error(), None, "revoke is not a failure");
    // afterwards every operation is refused, and says why
    let e = c0.all_reduce_inplace(&mut [1u32; 4], ReduceOp::Sum).unwrap_err();
    assert_eq!((e.kind, e.cause), (ErrorKind::InvalidUsage, Some(Cause::Revoked)), "{e}");
    // the peer's connections were closed by the revoke: its next collective fails, naming rank 0
    let e = comms[1].all_reduce_inplace(&mut [1u32; 4], ReduceOp::Sum).unwrap_err();
    assert_eq!(e.peer, Some(0), "{e}");
    // split still works on the revoked communicator (the other one revokes too)
    comms[1].revoke();
    let kids: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || c.split(0, 0).unwrap().unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    on_all(&kids, |c| check_allreduce(c, 3));
}

#[test]
fn revoke_fails_queued_async_operations_and_reaches_quiescence() {
    let comms = Communicator::init_all_with_config(2, cfg(60)).unwrap();
    on_all(&comms, |c| check_allreduce(c, 0)); // connected: submitting does not wait
                                               // rank 1 never joins: rank 0's queued operations wait, then fail on revoke
    let reqs: Vec<_> = (0..3).map(|_| comms[0].all_reduce_async(vec![1u32; 1024], ReduceOp::Sum).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!comms[0].quiescent());
    comms[0].revoke();
    for r in reqs {
        let e = r.wait().unwrap_err();
        assert_eq!(e.cause, Some(Cause::Revoked), "{e}");
    }
    let t = Instant::now();
    while !comms[0].quiescent() {
        assert!(t.elapsed() < Duration::from_secs(2), "not quiescent 2 s after revoke");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn shrink_renumbers_the_survivors_and_leaves_a_healthy_parent_usable() {
    let comms = Communicator::init_all_with_config(4, cfg(60)).unwrap();
    on_all(&comms, |c| check_allreduce(c, 0));
    let (stay, _out): (Vec<&Communicator>, Vec<&Communicator>) = comms.iter().partition(|c| c.rank() != 1);
    let kids: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = stay.iter().map(|c| s.spawn(move || c.shrink(&[1], ShrinkMode::Default).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(kids.iter().map(|c| (c.rank(), c.size())).collect::<Vec<_>>(), vec![(0, 3), (1, 3), (2, 3)]);
    assert_eq!(kids[2].peers()[2].pid, comms[3].peers()[3].pid);
    on_all(&kids, |c| check_allreduce(c, 5));
    // NCCL_SHRINK_DEFAULT leaves the parent as it was
    on_all(&comms, |c| check_allreduce(c, 7));
    // and shrinking twice (the second from the child) works
    let grand: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> =
            kids[..2].iter().map(|c| s.spawn(move || c.shrink(&[2], ShrinkMode::Abort).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    on_all(&grand, |c| check_allreduce(c, 9));
    assert!(kids[0].revoked(), "NCCL_SHRINK_ABORT revokes the parent");
    // aborting and destroying the parents afterwards waits for nothing; the children go on
    let t = Instant::now();
    kids.iter().for_each(|c| c.abort());
    drop(kids);
    drop(comms);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    on_all(&grand, |c| check_allreduce(c, 10));
}

#[test]
fn shrink_refuses_bad_lists_and_the_communicator_stays_usable() {
    let comms = Communicator::init_all_with_config(3, cfg(60)).unwrap();
    let c = &comms[0];
    for (ex, want) in [
        (&[3][..], "out of range"),
        (&[1, 1][..], "listed twice"),
        (&[0][..], "its own exclude list"),
        (&[0, 1, 2][..], "its own exclude list"),
    ] {
        let e = c.shrink(ex, ShrinkMode::Default).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{ex:?}: {e}");
        assert!(e.message.contains(want), "{ex:?}: {e}");
    }
    on_all(&comms, |c| check_allreduce(c, 1));
    // outstanding work: NCCL_SHRINK_DEFAULT refuses, naming the fix
    let r = comms[0].all_reduce_async(vec![1u64; 4097], ReduceOp::Sum).unwrap(); // connected: returns
    let e = comms[0].shrink(&[2], ShrinkMode::Default).unwrap_err();
    assert!(e.message.contains("NCCL_SHRINK_ABORT"), "{e}");
    std::thread::scope(|s| {
        s.spawn(|| comms[1].all_reduce_inplace(&mut [1u64; 4097], ReduceOp::Sum).unwrap());
        s.spawn(|| comms[2].all_reduce_inplace(&mut [1u64; 4097], ReduceOp::Sum).unwrap());
    });
    assert_eq!(r.wait().unwrap(), vec![3u64; 4097]);
}

#[test]
fn shrink_with_different_lists_fails_on_both_sides_naming_the_other() {
    let comms = Communicator::init_all_with_config(4, cfg(20)).unwrap();
    let errs: Vec<oxccl::Error> = std::thread::scope(|s| {
        let a = s.spawn(|| comms[0].shrink(&[3], ShrinkMode::Default).unwrap_err());
        let b = s.spawn(|| comms[1].shrink(&[2, 3], ShrinkMode::Default).unwrap_err());
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    for (e, other) in errs.iter().zip([1, 0]) {
        assert_eq!((e.kind, e.cause), (ErrorKind::InvalidUsage, Some(Cause::Mismatch)), "{e}");
        assert_eq!(e.peer, Some(other), "{e}");
        assert!(e.message.contains("excludes"), "{e}");
    }
}

#[test]
fn shrink_names_a_survivor_that_never_arrives_at_the_timeout() {
    let comms = Communicator::init_all_with_config(3, cfg(2)).unwrap();
    let t = Instant::now();
    let errs: Vec<oxccl::Error> = std::thread::scope(|s| {
        let a = s.spawn(|| comms[0].shrink(&[2], ShrinkMode::Default).unwrap_err());
        vec![a.join().unwrap()]
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!((errs[0].kind, errs[0].peer), (ErrorKind::Timeout, Some(1)), "{}", errs[0]);
    assert!(errs[0].message.contains("shrink: rank 1 did not take part"), "{}", errs[0]);
}

/// Grow 2 ranks to 4 with threads as newcomers; existing ranks keep their numbers.
#[test]
fn grow_keeps_the_members_numbers_and_ids_are_single_use() {
    let comms = Communicator::init_all_with_config(2, cfg(30)).unwrap();
    on_all(&comms, |c| check_allreduce(c, 0));
    let id = comms[0].grow_id().unwrap();
    // a second id before the grow completed: refused, on this rank or another
    for c in &comms {
        let e = c.grow_id().unwrap_err();
        assert!(e.message.contains("single-use"), "{e}");
    }
    let e = comms[1].grow(2, None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    let grown: Vec<Communicator> = std::thread::scope(|s| {
        let mut hs =
            vec![s.spawn(|| comms[0].grow(4, Some(&id)).unwrap()), s.spawn(|| comms[1].grow(4, None).unwrap())];
        for r in 2..4 {
            hs.push(s.spawn(move || Communicator::join_grow_with_config(&id, 4, r, cfg(30)).unwrap()));
        }
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(grown.iter().map(|c| c.rank()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(grown[1].peers()[1].pid, std::process::id());
    on_all(&grown, |c| check_allreduce(c, 2));
    // the id is spent
    let e = Communicator::join_grow_with_config(&id, 5, 4, cfg(5)).unwrap_err();
    assert!(e.message.contains("used already"), "{e}");
    // a newcomer that claims an existing member's rank is refused (next grow, new id)
    let id2 = grown[3].grow_id().unwrap();
    // the members have not called grow yet: the newcomer waits, and is refused once they have
    let grown2: Vec<Communicator> = std::thread::scope(|s| {
        let bad = s.spawn(move || Communicator::join_grow_with_config(&id2, 5, 1, cfg(10)).unwrap_err());
        let mut hs: Vec<_> = grown.iter().map(|c| s.spawn(move || c.grow(5, None).unwrap())).collect();
        hs.push(s.spawn(move || Communicator::join_grow_with_config(&id2, 5, 4, cfg(30)).unwrap()));
        let e = bad.join().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("existing member"), "{e}");
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    on_all(&grown2, |c| check_allreduce(c, 4));
    // once the id is spent, a member's rank is still named as the wrong argument it is
    let e = Communicator::join_grow_with_config(&id2, 5, 1, cfg(5)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("existing member"), "{e}");
}

#[test]
fn suspend_releases_connection_memory_and_resume_reconnects() {
    let comms = Communicator::init_all_with_config(3, cfg(30)).unwrap();
    on_all(&comms, |c| check_allreduce(c, 0));
    assert!(comms.iter().all(|c| c.memory_bytes() > 0));
    on_all(&comms, |c| c.suspend().unwrap());
    for c in &comms {
        assert!(c.suspended());
        assert_eq!(c.memory_bytes(), 0);
        let e = c.all_reduce_inplace(&mut [1u32; 4], ReduceOp::Sum).unwrap_err();
        assert_eq!((e.kind, e.cause), (ErrorKind::InvalidUsage, Some(Cause::Suspended)), "{e}");
        assert!(c.suspend().is_err(), "suspending twice");
    }
    on_all(&comms, |c| c.resume().unwrap());
    assert!(comms[0].resume().is_err(), "resume of a communicator not suspended");
    on_all(&comms, |c| check_allreduce(c, 6));
    assert!(comms.iter().all(|c| c.memory_bytes() > 0));
}

// ---- processes: kill -9, then shrink, then grow with a new process --------------------------

fn role() -> Option<(String, usize, usize, UniqueId)> {
    let r = std::env::var("OXCCL_ELASTIC_ROLE").ok()?;
    let rank = std::env::var("OXCCL_TEST_RANK").ok()?.parse().ok()?;
    let n = std::env::var("OXCCL_TEST_NRANKS").ok()?.parse().ok()?;
    let id = UniqueId::from_hex(&std::env::var("OXCCL_TEST_ID").ok()?).ok()?;
    Some((r, rank, n, id))
}

fn spawn(test: &str, role: &str, rank: usize, n: usize, id: &UniqueId, wrap: &[&str]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut c = match wrap {
        [] => Command::new(&exe),
        [first, rest @ ..] => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
    };
    c.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env("OXCCL_ELASTIC_ROLE", role)
        .env("OXCCL_TEST_RANK", rank.to_string())
        .env("OXCCL_TEST_NRANKS", n.to_string())
        .env("OXCCL_TEST_ID", id.to_hex())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let [.., host] = wrap {
        // a namespace host: its own address and host id, so only TCP reaches it
        c.env("OXCCL_SOCKET_IFNAME", "eth0").env("OXCCL_HOSTID", host);
    }
    c.spawn().unwrap()
}

/// The next line of `c`'s output that holds `want`, from `want` on (the test harness prints
/// the test's name on the line before its first output). Read a byte at a time: nothing past
/// the line is consumed, so the next call sees the next line.
fn line(c: &mut Child, want: &str) -> String {
    use std::io::Read;
    let out = c.stdout.as_mut().unwrap();
    let mut l = Vec::new();
    loop {
        let mut b = [0u8];
        assert!(out.read(&mut b).unwrap() > 0, "child exited before printing {want:?}");
        if b[0] != b'\n' {
            l.push(b[0]);
            continue;
        }
        let s = String::from_utf8_lossy(&l).into_owned();
        if let Some(i) = s.find(want) {
            return s[i..].trim().to_string();
        }
        l.clear();
    }
}

/// A member of the 4-rank job: collectives until rank 2 is killed, shrink, collectives on 3,
/// grow back to 4 (rank 0 makes the id and prints it), collectives on 4.
fn member(rank: usize, n: usize, id: UniqueId) {
    let c = Communicator::init(&id, n, rank).unwrap();
    check_allreduce(&c, 0);
    println!("READY");
    let mut v = vec![1.0f32; 1 << 16];
    let e = loop {
        if let Err(e) = c.all_reduce_inplace(&mut v, ReduceOp::Sum) {
            break e;
        }
    };
    let t = Instant::now();
    let s = c.shrink(&[2], ShrinkMode::Abort).unwrap();
    check_allreduce(&s, 1);
    println!("SHRUNK in {} ms after the failure ({e})", t.elapsed().as_millis());
    let gid = if s.rank() == 0 { Some(s.grow_id().unwrap()) } else { None };
    if let Some(g) = gid {
        println!("GROWID {}", g.to_hex());
    }
    let t = Instant::now();
    let g = s.grow(4, gid.as_ref()).unwrap();
    check_allreduce(&g, 2);
    println!("GROWN in {} ms", t.elapsed().as_millis());
    let t = Instant::now();
    drop(c);
    drop(s);
    println!("DONE, parents destroyed in {} ms", t.elapsed().as_millis());
    drop(g);
}

fn newcomer(rank: usize, n: usize, id: UniqueId) {
    let g = Communicator::join_grow(&id, n, rank).unwrap();
    check_allreduce(&g, 2);
    println!("DONE as rank {} of {} at {}", g.rank(), g.size(), g.peers()[g.rank()].ip);
}

fn kill_shrink_grow(test: &str, hosts: [&[&str]; 5]) {
    let ifname = if hosts[0].is_empty() { "lo" } else { "cclt-br0" }; // the bridge reaches every host
    let lo = Config { socket_ifname: Some(ifname.into()), ..Default::default() };
    let id = UniqueId::with_config(&lo).unwrap();
    let mut kids: Vec<Child> = (0..4).map(|r| spawn(test, "member", r, 4, &id, hosts[r])).collect();
    for k in &mut kids {
        line(k, "READY");
    }
    std::thread::sleep(Duration::from_millis(100));
    let _ = kids[2].kill();
    let _ = kids[2].wait();
    let killed = Instant::now();
    let shrunk: Vec<String> = [0, 1, 3].iter().map(|&r| line(&mut kids[r], "SHRUNK")).collect();
    let to_shrunk = killed.elapsed();
    let gid = UniqueId::from_hex(line(&mut kids[0], "GROWID").trim_start_matches("GROWID ")).unwrap();
    let mut fresh = spawn(test, "newcomer", 3, 4, &gid, hosts[4]);
    for r in [0, 1, 3] {
        let l = line(&mut kids[r], "GROWN");
        let d = line(&mut kids[r], "DONE");
        eprintln!("rank {r}: {l}; {d}");
        let ms: u64 = d.rsplit(' ').nth(1).unwrap().parse().unwrap();
        assert!(ms < 3000, "rank {r}: destroying the parents took {ms} ms");
    }
    let done = line(&mut fresh, "DONE");
    assert!(done.starts_with("DONE as rank 3 of 4 at "), "{done}");
    assert!(hosts[4].is_empty() || done.ends_with("10.213.0.5"), "the newcomer is on host 5: {done}");
    for (r, k) in kids.iter_mut().enumerate().filter(|(r, _)| *r != 2).chain([(4, &mut fresh)]) {
        assert!(k.wait().unwrap().success(), "process {r} failed");
    }
    eprintln!("kill -9 to a usable shrunk communicator: {to_shrunk:?} ({shrunk:?})");
    assert!(to_shrunk < Duration::from_secs(10), "{to_shrunk:?}");
}

/// In a child process: play its role (member or newcomer) and say so.
fn play_role() -> bool {
    let Some((role, rank, n, id)) = role() else { return false };
    match role.as_str() {
        "member" => member(rank, n, id),
        _ => newcomer(rank, n, id),
    }
    true
}

#[test]
fn kill_9_then_shrink_then_grow_with_a_new_process() {
    const T: &str = "kill_9_then_shrink_then_grow_with_a_new_process";
    if play_role() {
        return;
    }
    kill_shrink_grow(T, [&[], &[], &[], &[], &[]]);
}

/// The same on namespace hosts (`../shared/netns/`): the four members on hosts 1–4, the
/// newcomer on host 5, each with its own address and host id, over TCP.
#[test]
#[ignore = "needs root and network namespaces (run by .ci/run)"]
fn kill_9_then_shrink_then_grow_across_namespace_hosts() {
    const T: &str = "kill_9_then_shrink_then_grow_across_namespace_hosts";
    if play_role() {
        return;
    }
    let shared =
        std::env::var("OXCCL_SHARED").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../shared").into());
    let up = Command::new(format!("{shared}/netns/netns_up.sh")).args(["-n", "5"]).status().unwrap();
    assert!(up.success(), "netns_up.sh");
    let h = |i: usize| ["ip", "netns", "exec", ["cclt-h1", "cclt-h2", "cclt-h3", "cclt-h4", "cclt-h5"][i]];
    let hosts = [h(0), h(1), h(2), h(3), h(4)];
    let res = std::panic::catch_unwind(|| {
        kill_shrink_grow(T, [&hosts[0][..], &hosts[1][..], &hosts[2][..], &hosts[3][..], &hosts[4][..]])
    });
    let _ = Command::new(format!("{shared}/netns/netns_down.sh")).status();
    if let Err(p) = res {
        std::panic::resume_unwind(p);
    }
}

/// The process serving the store dies (here a helper that made the unique id): shrink cannot
/// meet, and says so within seconds, naming the store, instead of retrying until the timeout.
#[test]
fn shrink_names_the_store_when_the_process_serving_it_died() {
    const T: &str = "shrink_names_the_store_when_the_process_serving_it_died";
    if std::env::var("OXCCL_ELASTIC_ROLE").as_deref() == Ok("store") {
        let id = UniqueId::with_config(&cfg(60)).unwrap();
        println!("ID {}", id.to_hex());
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1]); // until killed
        return;
    }
    let mut store = Command::new(std::env::current_exe().unwrap())
        .args([T, "--exact", "--nocapture", "--test-threads=1"])
        .env("OXCCL_ELASTIC_ROLE", "store")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let id = UniqueId::from_hex(line(&mut store, "ID ").trim_start_matches("ID ")).unwrap();
    let comms: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..3).map(|r| s.spawn(move || Communicator::init_with_config(&id, 3, r, cfg(60)).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    on_all(&comms, |c| check_allreduce(c, 0));
    let _ = store.kill();
    let _ = store.wait();
    // the first try finds the connection broken; the second reconnects and is refused
    for (attempt, want) in [(1, "did not answer"), (2, "is gone (its process exited)")] {
        let t = Instant::now();
        let errs: Vec<oxccl::Error> = std::thread::scope(|s| {
            let hs: Vec<_> =
                comms[..2].iter().map(|c| s.spawn(move || c.shrink(&[2], ShrinkMode::Abort).unwrap_err())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t.elapsed() < Duration::from_secs(5), "attempt {attempt}: {:?} (timeout 60 s)", t.elapsed());
        for e in errs {
            assert!(e.message.contains("shrink: the bootstrap store") && e.message.contains(want), "{attempt}: {e}");
            eprintln!("attempt {attempt}, after {:?}: {e}", t.elapsed());
        }
    }
}
