//! Watching from the Rust API: the straggler window, the counters and the status record
//! (`src/watch`, docs/watching.md).

use super::*;
use crate::watch::{Lateness, Straggler};

impl Communicator {
    /// The peers' lateness as this rank saw it: the last full straggler window
    /// (`OXCCL_STRAGGLER_WINDOW` operations), or the one in progress before the first is full.
    /// Each rank times only its "clean" peers (see `src/watch/lateness.rs`); `oxccl-perf
    /// --status` adds up every rank's view.
    pub fn lateness(&self) -> Lateness {
        self.sh.recorder.lock().unwrap().lateness.report()
    }

    /// The rank most often last to arrive, every rank's view added up (each publishes its view
    /// to the store at the end of each straggler window; this asks the store for them, a few
    /// round trips: not for every step of a training loop), if one was last in at least half of
    /// the operations that timed it: "rank 3 was last to arrive in 91% of the last 1000
    /// operations, median lag 14.0 ms". This rank's view alone if the store does not answer.
    pub fn straggler(&self) -> Option<Straggler> {
        self.sh.job_straggler()
    }

    /// Operations of kind `coll` this rank completed, and their bytes (count × type size).
    pub fn completed_totals(&self, coll: crate::Coll) -> (u64, u64) {
        self.sh.recorder.lock().unwrap().counters.totals(coll)
    }

    /// The communicator's id, as status records, metrics and flight records print it (16 hex
    /// digits).
    pub fn comm_id(&self) -> u64 {
        self.sh.comm_id
    }

    /// Publish this rank's status record to the store now (operations running longer than
    /// `OXCCL_STATUS_AFTER_MS` do it themselves), for `oxccl-perf --status`.
    pub fn publish_status(&self) {
        self.sh.publish_status(None)
    }
}
