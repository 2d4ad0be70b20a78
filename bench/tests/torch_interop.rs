//! Interoperation with PyTorch's c10d: our store client against torch's `TCPStore` server, torch's
//! client against our server, and `torchrun` launching `oxccl-perf` (whose ranks become clients
//! of torchrun's store on MASTER_PORT). Needs a Python with torch in `OXCCL_PYTHON`; `.ci/run`
//! installs one and runs these with `--ignored`.

use oxccl::store::{Store, StoreServer, TcpStore};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn python() -> PathBuf {
    PathBuf::from(std::env::var("OXCCL_PYTHON").expect("set OXCCL_PYTHON to a python that has torch"))
}

#[test]
#[ignore = "needs torch (OXCCL_PYTHON); run by .ci/run"]
fn our_client_talks_to_torch_tcpstore() {
    let script = r#"
import sys, time, datetime
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
print(s.port, flush=True)
s.set("from_torch", b"hello")
v = s.get("from_oxccl")          # blocks until our client sets it
assert v == b"world", v
assert s.add("counter", 0) == 12, s.add("counter", 0)
print("OK", flush=True)
time.sleep(0.5)
"#;
    let mut child = Command::new(python()).args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port: u16 = line.trim().parse().expect("port");
    let st = TcpStore::connect(([127, 0, 0, 1], port).into(), None, Duration::from_secs(20)).unwrap();
    assert_eq!(st.get("from_torch", Duration::from_secs(20)).unwrap(), b"hello");
    assert_eq!(st.add("counter", 5).unwrap(), 5);
    assert_eq!(st.add("counter", 7).unwrap(), 12);
    assert!(st.check(&["from_torch".into()]).unwrap());
    assert!(!st.check(&["nope".into()]).unwrap());
    st.set("from_oxccl", b"world").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "OK");
    assert!(child.wait().unwrap().success());
}

#[test]
#[ignore = "needs torch (OXCCL_PYTHON); run by .ci/run"]
fn torch_client_talks_to_our_server() {
    let server = StoreServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), None).unwrap();
    let script = r#"
import sys, datetime
from torch.distributed import TCPStore
port = int(sys.argv[1])
for libuv in (False, True):
    s = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=20), use_libuv=libuv)
    s.set(f"k{libuv}", b"v")
    assert s.get(f"k{libuv}") == b"v"
    assert s.add(f"n{libuv}", 3) == 3 and s.add(f"n{libuv}", 4) == 7
    s.wait([f"k{libuv}"])
    assert s.check([f"k{libuv}"]) and not s.check(["absent"])
    assert s.compare_set(f"c{libuv}", b"", b"x") == b"x"
    assert s.multi_get([f"k{libuv}", f"n{libuv}"]) == [b"v", b"7"]
    s.multi_set(["a", "b"], [b"1", b"2"])
    assert s.get("b") == b"2"
    s.append("a", b"3")
    assert s.get("a") == b"13"
    assert s.delete_key("a") and s.num_keys() >= 1
print("OK")
"#;
    let out = Command::new(python()).args(["-c", script, &server.addr().port().to_string()]).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server.rejected(), 0);
}

#[test]
#[ignore = "needs torch (OXCCL_PYTHON); run by .ci/run"]
fn torchrun_launches_oxccl_perf_as_clients_of_its_store() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new(python())
        .args(["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"])
        .arg(format!("--master-port={port}"))
        .args([
            "--no-python",
            env!("CARGO_BIN_EXE_oxccl-perf"),
            "--coll",
            "all",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "-c",
            "1",
        ])
        .env("OXCCL_SOCKET_IFNAME", "lo")
        .env("OXCCL_DEBUG", "INFO")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("# Avg bus bandwidth"), "{stdout}");
    assert!(!stderr.contains("serving the bootstrap store"), "under torchrun no rank binds the port:\n{stderr}");
}
