//! Verifiable data: inputs whose reduction is exact in any order, so every algorithm must produce
//! bit-identical results (the idea of nccl-tests' `verifiable`).
//!
//! - Integers wrap, so any values are exact.
//! - Sum/avg/pre-multiplied sum on floats use small integers, bounded so that every partial sum
//!   is representable; on fp8, each element gets a non-zero value from one rank only.
//! - Prod uses ±1 everywhere except one rank per element, which contributes ±1 or ±2.
//! - Min/max use any small values.
//!
//! Values depend on (seed, rank, index), so misrouted data is caught.

use crate::reduce;
use crate::types::{DataType, Element, ReduceOp, F8E4M3, F8E5M2};

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn rnd(seed: u64, rank: usize, i: usize) -> u64 {
    mix(seed ^ mix((rank as u64) << 40 ^ i as u64))
}

/// The integer value rank `rank` contributes at index `i`.
pub fn value(dt: DataType, op: ReduceOp, rank: usize, nranks: usize, i: usize, seed: u64) -> i64 {
    let r = rnd(seed, rank, i);
    let owner = (i + (seed as usize % 7)) % nranks.max(1);
    let signed = !matches!(dt, DataType::U8 | DataType::U32 | DataType::U64);
    let narrow = matches!(dt, DataType::F8E4M3 | DataType::F8E5M2);
    match op {
        ReduceOp::Prod => {
            if !dt.is_float() {
                return (r % 7) as i64 - if signed { 3 } else { 0 };
            }
            let mag = if rank == owner { 1 + (r % 2) as i64 } else { 1 };
            if r & 4 != 0 {
                -mag
            } else {
                mag
            }
        }
        ReduceOp::Min | ReduceOp::Max => {
            let v = (r % 17) as i64;
            if signed {
                v - 8
            } else {
                v
            }
        }
        _ if !dt.is_float() => (r % 256) as i64 - if signed { 128 } else { 0 },
        _ if narrow => {
            if rank == owner {
                1 + (r % 4) as i64
            } else {
                0
            }
        }
        _ => (r % 9) as i64 - 4,
    }
}

fn gen<T: Element>(
    dt: DataType,
    op: ReduceOp,
    rank: usize,
    nranks: usize,
    count: usize,
    seed: u64,
    first: usize,
) -> Vec<u8> {
    let v: Vec<T> = (first..first + count).map(|i| T::from_i64(value(dt, op, rank, nranks, i, seed))).collect();
    bytemuck::cast_slice(&v).to_vec()
}

/// One element with integer value `v`, as bytes.
pub fn value_bytes(dt: DataType, v: i64) -> Vec<u8> {
    fn one<T: Element>(v: i64) -> Vec<u8> {
        bytemuck::bytes_of(&T::from_i64(v)).to_vec()
    }
    match dt {
        DataType::I8 => one::<i8>(v),
        DataType::U8 => one::<u8>(v),
        DataType::I32 => one::<i32>(v),
        DataType::U32 => one::<u32>(v),
        DataType::I64 => one::<i64>(v),
        DataType::U64 => one::<u64>(v),
        DataType::F16 => one::<half::f16>(v),
        DataType::F32 => one::<f32>(v),
        DataType::F64 => one::<f64>(v),
        DataType::BF16 => one::<half::bf16>(v),
        DataType::F8E4M3 => one::<F8E4M3>(v),
        DataType::F8E5M2 => one::<F8E5M2>(v),
    }
}

/// The pre-multiplied-sum op used by checks: scalar 2 (exact in every type).
pub fn premul_two(dt: DataType) -> ReduceOp {
    let mut b = [0u8; 8];
    let v = value_bytes(dt, 2);
    b[..v.len()].copy_from_slice(&v);
    ReduceOp::PreMulSum(b)
}

/// Every reduce op, with the pre-multiplied sum of [`premul_two`]: the ops a check covers.
pub fn all_ops(dt: DataType) -> Vec<ReduceOp> {
    ReduceOp::BASIC.into_iter().chain([premul_two(dt)]).collect()
}

/// The ops worth checking for `coll`: all of them if it reduces, otherwise just one.
pub fn ops_for(coll: crate::schedule::Coll, dt: DataType) -> Vec<ReduceOp> {
    if coll.reduces() {
        all_ops(dt)
    } else {
        vec![ReduceOp::Sum]
    }
}

/// Rank `rank`'s input of `count` elements starting at element `first`.
pub fn input_from(
    dt: DataType,
    op: ReduceOp,
    rank: usize,
    nranks: usize,
    count: usize,
    seed: u64,
    first: usize,
) -> Vec<u8> {
    match dt {
        DataType::I8 => gen::<i8>(dt, op, rank, nranks, count, seed, first),
        DataType::U8 => gen::<u8>(dt, op, rank, nranks, count, seed, first),
        DataType::I32 => gen::<i32>(dt, op, rank, nranks, count, seed, first),
        DataType::U32 => gen::<u32>(dt, op, rank, nranks, count, seed, first),
        DataType::I64 => gen::<i64>(dt, op, rank, nranks, count, seed, first),
        DataType::U64 => gen::<u64>(dt, op, rank, nranks, count, seed, first),
        DataType::F16 => gen::<half::f16>(dt, op, rank, nranks, count, seed, first),
        DataType::F32 => gen::<f32>(dt, op, rank, nranks, count, seed, first),
        DataType::F64 => gen::<f64>(dt, op, rank, nranks, count, seed, first),
        DataType::BF16 => gen::<half::bf16>(dt, op, rank, nranks, count, seed, first),
        DataType::F8E4M3 => gen::<F8E4M3>(dt, op, rank, nranks, count, seed, first),
        DataType::F8E5M2 => gen::<F8E5M2>(dt, op, rank, nranks, count, seed, first),
    }
}

