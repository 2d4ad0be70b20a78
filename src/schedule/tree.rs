//! Double binary tree all-reduce, and the balanced binary tree it is built on.

use super::*;

/// A balanced in-order binary tree over positions `0..n`: (parent, children) of each position.
pub fn binary_tree(n: usize) -> Vec<(Option<usize>, Vec<usize>)> {
    fn rec(t: &mut [(Option<usize>, Vec<usize>)], lo: usize, hi: usize, parent: Option<usize>) -> Option<usize> {
        if lo >= hi {
            return None;
        }
        let mid = lo + (hi - lo) / 2;
        t[mid].0 = parent;
        let kids: Vec<usize> =
            [rec(t, lo, mid, Some(mid)), rec(t, mid + 1, hi, Some(mid))].into_iter().flatten().collect();
        t[mid].1 = kids;
        Some(mid)
    }
    let mut t = vec![(None, Vec::new()); n];
    rec(&mut t, 0, n, None);
    t
}

/// How many chunk rounds the broadcast half of a tree trails its reduce half: lets a leaf keep
/// this many chunks in flight instead of waiting for each one's round trip.
pub const TREE_LAG: usize = 2;

/// Double binary tree all-reduce (see [`Algo::Tree`]). Tree 0 places rank r at position r, tree 1
/// at position (r + n - 1) mod n; tree t reduces and broadcasts half t of the buffer. Per chunk:
/// up — a leaf sends its input to its parent; an inner node adds its children's messages to its
/// input (the first into its output, the second on the way up); the root's last addition is the
/// result. Down, `TREE_LAG` rounds later: receive from the parent (the root reads its output),
/// write, forward to the children. Every message is sent and received at the same position of
/// the (round, phase, tree) sequence on both sides, which keeps the connection FIFOs in order.
pub(super) fn double_tree(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let t = binary_tree(n);
    let half = c / 2;
    let halves = [(0, half), (half, c)];
    // tree index -> (parent, children) of this rank, in ranks
    let node = |tree: usize| {
        let to_rank = |pos: usize| if tree == 0 { pos } else { (pos + 1) % n };
        let pos = if tree == 0 { r } else { (r + n - 1) % n };
        let (par, kids) = &t[pos];
        (par.map(to_rank), kids.iter().map(|&k| to_rank(k)).collect::<Vec<_>>())
    };
    let nodes = [node(0), node(1)];
    let rounds = (c - half).div_ceil(ch);
    let up = |b: &mut Builder, tree: usize, k: usize| {
        let (par, kids) = &nodes[tree];
        let (o, l) = chunk_of(halves[tree].0, halves[tree].1, k, ch);
        let root = par.is_none();
        match kids.len() {
            0 => b.step(Step { recv: None, src: inp(o), dst: None, send: *par, count: l, post: false }),
            _ => {
                if kids.len() == 2 {
                    b.step(Step { recv: Some(kids[0]), src: inp(o), dst: out(o), send: None, count: l, post: false });
                }
                let last = kids[kids.len() - 1];
                let src = if kids.len() == 2 { out(o) } else { inp(o) };
                let dst = if root { out(o) } else { None };
                b.step(Step { recv: Some(last), src, dst, send: *par, count: l, post: root && p.avg });
            }
        }
    };
    let down = |b: &mut Builder, tree: usize, k: usize| {
        let (par, kids) = &nodes[tree];
        let (o, l) = chunk_of(halves[tree].0, halves[tree].1, k, ch);
        let mut kids = kids.iter().copied();
        if let Some(par) = *par {
            b.step(Step { recv: Some(par), src: None, dst: out(o), send: kids.next(), count: l, post: false });
        }
        for kid in kids {
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(kid), count: l, post: false });
        }
    };
    for k in 0..rounds + TREE_LAG {
        if k < rounds {
            up(b, 0, k);
            up(b, 1, k);
        }
        if k >= TREE_LAG {
            down(b, 0, k - TREE_LAG);
            down(b, 1, k - TREE_LAG);
        }
    }
}
