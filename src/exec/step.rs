//! One step's data movement: the fused copy/reduce on the user buffers.

use super::OpMem;
use crate::reduce::{combine, combine_inplace};
use crate::schedule::{Buf, Slice, Step};
use crate::types::{DataType, ReduceOp};
use crate::{Error, Result};

pub(super) fn oob() -> Error {
    Error::internal("schedule step outside the user buffer")
}

/// Output bytes from which an operation whose schedule never reads its output (separate
/// buffers) writes it with streaming stores: below this the output stays in cache until the
/// caller reads it, which is worth more than the read for ownership saved. Measured on 2 ranks
/// (bench/RESULTS.md "Streaming stores from 16 MiB"): 16 MiB gains, 8 MiB loses.
pub const STREAM_MIN: usize = 16 << 20;

/// Whether an operation on `mem` with schedule `sched` may write its output with streaming
/// stores: separate buffers, an output of at least [`STREAM_MIN`] bytes, and a schedule that
/// never reads it (the executor asks once per operation, the simulator alike). Of its steps,
/// [`apply_step`] streams only the reductions (a received value combined with the input): a
/// large plain copy (memcpy's `rep movsb`) already skips the read for ownership.
pub fn streams_output(sched: &crate::schedule::Schedule, mem: &OpMem<'_>) -> bool {
    let out = match mem {
        OpMem::Split { output, .. } => output.len(),
        OpMem::OwnedSplit { output, .. } => output.bytes().len(),
        OpMem::InPlace { .. } | OpMem::OwnedInPlace { .. } => 0,
    };
    out >= STREAM_MIN && sched.output_write_only()
}

static STREAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes this process wrote to output buffers with streaming stores.
pub fn streamed_bytes() -> u64 {
    STREAMED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Run one step's data movement, on elements of type `dt` reduced with `op` in a communicator
/// of `nranks`. `recv` is the received payload, `slot` the send slot; with `stream` (see
/// [`streams_output`]), a reduction into the output buffer is written with streaming stores.
#[allow(clippy::too_many_arguments)]
pub fn apply_step(
    step: &Step,
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    stream: bool,
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
        return apply_step(step, dt, op, nranks, stream, &mut mem.view(), recv, slot);
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
                            let slot = slot.map(|s| &mut s[..len]);
                            // only reductions stream (see `streams_output`)
                            let stream = stream && recv.is_some() && src.is_some();
                            combine_to_both(dt, op, d, recv, src, post, slot, stream);
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
                        combine_to_both(dt, op, d, recv, None, post, slot.map(|s| &mut s[..len]), false);
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

/// `d = recv ⊕ pre(src)` (then `/ post`), also copied into `slot`, tile by tile; with `stream`,
/// `d` is written by streaming stores (tiles computed in L1, then stored without reading `d`'s
/// lines first).
#[allow(clippy::too_many_arguments)]
fn combine_to_both(
    dt: DataType,
    op: ReduceOp,
    d: &mut [u8],
    recv: Option<&[u8]>,
    src: Option<&[u8]>,
    post: Option<usize>,
    mut slot: Option<&mut [u8]>,
    stream: bool,
) {
    if stream {
        STREAMED.fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
        oxccl_simd::stream_fill(d, dt.size(), &mut |off, t| {
            let end = off + t.len();
            combine(dt, op, t, recv.map(|r| &r[off..end]), src.map(|x| &x[off..end]), post);
            if let Some(s) = slot.as_deref_mut() {
                oxccl_simd::copy(&mut s[off..end], t);
            }
        });
        return;
    }
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
        oxccl_simd::copy(&mut slot[off..end], dd);
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
        oxccl_simd::copy(&mut slot[off..end], &d[off..end]);
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
                combine_to_both(dt, op, d, recv, Some(s), post, slot, false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Buf, Slice, Step};

    fn bytes(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 131 + seed * 17) % 251) as u8 & 0x3f).collect()
    }

    /// Only an out-of-place output of at least `STREAM_MIN` bytes that the schedule never reads
    /// is streamed: 2-rank recursive doubling's is; in place, smaller, or 4-rank recursive
    /// doubling's (whose later rounds add to the output) is not.
    #[test]
    fn which_outputs_are_streamed() {
        use crate::schedule::{build, Algo, Coll, Params};
        let sched = |nranks, algo| {
            let p = Params { coll: Coll::AllReduce, nranks, rank: 0, count: STREAM_MIN / 4, root: 0, chunk: 1 << 18, avg: false, algo };
            build(&p)
        };
        let (input, mut out, mut big) = (vec![0u8; STREAM_MIN], vec![0u8; STREAM_MIN], vec![0u8; 2 * STREAM_MIN]);
        let split = |o: &mut Vec<u8>, n: usize| streams_output(&sched(2, Algo::RecursiveDoubling), &OpMem::Split { input: &input, output: &mut o[..n] });
        assert!(split(&mut out, STREAM_MIN));
        assert!(!split(&mut out, STREAM_MIN - 1));
        let inplace = OpMem::InPlace { buf: &mut big, in_off: 0, out_off: 0 };
        assert!(!streams_output(&sched(2, Algo::RecursiveDoubling), &inplace));
        assert!(!streams_output(&sched(4, Algo::RecursiveDoubling), &OpMem::Split { input: &input, output: &mut out }));
    }

    /// A step that receives, adds its input and sends, run with and without streaming stores:
    /// the output and the slot are the same bit for bit, for every type and op, at lengths
    /// around the tile and at an output that starts off the streaming alignment.
    #[test]
    fn streaming_the_output_changes_no_bit() {
        let tile = oxccl_simd::TILE;
        for dt in DataType::ALL {
            for op in crate::exact::ops_for(crate::schedule::Coll::AllReduce, dt) {
                let es = dt.size();
                for count in [1, tile / es - 1, tile / es + 3, 3 * tile / es + 5] {
                    for lead in [0, 1, 3] {
                        let step = Step {
                            recv: Some(1),
                            src: Some(Slice { buf: Buf::Input, offset: 0 }),
                            dst: Some(Slice { buf: Buf::Output, offset: lead }),
                            send: Some(1),
                            count,
                            post: matches!(op, ReduceOp::Avg),
                        };
                        let (input, recv) = (bytes(count * es, 1), bytes(count * es, 2));
                        let run = |stream| {
                            let mut out = vec![0u8; (count + lead) * es];
                            let mut slot = vec![0u8; count * es];
                            let mut mem = OpMem::Split { input: &input, output: &mut out };
                            apply_step(&step, dt, op, 2, stream, &mut mem, Some(&recv), Some(&mut slot)).unwrap();
                            (out, slot)
                        };
                        assert_eq!(run(true), run(false), "{dt:?} {op:?} count {count} lead {lead}");
                    }
                }
            }
        }
    }
}
