//! Single copy (messages sent by reference): which input a step may publish before it runs,
//! the addresses of the values sent, the window a direct receive writes, and the counters.

use super::step::oob;
use super::{OpMem, OpRun};
use crate::schedule::{Buf, Slice, Step};
use crate::types::ReduceOp;
use crate::Result;

impl OpRun<'_> {
    /// The input window step `pc` only passes on: nothing received, no scaling (a
    /// pre-multiplied sum scales its input first), no post-processing. It may be sent by
    /// reference before the step runs if its bytes stay as they are until the operation ends:
    /// with separate buffers the input never changes; in one allocation (in place), no step from
    /// `pc` on may write them, other than by copying them onto themselves (the root of a
    /// broadcast, a rank's own block of an all-gather).
    pub(super) fn forwarded_input(&self, pc: usize, step: &Step) -> Option<Slice> {
        let src = step.src.filter(|s| s.buf == Buf::Input)?;
        let plain = step.recv.is_none() && !step.post && !matches!(self.fp.op, ReduceOp::PreMulSum(_));
        let kept = match in_place_offsets(&self.mem) {
            None => true,
            Some((i, o)) => untouched(&self.sched.steps[pc..], src, step.count, self.fp.dtype.size(), (i, o)),
        };
        (plain && kept).then_some(src)
    }
}

/// How a rank takes part in an operation, for [`forwards`].
#[derive(Clone, Copy)]
pub(super) struct Role {
    /// Every message it sends passes its input on ([`crate::schedule::Schedule::sends_only_input`]).
    pub only_input: bool,
    /// Separate input and output buffers: the rank has a copy of its own for the receiver's
    /// read to overlap.
    pub split: bool,
    /// The rank receives in this operation too: a copy saved on its sends is one less copy on
    /// its core, which also copies what it receives.
    pub receives: bool,
    /// Messages the operation takes ([`oxccl_transport::SendConn::max_message`] each).
    pub messages: usize,
    /// The connection forwards whatever the role ([`oxccl_transport::Forwarding::any_role`]).
    pub any: bool,
}

/// A rank that only sends, out of place, sends by reference operations of at most this many
/// messages: beyond, the slots pipeline its copy and the receiver's over the two cores, and
/// the kernel's slower copy loses (a 2 MiB broadcast: 0.85×; bench/RESULTS.md).
const OVERLAP_MESSAGES: usize = 4;

/// Whether an operation of `op_bytes` sends its forwarded inputs by reference, given the
/// connection's range for them ([`oxccl_transport::SendConn::borrow_forward`]). In place
/// there is no copy of its own for the receiver's read to overlap, only the second copy to
/// save, so the system call pays from twice the range's start (measured: a 32 KiB broadcast in
/// place lost 0.88×, 64 KiB won 1.15×). A rank that only sends, in place, saves nothing on its
/// own core: single copy pays there only while the operation is one message, whose two copies
/// the slots cannot overlap (out of place, [`OVERLAP_MESSAGES`]). A rank that receives too
/// saves a copy on its own core: the whole range. A rank that also passes on what it received
/// (a ring of more than two) saves one copy in several and waits for its readers: it sends
/// through the slots (bench/RESULTS.md "Single copy by role"). A connection whose own copies
/// are slow just now ([`Role::any`]: shared memory between cores far apart) forwards whatever
/// the role.
pub(super) fn forwards(range: std::ops::Range<usize>, op_bytes: usize, role: Role) -> bool {
    let from = if role.split { range.start } else { range.start.saturating_mul(2) };
    let pays = role.any || role.receives || role.messages <= if role.split { OVERLAP_MESSAGES } else { 1 };
    (from..range.end).contains(&op_bytes) && role.only_input && pays
}

/// The byte offsets of the input and output windows in an in-place operation's allocation.
fn in_place_offsets(mem: &OpMem<'_>) -> Option<(usize, usize)> {
    match mem {
        OpMem::InPlace { in_off, out_off, .. } | OpMem::OwnedInPlace { in_off, out_off, .. } => Some((*in_off, *out_off)),
        OpMem::Split { .. } | OpMem::OwnedSplit { .. } => None,
    }
}

/// Whether none of `steps` writes the bytes of slice `v` (`count` elements of `es` bytes) of
/// an allocation whose input and output windows start at `offs`, other than by copying them
/// onto themselves.
fn untouched(steps: &[Step], v: Slice, count: usize, es: usize, offs: (usize, usize)) -> bool {
    let at = |x: Slice| if x.buf == Buf::Input { offs.0 } else { offs.1 } + x.offset * es;
    let (a, b) = (at(v), at(v) + count * es);
    steps.iter().all(|s| {
        let Some(d) = s.dst.filter(|_| s.count > 0) else { return true };
        let (da, db) = (at(d), at(d) + s.count * es);
        let onto_itself = s.recv.is_none() && !s.post && s.src.is_some_and(|x| at(x) == da);
        db <= a || b <= da || onto_itself
    })
}

pub(super) static SENT_BY_REFERENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static RECEIVED_DIRECT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Single-copy counters of this process: (messages sent by reference, messages copied straight
/// from a sender's memory into their destination).
pub fn single_copy_counts() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (SENT_BY_REFERENCE.load(Relaxed), RECEIVED_DIRECT.load(Relaxed))
}

