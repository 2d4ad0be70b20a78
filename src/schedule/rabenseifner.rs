//! Rabenseifner all-reduce: reduce-scatter by recursive halving, all-gather by recursive doubling.

use super::*;

/// Rabenseifner all-reduce. Ranks `0..p2` (p2 the largest power of two <= n) split the buffer
/// into p2 blocks. Reduce-scatter by recursive halving: at distance d = p2/2, ..., 1 each rank
/// keeps the half of its current block range on its side of bit d, sends the other half to
/// `r ^ d` and adds the partner's copy of the kept half; rank r ends owning block r. All-gather by
/// recursive doubling reverses the rounds. The `n - p2` extra ranks fold into ranks `0..n-p2`
/// first and get the result back at the end. Within a round, sends run one chunk ahead of
/// receives, so two slots per connection suffice.
pub(super) fn rabenseifner(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p2;
    let chunks = |s: usize, e: usize| (e - s).div_ceil(ch);
    if r >= p2 {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(r - p2), count: l, post: false });
        }
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: Some(r - p2), src: None, dst: out(o), send: None, count: l, post: false });
        }
        return;
    }
    let fold = (r < extra).then_some(r + p2);
    if let Some(e) = fold {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: Some(e), src: inp(o), dst: out(o), send: None, count: l, post: false });
        }
    }
    // element range of blocks [lo, hi)
    let range = |lo: usize, hi: usize| (block(c, p2, lo).0, block(c, p2, hi - 1).1);
    let mut base: fn(usize) -> Option<Slice> = if fold.is_some() { out } else { inp };
    let (mut lo, mut hi) = (0, p2);
    let mut d = p2 / 2;
    while d >= 1 {
        let partner = r ^ d;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if r & d == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let (gs, ge) = range(give.0, give.1);
        let (ks, ke) = range(keep.0, keep.1);
        exchange(b, partner, ch, (gs, ge, base), (ks, ke, base), p.avg && d == 1);
        (lo, hi) = keep;
        base = out;
        d /= 2;
    }
    let mut d = 1;
    while d < p2 {
        let partner = r ^ d;
        let (ps, pe) = (partner & !(d - 1), (partner & !(d - 1)) + d);
        let (ms, me) = range(lo, hi);
        let (ts, te) = range(ps, pe);
        exchange(b, partner, ch, (ms, me, out), (ts, te, |_| None), false);
        (lo, hi) = (lo.min(ps), hi.max(pe));
        d *= 2;
    }
    if let Some(e) = fold {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(e), count: l, post: false });
        }
    }
}

/// One pairwise exchange round of [`rabenseifner`]: send elements `[ss, se)` read from `sbuf` to
/// `partner` while receiving `[rs, re)` from it, combined with what `rsrc` gives (if any), into the
/// output (`post`: the avg division). Sends run one chunk ahead of receives, so two slots per
/// connection suffice.
type Window = (usize, usize, fn(usize) -> Option<Slice>);
fn exchange(b: &mut Builder, partner: usize, ch: usize, (ss, se, sbuf): Window, (rs, re, rsrc): Window, post: bool) {
    let rounds = (se - ss).div_ceil(ch).max((re - rs).div_ceil(ch));
    for k in 0..=rounds {
        if k < rounds {
            let (o, l) = chunk_of(ss, se, k, ch);
            b.step(Step { recv: None, src: sbuf(o), dst: None, send: Some(partner), count: l, post: false });
        }
        if k > 0 {
            let (o, l) = chunk_of(rs, re, k - 1, ch);
            b.step(Step { recv: Some(partner), src: rsrc(o), dst: out(o), send: None, count: l, post });
        }
    }
}
