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

struct Hosts;

impl Hosts {
    fn up(n: usize) -> Hosts {
        let s = Command::new(shared().join("netns/netns_up.sh"))
            .args(["-n", &n.to_string()])
            .status()
            .expect("netns_up.sh");
        assert!(s.success(), "netns_up.sh failed");
        Hosts
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
