//! The failure cascade: the first error is sticky, closes every connection and is published,
//! so every rank can name the root cause; and the timeout census.

use super::*;
use crate::exec::Conns;
use crate::Error;
use oxccl_transport::Cause;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Shared {
    /// Record the first error (sticky). The first time, also close every connection, so peers
    /// waiting on this rank fail at once instead of at their timeout (and theirs close in turn),
    /// and publish the error in the store (in the background: the store may be gone too), so
    /// every rank can name the first failure.
    pub(crate) fn set_error(&self, e: Error) {
        if self.revoked.load(Ordering::SeqCst) {
            return; // stopped on purpose, connections closed already: not a failure
        }
        let conns = {
            let mut st = self.state.lock().unwrap();
            if st.error.is_some() {
                return;
            }
            st.error = Some(e.clone());
            self.failed.store(true, Ordering::Release);
            st.pending_rx.iter_mut().for_each(|p| *p = None);
            std::mem::replace(&mut st.conns, Conns::new(self.nranks))
        };
        if let Some(dir) = &self.cfg.dump_dir {
            self.dump(dir, &e);
        }
        self.publish_status(None);
        let mut conns = conns;
        conns.abort_all();
        drop(conns);
        if e.cause == Some(Cause::PeerAborted) {
            return; // a cascade, not a cause: the cause is published by the rank that saw it
        }
        let store = self.store.clone();
        let key = format!("{}/failed", self.prefix);
        let msg = e.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            if let Ok(k) = store.add(&format!("{key}/count"), 1) {
                let _ = store.set(&format!("{key}/{k}"), msg.as_bytes());
            }
            let _ = tx.send(());
        });
        // wait for the report (the process may exit right after the error), but never long
        let _ = rx.recv_timeout(std::time::Duration::from_secs(1));
    }

    /// After a timeout in collective `seq`: say this rank reached it, give the others up to 1 s
    /// to say the same, and name the ranks that did not (they never reached the operation).
    /// Which ranks reached operation `seq`, for a timeout's report: every rank that times out
    /// says so in the store; `heard` are the peers whose messages of it arrived here, so a
    /// missing one among them reached it and then stopped responding (stopped, hung, paused).
    pub(crate) fn census(&self, seq: u64, heard: &[usize]) -> String {
        let key = |r: usize| format!("{}/reached/{seq}/{r}", self.prefix);
        let store = self.store.clone();
        let (me, n) = (self.rank, self.nranks);
        let prefix_keys: Vec<String> = (0..n).map(key).collect();
        // begun a second before the deadline, the census is complete at it; otherwise this rank
        // marks now and gives the others a second
        let begun = self.census_mark.lock().unwrap().filter(|m| m.0 == seq).map(|m| m.1);
        let until = begun.unwrap_or_else(Instant::now) + crate::exec::CENSUS_LEAD;
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            if begun.is_none() {
                let _ = store.set(&prefix_keys[me], b"1");
            }
            let mut missing: Vec<usize> = (0..n).collect();
            loop {
                missing.retain(|&r| !store.check(std::slice::from_ref(&prefix_keys[r])).unwrap_or(false));
                if missing.is_empty() || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = tx.send(missing);
        });
        match rx.recv_timeout(std::time::Duration::from_millis(1500)) {
            Ok(m) if m.is_empty() => format!("every rank reached op #{seq}: a wait inside it never completed"),
            Ok(m) => {
                let (inside, absent): (Vec<usize>, Vec<usize>) = m.into_iter().partition(|r| heard.contains(r));
                let mut parts = vec![];
                if !inside.is_empty() {
                    parts.push(format!(
                        "ranks {inside:?} reached op #{seq} (their messages of it arrived) and then stopped responding (stopped, hung or paused: they did not answer the timeout census)"
                    ));
                }
                if !absent.is_empty() {
                    let last = seq.checked_sub(1).map_or("none".to_string(), |s| format!("#{s}"));
                    parts.push(format!(
                        "ranks {absent:?} did not answer the timeout census: they never reached op #{seq}, or stopped before sending any of it (the last op this rank completed is {last})"
                    ));
                }
                parts.join("; ")
            }
            Err(_) => "the bootstrap store did not answer: cannot tell which ranks reached the operation".into(),
        }
    }

    /// For an error caused by a peer closing its connections, add the first failure reported in
    /// this communicator (waits at most 2 s for it). Also for a connection found closed: a peer
    /// that aborted its connections while this rank was sending to it leaves a reset, not its
    /// abort message, and the cause is then elsewhere too (unless the first report is this one).
    pub(crate) fn with_root_cause(&self, mut e: Error) -> Error {
        if !matches!(e.cause, Some(Cause::PeerAborted | Cause::PeerClosed)) {
            return e;
        }
        let store = self.store.clone();
        let key = format!("{}/failed/1", self.prefix);
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            let _ = tx.send(store.get(&key, std::time::Duration::from_secs(2)));
        });
        if let Ok(Ok(v)) = rx.recv_timeout(std::time::Duration::from_millis(2100)) {
            if v == e.to_string().as_bytes() {
                return e; // this rank's own report: its message already names the cause
            }
            e.message =
                format!("{} (first failure reported in this communicator: {})", e.message, String::from_utf8_lossy(&v));
        }
        e
    }
}
