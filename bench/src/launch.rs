//! `oxccl-perf --np N`: start N local ranks (or ranks in network namespaces) and wait for them.

use crate::args::Bind;
use oxccl::UniqueId;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

/// The ranks' standard error, forwarded a whole line at a time (never two ranks' text in one
/// line), and a line another rank already printed (the same text but for rank numbers) is held
/// back: the summary names the ranks that reported it too.
#[derive(Default)]
struct Stderr {
    /// Normalised line -> (the ranks that also printed it).
    seen: Mutex<BTreeMap<String, (String, Vec<usize>)>>,
}

impl Stderr {
    fn normal(line: &str) -> String {
        // "[rank 3]" and "rank 3 " differ between ranks: compare without the numbers
        let mut out = String::with_capacity(line.len());
        let mut rest = line;
        while let Some(i) = rest.find("rank ") {
            out.push_str(&rest[..i + 5]);
            rest = rest[i + 5..].trim_start_matches(|c: char| c.is_ascii_digit());
            out.push('#');
        }
        out.push_str(rest);
        out
    }

    fn line(&self, rank: usize, line: &str) {
        let key = Self::normal(line);
        let mut seen = self.seen.lock().unwrap();
        match seen.get_mut(&key) {
            Some((_, also)) => also.push(rank),
            None => {
                seen.insert(key, (line.to_string(), Vec::new()));
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{line}");
            }
        }
    }

    fn summary(&self) {
        for (first, also) in self.seen.lock().unwrap().values() {
            if !also.is_empty() {
                let mut ranks = also.clone();
                ranks.sort_unstable();
                ranks.dedup();
                let times = if also.len() > ranks.len() {
                    format!(" ({} times in all)", also.len() + 1)
                } else {
                    String::new()
                };
                let short: String = first.chars().take(60).collect();
                eprintln!("oxccl-perf: ranks {ranks:?} reported the same as \"{short}...\"{times}");
            }
        }
    }
}

/// Launch `np` local ranks of this program and wait for them.
///
/// With `netns`, rank r runs in namespace `netns[r * k / np]` (`ip netns exec`), as its own host:
/// its host id is the namespace name and it uses the namespace's `eth0`. With `pidns` as well,
/// each rank (one per namespace) also gets its own pid namespace (`unshare --pid --fork`).
///
/// A rank that dies (a signal, or a failing exit) is reported to the ranks still in init through
/// the id's store ([`UniqueId::report_failure`]): they fail at once with the cause instead of
/// waiting for a rank that will never join.
pub fn launch(
    np: usize,
    hosts: usize,
    (netns, pidns): (&[String], bool),
    id_file: Option<&str>,
    bind: Bind,
    args: &[String],
) -> ExitCode {
    if pidns && netns.len() != np {
        eprintln!("oxccl-perf: --pidns needs --netns with one namespace per rank ({np} ranks)");
        return ExitCode::FAILURE;
    }
    let id = match UniqueId::new() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(f) = id_file {
        // the id is a password to the job: readable by its owner only
        use std::os::unix::fs::OpenOptionsExt;
        let w = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(f);
        if let Err(e) = w.and_then(|mut w| writeln!(w, "{}", id.to_hex())) {
            eprintln!("oxccl-perf: --id-file {f}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let exe = std::env::current_exe().expect("current_exe");
    let epoch = oxccl::watch::trace::now_unix_us();
    let passthrough: Vec<String> = {
        let mut v = vec![];
        let mut i = 0;
        while i < args.len() {
            if args[i] == "--pidns" {
                i += 1;
                continue;
            }
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
    let cpus = allowed_cpus();
    let core_of = |r: usize| match bind {
        Bind::Core if !cpus.is_empty() => Some(cpus[r % cpus.len()]),
        Bind::Auto if np <= cpus.len() => Some(cpus[r]),
        _ => None,
    };
    let mut children = vec![];
    let stderr = Arc::new(Stderr::default());
    let mut readers = vec![];
    for r in 0..np {
        let mut cmd = if netns.is_empty() {
            Command::new(&exe)
        } else {
            let ns = &netns[r * netns.len() / np];
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]);
            if pidns {
                c.args(["unshare", "--pid", "--fork", "--kill-child"]);
            }
            c.arg(&exe);
            c.env("OXCCL_HOSTID", format!("netns-{ns}")).env("OXCCL_SOCKET_IFNAME", "eth0");
            c
        };
        cmd.args(&passthrough)
            .env("OXCCL_PERF_ID", id.to_hex())
            .env("OXCCL_PERF_RANK", r.to_string())
            .env("OXCCL_PERF_NRANKS", np.to_string())
            .env_remove(CPU_VAR)
            .env(crate::watch::EPOCH_VAR, epoch.to_string());
        if let Some(c) = core_of(r) {
            cmd.env(CPU_VAR, c.to_string());
        }
        if hosts > 1 && netns.is_empty() {
            cmd.env("OXCCL_HOSTID", format!("perf-host-{}", r * hosts / np));
        }
        cmd.stderr(Stdio::piped());
        match cmd.spawn() {
            Ok(mut ch) => {
                let err = ch.stderr.take().unwrap();
                let out = stderr.clone();
                readers.push(std::thread::spawn(move || {
                    for l in BufReader::new(err).lines().map_while(Result::ok) {
                        out.line(r, &l);
                    }
                }));
                children.push(ch)
            }
            Err(e) => {
                eprintln!("oxccl-perf: cannot start rank {r}: {e}");
                for mut c in children {
                    let _ = c.kill();
                }
                return ExitCode::FAILURE;
            }
        }
    }
    // exit statuses, grouped: "ranks [0, 1, 2] exited with exit status: 1"; a rank that dies
    // is reported to the others as soon as it does
    let (tx, rx) = std::sync::mpsc::channel();
    for (r, mut ch) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let pid = ch.id();
            let _ = tx.send((r, pid, ch.wait()));
        });
    }
    drop(tx);
    let mut exits: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (r, pid, status) in rx {
        let what = match status {
            Ok(s) if s.success() => continue,
            Ok(s) => format!("exited with {s}"),
            Err(e) => format!("could not be waited for: {e}"),
        };
        let _ = id.report_failure(&format!("rank {r} (pid {pid}) died: its process {what}, as the launcher saw"));
        exits.entry(what).or_default().push(r);
    }
    for h in readers {
        let _ = h.join();
    }
    stderr.summary();
    let ok = exits.is_empty();
    for (what, mut ranks) in exits {
        ranks.sort_unstable();
        match ranks.as_slice() {
            [r] => eprintln!("oxccl-perf: rank {r} {what}"),
            rs => eprintln!("oxccl-perf: ranks {rs:?} {what}"),
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The core the launcher bound this rank to (`--bind`), which the rank applies to itself first.
const CPU_VAR: &str = "OXCCL_PERF_CPU";

/// The cores this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return vec![] };
    (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

/// The core the launcher chose for this rank, if it chose one.
pub fn bound_core() -> Option<usize> {
    std::env::var(CPU_VAR).ok()?.parse().ok()
}

/// In a rank the launcher started: bind this process (before it starts any thread) to the core
/// the launcher chose, if it chose one.
pub fn bind_self() -> Result<(), String> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let Ok(v) = std::env::var(CPU_VAR) else { return Ok(()) };
    let c: usize = v.parse().map_err(|_| format!("bad {CPU_VAR}={v}"))?;
    let mut set = CpuSet::new();
    set.set(c).map_err(|e| format!("core {c}: {e}"))?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| format!("binding to core {c}: {e}"))
}
