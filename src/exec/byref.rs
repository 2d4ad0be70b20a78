//! Single copy (messages sent by reference): which input a step may publish before it runs,
//! the addresses of the values sent, the window a direct receive writes, and the counters.

use super::step::oob;
use super::{OpMem, OpRun};
use crate::schedule::{Buf, Slice, Step};
use crate::types::ReduceOp;
use crate::{Error, Result};

impl OpRun<'_> {
    /// The input window a step only passes on: nothing received, no scaling (a pre-multiplied
    /// sum scales its input first), no post-processing. With separate buffers the input never
    /// changes, so it may be sent by reference before the step runs, whatever later steps
    /// write.
    pub(super) fn forwarded_input(&self, step: &Step) -> Option<Slice> {
        let src = step.src.filter(|s| s.buf == Buf::Input)?;
        let plain = step.recv.is_none() && !step.post && !matches!(self.fp.op, ReduceOp::PreMulSum(_));
        plain.then_some(src)
    }
}

pub(super) static SENT_BY_REFERENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static RECEIVED_DIRECT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Single-copy counters of this process: (messages sent by reference, messages copied straight
/// from a sender's memory into their destination).
pub fn single_copy_counts() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (SENT_BY_REFERENCE.load(Relaxed), RECEIVED_DIRECT.load(Relaxed))
}

/// Bytes `[off, off + len)` of the output buffer of an operation with separate buffers.
pub(super) fn output_window<'m>(mem: &'m mut OpMem<'_>, off: usize, len: usize) -> Result<&'m mut [u8]> {
    let out: &mut [u8] = match mem {
        OpMem::Split { output, .. } => output,
        OpMem::OwnedSplit { output, .. } => output.bytes_mut(),
        _ => return Err(Error::internal("single copy needs separate buffers")),
    };
    out.get_mut(off..off + len).ok_or_else(oob)
}

/// The address of a slice of an operation with separate buffers (a value sent by reference).
pub(super) fn window_addr(mem: &OpMem<'_>, v: Slice, es: usize, len: usize) -> Result<usize> {
    let (input, output): (&[u8], &[u8]) = match mem {
        OpMem::Split { input, output } => (input, output),
        OpMem::OwnedSplit { input, output } => (input.bytes(), output.bytes()),
        _ => return Err(Error::internal("single copy needs separate buffers")),
    };
    let b = if v.buf == Buf::Input { input } else { output };
    b.get(v.offset * es..v.offset * es + len).map(|x| x.as_ptr() as usize).ok_or_else(oob)
}
