//! `oxccl-perf --analyze DIR`: explain the flight records of a failed job.

use std::process::ExitCode;

/// `--analyze DIR`: read the flight records (`OXCCL_DUMP_DIR`) of a failed job and say which
/// rank diverged or stalled first, per communicator.
pub fn analyze(dir: &str) -> ExitCode {
    use oxccl::flight::FlightRecord;
    let mut by_comm: std::collections::BTreeMap<String, Vec<FlightRecord>> = Default::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("oxccl-perf: cannot read {dir}: {e}");
            return ExitCode::from(2);
        }
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| FlightRecord::parse(&t)) {
            Ok(r) => by_comm.entry(r.comm.clone()).or_default().push(r),
            Err(why) => eprintln!("oxccl-perf: {} is not a flight record: {why}", path.display()),
        }
    }
    if by_comm.is_empty() {
        println!("no flight records in {dir}");
        return ExitCode::from(1);
    }
    for (comm, mut recs) in by_comm {
        recs.sort_by_key(|r| r.rank);
        report_comm(&comm, &recs);
    }
    ExitCode::SUCCESS
}

/// What the records of one communicator say: who wrote none, the first divergence, where each
/// rank stopped, who stalled first, and each rank's error.
fn report_comm(comm: &str, recs: &[oxccl::flight::FlightRecord]) {
    use oxccl::flight::{FlightRecord, OpState};
    let n = recs[0].nranks;
    let have: Vec<u64> = recs.iter().map(|r| r.rank).collect();
    println!("communicator {comm}: {n} ranks, records from ranks {have:?}");
    let missing: Vec<u64> = (0..n).filter(|r| !have.contains(r)).collect();
    if !missing.is_empty() {
        println!("  ranks {missing:?} wrote no record: they hit no error (never reached the failing operation, or still running)");
    }
    // collectives by sequence number, per rank
    let colls = |r: &FlightRecord| -> Vec<(u64, String, OpState)> {
        r.ops.iter().filter(|o| !o.op.starts_with("send/recv")).map(|o| (o.seq, o.op.clone(), o.state)).collect()
    };
    let mut seqs: Vec<u64> = recs.iter().flat_map(|r| colls(r).into_iter().map(|o| o.0)).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let diverged = seqs.iter().find_map(|s| {
        let calls: Vec<(u64, String)> =
            recs.iter().filter_map(|r| colls(r).into_iter().find(|o| o.0 == *s).map(|o| (r.rank, o.1))).collect();
        calls
            .windows(2)
            .find(|w| w[0].1 != w[1].1)
            .map(|w| format!("op #{s}: rank {} called {} but rank {} called {}", w[0].0, w[0].1, w[1].0, w[1].1))
    });
    match diverged {
        Some(d) => println!("  DIVERGED first at {d}"),
        None => println!("  every rank that left a record called the same operations"),
    }
    let last_done = |r: &FlightRecord| colls(r).iter().filter(|o| o.2 == OpState::Done).map(|o| o.0).max();
    for r in recs {
        let pending = colls(r).into_iter().find(|o| o.2 != OpState::Done);
        println!(
            "  rank {}: last completed op #{}, {}",
            r.rank,
            last_done(r).map_or("-".into(), |x| x.to_string()),
            pending.map_or("nothing pending".into(), |o| format!("{} in op #{} {}", o.2.name(), o.0, o.1))
        );
    }
    if let Some(min) = recs.iter().filter_map(last_done).min() {
        let first: Vec<u64> = recs.iter().filter(|r| last_done(r) == Some(min)).map(|r| r.rank).collect();
        println!(
            "  STALLED first: ranks {first:?} (fewest completed operations among the records){}",
            if missing.is_empty() { String::new() } else { format!("; ranks {missing:?} may be further behind") }
        );
    }
    for r in recs {
        println!("  rank {} error: {}", r.rank, r.error);
    }
}
