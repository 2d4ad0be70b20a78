//! A communicator's counters, and the Prometheus text format of every live communicator's.
//!
//! Families (labels `comm`, the communicator id; `rank`; `nranks`):
//! `oxccl_operations_total`, `oxccl_bytes_total` and `oxccl_operation_seconds_total` per `op`
//! (bytes: the call's count × type size), `oxccl_peer_wait_seconds_total` per `peer` (time this
//! rank's operations waited for a message from it), `oxccl_peer_last_arrivals` per `peer` (the
//! straggler window's "last to arrive" count), `oxccl_errors_total` and
//! `oxccl_connection_memory_bytes`.

use crate::schedule::Coll;
use std::fmt::Write;
use std::time::Duration;

/// Every operation, in declaration order.
const OPS: [Coll; 10] = Coll::ALL;

/// `c`'s place in [`OPS`] (the declaration order: a cast, checked by a test).
fn index(c: Coll) -> usize {
    c as usize
}

#[derive(Default, Clone, Copy)]
struct PerOp {
    ops: u64,
    bytes: u64,
    ns: u64,
}

/// One communicator's counters: plain adds on completion, under the lock the flight recorder
/// takes then anyway; the exporters copy them.
#[derive(Clone)]
pub(crate) struct Counters {
    per_op: [PerOp; OPS.len()],
    wait_ns: Vec<u64>,
    errors: u64,
}

impl Counters {
    pub(crate) fn new(nranks: usize) -> Counters {
        Counters { per_op: Default::default(), wait_ns: vec![0; nranks], errors: 0 }
    }

    /// An operation completed: `bytes` in `took`, having waited `waits` (peer, time).
    pub(crate) fn completed(&mut self, coll: Coll, bytes: usize, took: Duration, waits: &[(u32, u64)]) {
        let o = &mut self.per_op[index(coll)];
        o.ops += 1;
        o.bytes += bytes as u64;
        o.ns += took.as_nanos() as u64;
        for &(p, ns) in waits {
            if let Some(w) = self.wait_ns.get_mut(p as usize) {
                *w += ns;
            }
        }
    }

    /// An operation failed.
    pub(crate) fn failed(&mut self) {
        self.errors += 1;
    }

    /// (operations, bytes) completed of `coll`.
    pub(crate) fn totals(&self, coll: Coll) -> (u64, u64) {
        let o = &self.per_op[index(coll)];
        (o.ops, o.bytes)
    }
}

/// What the exporters read of one communicator.
pub(crate) struct Sample {
    pub(crate) comm: u64,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) counters: Counters,
    pub(crate) memory: usize,
    pub(crate) last_arrivals: Vec<(usize, u64)>,
}

/// The Prometheus text exposition (format 0.0.4) of `samples`.
pub(crate) fn render(samples: &[Sample]) -> String {
    let mut out = String::new();
    let labels = |s: &Sample| format!("comm=\"{:016x}\",rank=\"{}\",nranks=\"{}\"", s.comm, s.rank, s.nranks);
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    type Per<'b> = &'b dyn Fn(&PerOp) -> String;
    let per_op: [(&str, &str, Per<'_>); 3] = [
        ("oxccl_operations_total", "Operations completed.", &|o| o.ops.to_string()),
        ("oxccl_bytes_total", "Bytes of the operations completed (count x type size).", &|o| o.bytes.to_string()),
        ("oxccl_operation_seconds_total", "Time in the operations completed.", &|o| {
            format!("{:.9}", o.ns as f64 / 1e9)
        }),
    ];
    for (name, help, value) in per_op {
        family(&mut out, name, "counter", help);
        for s in samples {
            for (i, c) in OPS.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{},op=\"{}\"}} {}", labels(s), c.name(), value(&s.counters.per_op[i]));
            }
        }
    }
    family(&mut out, "oxccl_peer_wait_seconds_total", "counter", "Time operations waited for a message from the peer.");
    for s in samples {
        for (p, w) in s.counters.wait_ns.iter().enumerate().filter(|&(p, _)| p != s.rank) {
            let secs = *w as f64 / 1e9;
            let _ = writeln!(out, "oxccl_peer_wait_seconds_total{{{},peer=\"{p}\"}} {secs:.9}", labels(s));
        }
    }
    family(
        &mut out,
        "oxccl_peer_last_arrivals",
        "gauge",
        "Operations of the last straggler window in which the peer was last to arrive.",
    );
    for s in samples {
        for &(p, n) in &s.last_arrivals {
            let _ = writeln!(out, "oxccl_peer_last_arrivals{{{},peer=\"{p}\"}} {n}", labels(s));
        }
    }
    family(&mut out, "oxccl_errors_total", "counter", "Operations that failed.");
    for s in samples {
        let _ = writeln!(out, "oxccl_errors_total{{{}}} {}", labels(s), s.counters.errors);
    }
    family(&mut out, "oxccl_connection_memory_bytes", "gauge", "Memory held in connection buffers.");
    for s in samples {
        let _ = writeln!(out, "oxccl_connection_memory_bytes{{{}}} {}", labels(s), s.memory);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_in_declaration_order() {
        for (i, c) in OPS.iter().enumerate() {
            assert_eq!(index(*c), i, "{c:?}");
        }
    }

    #[test]
    fn counters_render_as_prometheus_text() {
        let mut c = Counters::new(2);
        c.completed(Coll::AllReduce, 4096, Duration::from_millis(2), &[(1, 1_500_000)]);
        c.completed(Coll::AllReduce, 4096, Duration::from_millis(1), &[]);
        c.failed();
        assert_eq!(c.totals(Coll::AllReduce), (2, 8192));
        let s = Sample { comm: 0xab, rank: 0, nranks: 2, counters: c, memory: 777, last_arrivals: vec![(1, 5)] };
        let text = render(&[s]);
        let l = "comm=\"00000000000000ab\",rank=\"0\",nranks=\"2\"";
        for want in [
            format!("oxccl_operations_total{{{l},op=\"allreduce\"}} 2"),
            format!("oxccl_bytes_total{{{l},op=\"allreduce\"}} 8192"),
            format!("oxccl_operation_seconds_total{{{l},op=\"allreduce\"}} 0.003000000"),
            format!("oxccl_peer_wait_seconds_total{{{l},peer=\"1\"}} 0.001500000"),
            format!("oxccl_peer_last_arrivals{{{l},peer=\"1\"}} 5"),
            format!("oxccl_errors_total{{{l}}} 1"),
            format!("oxccl_connection_memory_bytes{{{l}}} 777"),
            "# TYPE oxccl_operations_total counter".to_string(),
        ] {
            assert!(text.lines().any(|x| x == want), "{want} missing from\n{text}");
        }
        assert!(!text.contains("peer=\"0\""), "no wait on itself");
    }
}
