//! The tuner: a pure function from (call, topology, settings) to an algorithm.
//!
//! Deterministic mode forces the ordered schedules for reductions; operations other than
//! all-reduce use the ring (chain); otherwise an α-β model picks among the allowed all-reduce
//! algorithms (ring, recursive doubling, Rabenseifner, double binary tree, hierarchical when
//! ranks share hosts across several hosts), with shared-memory constants inside a host and
//! network constants between hosts. A communicator memoises the last answer
//! (`runtime/tune.rs`); the decision itself reads nothing but its arguments.

use crate::config::Tuner;
use crate::schedule::{Algo, Coll};
use crate::select::AlgoSelection;
use crate::{Error, Result};

/// What is being called.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Call {
    /// The operation.
    pub coll: Coll,
    /// Bytes of each rank's buffer (count × type size).
    pub bytes: usize,
    /// The call's algorithm selection.
    pub sel: AlgoSelection,
}

/// Where the ranks are.
#[derive(Debug, Clone, Copy)]
pub struct Topology<'a> {
    /// Host index of every rank (hosts numbered in order of their lowest rank).
    pub host_of: &'a [usize],
    /// Ranks of this communicator on this host per core (at least 1).
    pub oversub: f64,
    /// Whether shared memory is off (every pair talks over the network).
    pub shm_disabled: bool,
}

/// The communicator's settings that bear on the choice.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The all-reduce algorithms allowed (`OXCCL_ALGO` / `NCCL_ALGO`).
    pub algos: &'a [Algo],
    /// `OXCCL_DETERMINISTIC`.
    pub deterministic: bool,
    /// The cost model's constants.
    pub model: &'a Tuner,
}

/// The algorithm `call` runs. Fails (invalid usage) when the call's selection cannot be
/// honoured and it forces it.
pub fn select(call: &Call, topo: &Topology<'_>, set: &Settings<'_>) -> Result<Algo> {
    let (coll, sel) = (call.coll, call.sel);
    let restricted;
    let algos: &[Algo] = if !sel.is_restricted() {
        set.algos
    } else if set.deterministic && coll.reduces() {
        if sel.force {
            return Err(Error::invalid_usage(format!(
                "{}: OXCCL_DETERMINISTIC=1 fixes the algorithm of reductions, so algSelection {:?} cannot be honoured (forceAlgSelection is set)",
                coll.name(),
                AlgoSelection::describe_wire(sel.wire())
            )));
        }
        set.algos
    } else if coll == Coll::Broadcast {
        restricted = crate::select::restrict(broadcasts(set.algos), sel, coll)?;
        &restricted
    } else if coll != Coll::AllReduce {
        crate::select::restrict(&[Algo::Ring], sel, coll)?;
        set.algos
    } else {
        restricted = crate::select::restrict(set.algos, sel, coll)?;
        &restricted
    };
    Ok(if set.deterministic && coll.reduces() {
        Algo::Ordered
    } else if coll == Coll::Broadcast {
        // the chain unless only the star is allowed: back-to-back broadcasts pipeline along
        // the chain, and the star measured no faster at 4 and 8 ranks on 2 cores (bench/RESULTS.md)
        let have = if sel.is_restricted() { algos } else { broadcasts(algos) };
        if have.contains(&Algo::Ring) {
            Algo::Ring
        } else {
            Algo::Star
        }
    } else if coll != Coll::AllReduce {
        Algo::Ring
    } else if algos.len() == 1 {
        algos[0]
    } else {
        cheapest(call.bytes, topo, set.model, algos)
    })
}

/// The broadcasts `algos` allows: the chain (ring) and the star, as far as it allows them (the
/// chain when it allows neither).
fn broadcasts(algos: &[Algo]) -> &'static [Algo] {
    if algos.contains(&Algo::Star) && algos.contains(&Algo::Ring) {
        &[Algo::Ring, Algo::Star]
    } else if algos.contains(&Algo::Star) {
        &[Algo::Star]
    } else {
        &[Algo::Ring]
    }
}

