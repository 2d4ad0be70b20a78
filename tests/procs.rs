//! Depth 3: ranks as processes (this test binary re-executed with a role), for what only
//! processes can show: CPU use of idle and waiting ranks, and nothing leaked after `kill -9`.

mod common;

use oxccl::{Communicator, ReduceOp, UniqueId};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn role(test: &str) -> Option<(usize, usize, UniqueId)> {
    if std::env::var("OXCCL_TEST_ROLE").ok()? != test {
        return None;
    }
    let rank = std::env::var("OXCCL_TEST_RANK").ok()?.parse().ok()?;
    let n = std::env::var("OXCCL_TEST_NRANKS").ok()?.parse().ok()?;
    let id = UniqueId::from_hex(&std::env::var("OXCCL_TEST_ID").ok()?).ok()?;
    Some((rank, n, id))
}

fn spawn(test: &str, n: usize, id: &UniqueId, extra: &[(&str, &str)]) -> Vec<Child> {
    spawn_each(test, n, id, |_| extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// Start `n` ranks of `test`, with per-rank extra environment.
fn spawn_each(test: &str, n: usize, id: &UniqueId, env_of: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Child> {
    (0..n)
        .map(|r| {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env("OXCCL_TEST_ROLE", test)
                .env("OXCCL_TEST_RANK", r.to_string())
                .env("OXCCL_TEST_NRANKS", n.to_string())
                .env("OXCCL_TEST_ID", id.to_hex())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in env_of(r) {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect()
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn wait_line(c: &mut Child, want: &str) {
    use std::io::BufRead;
    let out = c.stdout.as_mut().unwrap();
    let mut r = std::io::BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "child exited before printing {want:?}");
        if line.contains(want) {
            return;
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn idle_and_waiting_ranks_do_not_spin() {
    const T: &str = "idle_and_waiting_ranks_do_not_spin";
    if let Some((rank, n, id)) = role(T) {
        let c = Communicator::init(&id, n, rank).unwrap();
        let mut v = vec![1.0f32; 1 << 16];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], n as f32);
        println!("READY");
        // phase 1: idle for 2 s holding the communicator
        std::thread::sleep(Duration::from_millis(2000));
        // phase 2: rank 0 arrives 2 s late; the others wait inside the allreduce
        if rank == 0 {
            std::thread::sleep(Duration::from_millis(2000));
        }
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        println!("DONE");
        return;
    }
    let _g = lock();
    let n = 8;
    let id = UniqueId::with_config(&oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() }).unwrap();
    let mut kids = spawn(T, n, &id, &[]);
    for k in &mut kids {
        wait_line(k, "READY");
    }
    let t0 = Instant::now();
    let before: Vec<f64> = kids.iter().map(|k| cpu_seconds(k.id())).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let idle: Vec<f64> = kids.iter().zip(&before).map(|(k, b)| cpu_seconds(k.id()) - b).collect();
    let idle_s = t0.elapsed().as_secs_f64();
    // wait into phase 2 (ranks 1.. are blocked in the allreduce)
    std::thread::sleep(Duration::from_millis(900));
    let before2: Vec<f64> = kids.iter().map(|k| cpu_seconds(k.id())).collect();
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let waiting: Vec<f64> = kids.iter().zip(&before2).map(|(k, b)| cpu_seconds(k.id()) - b).collect();
    let wait_s = t1.elapsed().as_secs_f64();
    for k in &mut kids {
        wait_line(k, "DONE");
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    for (r, c) in idle.iter().enumerate() {
        assert!(c / idle_s < 0.01, "rank {r} used {:.1}% CPU while idle", 100.0 * c / idle_s);
    }
    for (r, c) in waiting.iter().enumerate().skip(1) {
        assert!(c / wait_s < 0.02, "rank {r} used {:.1}% CPU while waiting", 100.0 * c / wait_s);
    }
}

fn dev_shm() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn nothing_leaks_after_kill_9_mid_collective() {
    const T: &str = "nothing_leaks_after_kill_9_mid_collective";
    if let Some((rank, n, id)) = role(T) {
        let c = Communicator::init(&id, n, rank).unwrap();
        let mut v = vec![1u32; 1 << 20];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        println!("READY");
        loop {
            let _ = c.all_reduce_inplace(&mut v, ReduceOp::Sum);
        }
    }
    let _g = lock();
    let shm_before = dev_shm();
    let id = UniqueId::with_config(&oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() }).unwrap();
    let mut kids = spawn(T, 4, &id, &[("OXCCL_HOSTID", "same")]);
    for k in &mut kids {
        wait_line(k, "READY");
    }
    std::thread::sleep(Duration::from_millis(300));
    for k in &mut kids {
        let _ = k.kill(); // SIGKILL
    }
    for mut k in kids {
        let _ = k.wait();
    }
    assert_eq!(dev_shm(), shm_before, "/dev/shm changed");
}

#[test]
fn survivors_detect_a_killed_rank_quickly_and_name_it() {
    const T: &str = "survivors_detect_a_killed_rank_quickly_and_name_it";
    if let Some((rank, n, id)) = role(T) {
        let c = Communicator::init(&id, n, rank).unwrap();
        let mut v = vec![1.0f32; 1 << 18];
        c.all_reduce_inplace(&mut v, ReduceOp::Sum).unwrap();
        println!("READY");
        loop {
            let t = Instant::now();
            if let Err(e) = c.all_reduce_inplace(&mut v, ReduceOp::Sum) {
                println!("FAILED after {} ms: {e}", t.elapsed().as_millis());
                break;
            }
        }
        drop(c);
        // recovery: the survivors build a fresh communicator without rank 2 and keep training
        let id2 = UniqueId::from_hex(&std::env::var("OXCCL_TEST_ID2").unwrap()).unwrap();
        let c = Communicator::init(&id2, n - 1, if rank < 2 { rank } else { rank - 1 }).unwrap();
        let mut w = vec![0.0f32; 1000];
        for step in 0..20 {
            let mut g = vec![(c.rank() + step) as f32; 1000];
            c.all_reduce_inplace(&mut g, ReduceOp::Sum).unwrap();
            let want = (0..c.size()).map(|r| (r + step) as f32).sum::<f32>();
            assert!(g.iter().all(|&x| x == want));
            w.iter_mut().zip(&g).for_each(|(w, g)| *w -= 0.01 * g);
        }
        println!("CONTINUED with {} ranks: w[0] = {}", c.size(), w[0]);
        return;
    }
    let _g = lock();
    for (n, env) in [
        (4, vec![("OXCCL_HOSTID", "one")]),
        (4, vec![("NCCL_SHM_DISABLE", "1")]),
        (4, vec![]), // each rank its own host id below: mixed by pairs
        (8, vec![("OXCCL_HOSTID", "one")]),
    ] {
        let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
        let (id, id2) = (UniqueId::with_config(&lo).unwrap(), UniqueId::with_config(&lo).unwrap());
        let mixed = env.is_empty();
        let mut kids = spawn_each(T, n, &id, |r| {
            let mut e: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            if mixed {
                e.push(("OXCCL_HOSTID".into(), format!("h{}", r / 2)));
            }
            e.push(("OXCCL_TEST_ID2".into(), id2.to_hex()));
            e.push(("OXCCL_TIMEOUT".into(), "600".into())); // the default is in force
            e
        });
        for k in &mut kids {
            wait_line(k, "READY");
        }
        std::thread::sleep(Duration::from_millis(200));
        let _ = kids[2].kill();
        let _ = kids[2].wait();
        for (r, k) in kids.into_iter().enumerate() {
            if r == 2 {
                continue;
            }
            let out = k.wait_with_output().unwrap();
            let s = String::from_utf8_lossy(&out.stdout);
            let line =
                s.lines().find(|l| l.starts_with("FAILED")).unwrap_or_else(|| panic!("rank {r} did not fail: {s}"));
            assert!(line.contains("rank 2"), "n={n} {env:?}: rank {r} does not name rank 2: {line}");
            // and the operation it stopped, on the rank that found the death too
            assert!(line.matches("allreduce(").count() >= 1, "n={n} {env:?}: rank {r} does not name the op: {line}");
            let ms: u64 = line["FAILED after ".len()..].split(' ').next().unwrap().parse().unwrap();
            assert!(ms < 5000, "n={n} {env:?}: rank {r} failed {ms} ms after the kill");
            assert!(
                s.contains(&format!("CONTINUED with {} ranks", n - 1)),
                "n={n} {env:?}: rank {r} did not recover: {s}"
            );
        }
    }
}

/// Start ranks `0..count` of `test` (of `nranks`), rank `own_pidns` in its own pid namespace
/// (`unshare --pid --fork`: as on another machine, its pid means nothing to the others).
fn spawn_with_pidns(test: &str, nranks: usize, count: usize, id: &UniqueId, own_pidns: usize) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    (0..count)
        .map(|r| {
            let mut c = if r == own_pidns {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--kill-child"]).arg(&exe);
                c
            } else {
                Command::new(&exe)
            };
            c.args([test, "--exact", "--nocapture", "--test-threads=1", "--ignored"])
                .env("OXCCL_TEST_ROLE", test)
                .env("OXCCL_TEST_RANK", r.to_string())
                .env("OXCCL_TEST_NRANKS", nranks.to_string())
                .env("OXCCL_TEST_ID", id.to_hex())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", "600")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            c.spawn().unwrap()
        })
        .collect()
}

/// Kill a rank started under `unshare` (its child is pid 1 of the namespace) and `unshare`.
fn kill_unshared(k: &mut Child) {
    let inner = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", k.id())).unwrap_or_default();
    for pid in inner.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let _ = k.kill();
}

/// A rank on "another machine" (its own pid namespace, so its pid means nothing to the others)
/// dies while a peer waits in the lazy setup of their first connection (a send mid-run): the
/// peer probes its liveness beacon and fails within seconds, naming it and the phase, under the
/// default timeout. Needs root (`unshare --pid`): `.ci/run` runs it.
#[test]
#[ignore = "needs root for a pid namespace (run by .ci/run)"]
fn a_rank_in_another_pid_namespace_that_dies_during_lazy_setup_is_named() {
    const T: &str = "a_rank_in_another_pid_namespace_that_dies_during_lazy_setup_is_named";
    if let Some((rank, n, id)) = role(T) {
        let c = Communicator::init(&id, n, rank).unwrap();
        println!("READY");
        if rank == 0 {
            // its first message to rank 2: the connection is set up now
            let e = c.send(&[1.0f32; 16], 2).unwrap_err();
            println!("FAILED: {e}");
        } else {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        return;
    }
    let _g = lock();
    let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
    let id = UniqueId::with_config(&lo).unwrap();
    let mut kids = spawn_with_pidns(T, 3, 3, &id, 2);
    for k in &mut kids {
        wait_line(k, "READY");
    }
    std::thread::sleep(Duration::from_millis(300)); // rank 0 waits in setup for rank 2
    kill_unshared(&mut kids[2]);
    let killed = Instant::now();
    let r0 = kids.remove(0);
    let out = r0.wait_with_output().unwrap();
    let took = killed.elapsed();
    let s = String::from_utf8_lossy(&out.stdout);
    let line = s.lines().find(|l| l.starts_with("FAILED")).unwrap_or_else(|| panic!("rank 0 did not fail: {s}"));
    assert!(took < Duration::from_secs(5), "rank 0 failed {took:?} after the kill: {line}");
    assert!(line.contains("connection setup: rank 2 ") && line.contains("died"), "{line}");
    assert!(line.contains("liveness port"), "found by the beacon, not the pid: {line}");
    eprintln!("rank 0 failed {took:?} after the kill: {line}");
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// A rank in its own pid namespace (as on another machine) joins, then dies while the others
/// still wait in init for a rank that has not come: they probe the joined rank's beacon and fail
/// within seconds, naming it, instead of waiting for the missing one until the timeout. Needs
/// root (`unshare --pid`): `.ci/run` runs it.
#[test]
#[ignore = "needs root for a pid namespace (run by .ci/run)"]
fn a_rank_in_another_pid_namespace_that_dies_in_init_is_named() {
    const T: &str = "a_rank_in_another_pid_namespace_that_dies_in_init_is_named";
    if let Some((rank, n, id)) = role(T) {
        println!("STARTED");
        match Communicator::init(&id, n, rank) {
            Ok(_) => println!("JOINED (unexpected)"),
            Err(e) => println!("FAILED: {e}"),
        }
        return;
    }
    let _g = lock();
    let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
    let id = UniqueId::with_config(&lo).unwrap();
    // ranks 0 and 1 of 3 (rank 2 never starts); rank 1 in its own pid namespace
    let mut kids = spawn_with_pidns(T, 3, 2, &id, 1);
    for k in &mut kids {
        wait_line(k, "STARTED");
    }
    std::thread::sleep(Duration::from_millis(1500)); // both joined; rank 0 waits for rank 2
    kill_unshared(&mut kids[1]);
    let killed = Instant::now();
    let out = kids.remove(0).wait_with_output().unwrap();
    let took = killed.elapsed();
    let s = String::from_utf8_lossy(&out.stdout);
    let line = s.lines().find(|l| l.starts_with("FAILED")).unwrap_or_else(|| panic!("rank 0 did not fail: {s}"));
    assert!(took < Duration::from_secs(5), "rank 0 failed {took:?} after the kill: {line}");
    assert!(line.contains("init: rank 1 ") && line.contains("died") && line.contains("liveness port"), "{line}");
    eprintln!("rank 0 failed {took:?} after the kill: {line}");
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// Soak: a seeded random sequence of collectives over the world communicator and random splits,
/// random types, ops, counts, roots and layouts, on 4 processes over 2 host ids (shm inside a
/// pair, TCP across), every result checked bit for bit. `OXCCL_SOAK_OPS` sets the length
/// (default 400; docs/reliability.md records longer runs).
#[test]
fn soak_random_collectives_over_random_splits() {
    const T: &str = "soak_random_collectives_over_random_splits";
    if let Some((rank, n, id)) = role(T) {
        use oxccl::exact::premul_two;
        use oxccl::schedule::inplace_layout;
        use oxccl::{Coll, DataType};
        let world = Communicator::init(&id, n, rank).unwrap();
        let ops: usize = std::env::var("OXCCL_SOAK_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
        let mut z = 0x5EED_u64; // the same sequence on every rank
        let mut rnd = move |m: usize| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((z >> 33) as usize) % m.max(1)
        };
        let colls = Coll::COLLECTIVES;
        let mut sub: Option<Communicator> = None;
        let mut checked = 0usize;
        for i in 0..ops {
            if rnd(25) == 0 {
                // a new split: colors from the shared sequence, some ranks left out
                let colors: Vec<i32> = (0..n).map(|_| rnd(3) as i32 - 1).collect();
                let key = rnd(100) as i32;
                sub = world.split(colors[rank], key).unwrap();
            }
            // the step runs on the world or on the current split; ranks outside the split skip
            // it, after drawing the same numbers as everyone (the sequences must stay aligned)
            let on_sub = rnd(2) == 0;
            let c = if on_sub { sub.as_ref() } else { Some(&world) };
            let (cn, cr) = c.map_or((1, 0), |c| (c.size(), c.rank()));
            let coll = colls[rnd(colls.len())];
            let dt = DataType::ALL[rnd(12)];
            let op = if coll.reduces() {
                [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg, premul_two(dt)][rnd(6)]
            } else {
                ReduceOp::Sum
            };
            let count = if rnd(10) == 0 { 20_000 + rnd(80_000) } else { rnd(3000) };
            let root = rnd(cn);
            let inplace = rnd(2) == 0 && inplace_layout(coll, cn, cr, count, root).is_some();
            let Some(c) = c else { continue };
            let wrong = common::run_and_count_wrong(c, coll, dt, op, count, root, inplace, i as u64);
            assert_eq!(
                wrong, 0,
                "op {i}: {coll:?} {dt:?} {op:?} count {count} root {root} inplace {inplace} on {cn} ranks"
            );
            checked += 1;
        }
        println!("SOAK OK {checked}");
        return;
    }
    let _g = lock();
    let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
    let id = UniqueId::with_config(&lo).unwrap();
    let n = 4;
    let kids = spawn_each(T, n, &id, |r| {
        vec![("OXCCL_HOSTID".into(), format!("soak-h{}", r / 2)), ("OXCCL_TIMEOUT".into(), "120".into())]
    });
    for (r, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && s.contains("SOAK OK"), "rank {r}:\n{s}");
        let checked: usize =
            s.split("SOAK OK ").nth(1).and_then(|x| x.split_whitespace().next()?.parse().ok()).unwrap();
        assert!(checked >= 150, "rank {r} checked only {checked} operations");
        eprintln!("rank {r}: {checked} operations checked");
    }
}

#[test]
fn init_names_the_ranks_that_never_joined() {
    // here rather than with the thread tests: under the lock nothing else loads the machine, so
    // the two present ranks always meet before the deadline
    let _g = lock();
    // generous enough that the two present ranks always meet, even on a loaded machine
    let cf = oxccl::Config { timeout: Duration::from_secs(4), socket_ifname: Some("lo".into()), ..Default::default() };
    let id = oxccl::UniqueId::with_config(&cf).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let cf = cf.clone();
                s.spawn(move || Communicator::init_with_config(&id, 4, r, cf))
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap().unwrap_err();
            assert_eq!(e.kind, oxccl::ErrorKind::Timeout, "{e}");
            assert!(e.to_string().contains("ranks [2, 3] did not join"), "{e}");
        }
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_launchers_report_of_a_dead_rank_ends_the_others_init_at_once() {
    // a rank killed before it reached the store is invisible to the others: its launcher saw it
    // die and says so through the id (oxccl-perf does; UniqueId::report_failure)
    let cf =
        oxccl::Config { timeout: Duration::from_secs(120), socket_ifname: Some("lo".into()), ..Default::default() };
    let id = oxccl::UniqueId::with_config(&cf).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let cf = cf.clone();
                s.spawn(move || Communicator::init_with_config(&id, 3, r, cf))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        id.report_failure("rank 2 (pid 4242) died: its process exited with signal: 9 (SIGKILL), as the launcher saw")
            .unwrap();
        for h in hs {
            let e = h.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("rank 2 (pid 4242) died"), "{e}");
        }
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// Over libfabric (`tcp;ofi_rxm`, two host ids on loopback): a rank that sends its last
/// message and closes at once waits, when closing, until its peer has read it — the peer is
/// asleep (not progressing) for a second first, so the close ends only after the peer woke —
/// and the peer gets it: it is not lost with the sender's process. An aborted rank closes at
/// once instead, and its peer gets the message or a clean error, without hanging.
#[test]
fn over_libfabric_a_rank_that_closes_first_delivers_its_last_messages() {
    const T: &str = "over_libfabric_a_rank_that_closes_first_delivers_its_last_messages";
    if let Some((rank, n, id)) = role(T) {
        use std::io::Write;
        let c = match Communicator::init(&id, n, rank) {
            Ok(c) => c,
            Err(e) if e.kind == oxccl::ErrorKind::Unavailable => {
                println!("UNAVAILABLE {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut v = [1.0f32; 4];
        // (with an abort, rank 1 may abort while rank 0 still finishes this)
        if let Err(e) = c.all_reduce_inplace(&mut v, ReduceOp::Sum) {
            println!("FAILED {e}");
            return;
        }
        if rank == 1 {
            // go once rank 0 is asleep (the test relays its SLEEPING line)
            std::io::stdin().read_line(&mut String::new()).unwrap();
            c.send(&[7u64, 8, 9], 0).unwrap();
            if std::env::var_os("OXCCL_TEST_ABORT").is_some() {
                c.abort();
            }
            let t = Instant::now();
            drop(c);
            println!("CLOSED at {} after {} ms", unix_ms(), t.elapsed().as_millis());
        } else {
            println!("SLEEPING");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_millis(1000));
            println!("WOKE at {}", unix_ms());
            let mut got = [0u64; 3];
            match c.recv(&mut got, 1) {
                Ok(()) => println!("GOT {got:?}"),
                Err(e) => println!("RECV FAILED {e}"),
            }
        }
        return;
    }
    use std::io::{BufRead, Read, Write};
    let _g = lock();
    let num = |out: &str, key: &str| -> u128 {
        let rest = out.split_once(key).unwrap_or_else(|| panic!("no {key:?} in {out}")).1;
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    for abort in [false, true] {
        let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
        let id = UniqueId::with_config(&lo).unwrap();
        let mut kids = spawn_each(T, 2, &id, |r| {
            let mut e = vec![
                ("OXCCL_HOSTID".to_string(), format!("h{r}")),
                ("OXCCL_NET".into(), "ofi".into()),
                ("OXCCL_OFI_PROVIDER".into(), "tcp;ofi_rxm".into()),
                ("OXCCL_TIMEOUT".into(), "60".into()),
            ];
            if abort {
                e.push(("OXCCL_TEST_ABORT".into(), "1".into()));
            }
            e
        });
        let mut r0 = std::io::BufReader::new(kids[0].stdout.take().unwrap());
        let mut out0 = String::new();
        let mut line = String::new();
        while !line.contains("SLEEPING") && !line.contains("UNAVAILABLE") && !line.contains("FAILED") {
            line.clear();
            if r0.read_line(&mut line).unwrap() == 0 {
                break;
            }
            out0.push_str(&line);
        }
        let _ = kids[1].stdin.take().unwrap().write_all(b"go\n");
        r0.read_to_string(&mut out0).unwrap();
        let outs: Vec<String> = std::iter::once(out0)
            .chain(
                kids.into_iter()
                    .skip(1)
                    .map(|k| String::from_utf8_lossy(&k.wait_with_output().unwrap().stdout).into_owned()),
            )
            .collect();
        if outs.iter().any(|o| o.contains("UNAVAILABLE")) && std::env::var_os("OXCCL_REQUIRE_OFI").is_none() {
            eprintln!("skipped: libfabric is not here: {}", outs[0]);
            return;
        }
        let (closed_at, ms) = (num(&outs[1], "CLOSED at "), num(&outs[1], " after "));
        if abort {
            assert!(ms < 400, "an aborted rank closed after {ms} ms");
            assert!(outs[0].contains("GOT") || outs[0].contains("FAILED"), "{}", outs[0]);
        } else {
            let woke_at = num(&outs[0], "WOKE at ");
            assert!(closed_at >= woke_at, "closed {} ms before its peer woke to read: {outs:?}", woke_at - closed_at);
            assert!(ms < 5000, "closed after {ms} ms");
            assert!(outs[0].contains("GOT [7, 8, 9]"), "{}", outs[0]);
        }
    }
}

/// Ranks on two hosts that disagree on the network between them (`OXCCL_NET=ofi` on one,
/// `socket` on the other) both fail at the first collective, at once, with an error naming both
/// networks and the setting — not a decoder error or a timeout.
#[test]
fn ranks_that_disagree_on_the_network_fail_clearly() {
    const T: &str = "ranks_that_disagree_on_the_network_fail_clearly";
    if let Some((rank, n, id)) = role(T) {
        let c = match Communicator::init(&id, n, rank) {
            Ok(c) => c,
            Err(e) => {
                println!("INIT FAILED {e}");
                return;
            }
        };
        let t = Instant::now();
        match c.all_reduce_inplace(&mut [1.0f32; 4], ReduceOp::Sum) {
            Ok(()) => println!("NO ERROR"),
            Err(e) => println!("FAILED after {} ms: {e}", t.elapsed().as_millis()),
        }
        return;
    }
    let _g = lock();
    let lo = oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() };
    let id = UniqueId::with_config(&lo).unwrap();
    let kids = spawn_each(T, 2, &id, |r| {
        vec![
            ("OXCCL_HOSTID".to_string(), format!("h{r}")),
            ("OXCCL_NET".into(), if r == 0 { "ofi" } else { "socket" }.into()),
            ("OXCCL_OFI_PROVIDER".into(), "tcp;ofi_rxm".into()),
            ("OXCCL_TIMEOUT".into(), "60".into()),
        ]
    });
    let outs: Vec<String> =
        kids.into_iter().map(|k| String::from_utf8_lossy(&k.wait_with_output().unwrap().stdout).into_owned()).collect();
    if outs[0].contains("INIT FAILED")
        && outs[0].contains("navailable")
        && std::env::var_os("OXCCL_REQUIRE_OFI").is_none()
    {
        eprintln!("skipped: libfabric is not here: {}", outs[0]);
        return;
    }
    for (r, o) in outs.iter().enumerate() {
        let line = o.split_once("FAILED after ").unwrap_or_else(|| panic!("rank {r} did not fail: {o}")).1;
        let ms: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
        assert!(ms < 10_000, "rank {r} failed after {ms} ms");
        assert!(
            line.contains("NET/OFI") && line.contains("NET/Socket") && line.contains("OXCCL_NET"),
            "rank {r}: {line}"
        );
    }
    eprintln!("{}", outs[0].lines().find(|l| l.contains("FAILED")).unwrap_or(""));
}
