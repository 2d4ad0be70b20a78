//! Per-call options: the algorithm restriction and profiler tag of one operation (NCCL 2.31's
//! `ncclCollConfig_t`, and [`crate::Communicator::run_with`]).
//!
//! An [`AlgoSelection`] is parsed with `NCCL_ALGO`'s syntax for the call's collective, and
//! travels in every frame of the call (the top byte of the `count` word), so ranks that pass
//! different selections fail as a mismatch where their messages meet.

use crate::schedule::{Algo, Coll};
use crate::{Error, Result};

/// The algorithms one call may use: a bit per [`Algo::ALL`] entry, or automatic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AlgoSelection {
    /// Bit `i` allows `Algo::ALL[i]`; 0 means automatic (the communicator's tuner decides).
    mask: u8,
    /// An unsatisfiable selection is an error (`true`, NCCL's default) or falls back to automatic.
    pub force: bool,
}

/// The wire byte of a restricted selection has this bit set (so no restriction is byte 0).
const RESTRICTED: u8 = 0x80;

impl AlgoSelection {
    /// Automatic: no restriction.
    pub const AUTO: AlgoSelection = AlgoSelection { mask: 0, force: false };

    /// Exactly these algorithms.
    pub fn only(algos: &[Algo], force: bool) -> AlgoSelection {
        let mask = algos.iter().fold(0u8, |m, a| m | 1 << a.index());
        AlgoSelection { mask, force }
    }

    /// Parse `spec` (`NCCL_ALGO`'s syntax: `ring,tree`, `^tree`, or per collective
    /// `allreduce:tree;allgather:ring`) for a call of `coll`. An empty spec, or a per-collective
    /// spec without an entry for `coll`, is automatic.
    pub fn parse(spec: &str, coll: Coll, force: bool) -> Result<AlgoSelection> {
        let spec = spec.trim();
        let list = if spec.contains(':') {
            let mut found = None;
            for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
                let (f, l) = part
                    .split_once(':')
                    .ok_or_else(|| Error::invalid_argument(format!("algSelection entry {part:?} has no ':'")))?;
                let f = f.trim().to_ascii_lowercase();
                if !Coll::COLLECTIVES.iter().any(|c| c.name() == f) {
                    return Err(Error::invalid_argument(format!(
                        "algSelection names unknown collective {f:?} (expected one of {})",
                        Coll::COLLECTIVES.map(|c| c.name()).join(", ")
                    )));
                }
                if f == coll.name() {
                    found = Some(l.trim());
                }
            }
            match found {
                Some(l) => l,
                None => return Ok(AlgoSelection::AUTO),
            }
        } else {
            spec
        };
        if list.is_empty() {
            return Ok(AlgoSelection::AUTO);
        }
        let algos = crate::config::parse_algos(list)?;
        Ok(AlgoSelection::only(&algos, force))
    }

    /// Whether this is a restriction (not automatic).
    pub fn is_restricted(&self) -> bool {
        self.mask != 0
    }

    /// Whether `a` is allowed (everything is, when automatic).
    pub fn allows(&self, a: Algo) -> bool {
        self.mask == 0 || self.mask & (1 << a.index()) != 0
    }

    /// The byte carried in frame headers: 0 when automatic.
    pub fn wire(&self) -> u8 {
        if self.mask == 0 {
            0
        } else {
            RESTRICTED | self.mask
        }
    }

    /// The allowed algorithms' names of a wire byte, for messages ("auto" for 0).
    pub fn describe_wire(b: u8) -> String {
        if b == 0 {
            return "auto".into();
        }
        let names: Vec<&str> =
            Algo::ALL.iter().enumerate().filter(|(i, _)| b & (1 << i) != 0).map(|(_, a)| a.name()).collect();
        names.join(",")
    }
}

/// Options of one call beyond its [`crate::OpDesc`]; `CallOptions::default()` is a plain call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallOptions {
    /// The algorithms the call may use.
    pub algos: AlgoSelection,
    /// An opaque tag written with the call into the flight record (0: untagged).
    pub profiler_tag: u64,
}

/// Among `available` (the communicator's allowed algorithms for this call), those `sel` keeps;
/// when none is left, an error if `sel.force`, else `available` unchanged.
pub fn restrict(available: &[Algo], sel: AlgoSelection, coll: Coll) -> Result<Vec<Algo>> {
    let kept: Vec<Algo> = available.iter().copied().filter(|a| sel.allows(*a)).collect();
    if !kept.is_empty() {
        return Ok(kept);
    }
    if sel.force {
        let have: Vec<&str> = available.iter().map(|a| a.name()).collect();
        return Err(Error::invalid_usage(format!(
            "algSelection {:?} leaves no algorithm for {} (available here: {}; forceAlgSelection is set)",
            AlgoSelection::describe_wire(sel.wire()),
            coll.name(),
            have.join(", ")
        )));
    }
    Ok(available.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse_like_nccl_algo() {
        let ar = Coll::AllReduce;
        assert_eq!(AlgoSelection::parse("", ar, true).unwrap(), AlgoSelection::AUTO);
        let t = AlgoSelection::parse("Tree", ar, true).unwrap();
        assert!(t.allows(Algo::Tree) && !t.allows(Algo::Ring) && t.is_restricted());
        let x = AlgoSelection::parse("^tree", ar, true).unwrap();
        assert!(!x.allows(Algo::Tree) && x.allows(Algo::Ring));
        let per = AlgoSelection::parse("allreduce:ring;allgather:tree", ar, true).unwrap();
        assert_eq!(per, AlgoSelection::only(&[Algo::Ring], true));
        assert_eq!(AlgoSelection::parse("allgather:tree", ar, true).unwrap(), AlgoSelection::AUTO);
        assert!(AlgoSelection::parse("bogus", ar, true).is_err());
        assert!(AlgoSelection::parse("allfoo:ring", ar, true).is_err());
        assert!(AlgoSelection::parse("allreduce ring", ar, true).is_err());
    }

    #[test]
    fn wire_bytes_name_the_selection() {
        let s = AlgoSelection::only(&[Algo::Ring, Algo::Tree], true);
        assert_ne!(s.wire(), 0);
        assert_eq!(AlgoSelection::describe_wire(s.wire()), "ring,tree");
        assert_eq!(AlgoSelection::describe_wire(0), "auto");
    }

    #[test]
    fn restriction_errors_only_when_forced() {
        let sel = AlgoSelection::only(&[Algo::Tree], true);
        assert!(restrict(&[Algo::Ring], sel, Coll::AllGather).is_err());
        let soft = AlgoSelection { force: false, ..sel };
        assert_eq!(restrict(&[Algo::Ring], soft, Coll::AllGather).unwrap(), vec![Algo::Ring]);
        assert_eq!(restrict(&[Algo::Ring, Algo::Tree], sel, Coll::AllReduce).unwrap(), vec![Algo::Tree]);
    }
}
