//! Deterministic (ordered) reductions: every element reduced in rank order by its owner.

use super::*;

/// Deterministic schedules: the owner of each block accumulates every rank's contribution, its
/// own included (through a connection to itself), in rank order 0..n-1; all-reduce then shares
/// the blocks with a ring all-gather.
pub(super) fn ordered(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    // (input offset, output offset, length) of chunk k of block `blk`, and the block owner
    let part = |blk: usize, k: usize| -> (usize, usize, usize) {
        match p.coll {
            Coll::AllReduce => {
                let (s, e) = block(c, n, blk);
                let (o, l) = chunk_of(s, e, k, ch);
                (o, o, l)
            }
            Coll::ReduceScatter => {
                let (o, l) = chunk_of(0, c, k, ch);
                (blk * c + o, o, l)
            }
            _ => {
                let (o, l) = chunk_of(0, c, k, ch);
                (o, o, l)
            }
        }
    };
    let rounds = match p.coll {
        Coll::AllReduce => (0..n).map(|x| block(c, n, x)).map(|(s, e)| e - s).max().unwrap().div_ceil(ch),
        _ => c.div_ceil(ch),
    };
    for k in 0..rounds {
        // 1. contributions to their owners (the block's rank; the root for reduce)
        let owners: Vec<usize> = match p.coll {
            Coll::Reduce => vec![p.root],
            _ => (0..n).map(|i| (r + 1 + i) % n).collect(),
        };
        for &owner in &owners {
            let (io, _, l) = part(owner, k);
            let io = if p.coll == Coll::Reduce { part(0, k).0 } else { io };
            b.step(Step { recv: None, src: inp(io), dst: None, send: Some(owner), count: l, post: false });
        }
        // 2. the owner accumulates in rank order
        if p.coll != Coll::Reduce || r == p.root {
            let (_, oo, l) = part(r, k);
            for q in 0..n {
                let src = if q == 0 { None } else { out(oo) };
                b.step(Step { recv: Some(q), src, dst: out(oo), send: None, count: l, post: p.avg && q == n - 1 });
            }
        }
        // 3. all-reduce: ring all-gather of the owned blocks
        if p.coll == Coll::AllReduce {
            let (o, _, l) = part(r, k);
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(next), count: l, post: false });
            for j in 1..n - 1 {
                let (o, _, l) = part((r + n - j) % n, k);
                b.step(Step { recv: Some(prev), src: None, dst: out(o), send: Some(next), count: l, post: false });
            }
            let (o, _, l) = part(next, k);
            b.step(Step { recv: Some(prev), src: None, dst: out(o), send: None, count: l, post: false });
        }
    }
}
