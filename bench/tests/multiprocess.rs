//! Depth 3: ranks as processes on shared memory, TCP and mixed layouts, every collective checked
//! bit for bit by `oxccl-perf -c 1` (exit status non-zero on any wrong element).

use std::process::Command;

fn perf(np: usize, extra: &[&str], env: &[(&str, &str)]) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl-perf"));
    c.arg("--np").arg(np.to_string()).args(extra).env("OXCCL_SOCKET_IFNAME", "lo").env("OXCCL_TIMEOUT", "120");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run oxccl-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "oxccl-perf --np {np} {extra:?} {env:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert!(rows > 0, "no result rows:\n{stdout}");
    assert!(stdout.contains("# Avg bus bandwidth"), "{stdout}");
}

const SMALL_ALL: [&str; 16] =
    ["--coll", "all", "-d", "all", "-o", "all", "-b", "1", "-e", "64K", "-f", "64", "-n", "1", "-w", "0"];
const F32_BIG: [&str; 14] = ["--coll", "all", "-b", "4", "-e", "4M", "-f", "32", "-n", "2", "-w", "1", "-c", "1"];

fn with_check(a: &[&'static str]) -> Vec<&'static str> {
    let mut v = a.to_vec();
    v.extend(["-c", "1"]);
    v
}

#[test]
fn shm_2_3_4_ranks_every_type_and_op() {
    for np in [2, 3, 4] {
        perf(np, &with_check(&SMALL_ALL), &[]);
    }
}

#[test]
fn tcp_2_3_4_ranks_every_type_and_op() {
    for np in [2, 3, 4] {
        perf(np, &with_check(&SMALL_ALL), &[("NCCL_SHM_DISABLE", "1")]);
    }
}

#[test]
fn mixed_2_hosts_x_2_ranks() {
    let mut a = with_check(&SMALL_ALL);
    a.extend(["--hosts", "2"]);
    perf(4, &a, &[]);
    perf(4, &F32_BIG.iter().copied().chain(["--hosts", "2"]).collect::<Vec<_>>(), &[]);
}

#[test]
fn eight_ranks_on_two_cores_shm_tcp_and_mixed() {
    perf(8, &F32_BIG, &[]);
    perf(8, &F32_BIG, &[("NCCL_SHM_DISABLE", "1")]);
    perf(8, &F32_BIG.iter().copied().chain(["--hosts", "2"]).collect::<Vec<_>>(), &[]);
}

#[test]
fn sixteen_ranks_oversubscribed() {
    perf(
        16,
        &["--coll", "allreduce,allgather,sendrecv", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-c", "1"],
        &[],
    );
}

#[test]
fn bad_flags_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxccl-perf")).args(["-d", "quux"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown type"));
}

/// Standalone env launch: no torchrun, so rank 0 serves a c10d-compatible store on MASTER_PORT;
/// rank and size come from torchrun's, Open MPI's or Slurm's variable names.
#[test]
fn env_launch_with_each_launchers_variables() {
    for (rank_var, size_var) in
        [("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")]
    {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let kids: Vec<_> = (0..3)
            .map(|r| {
                Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
                    .args([
                        "--coll",
                        "allreduce,broadcast",
                        "-b",
                        "8",
                        "-e",
                        "64K",
                        "-f",
                        "64",
                        "-n",
                        "1",
                        "-w",
                        "0",
                        "-c",
                        "1",
                    ])
                    .env(rank_var, r.to_string())
                    .env(size_var, "3")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("OXCCL_SOCKET_IFNAME", "lo")
                    .env("OXCCL_TIMEOUT", "60")
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (r, k) in kids.into_iter().enumerate() {
            let out = k.wait_with_output().unwrap();
            assert!(out.status.success(), "{rank_var} rank {r}");
            if r == 0 {
                assert!(String::from_utf8_lossy(&out.stdout).contains("# Avg bus bandwidth"));
            }
        }
    }
}

/// `OXCCL_UNIQUE_ID` with RANK/WORLD_SIZE: the id replaces MASTER_ADDR/MASTER_PORT.
#[test]
fn unique_id_from_the_environment() {
    let id = oxccl::UniqueId::with_config(&oxccl::Config { socket_ifname: Some("lo".into()), ..Default::default() })
        .unwrap();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            Command::new(env!("CARGO_BIN_EXE_oxccl-perf"))
                .args(["-b", "8", "-e", "1K", "-f", "8", "-n", "1", "-w", "0", "-c", "1"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("OXCCL_UNIQUE_ID", id.to_hex())
                .env_remove("MASTER_ADDR")
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        assert!(k.wait_with_output().unwrap().status.success());
    }
}

/// Hierarchical all-reduce (shm inside a host id, TCP between), forced, on even and uneven
/// layouts; and the tuner's own choice on the same layouts.
#[test]
fn hierarchical_allreduce_over_host_layouts() {
    let args = [
        "--coll",
        "allreduce",
        "-d",
        "all",
        "-o",
        "all",
        "-b",
        "1",
        "-e",
        "1M",
        "-f",
        "64",
        "-n",
        "1",
        "-w",
        "0",
        "-c",
        "1",
    ];
    for (np, hosts) in [(4, 2), (5, 2), (6, 3)] {
        let h = hosts.to_string();
        let mut forced = args.to_vec();
        forced.extend(["--hosts", &h, "--algo", "hierarchical"]);
        perf(np, &forced, &[]);
        let mut tuned = args.to_vec();
        tuned.extend(["--hosts", &h]);
        perf(np, &tuned, &[]);
    }
}

/// The flight recorder: a mismatch leaves a JSON record per rank in OXCCL_DUMP_DIR, and
/// `oxccl-perf --analyze` names where the ranks diverged.
#[test]
fn flight_records_and_analysis() {
    use oxccl::{Communicator, Config, ReduceOp};
    let dir = std::env::temp_dir().join(format!("oxccl-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cf = Config { dump_dir: Some(dir.clone()), timeout: std::time::Duration::from_secs(20), ..Default::default() };
    let comms = Communicator::init_all_with_config(3, cf).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                c.barrier().unwrap();
                let op = if c.rank() == 1 { ReduceOp::Max } else { ReduceOp::Sum };
                assert!(c.all_reduce_inplace(&mut [1f32; 100], op).is_err());
            });
        }
    });
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 3, "one record per rank");
    let text = std::fs::read_to_string(files[0].path()).unwrap();
    assert!(
        text.contains("\"seq\": 1") && text.contains("\"state\": \"failed\"") && text.contains("\"state\": \"done\""),
        "{text}"
    );
    let out =
        Command::new(env!("CARGO_BIN_EXE_oxccl-perf")).args(["--analyze", dir.to_str().unwrap()]).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert!(s.contains("DIVERGED first at op #1") && s.contains("op=max") && s.contains("op=sum"), "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}
