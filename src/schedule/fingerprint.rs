//! What identifies an operation across ranks, and how it travels in frame headers.

use super::*;
use crate::types::{DataType, ReduceOp};

/// What identifies an operation across ranks: it travels in every frame header (`count` and the
/// packed `call` word) so a mismatch is caught where the data arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Operation.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (Sum for operations that do not reduce).
    pub op: ReduceOp,
    /// Root (peer for point to point; 0 when unused).
    pub root: usize,
    /// Count, in NCCL's convention.
    pub count: usize,
    /// Algorithm (ranks that chose differently would exchange differently shaped messages).
    pub algo: Algo,
    /// The call's algorithm selection ([`crate::select::AlgoSelection::wire`]; 0: automatic).
    pub sel: u8,
}

/// Element counts fit below this bit of the header's `count` word; the byte above carries the
/// call's algorithm selection.
pub const COUNT_BITS: u32 = 56;

impl Fingerprint {
    /// The header's `count` word: the element count, and the selection in the top byte.
    pub fn count_word(&self) -> u64 {
        self.count as u64 | (self.sel as u64) << COUNT_BITS
    }

    /// The `call` word: operation, type, reduce op and root packed in 32 bits.
    pub fn call_word(&self) -> u32 {
        let root = if matches!(self.coll, Coll::Send | Coll::Recv) { 0 } else { (self.root as u32) & 0x3FFFF };
        let root = root & 0x1FFFF;
        self.coll.code() | (self.dtype as u32) << 4 | self.op.code() << 8 | self.algo.code() << 12 | root << 15
    }

    /// Describe a peer's (count, call) pair for messages.
    pub fn describe_wire(count_word: u64, call: u32) -> String {
        let count = count_word & ((1u64 << COUNT_BITS) - 1);
        let sel = (count_word >> COUNT_BITS) as u8;
        let coll = Coll::from_code(call & 0xF).map_or("unknown", Coll::wire_name);
        let dt = DataType::from_raw(((call >> 4) & 0xF) as i32).map(|d| d.name()).unwrap_or("?");
        let op =
            ["sum", "prod", "max", "min", "avg", "premulsum"].get(((call >> 8) & 0xF) as usize).copied().unwrap_or("?");
        let algo = Algo::ALL.get(((call >> 12) & 7) as usize).map(|a| a.name()).unwrap_or("?");
        format!("{coll}(type={dt}, count={count}, op={op}, root={}, algo={algo}{})", call >> 15, sel_suffix(sel))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.coll.wire_name();
        let root = if matches!(self.coll, Coll::Send | Coll::Recv) { 0 } else { self.root };
        write!(
            f,
            "{name}(type={}, count={}, op={}, root={root}, algo={}{})",
            self.dtype.name(),
            self.count,
            self.op.name(),
            self.algo.name(),
            sel_suffix(self.sel)
        )
    }
}

/// `, algSelection=ring,tree` for a restricted call; nothing for an automatic one.
fn sel_suffix(sel: u8) -> String {
    if sel == 0 {
        String::new()
    } else {
        format!(", algSelection={}", crate::select::AlgoSelection::describe_wire(sel))
    }
}
