"""A real Prometheus scrape of a running job (docs/watching.md): 2 ranks of oxccl-perf with
OXCCL_METRICS_PORT and OXCCL_METRICS_FILE; `curl` fetches each process's endpoint and the
prometheus_client text parser (PyPI) reads it, and the textfile-collector files too.

Run: python bench/tests/scrape_metrics.py target/release/oxccl-perf   (.ci/run does)
"""

import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

from prometheus_client.parser import text_string_to_metric_families


def free_port_pair():
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p < 65000:
            try:
                with socket.socket() as a, socket.socket() as b:
                    a.bind(("127.0.0.1", p))
                    b.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                continue
    raise RuntimeError("no two free ports")


def scrape(port):
    out = subprocess.run(
        ["curl", "-sf", "--max-time", "5", f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True
    )
    return out.stdout if out.returncode == 0 else None


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def allreduce_ops(fams):
    """rank -> operations_total of allreduce (the parser drops the _total suffix of counters)."""
    return {
        int(s.labels["rank"]): s.value
        for s in fams["oxccl_operations"].samples
        if s.name == "oxccl_operations_total" and s.labels["op"] == "allreduce"
    }


def main():
    perf = sys.argv[1]
    port = free_port_pair()
    d = tempfile.mkdtemp(prefix="oxccl-scrape-")
    env = dict(os.environ, OXCCL_SOCKET_IFNAME="lo", OXCCL_METRICS_PORT=str(port),
               OXCCL_METRICS_FILE=os.path.join(d, "oxccl-%p.prom"), OXCCL_METRICS_INTERVAL_MS="200",
               OXCCL_TIMEOUT="120")
    job = subprocess.Popen([perf, "--np", "2", "-b", "4K", "-e", "4K", "-n", "100000000", "-w", "1", "-c", "0"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        seen = {}
        t = time.time()
        while len(seen) < 2 and time.time() - t < 20:
            for p in (port, port + 1):
                text = scrape(p)
                if text and allreduce_ops(families(text)):
                    seen[p] = text
            time.sleep(0.2)
        assert len(seen) == 2, f"both processes' endpoints on {port} and {port + 1}: {list(seen)}"
        ranks = {}
        for p, text in seen.items():
            fams = families(text)
            for name, kind in [("oxccl_operations", "counter"), ("oxccl_bytes", "counter"),
                               ("oxccl_operation_seconds", "counter"), ("oxccl_peer_wait_seconds", "counter"),
                               ("oxccl_errors", "counter"), ("oxccl_connection_memory_bytes", "gauge"),
                               ("oxccl_peer_last_arrivals", "gauge")]:
                assert name in fams and fams[name].type == kind, (name, fams.get(name))
            ops = allreduce_ops(fams)
            assert len(ops) == 1, ops  # one communicator, this process's rank
            (rank, n), = ops.items()
            by = {s.labels["op"]: s.value for s in fams["oxccl_bytes"].samples if s.name == "oxccl_bytes_total"}
            # 4 KiB per timed all-reduce (oxccl-perf's own few small ones besides; bytes are read
            # after operations, so they may count a few more)
            assert 4096 * (n - 4) <= by["allreduce"] <= 4096 * (n + 1000), (by["allreduce"], n)
            mem = [s.value for s in fams["oxccl_connection_memory_bytes"].samples]
            assert mem and mem[0] > 0, mem
            # counters grow while the job runs
            time.sleep(0.5)
            later = allreduce_ops(families(scrape(p)))[rank]
            assert later > n, (n, later)
            ranks[rank] = later
        assert sorted(ranks) == [0, 1], ranks
        # the textfile collector's files: one per process, whole, parseable
        time.sleep(0.5)
        files = glob.glob(os.path.join(d, "oxccl-*.prom"))
        assert len(files) == 2, files
        for f in files:
            with open(f) as fh:
                assert allreduce_ops(families(fh.read())), f
        print(f"scrape: 2 endpoints on {port}/{port + 1} and 2 files parsed; all-reduces so far {ranks}")
    finally:
        os.killpg(job.pid, 9)
        job.wait()


if __name__ == "__main__":
    main()
