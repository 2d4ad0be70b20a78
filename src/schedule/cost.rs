//! The costs documented in `docs/algorithms.md`: elements each rank sends, as closed formulas.
//! Tests check every schedule against them.

use super::{block, Coll};

/// Elements rank `rank` sends for `coll` with `nranks` ranks, count `count` (NCCL convention)
/// and root `root`.
pub fn elements_sent(coll: Coll, nranks: usize, rank: usize, count: usize, root: usize) -> usize {
    let n = nranks;
    if n == 1 {
        return 0;
    }
    let blk = |b: usize| {
        let (s, e) = block(count, n, b % n);
        e - s
    };
    match coll {
        // ring: reduce-scatter sends every block but its own, all-gather every block but its
        // successor's: 2S - |B_r| - |B_r+1|  (= 2(n-1)/n S for equal blocks)
        Coll::AllReduce => 2 * count - blk(rank) - blk(rank + 1),
        // (n-1) blocks of `count`
        Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => (n - 1) * count,
        // chain from the root: everyone but the last forwards S
        Coll::Broadcast => {
            if (rank + 1) % n == root {
                0
            } else {
                count
            }
        }
        // chain to the root: everyone but the root sends S
        Coll::Reduce | Coll::Gather => {
            if rank == root {
                0
            } else {
                count
            }
        }
        Coll::Scatter => {
            if rank == root {
                (n - 1) * count
            } else {
                0
            }
        }
        Coll::Send => count,
        Coll::Recv => 0,
    }
}

/// Elements rank `rank` sends in a Rabenseifner all-reduce of `count` elements: with p2 the
/// largest power of two <= n, `B'_r` rank r's block of p2 blocks and `G_d(r)` the d aligned
/// blocks holding r, a rank below p2 sends `S - |B'_r|` in the halving rounds and the sum of
/// `|G_d(r)|` over d = 1, 2, ..., p2/2 in the doubling rounds, plus S if it folds an extra rank
/// in; an extra rank sends S.
pub fn rabenseifner_elements_sent(nranks: usize, rank: usize, count: usize) -> usize {
    if nranks == 1 {
        return 0;
    }
    let p2 = 1usize << (usize::BITS - 1 - nranks.leading_zeros());
    if rank >= p2 {
        return count;
    }
    let blocks = |lo: usize, hi: usize| block(count, p2, hi - 1).1 - block(count, p2, lo).0;
    let halving = count - blocks(rank, rank + 1);
    let doubling: usize =
        (0..p2.trailing_zeros()).map(|i| 1 << i).map(|d| blocks(rank & !(d - 1), (rank & !(d - 1)) + d)).sum();
    halving + doubling + if rank < nranks - p2 { count } else { 0 }
}

/// Elements all ranks together send in a double-binary-tree all-reduce: in each tree every
/// rank but the root sends its half up once and receives it down once, so `2(n-1)·S` in all,
/// the ring's total, but spread unevenly (inner nodes send up to 1.5 S, leaves 0.5 S).
pub fn tree_total_elements_sent(nranks: usize, count: usize) -> usize {
    2 * (nranks - 1) * count
}

/// Elements rank `rank` sends in a star all-reduce of `count` elements: rank 0 sends the
/// result to each of the others, `(n-1)·S`; every other rank sends its input once, `S`.
pub fn star_elements_sent(nranks: usize, rank: usize, count: usize) -> usize {
    match (nranks, rank) {
        (1, _) => 0,
        (n, 0) => (n - 1) * count,
        _ => count,
    }
}

/// Messages (steps that send) per rank for a ring all-reduce: 2(n-1) per chunk round.
pub fn allreduce_sends_per_round(nranks: usize) -> usize {
    2 * (nranks - 1)
}
