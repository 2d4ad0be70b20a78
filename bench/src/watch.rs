//! `oxccl-perf --status` (a running job's live status) and `--trace FILE` (a Chrome trace of
//! every rank's operations and steps). docs/watching.md.

use std::process::ExitCode;

/// `oxccl-perf --status [ID | @FILE | HOST:PORT]`: print every communicator's ranks, the
/// verdict and the straggler of the job whose store `spec` names (default `OXCCL_UNIQUE_ID`).
pub fn status(spec: Option<&str>) -> ExitCode {
    let spec = match spec.map(String::from).or_else(|| std::env::var("OXCCL_UNIQUE_ID").ok()) {
        Some(s) => s,
        None => {
            eprintln!("usage: oxccl-perf --status [ID | @FILE | HOST:PORT] (or set OXCCL_UNIQUE_ID)");
            return ExitCode::from(2);
        }
    };
    let spec = match spec.strip_prefix('@') {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("oxccl-perf --status: cannot read {path}: {e}");
                return ExitCode::from(2);
            }
        },
        None => spec,
    };
    match oxccl::watch::job_status(&spec, &oxccl::Config::from_env()) {
        Ok(job) if job.comms.is_empty() => {
            println!(
                "no communicator has published a status yet (ranks publish while an operation runs longer than \
                 OXCCL_STATUS_AFTER_MS, on their first error, and with their straggler view when a peer was late, at most every 10 s)"
            );
            ExitCode::SUCCESS
        }
        Ok(job) => {
            for c in &job.comms {
                print!("{c}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oxccl-perf --status: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The launcher's clock when the job started (Unix µs), every rank's trace epoch.
pub const EPOCH_VAR: &str = "OXCCL_PERF_TRACE_EPOCH_US";

/// This rank's part of the trace: its events, one per line, in `FILE.rank<r>`.
pub fn write_part(file: &str, comm: &oxccl::Communicator) -> std::io::Result<()> {
    let me = &comm.peers()[comm.rank()];
    let label = format!("({}, pid {})", me.hostname, me.pid);
    let epoch = std::env::var(EPOCH_VAR).ok().and_then(|v| v.parse().ok());
    let events = oxccl::watch::trace::take_events(&label, epoch.unwrap_or_else(oxccl::watch::trace::now_unix_us));
    std::fs::write(format!("{file}.rank{}", comm.rank()), events.join("\n") + "\n")
}

/// The launcher, once every rank exited: the ranks' parts joined into one Chrome trace at
/// `file` (the parts are removed).
pub fn merge(file: &str, np: usize) -> std::io::Result<()> {
    let mut events = vec![];
    for r in 0..np {
        let part = format!("{file}.rank{r}");
        if let Ok(text) = std::fs::read_to_string(&part) {
            events.extend(text.lines().filter(|l| !l.is_empty()).map(String::from));
            let _ = std::fs::remove_file(&part);
        }
    }
    let body = format!("{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{}\n]}}\n", events.join(",\n"));
    std::fs::write(file, body)
}
