//! The tuner's call: which algorithm a collective of this communicator runs.

use super::*;
use crate::schedule::Coll;
use crate::select::AlgoSelection;
use crate::{Error, Result};

impl Shared {
    /// The tuner: the algorithm for `coll` on `bytes` per rank buffer. Deterministic mode forces
    /// the ordered schedules for reductions; otherwise an α-β model picks among the allowed
    /// algorithms (ring, recursive doubling, Rabenseifner, double binary tree, hierarchical when
    /// ranks share hosts across several hosts), with shared-memory constants inside a host and network constants between hosts.
    pub(crate) fn choose_algo(&self, coll: Coll, bytes: usize, sel: AlgoSelection) -> Result<crate::schedule::Algo> {
        use crate::schedule::Algo;
        let mut last = self.last_choice.lock().unwrap();
        if let Some((c, b, s, a)) = *last {
            if c == coll && b == bytes && s == sel {
                return Ok(a); // the common case: the same call again
            }
        }
        let restricted;
        let algos: &[Algo] = if !sel.is_restricted() {
            &self.algos
        } else if self.cfg.deterministic && coll.reduces() {
            if sel.force {
                return Err(Error::invalid_usage(format!(
                    "{}: OXCCL_DETERMINISTIC=1 fixes the algorithm of reductions, so algSelection {:?} cannot be honoured (forceAlgSelection is set)",
                    coll.name(),
                    AlgoSelection::describe_wire(sel.wire())
                ))
                .with_rank(self.rank));
            }
            &self.algos
        } else if coll != Coll::AllReduce {
            crate::select::restrict(&[Algo::Ring], sel, coll).map_err(|e| e.with_rank(self.rank))?;
            &self.algos
        } else {
            restricted = crate::select::restrict(&self.algos, sel, coll).map_err(|e| e.with_rank(self.rank))?;
            &restricted
        };
        let algo = if self.cfg.deterministic && coll.reduces() {
            Algo::Ordered
        } else if coll != Coll::AllReduce {
            Algo::Ring
        } else if algos.len() == 1 {
            algos[0]
        } else {
            let t = &self.cfg.tuner;
            let hosts = self.host_of.iter().max().map_or(1, |m| m + 1);
            let n = self.nranks as f64;
            let h = hosts as f64;
            let g = (0..hosts).map(|x| self.host_of.iter().filter(|&&y| y == x).count()).max().unwrap_or(1) as f64;
            let s = bytes as f64; // bytes; betas in bytes/µs
            let sa = t.shm_alpha_us + (self.oversub - 1.0) * t.switch_us;
            let sb = t.shm_beta_gbps * 1e3;
            // log-round algorithms lose bandwidth when ranks wait for cores
            let pen = if self.oversub > 1.0 { t.oversub_round_factor } else { 1.0 };
            let (na, nb) = (t.net_alpha_us, t.net_beta_gbps * 1e3);
            let one_host = hosts == 1 && !self.cfg.shm_disable;
            let (alpha, beta) = if one_host { (sa, sb) } else { (na, nb) };
            let ring = 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * s / beta;
            let p2 = (1usize << (usize::BITS - 1 - self.nranks.leading_zeros())) as f64;
            let fold = if p2 < n { 2.0 } else { 0.0 };
            // recursive doubling moves the whole message every round: twice the penalty
            let pen_rd = if pen > 1.0 { 2.0 * pen } else { 1.0 };
            let rd = (p2.log2() + fold) * (alpha + pen_rd * s / beta);
            let rab = (2.0 * p2.log2() + fold) * alpha + pen * (2.0 * (p2 - 1.0) / p2 + fold) * s / beta;
            let depth = (usize::BITS - self.nranks.leading_zeros()) as f64;
            let tree = 2.0 * depth * alpha + pen * 2.0 * s / beta;
            let hier = if hosts > 1 && hosts < self.nranks {
                2.0 * ((g - 1.0) * sa + s / sb) + 2.0 * (h - 1.0) * na + 2.0 * (h - 1.0) / h * s / nb
            } else {
                f64::INFINITY
            };
            let mut best = (f64::INFINITY, algos[0]);
            let costs = [
                (ring, Algo::Ring),
                (rd, Algo::RecursiveDoubling),
                (rab, Algo::Rabenseifner),
                (tree, Algo::Tree),
                (hier, Algo::Hierarchical),
            ];
            for (cost, a) in costs {
                if algos.contains(&a) && cost < best.0 {
                    best = (cost, a);
                }
            }
            best.1
        };
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
