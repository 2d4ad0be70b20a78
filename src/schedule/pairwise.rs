//! Pairwise schedules: all-to-all, gather, scatter and point-to-point send and receive.

use super::*;

/// All-to-all: a local copy, then one exchange per distance.
pub(super) fn all_to_all(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    local(b, r * c, r * c, c, false);
    for i in 1..n {
        let to = (r + i) % n;
        let from = (r + n - i) % n;
        for k in 0..c.div_ceil(ch) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: inp(to * c + o), dst: None, send: Some(to), count: l, post: false });
            b.step(Step { recv: Some(from), src: None, dst: out(from * c + o), send: None, count: l, post: false });
        }
    }
}

/// Gather: every rank sends to the root.
pub(super) fn gather(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    if r == p.root {
        local(b, 0, r * c, c, false);
        for i in 1..n {
            let from = (r + i) % n;
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                b.step(Step { recv: Some(from), src: None, dst: out(from * c + o), send: None, count: l, post: false });
            }
        }
    } else {
        for k in 0..c.div_ceil(ch) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(p.root), count: l, post: false });
        }
    }
}

/// Scatter: the root sends each rank its block.
pub(super) fn scatter(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    if r == p.root {
        local(b, r * c, 0, c, false);
        for i in 1..n {
            let to = (r + i) % n;
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                b.step(Step { recv: None, src: inp(to * c + o), dst: None, send: Some(to), count: l, post: false });
            }
        }
    } else {
        for k in 0..c.div_ceil(ch) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: Some(p.root), src: None, dst: out(o), send: None, count: l, post: false });
        }
    }
}

/// Send to `p.root` (the peer).
pub(super) fn send(b: &mut Builder, p: &Params) {
    let (c, ch) = (p.count, p.chunk);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        b.step(Step { recv: None, src: inp(o), dst: None, send: Some(p.root), count: l, post: false });
    }
}

/// Receive from `p.root` (the peer).
pub(super) fn recv(b: &mut Builder, p: &Params) {
    let (c, ch) = (p.count, p.chunk);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        b.step(Step { recv: Some(p.root), src: None, dst: out(o), send: None, count: l, post: false });
    }
}