/// Rank `rank`'s input of `count` elements.
pub fn input(dt: DataType, op: ReduceOp, rank: usize, nranks: usize, count: usize, seed: u64) -> Vec<u8> {
    input_from(dt, op, rank, nranks, count, seed, 0)
}

/// The reduction over all ranks of elements `[first, first+count)`, computed block by block so
/// memory stays O(count).
pub fn reduced_from(dt: DataType, op: ReduceOp, nranks: usize, count: usize, seed: u64, first: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dt.size());
    let block = 1 << 16;
    let mut done = 0;
    while done < count {
        let n = block.min(count - done);
        let ins: Vec<Vec<u8>> = (0..nranks).map(|r| input_from(dt, op, r, nranks, n, seed, first + done)).collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
        out.extend_from_slice(&reduce::reference(dt, op, &refs));
        done += n;
    }
    out
}

/// The reduction over all ranks of `count` elements.
pub fn reduced(dt: DataType, op: ReduceOp, nranks: usize, count: usize, seed: u64) -> Vec<u8> {
    reduced_from(dt, op, nranks, count, seed, 0)
}

/// Count of elements that differ between `got` and `want` (bitwise).
pub fn count_wrong(dt: DataType, got: &[u8], want: &[u8]) -> usize {
    let s = dt.size();
    if got.len() != want.len() {
        return got.len().max(want.len()) / s;
    }
    got.chunks(s).zip(want.chunks(s)).filter(|(a, b)| a != b).count()
}

/// Rank `rank`'s input buffer for `coll` (sized by NCCL's count convention; rank `r`'s data
/// for all-to-all and scatter is the concatenation of its per-peer blocks).
#[allow(clippy::too_many_arguments)]
pub fn coll_input(
    coll: crate::schedule::Coll,
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    rank: usize,
    count: usize,
    root: usize,
    seed: u64,
) -> Vec<u8> {
    let (ni, _) = coll.buffer_counts(nranks, rank, count, root);
    let op = if coll.reduces() { op } else { ReduceOp::Sum };
    input(dt, op, rank, nranks, ni, seed)
}

/// What rank `rank`'s output buffer must hold after `coll` over [`coll_input`] data.
#[allow(clippy::too_many_arguments)]
pub fn expected_output(
    coll: crate::schedule::Coll,
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    rank: usize,
    count: usize,
    root: usize,
    seed: u64,
) -> Vec<u8> {
    use crate::schedule::Coll;
    let (n, c) = (nranks, count);
    let (_, no) = coll.buffer_counts(n, rank, c, root);
    let data = |r: usize, len: usize, first: usize| input_from(dt, ReduceOp::Sum, r, n, len, seed, first);
    match coll {
        Coll::AllReduce => reduced(dt, op, n, c, seed),
        Coll::Reduce => {
            if rank == root {
                reduced(dt, op, n, c, seed)
            } else {
                vec![]
            }
        }
        Coll::ReduceScatter => reduced_from(dt, op, n, c, seed, rank * c),
        Coll::AllGather => (0..n).flat_map(|b| data(b, c, 0)).collect(),
        Coll::Gather => (0..n).flat_map(|b| data(b, c, 0)).take(no * dt.size()).collect(),
        Coll::Broadcast => data(root, c, 0),
        Coll::AllToAll => (0..n).flat_map(|p| data(p, c, rank * c)).collect(),
        Coll::Scatter => data(root, c, rank * c),
        Coll::Send | Coll::Recv => data(root, c, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reductions in two different orders give identical bits.
    #[test]
    fn order_independent() {
        for dt in DataType::ALL {
            for op in all_ops(dt) {
                for n in [1usize, 2, 3, 7, 16] {
                    let ins: Vec<Vec<u8>> = (0..n).map(|r| input(dt, op, r, n, 200, 5)).collect();
                    let fwd: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                    let mut rev = fwd.clone();
                    rev.reverse();
                    let a = reduce::reference(dt, op, &fwd);
                    let b = reduce::reference(dt, op, &rev);
                    // tree order: pairs first
                    let mut lvl: Vec<Vec<u8>> = ins
                        .iter()
                        .map(|x| {
                            let mut o = vec![0u8; x.len()];
                            reduce::combine(dt, op, &mut o, None, Some(x), None);
                            o
                        })
                        .collect();
                    let sum_op = if matches!(op, ReduceOp::PreMulSum(_) | ReduceOp::Avg) { ReduceOp::Sum } else { op };
                    while lvl.len() > 1 {
                        let mut next = vec![];
                        for p in lvl.chunks(2) {
                            if p.len() == 2 {
                                let mut o = vec![0u8; p[0].len()];
                                reduce::combine(dt, sum_op, &mut o, Some(&p[0]), Some(&p[1]), None);
                                next.push(o);
                            } else {
                                next.push(p[0].clone());
                            }
                        }
                        lvl = next;
                    }
                    let mut c = lvl.pop().unwrap();
                    if op == ReduceOp::Avg {
                        reduce::combine_inplace(dt, op, &mut c, None, Some(n));
                    }
                    assert_eq!(a, b, "{dt:?} {op:?} n={n}");
                    assert_eq!(a, c, "{dt:?} {op:?} n={n} tree order");
                    assert_eq!(reduced(dt, op, n, 200, 5), a);
                }
            }
        }
    }
}
