//! One step's data movement: the fused copy/reduce on the user buffers.

use super::OpMem;
use crate::reduce::{combine, combine_inplace};
use crate::schedule::{Buf, Slice, Step};
use crate::types::{DataType, ReduceOp};
use crate::{Error, Result};

pub(super) fn oob() -> Error {
    Error::internal("schedule step outside the user buffer")
}

/// Run one step's data movement. `recv` is the received payload, `slot` the send slot.
#[allow(clippy::too_many_arguments)]
pub fn apply_step(
    step: &Step,
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    mem: &mut OpMem<'_>,
    recv: Option<&[u8]>,
    slot: Option<&mut [u8]>,
) -> Result<()> {
    let es = dt.size();
    let len = step.count * es;
    let post = step.post.then_some(nranks);
    if recv.is_some_and(|r| r.len() != len) {
        return Err(Error::internal("received message size does not match the step"));
    }
    let byte_range = |s: Slice| (s.buf, s.offset * es, s.offset * es + len);
    if matches!(mem, OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. }) {
        return apply_step(step, dt, op, nranks, &mut mem.view(), recv, slot);
    }
    // The pre-multiplier (pre-multiplied sum) applies to reads of the input buffer only: those
    // are a rank's own contributions; the output buffer holds partial results.
    let op_for = |src: Option<Slice>| match (op, src) {
        (ReduceOp::PreMulSum(_), Some(Slice { buf: Buf::Output, .. })) => ReduceOp::Sum,
        _ => op,
    };
    let op = op_for(step.src);
    match mem {
        OpMem::Split { input, output } => {
            match (step.src.map(byte_range), step.dst.map(byte_range)) {
                // output read and written: the one-buffer rules
                (Some((Buf::Output, sa, sb)), dst) => {
                    let dst = match dst {
                        Some((Buf::Output, a, b)) => Some((a, b)),
                        Some(_) => return Err(Error::internal("schedule writes the input buffer")),
                        None => None,
                    };
                    one_buffer(dt, op, output, (sa, sb), dst, recv, slot, post, len)?;
                }
                (src, dst) => {
                    let src = match src {
                        Some((_, a, b)) => Some(input.get(a..b).ok_or_else(oob)?),
                        None => None,
                    };
                    match (dst, slot) {
                        (Some((Buf::Output, a, b)), slot) => {
                            let d = output.get_mut(a..b).ok_or_else(oob)?;
                            combine_to_both(dt, op, d, recv, src, post, slot.map(|s| &mut s[..len]));
                        }
                        (Some((Buf::Input, _, _)), _) => {
                            return Err(Error::internal("schedule writes the input buffer"))
                        }
                        (None, Some(s)) => combine(dt, op, &mut s[..len], recv, src, post),
                        (None, None) => {}
                    }
                }
            }
        }
        OpMem::InPlace { buf, in_off, out_off } => {
            let abs = |s: Slice| {
                let (b, x, y) = byte_range(s);
                let base = if b == Buf::Input { *in_off } else { *out_off };
                (base + x, base + y)
            };
            match step.src.map(abs) {
                Some(src) => one_buffer(dt, op, buf, src, step.dst.map(abs), recv, slot, post, len)?,
                None => match (step.dst.map(abs), slot) {
                    (Some((a, b)), slot) => {
                        let d = buf.get_mut(a..b).ok_or_else(oob)?;
                        combine_to_both(dt, op, d, recv, None, post, slot.map(|s| &mut s[..len]));
                    }
                    (None, Some(s)) => combine(dt, op, &mut s[..len], recv, None, post),
                    (None, None) => {}
                },
            }
        }
        OpMem::OwnedSplit { .. } | OpMem::OwnedInPlace { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// Bytes per tile when a step writes both a destination and a send slot: the slot copy reads
/// the tile while it is still in L1 instead of making a second pass over the chunk.
const TILE: usize = 16 << 10;

/// `d = recv ⊕ pre(src)` (then `/ post`), also copied into `slot`, tile by tile.
#[allow(clippy::too_many_arguments)]
fn combine_to_both(
    dt: DataType,
    op: ReduceOp,
    d: &mut [u8],
    recv: Option<&[u8]>,
    src: Option<&[u8]>,
    post: Option<usize>,
    slot: Option<&mut [u8]>,
) {
    let Some(slot) = slot else {
        combine(dt, op, d, recv, src, post);
        return;
    };
    let tile = TILE - TILE % dt.size();
    let mut off = 0;
    while off < d.len() {
        let end = (off + tile).min(d.len());
        let dd = &mut d[off..end];
        combine(dt, op, dd, recv.map(|r| &r[off..end]), src.map(|x| &x[off..end]), post);
        slot[off..end].copy_from_slice(dd);
        off = end;
    }
}

/// [`combine_inplace`] on `d`, also copied into `slot`, tile by tile.
fn combine_inplace_to_both(
    dt: DataType,
    op: ReduceOp,
    d: &mut [u8],
    recv: Option<&[u8]>,
    post: Option<usize>,
    slot: Option<&mut [u8]>,
) {
    let Some(slot) = slot else {
        combine_inplace(dt, op, d, recv, post);
        return;
    };
    let tile = TILE - TILE % dt.size();
    let mut off = 0;
    while off < d.len() {
        let end = (off + tile).min(d.len());
        combine_inplace(dt, op, &mut d[off..end], recv.map(|r| &r[off..end]), post);
        slot[off..end].copy_from_slice(&d[off..end]);
        off = end;
    }
}

/// A step whose source (byte range `src`) and destination (`dst`) lie in one buffer.
#[allow(clippy::too_many_arguments)]
fn one_buffer(
    dt: DataType,
    op: ReduceOp,
    buf: &mut [u8],
    (sa, sb): (usize, usize),
    dst: Option<(usize, usize)>,
    recv: Option<&[u8]>,
    slot: Option<&mut [u8]>,
    post: Option<usize>,
    len: usize,
) -> Result<()> {
    if sb > buf.len() || dst.is_some_and(|(_, b)| b > buf.len()) {
        return Err(oob());
    }
    match dst {
        Some((a, b)) => {
            let slot = slot.map(|s| &mut s[..len]);
            if sa == a {
                combine_inplace_to_both(dt, op, &mut buf[a..b], recv, post, slot);
            } else if sb <= a || sa >= b {
                let (d, s) = if sb <= a {
                    let (lo, hi) = buf.split_at_mut(a);
                    (&mut hi[..len], &lo[sa..sb])
                } else {
                    let (lo, hi) = buf.split_at_mut(sa);
                    (&mut lo[a..b], &hi[..len])
                };
                combine_to_both(dt, op, d, recv, Some(s), post, slot);
            } else {
                return Err(Error::internal("partially overlapping step slices"));
            }
        }
        None => {
            if let Some(s) = slot {
                combine(dt, op, &mut s[..len], recv, Some(&buf[sa..sb]), post);
            }
        }
    }
    Ok(())
}
