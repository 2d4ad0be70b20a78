//! Ring and chain schedules: the bandwidth-optimal pipelines of all-reduce, reduce-scatter,
//! all-gather, broadcast (chain from the root) and reduce (chain to the root).

use super::*;

/// Ring all-reduce: reduce-scatter then all-gather around the ring, pipelined by chunk.
pub(super) fn all_reduce(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    let max_block = (0..n).map(|x| block(c, n, x)).map(|(s, e)| e - s).max().unwrap();
    for k in 0..max_block.div_ceil(ch) {
        let ck = |blk: usize| {
            let (s, e) = block(c, n, blk);
            chunk_of(s, e, k, ch)
        };
        let (o, l) = ck(m(ri - 1));
        b.step(Step { recv: None, src: inp(o), dst: None, send: Some(next), count: l, post: false });
        for j in 1..n as isize - 1 {
            let (o, l) = ck(m(ri - 1 - j));
            b.step(Step { recv: Some(prev), src: inp(o), dst: None, send: Some(next), count: l, post: false });
        }
        let (o, l) = ck(r);
        b.step(Step { recv: Some(prev), src: inp(o), dst: out(o), send: Some(next), count: l, post: p.avg });
        for j in 1..n as isize - 1 {
            let (o, l) = ck(m(ri - j));
            b.step(Step { recv: Some(prev), src: None, dst: out(o), send: Some(next), count: l, post: false });
        }
        let (o, l) = ck(next);
        b.step(Step { recv: Some(prev), src: None, dst: out(o), send: None, count: l, post: false });
    }
}

/// Ring reduce-scatter.
pub(super) fn reduce_scatter(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        let blk = |x: usize| x * c + o;
        b.step(Step { recv: None, src: inp(blk(m(ri - 1))), dst: None, send: Some(next), count: l, post: false });
        for j in 1..n as isize - 1 {
            b.step(Step {
                recv: Some(prev),
                src: inp(blk(m(ri - 1 - j))),
                dst: None,
                send: Some(next),
                count: l,
                post: false,
            });
        }
        b.step(Step { recv: Some(prev), src: inp(blk(r)), dst: out(o), send: None, count: l, post: p.avg });
    }
}

/// Ring all-gather.
pub(super) fn all_gather(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        let blk = |x: usize| x * c + o;
        let send = (n > 1).then_some(next);
        b.step(Step { recv: None, src: inp(o), dst: out(blk(r)), send, count: l, post: false });
        for j in 1..n as isize - 1 {
            b.step(Step {
                recv: Some(prev),
                src: None,
                dst: out(blk(m(ri - j))),
                send: Some(next),
                count: l,
                post: false,
            });
        }
        if n > 1 {
            b.step(Step { recv: Some(prev), src: None, dst: out(blk(next)), send: None, count: l, post: false });
        }
    }
}

/// Chain broadcast from the root, pipelined by chunk.
pub(super) fn broadcast(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    let pos = m(ri - p.root as isize);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        let send = (pos + 1 < n).then_some(next);
        if pos == 0 {
            b.step(Step { recv: None, src: inp(o), dst: out(o), send, count: l, post: false });
        } else {
            b.step(Step { recv: Some(prev), src: None, dst: out(o), send, count: l, post: false });
        }
    }
}

/// Chain reduce: root+1 -> root+2 -> ... -> root.
pub(super) fn reduce(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    // chain root+1 -> root+2 -> ... -> root
    let pos = m(ri - p.root as isize - 1);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        let s = if pos == 0 {
            Step { recv: None, src: inp(o), dst: None, send: Some(next), count: l, post: false }
        } else if pos + 1 < n {
            Step { recv: Some(prev), src: inp(o), dst: None, send: Some(next), count: l, post: false }
        } else {
            Step { recv: Some(prev), src: inp(o), dst: out(o), send: None, count: l, post: p.avg }
        };
        b.step(s);
    }
}
