//! Depth 3: a rank killed at a random moment (init, connection setup, or an operation, the
//! first use of a peer set included) is detected by every survivor within seconds under the
//! default 600 s timeout, and named with the phase it died in. Shared memory, TCP, and both
//! (two host ids).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The children of `pid`, in start order (the launcher starts rank 0 first).
fn children(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// A layout: its name, oxccl-perf's flags and environment for it.
type Layout<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

#[test]
fn a_rank_killed_at_a_random_moment_is_named_within_seconds() {
    let layouts: [Layout<'_>; 3] =
        [("shm", &[], &[]), ("tcp", &[], &[("NCCL_SHM_DISABLE", "1")]), ("mixed", &["--hosts", "2"], &[])];
    let mut seed = 0x2545_f491_4f6c_dd1du64 ^ std::process::id() as u64;
    let mut rnd = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for (name, args, env) in layouts {
        for _ in 0..3 {
            let delay = Duration::from_millis(rnd(700));
            let victim = 1 + rnd(3) as usize;
            let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"));
            c.args(["--np", "4", "-b", "1K", "-e", "16M", "-n", "30", "-c", "1"])
                .args(args)
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env_remove("OXCCL_TIMEOUT") // the default 600 s
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            let launcher = c.spawn().unwrap();
            let t = Instant::now();
            let mut kids = children(launcher.id());
            while kids.len() < 4 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(2));
                kids = children(launcher.id());
            }
            assert_eq!(kids.len(), 4, "{name}: the ranks did not start");
            std::thread::sleep(delay.saturating_sub(t.elapsed()));
            let _ = Command::new("kill").args(["-9", &kids[victim].to_string()]).status();
            let killed = Instant::now();
            let out = launcher.wait_with_output().unwrap();
            let took = killed.elapsed();
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                continue; // the job had finished before the kill landed
            }
            assert!(took < Duration::from_secs(5), "{name}, kill at {delay:?}: survivors took {took:?}\n{err}");
            // shared memory names the process ("rank 2 (pid 123) died"), TCP the closed connection
            // ("rank 2 closed the TCP connection unexpectedly (process died or connection reset)")
            assert!(err.contains(&format!("rank {victim} ")) && err.contains("died"), "{name}: {err}");
            // a kill during init can reach a survivor through the launcher's cascade first:
            // "init failed: ... init failed on another rank: rank 3 (pid ..) died"
            let phase = ["init:", "init failed", "connection setup:", "allreduce("].iter().any(|p| err.contains(p));
            assert!(phase, "{name}, kill at {delay:?}: no phase named:\n{err}");
            eprintln!("{name}: rank {victim} killed at {delay:?}, survivors failed {took:?} later");
        }
    }
}
