//! `oxccl-perf --np N`: start N local ranks (or ranks in network namespaces) and wait for them.

use oxccl::UniqueId;
use std::process::{Command, ExitCode};

/// Launch `np` local ranks of this program and wait for them.
///
/// With `netns`, rank r runs in namespace `netns[r * k / np]` (`ip netns exec`), as its own host:
/// its host id is the namespace name and it uses the namespace's `eth0`.
pub fn launch(np: usize, hosts: usize, netns: &[String], args: &[String]) -> ExitCode {
    let id = match UniqueId::new() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = std::env::current_exe().expect("current_exe");
    let passthrough: Vec<String> = {
        let mut v = vec![];
        let mut i = 0;
        while i < args.len() {
            if args[i] == "--np" || args[i] == "--hosts" || args[i] == "--netns" {
                i += 2;
                continue;
            }
            if args[i].starts_with("--np=") || args[i].starts_with("--hosts=") || args[i].starts_with("--netns=") {
                i += 1;
                continue;
            }
            v.push(args[i].clone());
            i += 1;
        }
        v
    };
    let mut children = vec![];
    for r in 0..np {
        let mut cmd = if netns.is_empty() {
            Command::new(&exe)
        } else {
            let ns = &netns[r * netns.len() / np];
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&exe);
            c.env("OXCCL_HOSTID", format!("netns-{ns}")).env("OXCCL_SOCKET_IFNAME", "eth0");
            c
        };
        cmd.args(&passthrough)
            .env("OXCCL_PERF_ID", id.to_hex())
            .env("OXCCL_PERF_RANK", r.to_string())
            .env("OXCCL_PERF_NRANKS", np.to_string());
        if hosts > 1 && netns.is_empty() {
            cmd.env("OXCCL_HOSTID", format!("perf-host-{}", r * hosts / np));
        }
        match cmd.spawn() {
            Ok(ch) => children.push(ch),
            Err(e) => {
                eprintln!("oxccl-perf: cannot start rank {r}: {e}");
                for mut c in children {
                    let _ = c.kill();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let mut ok = true;
    for (r, mut ch) in children.into_iter().enumerate() {
        match ch.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("oxccl-perf: rank {r} exited with {s}");
                ok = false;
            }
            Err(e) => {
                eprintln!("oxccl-perf: waiting for rank {r}: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
