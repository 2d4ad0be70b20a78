//! The tuner's call: which algorithm a collective of this communicator runs.

use super::*;
use crate::schedule::Coll;
use crate::select::AlgoSelection;
use crate::Result;

impl Shared {
    /// The algorithm for `coll` on `bytes` per rank buffer: [`crate::tuner::select`] on this
    /// communicator's topology and settings, memoised for the common case (the same call again),
    /// logged when it changes. The caller holds the state lock (`st`).
    pub(crate) fn choose_algo(
        &self,
        st: &mut State,
        coll: Coll,
        bytes: usize,
        sel: AlgoSelection,
    ) -> Result<crate::schedule::Algo> {
        let last = &mut st.last_choice;
        if let Some((c, b, s, a)) = *last {
            if c == coll && b == bytes && s == sel {
                return Ok(a); // the common case: the same call again
            }
        }
        let call = crate::tuner::Call { coll, bytes, sel };
        let topo = crate::tuner::Topology {
            host_of: &self.host_of,
            oversub: self.oversub,
            shm_disabled: self.cfg.shm_disable,
        };
        let set = crate::tuner::Settings {
            algos: &self.algos,
            deterministic: self.cfg.deterministic,
            model: &self.cfg.tuner,
        };
        let algo = crate::tuner::select(&call, &topo, &set).map_err(|e| e.with_rank(self.rank))?;
        if last.map(|(c, _, _, a)| (c, a)) != Some((coll, algo)) {
            let why = if sel.is_restricted() {
                format!(" (algSelection {})", AlgoSelection::describe_wire(sel.wire()))
            } else {
                String::new()
            };
            tracing::info!(target: "TUNING", rank = self.rank, "{} of {bytes} bytes uses {}{why}", coll.name(), algo.name());
        }
        *last = Some((coll, bytes, sel, algo));
        Ok(algo)
    }
}
