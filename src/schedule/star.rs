//! Star all-reduce: every rank sends its message straight to rank 0, which combines them in
//! rank order and sends the result straight back; and the star broadcast, its second half from
//! any root. Two dependent hand-offs whatever the rank count (recursive doubling needs log2(n),
//! each of which makes every rank run), for tiny messages on a host with more ranks than cores,
//! where each hand-off waits for a core (Open MPI's shared-memory fan-in/fan-out does the
//! same). The root's work grows with n, so the tuner keeps it to small messages.

use super::*;

/// The root of the star.
const ROOT: usize = 0;

/// Star all-reduce, chunk by chunk: rank 0 folds rank 1, 2, ..., n-1's messages into its own
/// (a fixed order, so the result does not depend on arrival), then sends the result to each.
pub(super) fn star(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        if r != ROOT {
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(ROOT), count: l, post: false });
            b.step(Step { recv: Some(ROOT), src: None, dst: out(o), send: None, count: l, post: false });
            continue;
        }
        let mut acc = inp(o);
        for q in 1..n {
            let last = q + 1 == n;
            b.step(Step { recv: Some(q), src: acc, dst: out(o), send: None, count: l, post: p.avg && last });
            acc = out(o);
        }
        for q in 1..n {
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(q), count: l, post: false });
        }
    }
}

/// Star broadcast: the root sends each chunk straight to root+1, root+2, ... in turn (one
/// hand-off to every rank, where the chain needs n-1 in a row); the others receive it into
/// their output.
pub(super) fn broadcast(b: &mut Builder, p: &Params) {
    let (n, r, c, ch, root) = (p.nranks, p.rank, p.count, p.chunk, p.root);
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        if r != root {
            b.step(Step { recv: Some(root), src: None, dst: out(o), send: None, count: l, post: false });
            continue;
        }
        // the root's own copy (none in place) goes with its first send
        let first = (root + 1) % n;
        b.step(Step { recv: None, src: inp(o), dst: out(o), send: Some(first), count: l, post: false });
        for q in (2..n).map(|i| (root + i) % n) {
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(q), count: l, post: false });
        }
    }
}