/// The α-β model's cheapest all-reduce among `algos`.
fn cheapest(bytes: usize, topo: &Topology<'_>, t: &Tuner, algos: &[Algo]) -> Algo {
    let nranks = topo.host_of.len().max(1);
    let hosts = topo.host_of.iter().max().map_or(1, |m| m + 1);
    let n = nranks as f64;
    let h = hosts as f64;
    let g = (0..hosts).map(|x| topo.host_of.iter().filter(|&&y| y == x).count()).max().unwrap_or(1) as f64;
    let s = bytes as f64; // bytes; betas in bytes/µs
    let sa = t.shm_alpha_us + (topo.oversub - 1.0) * t.switch_us;
    let sb = t.shm_beta_gbps * 1e3;
    // log-round algorithms lose bandwidth when ranks wait for cores in their shared-memory
    // exchanges; with one rank per host every exchange is a network message, and there
    // Rabenseifner beat the ring at every size (4 namespace hosts on 2 cores, bench/RESULTS.md
    // "The tuner between hosts")
    let pen = if topo.oversub > 1.0 && g > 1.0 { t.oversub_round_factor } else { 1.0 };
    let (na, nb) = (t.net_alpha_us, t.net_beta_gbps * 1e3);
    let one_host = hosts == 1 && !topo.shm_disabled;
    let (alpha, beta) = if one_host { (sa, sb) } else { (na, nb) };
    let ring = 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * s / beta;
    let p2 = (1usize << (usize::BITS - 1 - nranks.leading_zeros())) as f64;
    let fold = if p2 < n { 2.0 } else { 0.0 };
    // recursive doubling moves the whole message every round: twice the penalty
    let pen_rd = if pen > 1.0 { 2.0 * pen } else { 1.0 };
    let rd = (p2.log2() + fold) * (alpha + pen_rd * s / beta);
    let rab = (2.0 * p2.log2() + fold) * alpha + pen * (2.0 * (p2 - 1.0) / p2 + fold) * s / beta;
    let depth = (usize::BITS - nranks.leading_zeros()) as f64;
    let tree = 2.0 * depth * alpha + pen * 2.0 * s / beta;
    // star: two hand-offs whatever n, but rank 0 handles the n-1 messages of each way in
    // turn (each ~1.5 α of a lone shared-memory message) and its link carries (n-1)·S; only
    // inside one host
    let star = if one_host { 2.0 * alpha + (n - 1.0) * (1.5 * t.shm_alpha_us + s / beta) } else { f64::INFINITY };
    let hier = if hosts > 1 && hosts < nranks {
        2.0 * ((g - 1.0) * sa + s / sb) + 2.0 * (h - 1.0) * na + 2.0 * (h - 1.0) / h * s / nb
    } else {
        f64::INFINITY
    };
    let costs = [
        (ring, Algo::Ring),
        (rd, Algo::RecursiveDoubling),
        (rab, Algo::Rabenseifner),
        (tree, Algo::Tree),
        (hier, Algo::Hierarchical),
        (star, Algo::Star),
    ];
    let mut best = (f64::INFINITY, algos[0]);
    for (cost, a) in costs {
        if algos.contains(&a) && cost < best.0 {
            best = (cost, a);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Algo; 6] =
        [Algo::Ring, Algo::RecursiveDoubling, Algo::Rabenseifner, Algo::Tree, Algo::Hierarchical, Algo::Star];

    fn pick(coll: Coll, bytes: usize, host_of: &[usize], oversub: f64, sel: AlgoSelection, det: bool) -> Result<Algo> {
        let model = Tuner::default();
        let call = Call { coll, bytes, sel };
        let topo = Topology { host_of, oversub, shm_disabled: false };
        select(&call, &topo, &Settings { algos: &ALL, deterministic: det, model: &model })
    }

    #[test]
    fn small_all_reduces_take_few_rounds_and_large_ones_the_bandwidth_optimal_schedules() {
        let one_host = [0; 8];
        let small = pick(Coll::AllReduce, 8, &one_host, 1.0, AlgoSelection::AUTO, false).unwrap();
        assert!(matches!(small, Algo::RecursiveDoubling | Algo::Tree), "{small:?}");
        let large = pick(Coll::AllReduce, 256 << 20, &one_host, 1.0, AlgoSelection::AUTO, false).unwrap();
        assert!(matches!(large, Algo::Ring | Algo::Rabenseifner), "{large:?}");
        // four hosts of eight ranks, large message: the network is crossed once per host
        let hosts: Vec<usize> = (0..32).map(|r| r / 8).collect();
        assert_eq!(
            pick(Coll::AllReduce, 256 << 20, &hosts, 1.0, AlgoSelection::AUTO, false).unwrap(),
            Algo::Hierarchical
        );
        // one rank per host: no hierarchy
        let spread = [0, 1, 2, 3];
        assert_ne!(
            pick(Coll::AllReduce, 256 << 20, &spread, 1.0, AlgoSelection::AUTO, false).unwrap(),
            Algo::Hierarchical
        );
    }

    #[test]
    fn tiny_all_reduces_on_an_oversubscribed_host_take_the_star_from_six_ranks() {
        // measured on 2 cores (bench/RESULTS.md): recursive doubling wins at 4 ranks, the star
        // at 6, 8 and 16, up to 64 KiB at 8 ranks; Rabenseifner from 256 KiB
        let at = |n: usize, bytes: usize| pick(Coll::AllReduce, bytes, &vec![0; n], n as f64 / 2.0, AlgoSelection::AUTO, false).unwrap();
        assert_eq!(at(4, 8), Algo::RecursiveDoubling);
        for n in [6, 8, 16] {
            assert_eq!(at(n, 8), Algo::Star, "{n} ranks");
        }
        assert_eq!(at(8, 16 << 10), Algo::Star);
        assert_ne!(at(8, 256 << 10), Algo::Star);
        // not oversubscribed, or over the network: never
        for n in [2, 8, 16] {
            let free = pick(Coll::AllReduce, 8, &vec![0; n], 1.0, AlgoSelection::AUTO, false).unwrap();
            assert_ne!(free, Algo::Star, "{n} ranks on {n} cores");
        }
        let hosts: Vec<usize> = (0..16).collect();
        assert_ne!(pick(Coll::AllReduce, 8, &hosts, 1.0, AlgoSelection::AUTO, false).unwrap(), Algo::Star);
    }

    /// One rank per host, more ranks than cores (namespace hosts on one machine): no log-round
    /// penalty. Measured on 4 such hosts on 2 cores (bench/RESULTS.md "The tuner between
    /// hosts"): recursive doubling fastest at 32 KiB, Rabenseifner from 64 KiB to 64 MiB.
    #[test]
    fn one_rank_per_host_takes_the_log_round_schedules_even_oversubscribed() {
        let spread = [0, 1, 2, 3];
        let at = |bytes: usize| pick(Coll::AllReduce, bytes, &spread, 2.0, AlgoSelection::AUTO, false).unwrap();
        assert_eq!(at(32 << 10), Algo::RecursiveDoubling);
        for bytes in [128 << 10, 1 << 20, 16 << 20, 64 << 20] {
            assert_eq!(at(bytes), Algo::Rabenseifner, "{bytes} bytes");
        }
        // ranks sharing a host keep the penalty: one host of 8 ranks on 2 cores, the ring
        assert_eq!(pick(Coll::AllReduce, 64 << 20, &[0; 8], 4.0, AlgoSelection::AUTO, false).unwrap(), Algo::Ring);
    }

    #[test]
    fn broadcasts_take_the_chain_unless_only_the_star_is_allowed() {
        for (n, oversub) in [(4, 2.0), (8, 4.0), (8, 1.0)] {
            assert_eq!(pick(Coll::Broadcast, 8, &vec![0; n], oversub, AlgoSelection::AUTO, false).unwrap(), Algo::Ring);
        }
        let model = Tuner::default();
        let call = Call { coll: Coll::Broadcast, bytes: 8, sel: AlgoSelection::AUTO };
        let topo = Topology { host_of: &[0; 8], oversub: 4.0, shm_disabled: false };
        let star_only = [Algo::Star];
        let set = Settings { algos: &star_only, deterministic: false, model: &model };
        assert_eq!(select(&call, &topo, &set).unwrap(), Algo::Star);
        let tree_only = [Algo::Tree];
        let set = Settings { algos: &tree_only, deterministic: false, model: &model };
        assert_eq!(select(&call, &topo, &set).unwrap(), Algo::Ring);
        let star = AlgoSelection::only(&[Algo::Star], true);
        assert_eq!(pick(Coll::Broadcast, 64 << 20, &[0; 8], 1.0, star, false).unwrap(), Algo::Star);
        let tree = AlgoSelection::only(&[Algo::Tree], true);
        assert!(pick(Coll::Broadcast, 8, &[0; 8], 1.0, tree, false).is_err());
    }

    #[test]
    fn the_decision_is_a_function_of_its_arguments() {
        let hosts = [0, 0, 0, 1, 1, 1];
        for bytes in [0, 8, 4096, 1 << 20, 64 << 20] {
            for oversub in [1.0, 4.0] {
                let a = pick(Coll::AllReduce, bytes, &hosts, oversub, AlgoSelection::AUTO, false).unwrap();
                let b = pick(Coll::AllReduce, bytes, &hosts, oversub, AlgoSelection::AUTO, false).unwrap();
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn other_operations_use_the_ring_and_deterministic_mode_the_ordered_schedules() {
        let h = [0; 4];
        for coll in [Coll::AllGather, Coll::Broadcast, Coll::ReduceScatter, Coll::AllToAll] {
            assert_eq!(pick(coll, 1 << 20, &h, 1.0, AlgoSelection::AUTO, false).unwrap(), Algo::Ring);
        }
        for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::Reduce] {
            assert_eq!(pick(coll, 1 << 20, &h, 1.0, AlgoSelection::AUTO, true).unwrap(), Algo::Ordered);
        }
        assert_eq!(pick(Coll::AllGather, 1 << 20, &h, 1.0, AlgoSelection::AUTO, true).unwrap(), Algo::Ring);
    }

    #[test]
    fn a_selection_is_honoured_or_refused_when_forced() {
        let h = [0; 8];
        let tree = AlgoSelection::only(&[Algo::Tree], true);
        assert_eq!(pick(Coll::AllReduce, 256 << 20, &h, 1.0, tree, false).unwrap(), Algo::Tree);
        let e = pick(Coll::AllReduce, 8, &h, 1.0, tree, true).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::InvalidUsage);
        // not forced: deterministic mode wins quietly
        let soft = AlgoSelection::only(&[Algo::Tree], false);
        assert_eq!(pick(Coll::AllReduce, 8, &h, 1.0, soft, true).unwrap(), Algo::Ordered);
        // a collective that only has the ring, forced to the tree
        assert!(pick(Coll::AllGather, 8, &h, 1.0, tree, false).is_err());
    }
}
