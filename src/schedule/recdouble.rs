//! Recursive doubling all-reduce: log2(n) exchanges of the whole message, for small messages.

use super::*;

/// Recursive doubling all-reduce. With n not a power of two, the `n - p2` extra ranks first fold
/// their data into ranks `0..n-p2` and get the result back at the end.
pub(super) fn recursive_doubling(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p2;
    let rounds = p2.trailing_zeros();
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        if r >= p2 {
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(r - p2), count: l, post: false });
            b.step(Step { recv: Some(r - p2), src: None, dst: out(o), send: None, count: l, post: false });
            continue;
        }
        let fold = if r < extra { Some(r + p2) } else { None };
        // the first round reads the input directly (out of place, copying it to the output
        // first would be one more pass over the message), unless the fold combined it there
        let mut acc = inp(o);
        if fold.is_some() || rounds == 0 {
            b.step(Step { recv: fold, src: inp(o), dst: out(o), send: None, count: l, post: false });
            acc = out(o);
        }
        for bit in 0..rounds {
            let partner = r ^ (1 << bit);
            let last = bit + 1 == rounds;
            b.step(Step { recv: None, src: acc, dst: None, send: Some(partner), count: l, post: false });
            b.step(Step { recv: Some(partner), src: acc, dst: out(o), send: None, count: l, post: p.avg && last });
            acc = out(o);
        }
        if let Some(e) = fold {
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(e), count: l, post: false });
        }
    }
}
