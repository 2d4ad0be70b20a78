//! Watching a running job from outside (docs/watching.md): `oxccl-perf --status` names a rank
//! stopped with SIGSTOP, and `--trace` writes a Chrome trace whose events nest and are in order.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PERF: &str = env!("CARGO_BIN_EXE_oxccl-perf");

/// Rank r's process among the launcher's children (its `OXCCL_PERF_RANK`).
fn rank_pids(launcher: u32, n: usize) -> Vec<u32> {
    let t = Instant::now();
    loop {
        let kids: Vec<u32> = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let mut by_rank = vec![0u32; n];
        for k in kids {
            let env = std::fs::read(format!("/proc/{k}/environ")).unwrap_or_default();
            let rank = env
                .split(|&b| b == 0)
                .find_map(|kv| kv.strip_prefix(b"OXCCL_PERF_RANK="))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok());
            if let Some(r) = rank.filter(|&r| r < n) {
                by_rank[r] = k;
            }
        }
        if by_rank.iter().all(|&p| p != 0) {
            return by_rank;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn status(id_file: &str) -> Output {
    Command::new(PERF).args(["--status", &format!("@{id_file}")]).output().unwrap()
}

struct Job(Child, Vec<u32>);

impl Drop for Job {
    fn drop(&mut self) {
        for p in &self.1 {
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn status_names_the_rank_stopped_with_sigstop() {
    let dir = std::env::temp_dir().join(format!("oxccl-status-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let id_file = dir.join("id").to_string_lossy().into_owned();
    let launcher = Command::new(PERF)
        .args(["--np", "4", "-b", "64K", "-e", "64K", "-n", "100000000", "-w", "1", "-c", "0"])
        .args(["--id-file", &id_file])
        .env("OXCCL_SOCKET_IFNAME", "lo")
        .env("OXCCL_STATUS_AFTER_MS", "300")
        .env("OXCCL_TIMEOUT", "120")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let id = launcher.id();
    let pids = rank_pids(id, 4);
    let job = Job(launcher, pids.clone());
    // running, fast: no rank is in a long operation (nothing published, or only the first
    // straggler window's views)
    std::thread::sleep(Duration::from_millis(500));
    let quiet = String::from_utf8_lossy(&status(&id_file).stdout).into_owned();
    let idle = ["no communicator has published a status yet", "verdict: no rank is in a long operation"];
    assert!(idle.iter().any(|s| quiet.contains(s)), "{quiet}");
    let victim = 2;
    Command::new("kill").args(["-STOP", &pids[victim].to_string()]).status().unwrap();
    let t = Instant::now();
    let text = loop {
        std::thread::sleep(Duration::from_millis(300));
        let out = status(&id_file);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        // every rank but the victim reports waiting
        let waiting = (0..4).filter(|&r| r != victim).all(|r| {
            text.lines().any(|l| l.trim_start().starts_with(&format!("rank {r} ")) && l.contains("waiting for ranks"))
        });
        if waiting || t.elapsed() > Duration::from_secs(15) {
            break text;
        }
    };
    eprintln!("{text}");
    let verdict = text.lines().find(|l| l.trim_start().starts_with("verdict:")).expect("a verdict");
    assert!(verdict.contains(&format!("ranks [{victim}] ")), "{verdict}");
    assert!(verdict.ends_with("ranks [0, 1, 3] wait for them"), "{verdict}");
    let victim_line = text.lines().find(|l| l.trim_start().starts_with(&format!("rank {victim} "))).unwrap();
    assert!(victim_line.contains(&format!("pid {}", pids[victim])), "{victim_line}");
    // (it may have published its straggler window's view before it was stopped)
    let silent = ["no status published", "not in a long operation"];
    assert!(silent.iter().any(|s| victim_line.contains(s)), "{victim_line}");
    drop(job);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_loads_and_its_events_nest_in_order() {
    let dir = std::env::temp_dir().join(format!("oxccl-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("trace.json").to_string_lossy().into_owned();
    let out = Command::new(PERF)
        .args(["--np", "2", "-b", "8", "-e", "1M", "-f", "32", "-n", "3", "-w", "1", "--trace", &file])
        .args(["--coll", "allreduce,allgather"])
        .env("OXCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // loaded with Python's json (what chrome://tracing and Perfetto read): every step lies
    // inside its operation on the same row, operations follow each other, in sequence order
    let check = r##"
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
ops = [e for e in ev if e.get("cat") == "op"]
steps = [e for e in ev if e.get("cat") == "step"]
assert {e["pid"] for e in ops} == {0, 1}, "both ranks"
assert {e["name"] for e in ev if e["ph"] == "M"} == {"process_name"}
eps = 0.002
for s in steps:
    seq = s["args"]["seq"]
    mine = [o for o in ops if o["pid"] == s["pid"] and o["tid"] == s["tid"] and o["name"].endswith(" #%d" % seq)]
    assert len(mine) == 1, ("one op for", s)
    o = mine[0]
    assert o["ts"] - eps <= s["ts"] and s["ts"] + s["dur"] <= o["ts"] + o["dur"] + eps, ("step outside its op", s, o)
for pid in (0, 1):
    row = sorted((o for o in ops if o["pid"] == pid), key=lambda o: o["ts"])
    seqs = [int(o["name"].split("#")[1]) for o in row]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    for a, b in zip(row, row[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + eps, ("ops overlap", a, b)
names = {o["name"].split(" ")[0] for o in ops}
assert {"allreduce", "allgather"} <= names, names
print("trace: %d operations, %d steps" % (len(ops), len(steps)))
"##;
    let py = Command::new("python3").args(["-c", check, &file]).output().unwrap();
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    eprint!("{}", String::from_utf8_lossy(&py.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}
