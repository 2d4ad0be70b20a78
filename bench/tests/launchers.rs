//! Depth 3: `oxccl-perf` started the way launchers start it, as separate processes with only the
//! launcher's environment (Open MPI, MPICH, Slurm, torchrun-style): no `MASTER_ADDR`, ranks
//! started with different sizes, a port held by a program that is not a store, and ranks on
//! several nodes where the launcher does not say where rank 0 is.

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run `n` ranks of `oxccl-perf` at once, rank `r` with the environment `env_of(r)`.
fn ranks(n: usize, args: &[&str], env_of: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Output> {
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"));
            c.args(args)
                .env("OXCCL_TIMEOUT", "60")
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env_remove("MASTER_ADDR")
                .env_remove("MASTER_PORT")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env_of(r) {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    kids.into_iter().map(|k| k.wait_with_output().unwrap()).collect()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn job() -> String {
    format!("{}{}", std::process::id(), Instant::now().elapsed().subsec_nanos())
}

fn kv(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

const SMALL: [&str; 6] = ["-b", "8", "-e", "4K", "-c", "1"];

/// A launcher's name and the environment it gives rank r.
type Style<'a> = (&'static str, Box<dyn Fn(usize) -> Vec<(String, String)> + 'a>);

#[test]
fn open_mpi_mpich_and_slurm_on_one_node_need_no_master_addr() {
    let j = job();
    let styles: [Style<'_>; 3] = [
        (
            "Open MPI",
            Box::new(|r| {
                kv(&[
                    ("OMPI_COMM_WORLD_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_SIZE", "2".into()),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
                    ("OMPI_MCA_ess_base_jobid", format!("ompi{j}")),
                ])
            }),
        ),
        (
            "MPICH",
            Box::new(|r| {
                kv(&[
                    ("PMI_RANK", r.to_string()),
                    ("PMI_SIZE", "2".into()),
                    ("MPI_LOCALNRANKS", "2".into()),
                    ("PMI_KVSNAME", format!("kvs_{j}")),
                ])
            }),
        ),
        (
            "Slurm",
            Box::new(|r| {
                kv(&[
                    ("SLURM_PROCID", r.to_string()),
                    ("SLURM_NTASKS", "2".into()),
                    ("SLURM_NNODES", "1".into()),
                    ("SLURM_JOB_ID", format!("9{}", &j[..6.min(j.len())])),
                    ("SLURM_STEP_ID", "0".into()),
                ])
            }),
        ),
    ];
    for (who, env) in styles {
        let out = ranks(2, &SMALL, env);
        for (r, o) in out.iter().enumerate() {
            assert!(o.status.success(), "{who}: rank {r} failed:\n{}", text(o));
        }
        assert!(text(&out[0]).contains("# Avg bus bandwidth"), "{who}: {}", text(&out[0]));
    }
}

#[test]
fn ranks_on_several_nodes_without_master_addr_are_told_what_to_export() {
    let t = Instant::now();
    let out = ranks(1, &SMALL, |_| {
        kv(&[
            ("OMPI_COMM_WORLD_RANK", "0".into()),
            ("OMPI_COMM_WORLD_SIZE", "4".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
        ])
    });
    let s = text(&out[0]);
    assert!(!out[0].status.success(), "{s}");
    assert!(s.contains("span 2 nodes") && s.contains("export MASTER_ADDR="), "{s}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
}

#[test]
fn ranks_started_with_different_sizes_both_get_the_cause() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let out = ranks(2, &SMALL, |r| {
        kv(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", (2 + r).to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
    for (r, o) in out.iter().enumerate() {
        let s = text(o);
        assert!(!o.status.success(), "rank {r} succeeded: {s}");
        assert!(s.contains("rank 1 was started with 3 ranks and rank 0 with 2"), "rank {r}: {s}");
    }
}

#[test]
fn a_port_held_by_another_program_is_named_at_once() {
    // something that accepts connections and never answers
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        l.set_nonblocking(true).unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            match l.accept() {
                Ok((mut s, _)) => {
                    let mut b = [0u8; 64];
                    let _ = s.set_read_timeout(Some(Duration::from_millis(10)));
                    let _ = s.read(&mut b);
                    held.push(s);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
            if held.len() >= 8 {
                break;
            }
        }
    });
    let t = Instant::now();
    let out = ranks(2, &SMALL, |r| {
        kv(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
    let took = t.elapsed();
    for (r, o) in out.iter().enumerate() {
        let s = text(o);
        assert!(!o.status.success(), "rank {r}: {s}");
        assert!(s.contains("is held by a program that is not an oxccl or c10d store"), "rank {r}: {s}");
    }
    assert!(took < Duration::from_secs(15), "took {took:?} (the timeout is 60 s)");
    drop(holder);
}

/// A long wait says what it waits for while it waits (`OXCCL_WAIT_REPORT` seconds): at init,
/// the ranks that have not joined; in an operation, the ranks it waits for and the call.
#[test]
fn long_waits_say_what_they_wait_for() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let env = |r: usize| {
        kv(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
            ("OXCCL_WAIT_REPORT", "1".into()),
            ("OXCCL_TIMEOUT", "5".into()),
        ])
    };
    // rank 1 never starts
    let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"));
    c.args(SMALL).env("OXCCL_SOCKET_IFNAME", "lo").envs(env(0));
    let o = c.output().unwrap();
    let s = text(&o);
    assert!(!o.status.success());
    assert!(s.contains("init: rank 0 waiting for ranks [1] to join (1 of 2 joined), 1 of 5 s"), "{s}");
    // rank 1 stops in the middle of the run
    let port2 = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            let mut e = env(r);
            e.retain(|(k, _)| k != "MASTER_PORT");
            e.push(("MASTER_PORT".into(), port2.clone()));
            Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
                .args(["-b", "8", "-e", "8", "-n", "100000000", "-w", "0", "-c", "0"])
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .envs(e)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let stop = |sig: &str, pid: u32| {
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
    };
    stop("-STOP", kids[1].id());
    let stopped = std::time::Instant::now();
    let mut it = kids.into_iter();
    let (r0, r1) = (it.next().unwrap(), it.next().unwrap());
    let out0 = r0.wait_with_output().unwrap(); // fails at its 5 s timeout
                                               // (the census begins a second before the deadline, so the report comes at the timeout)
    let took = stopped.elapsed();
    eprintln!("the stopped rank was reported {took:?} after SIGSTOP (OXCCL_TIMEOUT=5)");
    assert!(took < Duration::from_millis(5900), "reported {took:?} after SIGSTOP: not at the 5 s timeout");
    stop("-KILL", r1.id());
    let _ = r1.wait_with_output();
    let s = text(&out0);
    assert!(!out0.status.success(), "{s}");
    assert!(s.contains("rank 0: waiting for ranks [1] in allreduce #"), "{s}");
    assert!(s.contains("(float, 8 B), 1 of 5 s"), "{s}");
    // the timeout's report: the stopped rank did not answer the census, and it says so
    assert!(s.contains("ranks [1] ") && s.contains("stopped"), "{s}");
}