/// Bytes `[off, off + len)` of an operation's output window.
pub(super) fn output_window<'m>(mem: &'m mut OpMem<'_>, off: usize, len: usize) -> Result<&'m mut [u8]> {
    let (out, base): (&mut [u8], usize) = match mem {
        OpMem::Split { output, .. } => (output, 0),
        OpMem::OwnedSplit { output, .. } => (output.bytes_mut(), 0),
        OpMem::InPlace { buf, out_off, .. } => (buf, *out_off),
        OpMem::OwnedInPlace { buf, out_off, .. } => (buf.bytes_mut(), *out_off),
    };
    out.get_mut(base + off..base + off + len).ok_or_else(oob)
}

/// The address of a slice of an operation's buffers (a value sent by reference).
pub(super) fn window_addr(mem: &OpMem<'_>, v: Slice, es: usize, len: usize) -> Result<usize> {
    let (bytes, base): (&[u8], usize) = match (mem, v.buf) {
        (OpMem::Split { input, .. }, Buf::Input) => (input, 0),
        (OpMem::Split { output, .. }, Buf::Output) => (output, 0),
        (OpMem::OwnedSplit { input, .. }, Buf::Input) => (input.bytes(), 0),
        (OpMem::OwnedSplit { output, .. }, Buf::Output) => (output.bytes(), 0),
        (OpMem::InPlace { buf, in_off, out_off }, b) => (buf, if b == Buf::Input { *in_off } else { *out_off }),
        (OpMem::OwnedInPlace { buf, in_off, out_off }, b) => {
            (buf.bytes(), if b == Buf::Input { *in_off } else { *out_off })
        }
    };
    let (a, n) = (base + v.offset * es, len);
    bytes.get(a..a + n).map(|x| x.as_ptr() as usize).ok_or_else(oob)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(recv: Option<usize>, src: Option<Slice>, dst: Option<Slice>, count: usize) -> Step {
        Step { recv, src, dst, send: None, count, post: false }
    }

    #[test]
    fn in_place_operations_forward_by_reference_from_twice_the_start() {
        let r = 32..256;
        let (split, inplace) = (
            Role { only_input: true, split: true, receives: false, messages: 1, any: false },
            Role { only_input: true, split: false, receives: false, messages: 1, any: false },
        );
        assert!(forwards(r.clone(), 32, split) && !forwards(r.clone(), 32, inplace));
        assert!(forwards(r.clone(), 64, inplace) && !forwards(r.clone(), 256, split));
        assert!(!forwards(r.clone(), 31, split) && !forwards(0..0, 0, split));
    }

    #[test]
    fn a_rank_that_only_sends_forwards_by_reference_only_a_few_messages() {
        let r = 32..4096;
        let two = Role { only_input: true, split: false, receives: false, messages: 2, any: false };
        assert!(!forwards(r.clone(), 1024, two));
        assert!(forwards(r.clone(), 1024, Role { messages: 1, ..two }));
        assert!(forwards(r.clone(), 1024, Role { split: true, ..two }));
        let many = Role { messages: OVERLAP_MESSAGES + 1, split: true, ..two };
        assert!(!forwards(r.clone(), 1024, many));
        // one that receives too: the whole range
        assert!(forwards(r.clone(), 1024, Role { receives: true, ..many }));
        assert!(forwards(r.clone(), 1024, Role { receives: true, split: false, ..many }));
        // a connection whose own copies are slow just now: every role in range
        assert!(forwards(r.clone(), 1024, Role { any: true, ..many }));
        assert!(!forwards(r.clone(), 8192, Role { any: true, ..many }));
        // a rank that also passes on what it received never does
        let relay = Role { only_input: false, split: true, receives: true, messages: 1, any: false };
        assert!(!forwards(r.clone(), 1024, relay));
    }

    #[test]
    fn an_input_in_place_is_untouched_unless_a_step_writes_other_bytes_over_it() {
        let (inp, out) = (|o| Slice { buf: Buf::Input, offset: o }, |o| Slice { buf: Buf::Output, offset: o });
        let v = inp(0);
        // copied onto itself (a broadcast's root in place), or written elsewhere: untouched
        let own = step(None, Some(inp(0)), Some(out(0)), 4);
        let other = step(Some(1), None, Some(out(4)), 4);
        assert!(untouched(&[own, other], v, 4, 4, (0, 0)));
        // received over it, or combined into it: touched
        assert!(!untouched(&[own, step(Some(1), None, Some(out(2)), 4)], v, 4, 4, (0, 0)));
        assert!(!untouched(&[step(Some(1), Some(inp(0)), Some(out(0)), 4)], v, 4, 4, (0, 0)));
        // the same step with the windows apart (an all-gather's block elsewhere in the buffer)
        assert!(untouched(&[step(Some(1), None, Some(out(2)), 4)], v, 4, 4, (64, 0)));
        // the input window inside the output: a copy from another offset onto it touches it
        assert!(!untouched(&[step(None, Some(inp(4)), Some(out(16)), 4)], v, 4, 4, (64, 0)));
    }
}
