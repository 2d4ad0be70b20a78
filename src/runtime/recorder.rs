//! The flight recorder: the last operations of a communicator, written out on the first error.

use super::*;
use crate::schedule::Fingerprint;
use crate::Error;
use std::sync::Arc;
use std::time::Instant;

/// One entry of the flight recorder.
pub(crate) struct Record {
    pub(crate) seq: u64,
    pub(crate) fp: Fingerprint,
    /// The caller's profiler tag (0: untagged).
    pub(crate) tag: u64,
    pub(crate) sched: Arc<crate::schedule::Schedule>,
    pub(crate) start: Instant,
    pub(crate) end: Option<Instant>,
    pub(crate) failed: bool,
}

/// How many operations the flight recorder keeps per communicator.
pub(crate) const RECORDS: usize = 64;

impl Shared {
    pub(crate) fn record(
        &self,
        seq: u64,
        fp: Fingerprint,
        tag: u64,
        sched: Arc<crate::schedule::Schedule>,
        start: Instant,
    ) {
        let mut r = self.recorder.lock().unwrap();
        if r.len() == RECORDS {
            r.pop_front();
        }
        r.push_back(Record { seq, fp, tag, sched, start, end: None, failed: false });
    }

    pub(crate) fn record_end(&self, seq: u64, fp: Fingerprint, done: bool, end: Instant) {
        let mut r = self.recorder.lock().unwrap();
        if let Some(x) = r.iter_mut().rev().find(|x| x.seq == seq && x.fp == fp && x.end.is_none()) {
            x.end = Some(end);
            x.failed = !done;
        }
    }

    /// Write the flight record (`<dir>/oxccl-<comm>-rank<r>.json`): the last operations with
    /// sequence number, call, state, peers and times, and the error.
    pub(crate) fn dump(&self, dir: &std::path::Path, e: &Error) {
        fn q(s: &str) -> String {
            let mut o = String::from("\"");
            for ch in s.chars() {
                match ch {
                    '"' => o.push_str("\\\""),
                    '\\' => o.push_str("\\\\"),
                    c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
                    c => o.push(c),
                }
            }
            o.push('"');
            o
        }
        let us = |t: Instant| t.saturating_duration_since(self.born).as_micros();
        let ops: Vec<String> = self
            .recorder
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                let (rx, tx) = r.sched.peers();
                let state = match (r.end, r.failed) {
                    (None, _) => "running",
                    (Some(_), true) => "failed",
                    (Some(_), false) => "done",
                };
                format!(
                    "{{\"seq\": {}, \"op\": {}, \"tag\": {}, \"state\": \"{state}\", \"recv_from\": {rx:?}, \"send_to\": {tx:?}, \"start_us\": {}, \"end_us\": {}}}",
                    r.seq,
                    q(&r.fp.to_string()),
                    r.tag,
                    us(r.start),
                    r.end.map_or("null".to_string(), |t| us(t).to_string())
                )
            })
            .collect();
        let body = format!(
            "{{\"comm\": \"{:016x}\", \"rank\": {}, \"nranks\": {}, \"host\": {}, \"pid\": {}, \"created_unix_ms\": {}, \"error\": {}, \"ops\": [\n  {}\n]}}\n",
            self.comm_id,
            self.rank,
            self.nranks,
            q(&self.peers[self.rank].hostname),
            self.peers[self.rank].pid,
            self.born_unix_ms,
            q(&e.to_string()),
            ops.join(",\n  ")
        );
        let path = dir.join(format!("oxccl-{:016x}-rank{}.json", self.comm_id, self.rank));
        if let Err(err) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, body)) {
            tracing::warn!("oxccl: could not write the flight record {}: {err}", path.display());
        }
    }
}
