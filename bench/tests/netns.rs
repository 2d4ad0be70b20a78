//! Depth 4: ranks on separate hosts made of Linux network namespaces joined by a bridge
//! (`../shared/netns/netns_up.sh`): every rank has its own host id and address, so only the TCP
//! transport carries data. Needs root; `.ci/run` runs it with `--ignored`.

use std::path::PathBuf;
use std::process::Command;

fn shared() -> PathBuf {
    std::env::var_os("OXCCL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// The namespace hosts of one test; holding it keeps other tests (which would tear the same
/// hosts down) waiting.
struct Hosts(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Hosts {
    fn up(n: usize) -> Hosts {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let s = Command::new(shared().join("netns/netns_up.sh"))
            .args(["-n", &n.to_string()])
            .status()
            .expect("netns_up.sh");
        assert!(s.success(), "netns_up.sh failed");
        Hosts(guard)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new(shared().join("netns/netns_down.sh")).status();
    }
}

fn perf(np: usize, netns: &str, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(["--np", &np.to_string(), "--netns", netns])
        .args(extra)
        .env("OXCCL_SOCKET_IFNAME", "cclt-br0") // the launcher's store, on the bridge
        .env("OXCCL_TIMEOUT", "120")
        .env("OXCCL_DEBUG", "INFO")
        .output()
        .expect("oxccl-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--np {np} --netns {netns} {extra:?}\n{stdout}\n{stderr}");
    assert!(stderr.contains("via NET/Socket"), "inter-host pairs use TCP:\n{stderr}");
    if np == netns.split(',').count() {
        assert!(!stderr.contains("via SHM"), "one rank per host: no shm:\n{stderr}");
    } else {
        assert!(stderr.contains("via SHM"), "ranks sharing a host use shm:\n{stderr}");
    }
    assert!(stderr.contains("10.213.0."), "ranks use their namespace addresses:\n{stderr}");
}

#[test]
#[ignore = "needs root and network namespaces (run by .ci/run)"]
fn collectives_across_namespace_hosts() {
    let _h = Hosts::up(4);
    let all = [
        "--coll", "all", "-d", "all", "-o", "all", "-b", "1", "-e", "64K", "-f", "64", "-n", "1", "-w", "0", "-c", "1",
    ];
    let big = ["--coll", "all", "-b", "4", "-e", "8M", "-f", "16", "-n", "2", "-w", "1", "-c", "1"];
    perf(2, "cclt-h1,cclt-h2", &all);
    perf(4, "cclt-h1,cclt-h2,cclt-h3,cclt-h4", &all);
    perf(4, "cclt-h1,cclt-h2,cclt-h3,cclt-h4", &big);
    perf(8, "cclt-h1,cclt-h2,cclt-h3,cclt-h4", &big);
}

/// A namespace host's link goes down (or its packets are dropped by nftables) in the middle of a
/// run of all-reduces: with OXCCL_TIMEOUT=5 the job must end in an error well within the
/// timeout plus reporting time, never hang.
#[test]
#[ignore = "needs root and network namespaces (run by .ci/run)"]
fn link_failure_becomes_an_error_not_a_hang() {
    use std::time::{Duration, Instant};
    let _h = Hosts::up(2);
    let faults: [&[&str]; 2] = [
        &["ip", "link", "set", "eth0", "down"],
        &["sh", "-c", "nft add table inet cclt && nft add chain inet cclt out '{ type filter hook output priority 0; }' && nft add rule inet cclt out ip daddr 10.213.0.1 drop"],
    ];
    for fault in faults {
        if fault[0] == "sh" && Command::new("nft").arg("--version").output().is_err() {
            continue;
        }
        let _ = Command::new("ip").args(["netns", "exec", "cclt-h2", "ip", "link", "set", "eth0", "up"]).status();
        let _ =
            Command::new("ip").args(["netns", "exec", "cclt-h2", "nft", "delete", "table", "inet", "cclt"]).output();
        let mut child = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
            .args(["--np", "2", "--netns", "cclt-h1,cclt-h2", "-s", "1M", "-n", "10000000", "-w", "0"])
            .env("OXCCL_SOCKET_IFNAME", "cclt-br0")
            .env("OXCCL_TIMEOUT", "5")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let s = Command::new("ip").args(["netns", "exec", "cclt-h2"]).args(fault).status().unwrap();
        assert!(s.success(), "injecting {fault:?}");
        let t = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{fault:?}: still running 30 s after the fault: a hang");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut err = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!status.success(), "{fault:?}: the job must fail");
        assert!(t.elapsed() < Duration::from_secs(15), "{fault:?}: took {:?}", t.elapsed());
        assert!(err.contains("timed out") || err.contains("unreachable") || err.contains("rank"), "{fault:?}: {err}");
        eprintln!("{fault:?}: failed after {:?}: {}", t.elapsed(), err.lines().next().unwrap_or(""));
    }
}
