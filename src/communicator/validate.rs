//! Argument and state checks: every call is checked before it takes a sequence number.

use super::*;
use crate::exec::OpMem;
use crate::runtime::State;
use crate::schedule::{inplace_layout, Coll};
use crate::types::{Element, ReduceOp};
use crate::{Error, Result};

impl Communicator {
    pub(crate) fn per_rank(&self, len: usize) -> Result<usize> {
        if len % self.sh.nranks != 0 {
            return Err(Error::invalid_argument(format!(
                "buffer of {len} elements is not divisible into {} equal blocks",
                self.sh.nranks
            ))
            .with_rank(self.sh.rank));
        }
        Ok(len / self.sh.nranks)
    }

    pub(crate) fn inplace<'a, T: Element>(
        &self,
        coll: Coll,
        count: usize,
        root: usize,
        buf: &'a mut [T],
    ) -> Result<OpMem<'a>> {
        let es = std::mem::size_of::<T>();
        let (io, oo, _) =
            inplace_layout(coll, self.sh.nranks, self.sh.rank, count, root.min(self.sh.nranks.saturating_sub(1)))
                .ok_or_else(|| Error::invalid_argument(format!("{} has no in-place form", coll.name())))?;
        Ok(OpMem::InPlace { buf: bytemuck::cast_slice_mut(buf), in_off: io * es, out_off: oo * es })
    }

    /// Check `desc` and `mem` against this communicator (sizes, root, in-place layout).
    pub(crate) fn validate(&self, d: &OpDesc, mem: &OpMem<'_>) -> Result<()> {
        let (n, r) = (self.sh.nranks, self.sh.rank);
        let bad = |m: String| Err(Error::invalid_argument(m).with_rank(r).with_op(d.coll.name()));
        if d.coll.rooted() && d.root >= n {
            let what = if matches!(d.coll, Coll::Send | Coll::Recv) { "peer" } else { "root" };
            return bad(format!("{what} {} is out of range (communicator of {n} ranks)", d.root));
        }
        let es = d.dtype.size();
        let (ni, no) = d.coll.buffer_counts(n, r, d.count, d.root);
        let bytes = |c: usize| c.checked_mul(es).filter(|b| *b <= isize::MAX as usize);
        let (Some(bi), Some(bo)) = (bytes(ni), bytes(no)) else {
            return bad(format!("count {} of {} overflows the address space", d.count, d.dtype.name()));
        };
        if d.count as u64 >= 1u64 << crate::schedule::COUNT_BITS {
            return bad(format!("count {} is not below 2^{}", d.count, crate::schedule::COUNT_BITS));
        }
        if let ReduceOp::PreMulSum(_) = d.op {
            if !d.coll.reduces() {
                return bad("pre-multiplied sum on an operation that does not reduce".into());
            }
        }
        match mem {
            OpMem::Split { input, output } => {
                // broadcast reads the send buffer on the root only: others may pass none
                let unused = d.coll == Coll::Broadcast && r != d.root && input.is_empty();
                if ni > 0 && input.len() != bi && !unused {
                    return bad(format!(
                        "send buffer has {} bytes, {} needs {bi} ({ni} x {})",
                        input.len(),
                        d.coll.name(),
                        d.dtype.name()
                    ));
                }
                if no > 0 && output.len() != bo {
                    return bad(format!(
                        "receive buffer has {} bytes, {} needs {bo} ({no} x {})",
                        output.len(),
                        d.coll.name(),
                        d.dtype.name()
                    ));
                }
            }
            OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. } => {
                return Err(Error::internal("validate takes a borrowed view"));
            }
            OpMem::InPlace { buf, in_off, out_off } => {
                let Some((io, oo, len)) = inplace_layout(d.coll, n, r, d.count, d.root) else {
                    return bad(format!("{} has no in-place form", d.coll.name()));
                };
                if buf.len() != len * es || *in_off != io * es || *out_off != oo * es {
                    return bad(format!(
                        "in-place buffer of {} bytes does not match {}'s layout ({} bytes, input at {}, output at {})",
                        buf.len(),
                        d.coll.name(),
                        len * es,
                        io * es,
                        oo * es
                    ));
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn check_rank(nranks: usize, rank: usize) -> Result<()> {
    if nranks == 0 || rank >= nranks {
        return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
    }
    Ok(())
}

pub(crate) fn check_state(sh: &Shared, st: &State) -> Result<()> {
    if sh.stopped() {
        return Err(sh.stop_error());
    }
    if st.suspended {
        return Err(Error::invalid_usage("communicator is suspended (ncclCommSuspend): resume it first")
            .with_cause(oxccl_transport::Cause::Suspended)
            .with_rank(sh.rank));
    }
    if let Some(e) = &st.error {
        let mut e2 = Error::new(e.kind, format!("communicator failed earlier: {e}"));
        e2.rank = Some(sh.rank);
        return Err(e2);
    }
    Ok(())
}
