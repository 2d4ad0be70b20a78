//! `oxccl-perf`'s command line as a user meets it: help and version exit 0, nccl-tests flags that
//! would change what is measured are refused and the harmless ones warned about, results are
//! checked by default, and an error every rank hits is printed once.

use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
        .args(args)
        .env("OXCCL_SOCKET_IFNAME", "lo")
        .env("OXCCL_TIMEOUT", "60")
        .output()
        .unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_and_version_exit_0_and_describe_every_flag() {
    let o = perf(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let h = String::from_utf8_lossy(&o.stdout);
    for flag in
        ["-b,", "-e,", "-f,", "-i,", "-n,", "-w,", "-c,", "-o,", "-d,", "-r,", "-a,", "--coll", "--np", "--hosts"]
    {
        assert!(h.contains(flag), "help lacks {flag}:\n{h}");
    }
    assert!(h.contains("default 64M") && h.contains("default 1 (mean)"), "{h}");
    let v = perf(&["--version"]);
    assert_eq!(v.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("oxccl-perf "));
}

#[test]
fn nccl_tests_flags_are_refused_or_warned_about() {
    let o = perf(&["-t", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("use --np"), "{}", err(&o));
    let o = perf(&["-g", "2", "-b", "8", "-e", "8"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let o = perf(&["-p", "1", "-z", "0", "-b", "8", "-e", "8"]);
    assert!(o.status.success(), "{}", err(&o));
    let e = err(&o);
    assert_eq!(e.matches("-p 1 has no effect").count(), 1, "{e}");
    assert_eq!(e.matches("-z 0 has no effect").count(), 1, "{e}");
}

#[test]
fn results_are_checked_by_default() {
    let o = perf(&["-b", "8", "-e", "64", "-f", "8"]);
    assert!(o.status.success(), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert!(!rows.is_empty(), "{out}");
    for r in rows {
        assert!(!r.contains("N/A"), "unchecked row: {r}");
    }
}

#[test]
fn an_error_every_rank_hits_is_printed_once() {
    let o = perf(&["--np", "3", "--algo", "nvls", "-b", "8", "-e", "8"]);
    assert!(!o.status.success());
    let e = err(&o);
    assert_eq!(e.matches("is not implemented by oxccl").count(), 1, "{e}");
    // which rank's line comes first depends on timing; the other two are named
    assert!(e.matches("reported the same").count() == 1 && e.contains("ranks ["), "{e}");
    assert!(e.contains("ranks [0, 1, 2] exited with exit status: 1"), "{e}");
    // every line is one rank's: no two messages run together
    assert!(!e.contains("oxccl-perf: oxccl-perf"), "{e}");
}

/// `NCCL_DEBUG=INFO` lines are NCCL's: `host:pid:tid [rank] NCCL INFO ...`, filtered by
/// `NCCL_DEBUG_SUBSYS`, and written to per-process files by `NCCL_DEBUG_FILE` (`%h`, `%p`).
#[test]
fn logs_follow_nccl_conventions() {
    let run = |env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"));
        c.args(["-b", "8", "-e", "8", "-n", "1", "-w", "0"]).env("OXCCL_SOCKET_IFNAME", "lo");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = run(&[("NCCL_DEBUG", "INFO")]);
    assert!(o.status.success());
    let e = err(&o);
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines.iter().any(|l| l.contains("NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM")), "{e}");
    for l in &lines {
        // host:pid:tid [rank] NCCL LEVEL
        let (prefix, rest) = l.split_once(' ').unwrap_or_else(|| panic!("no prefix: {l}"));
        let parts: Vec<&str> = prefix.split(':').collect();
        assert!(parts.len() == 3 && parts[1].parse::<u32>().is_ok() && parts[2].parse::<u32>().is_ok(), "{l}");
        assert!(rest.starts_with('[') && (rest.contains("] NCCL INFO ") || rest.contains("] NCCL WARN ")), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains(" [0] NCCL INFO")) && lines.iter().any(|l| l.contains(" [1] NCCL INFO")));
    // TUNING is not in NCCL's default subsystems; asked for, it is the only one shown
    assert!(!e.contains("bytes uses"), "{e}");
    let t = err(&run(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "TUNING")]));
    assert!(t.contains("allreduce of 8 bytes uses") && !t.contains("Channel 00"), "{t}");
    // one file per process
    let dir = std::env::temp_dir().join(format!("oxccl-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = format!("{}/nccl.%h.%p.log", dir.display());
    let o = run(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_FILE", &pattern)]);
    assert!(o.status.success() && !err(&o).contains("NCCL INFO"), "{}", err(&o));
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|f| f.unwrap().path()).collect();
    assert_eq!(files.len(), 3, "the launcher and 2 ranks: {files:?}");
    let ranks = files.iter().filter(|f| std::fs::read_to_string(f).unwrap().contains("via SHM")).count();
    assert_eq!(ranks, 2, "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a terminal the row being measured is shown (and erased when the row is printed); when the
/// output is not a terminal nothing of it appears.
#[test]
fn the_row_being_measured_shows_on_a_terminal_only() {
    let exe = env!("CARGO_BIN_EXE_oxccl-perf");
    let o = perf(&["-b", "8", "-e", "64", "-f", "8"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("measuring"));
    // `script` gives the program a pseudo-terminal
    let Ok(t) = Command::new("script")
        .args(["-qec", &format!("{exe} -b 8 -e 64 -f 8"), "/dev/null"])
        .env("OXCCL_SOCKET_IFNAME", "lo")
        .output()
    else {
        eprintln!("no `script` here: skipped");
        return;
    };
    let out = String::from_utf8_lossy(&t.stdout);
    assert!(t.status.success(), "{out}");
    assert!(out.contains("\r# measuring allreduce float sum 8 B ...\x1b[K"), "{out:?}");
    assert!(out.contains("\r\x1b[K"), "the indicator is erased: {out:?}");
}

#[test]
fn ranks_are_bound_to_cores_only_on_request() {
    let first = {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap();
        let list = l.split(':').nth(1).unwrap().trim().to_string();
        list.split([',', '-']).next().unwrap().to_string()
    };
    let o = perf(&["--np", "2", "--bind", "core", "-s", "8", "-n", "2", "-w", "0"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let want = format!("rank 0 runs on cores [{first}]");
    assert!(out.contains(&want), "want {want:?}:\n{out}");
    for free in [&["--bind", "none"][..], &[]] {
        let o = perf(&[&["--np", "2", "-s", "8", "-n", "2", "-w", "0"], free].concat());
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains("bound to cores"));
    }
    let o = perf(&["--bind", "sometimes"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("bad --bind sometimes: auto, core or none"), "{}", err(&o));
}
