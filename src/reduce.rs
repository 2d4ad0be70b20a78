//! Host reductions: the fused copy/reduce kernel every schedule step runs.
//!
//! A step's value is `recv ⊕ pre(src)`, where either side may be absent, `pre` multiplies by the
//! pre-multiplied-sum scalar, and `⊕` is the reduction op; with `post` the value is then divided by
//! the rank count (avg). The value is written in one pass into the output. Loops are written so
//! the compiler vectorises the common types; SIMD-specific kernels come with the performance work.

use crate::types::{DataType, Element, ReduceOp, F8E4M3, F8E5M2};
use std::borrow::Cow;

fn typed<T: Element>(b: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice::<u8, T>(b) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(b.chunks_exact(std::mem::size_of::<T>()).map(bytemuck::pod_read_unaligned).collect()),
    }
}

fn with_typed_mut<T: Element>(b: &mut [u8], f: impl FnOnce(&mut [T])) {
    match bytemuck::try_cast_slice_mut::<u8, T>(b) {
        Ok(s) => f(s),
        Err(_) => {
            let mut tmp: Vec<T> = typed::<T>(b).into_owned();
            f(&mut tmp);
            b.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
}

fn scalar<T: Element>(op: ReduceOp) -> Option<T> {
    match op {
        ReduceOp::PreMulSum(b) => Some(bytemuck::pod_read_unaligned(&b[..std::mem::size_of::<T>()])),
        _ => None,
    }
}

#[inline(always)]
fn zip2<T: Copy, F: Fn(T, T) -> T>(out: &mut [T], a: &[T], b: &[T], f: F) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

#[inline(always)]
fn zip1<T: Copy, F: Fn(T, T) -> T>(out: &mut [T], a: &[T], f: F) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x, *o);
    }
}

/// Apply `$body` with `$f` bound to the op's function as a concrete closure, so each loop is
/// monomorphised per op and can be inlined and vectorised.
macro_rules! with_op {
    ($op:expr, $s:expr, $f:ident => $body:expr) => {
        match ($op, $s) {
            (_, Some(s)) => {
                let $f = |x: T, y: T| T::add(x, T::mul(s, y));
                $body
            }
            (ReduceOp::Prod, None) => {
                let $f = T::mul;
                $body
            }
            (ReduceOp::Min, None) => {
                let $f = T::min;
                $body
            }
            (ReduceOp::Max, None) => {
                let $f = T::max;
                $body
            }
            _ => {
                let $f = T::add;
                $body
            }
        }
    };
}

/// The kernel, compiled for several instruction sets and dispatched at run time.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma+f16c",
    "x86_64+avx2+fma+f16c",
    "aarch64+neon"
))]
fn kernel<T: Element>(
    op: ReduceOp,
    out: &mut [T],
    recv: Option<&[T]>,
    src: Option<&[T]>,
    src_is_out: bool,
    post: Option<usize>,
) {
    let s = scalar::<T>(op);
    let n = out.len();
    match (recv, src_is_out, src) {
        // out = recv op pre(src)   (pre(src) = s * src for a pre-multiplied sum)
        (Some(r), false, Some(x)) => with_op!(op, s, f => zip2(out, &r[..n], &x[..n], f)),
        // out = recv op pre(out)
        (Some(r), true, _) => with_op!(op, s, f => zip1(out, &r[..n], f)),
        // out = recv
        (Some(r), false, None) => out.copy_from_slice(&r[..n]),
        // out = pre(src)
        (None, false, Some(x)) => match s {
            Some(s) => {
                for (o, &v) in out.iter_mut().zip(&x[..n]) {
                    *o = T::mul(s, v);
                }
            }
            None => out.copy_from_slice(&x[..n]),
        },
        (None, true, _) => {
            if let Some(s) = s {
                for v in out.iter_mut() {
                    *v = T::mul(s, *v);
                }
            }
        }
        (None, false, None) => {}
    }
    if let Some(count) = post {
        for v in out.iter_mut() {
            *v = T::div_count(*v, count);
        }
    }
}

fn combine_t<T: Element>(op: ReduceOp, out: &mut [u8], recv: Option<&[u8]>, src: Option<&[u8]>, post: Option<usize>) {
    let recv = recv.map(typed::<T>);
    let src = src.map(typed::<T>);
    with_typed_mut::<T>(out, |o| kernel::<T>(op, o, recv.as_deref(), src.as_deref(), false, post));
}

fn combine_inplace_t<T: Element>(op: ReduceOp, inout: &mut [u8], recv: Option<&[u8]>, post: Option<usize>) {
    let recv = recv.map(typed::<T>);
    with_typed_mut::<T>(inout, |o| kernel::<T>(op, o, recv.as_deref(), None, true, post));
}

macro_rules! dispatch {
    ($dt:expr, $f:ident, $($args:expr),*) => {
        match $dt {
            DataType::I8 => $f::<i8>($($args),*),
            DataType::U8 => $f::<u8>($($args),*),
            DataType::I32 => $f::<i32>($($args),*),
            DataType::U32 => $f::<u32>($($args),*),
            DataType::I64 => $f::<i64>($($args),*),
            DataType::U64 => $f::<u64>($($args),*),
            DataType::F16 => $f::<half::f16>($($args),*),
            DataType::F32 => $f::<f32>($($args),*),
            DataType::F64 => $f::<f64>($($args),*),
            DataType::BF16 => $f::<half::bf16>($($args),*),
            DataType::F8E4M3 => $f::<F8E4M3>($($args),*),
            DataType::F8E5M2 => $f::<F8E5M2>($($args),*),
        }
    };
}

/// f16 sum/prod/min/max without pre-multiplier: convert tiles to f32 with the `half` crate's slice
/// conversions (F16C when the CPU has it), compute in f32, round back once. Bitwise identical to
/// the per-element path (`f16::from_f32(a.to_f32() ⊕ b.to_f32())`). Returns false if it does not
/// apply (misaligned buffers, pre-multiplied sum).
fn f16_tiles(op: ReduceOp, out: &mut [u8], a: &[u8], b: Option<&[u8]>) -> bool {
    use half::slice::HalfFloatSliceExt;
    if matches!(op, ReduceOp::PreMulSum(_)) {
        return false;
    }
    let (Ok(a), Ok(n)) =
        (bytemuck::try_cast_slice::<u8, half::f16>(a), bytemuck::try_cast_slice::<u8, half::f16>(out).map(|o| o.len()))
    else {
        return false;
    };
    let b = match b.map(bytemuck::try_cast_slice::<u8, half::f16>) {
        Some(Ok(b)) => Some(b),
        Some(Err(_)) => return false,
        None => None,
    };
    const T: usize = 1024;
    let (mut fa, mut fb) = ([0f32; T], [0f32; T]);
    let mut start = 0;
    let mut tile_out = [half::f16::ZERO; T];
    while start < n {
        let m = T.min(n - start);
        a[start..start + m].convert_to_f32_slice(&mut fa[..m]);
        match b {
            Some(b) => b[start..start + m].convert_to_f32_slice(&mut fb[..m]),
            None => bytemuck::cast_slice::<u8, half::f16>(&out[start * 2..(start + m) * 2])
                .convert_to_f32_slice(&mut fb[..m]),
        }
        let (x, y) = (&mut fa[..m], &fb[..m]);
        match op {
            ReduceOp::Prod => x.iter_mut().zip(y).for_each(|(x, y)| *x *= y),
            // min and max pick one input's bits unchanged (a round trip through f32 would quiet
            // a signalling NaN), as the per-element path does
            ReduceOp::Min | ReduceOp::Max => {
                let ybits: &[half::f16] = match b {
                    Some(b) => &b[start..start + m],
                    None => bytemuck::cast_slice(&out[start * 2..(start + m) * 2]),
                };
                let pick_y = |x: f32, y: f32| if op == ReduceOp::Min { y < x } else { y > x };
                for i in 0..m {
                    tile_out[i] = if pick_y(x[i], y[i]) { ybits[i] } else { a[start + i] };
                }
            }
            _ => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
        }
        if !matches!(op, ReduceOp::Min | ReduceOp::Max) {
            tile_out[..m].convert_from_f32_slice(x);
        }
        let ob: &mut [half::f16] = bytemuck::cast_slice_mut(&mut out[start * 2..(start + m) * 2]);
        ob.copy_from_slice(&tile_out[..m]);
        start += m;
    }
    true
}

/// bf16 → f32 exactly as `half::bf16::to_f32` (a NaN gets its quiet bit), branch-free.
#[inline(always)]
fn bf16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let quiet = if h & 0x7FFF > 0x7F80 { 0x40 } else { 0 };
    f32::from_bits((h | quiet) << 16)
}

/// f32 → bf16 exactly as `half::bf16::from_f32` (round to nearest even; a NaN keeps its high
/// mantissa bits and gets its quiet bit), branch-free.
#[inline(always)]
fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let nan = x & 0x7FFF_FFFF > 0x7F80_0000;
    // round up when the dropped half is above one half, or exactly one half and the kept part odd
    let up = ((x >> 15) & 1) & (((x & 0x7FFF) != 0) as u32 | ((x >> 16) & 1));
    let rounded = (x >> 16).wrapping_add(up);
    (if nan { (x >> 16) | 0x40 } else { rounded }) as u16
}

/// The bf16 kernel: `out = a ⊕ b` element-wise on raw bf16 bits, written so that the compiler
/// vectorises it (integer shifts and selects around f32 arithmetic) and compiled per instruction
/// set. Bit for bit the per-element path (`bf16::from_f32(a.to_f32() ⊕ b.to_f32())`; min and max
/// pick one of the inputs unchanged). AVX512-BF16's `vcvtne2ps2bf16` is not used: it treats
/// subnormal inputs as zero, which would break that equality.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn bf16_kernel(op: ReduceOp, out: &mut [u16], a: &[u16], b: &[u16]) {
    let it = out.iter_mut().zip(a).zip(b);
    match op {
        ReduceOp::Prod => it.for_each(|((o, &x), &y)| *o = f32_to_bf16_bits(bf16_bits_to_f32(x) * bf16_bits_to_f32(y))),
        ReduceOp::Min => {
            it.for_each(|((o, &x), &y)| *o = if bf16_bits_to_f32(y) < bf16_bits_to_f32(x) { y } else { x })
        }
        ReduceOp::Max => {
            it.for_each(|((o, &x), &y)| *o = if bf16_bits_to_f32(y) > bf16_bits_to_f32(x) { y } else { x })
        }
        _ => it.for_each(|((o, &x), &y)| *o = f32_to_bf16_bits(bf16_bits_to_f32(x) + bf16_bits_to_f32(y))),
    }
}

/// The bf16 fast path of [`combine`]/[`combine_inplace`] (`b = None`: in place, `out` is the
/// second operand). Returns false if it does not apply (misaligned buffers, pre-multiplied sum,
/// avg's division).
fn bf16_fast(op: ReduceOp, out: &mut [u8], a: &[u8], b: Option<&[u8]>) -> bool {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max | ReduceOp::Avg) {
        return false;
    }
    let Ok(a) = bytemuck::try_cast_slice::<u8, u16>(a) else { return false };
    match b {
        Some(b) => {
            let (Ok(b), Ok(o)) = (bytemuck::try_cast_slice::<u8, u16>(b), bytemuck::try_cast_slice_mut::<u8, u16>(out))
            else {
                return false;
            };
            bf16_kernel(op, o, a, b);
        }
        None => {
            let Ok(o) = bytemuck::try_cast_slice_mut::<u8, u16>(out) else { return false };
            // in place: out = a ⊕ out, a tile at a time (the kernel needs distinct slices)
            let mut tile = [0u16; 1024];
            for (oc, ac) in o.chunks_mut(1024).zip(a.chunks(1024)) {
                let t = &mut tile[..oc.len()];
                t.copy_from_slice(oc);
                bf16_kernel(op, oc, ac, t);
            }
        }
    }
    true
}

/// `out = recv ⊕ pre(src)`, then `/ post` if given. `out` must not overlap the inputs; input
/// lengths must equal `out.len()` (a multiple of the element size).
pub fn combine(
    dt: DataType,
    op: ReduceOp,
    out: &mut [u8],
    recv: Option<&[u8]>,
    src: Option<&[u8]>,
    post: Option<usize>,
) {
    debug_assert!(recv.is_none_or(|r| r.len() == out.len()));
    debug_assert!(src.is_none_or(|s| s.len() == out.len()));
    if recv.is_some() != src.is_some() && post.is_none() && !matches!(op, ReduceOp::PreMulSum(_)) {
        // plain copy: no element arithmetic
        oxccl_simd::copy(out, recv.or(src).unwrap());
        return;
    }
    if dt == DataType::F16 && post.is_none() {
        if let (Some(r), Some(x)) = (recv, src) {
            if f16_tiles(op, out, r, Some(x)) {
                return;
            }
        }
    }
    if dt == DataType::BF16 && post.is_none() {
        if let (Some(r), Some(x)) = (recv, src) {
            if bf16_fast(op, out, r, Some(x)) {
                return;
            }
        }
    }
    dispatch!(dt, combine_t, op, out, recv, src, post)
}

/// `inout = recv ⊕ pre(inout)`, then `/ post` if given (the in-place form of [`combine`]).
pub fn combine_inplace(dt: DataType, op: ReduceOp, inout: &mut [u8], recv: Option<&[u8]>, post: Option<usize>) {
    if recv.is_none() && post.is_none() && !matches!(op, ReduceOp::PreMulSum(_)) {
        return;
    }
    if dt == DataType::F16 && post.is_none() {
        if let Some(r) = recv {
            if f16_tiles(op, inout, r, None) {
                return;
            }
        }
    }
    if dt == DataType::BF16 && post.is_none() {
        if let Some(r) = recv {
            if bf16_fast(op, inout, r, None) {
                return;
            }
        }
    }
    dispatch!(dt, combine_inplace_t, op, inout, recv, post)
}

/// Reference reduction of `inputs` (one per rank) in rank order, for tests and checks:
/// `pre(x0) ⊕ pre(x1) ⊕ ...`, then `/ n` for avg.
pub fn reference(dt: DataType, op: ReduceOp, inputs: &[&[u8]]) -> Vec<u8> {
    let mut acc = vec![0u8; inputs[0].len()];
    combine(dt, op, &mut acc, None, Some(inputs[0]), None);
    for x in &inputs[1..] {
        let prev = acc.clone();
        combine(dt, op, &mut acc, Some(&prev), Some(x), None);
    }
    if op == ReduceOp::Avg {
        combine_inplace(dt, op, &mut acc, None, Some(inputs.len()));
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_ops() {
        let a: [f32; 4] = [1.0, -2.0, 3.0, 8.0];
        let b: [f32; 4] = [4.0, 5.0, -6.0, 8.0];
        let ab = |op| {
            let mut o = vec![0u8; 16];
            combine(DataType::F32, op, &mut o, Some(bytemuck::cast_slice(&a)), Some(bytemuck::cast_slice(&b)), None);
            bytemuck::cast_slice::<u8, f32>(&o).to_vec()
        };
        assert_eq!(ab(ReduceOp::Sum), vec![5.0, 3.0, -3.0, 16.0]);
        assert_eq!(ab(ReduceOp::Prod), vec![4.0, -10.0, -18.0, 64.0]);
        assert_eq!(ab(ReduceOp::Min), vec![1.0, -2.0, -6.0, 8.0]);
        assert_eq!(ab(ReduceOp::Max), vec![4.0, 5.0, 3.0, 8.0]);
        assert_eq!(ab(ReduceOp::pre_mul_sum(2.0f32)), vec![9.0, 8.0, -9.0, 24.0]);
        let r = reference(DataType::F32, ReduceOp::Avg, &[bytemuck::cast_slice(&a), bytemuck::cast_slice(&b)]);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&r), &[2.5, 1.5, -1.5, 8.0]);
    }

    #[test]
    fn ints_wrap_and_avg_truncates() {
        let a = [250u8, 7];
        let b = [10u8, 8];
        let r = reference(DataType::U8, ReduceOp::Sum, &[&a, &b]);
        assert_eq!(r, vec![4, 15]);
        let r = reference(DataType::U8, ReduceOp::Avg, &[&a, &b]);
        assert_eq!(r, vec![2, 7]);
        let r = reference(DataType::I8, ReduceOp::Min, &[&[0xFF, 1], &[1, 2]]);
        assert_eq!(r, vec![0xFF, 1], "-1 < 1 for int8");
    }

    #[test]
    fn unaligned_buffers_work() {
        let a: Vec<u8> = bytemuck::cast_slice(&[1.0f64, 2.0]).to_vec();
        let mut buf = [0u8; 17];
        buf[1..].copy_from_slice(&a);
        let mut out = [0u8; 17];
        combine(DataType::F64, ReduceOp::Sum, &mut out[1..], Some(&buf[1..]), Some(&a), None);
        let v: Vec<f64> = out[1..].chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v, vec![2.0, 4.0]);
    }

    #[test]
    fn inplace_matches_out_of_place() {
        for dt in DataType::ALL {
            for op in ReduceOp::BASIC.into_iter().chain([ReduceOp::PreMulSum({
                let mut b = [0u8; 8];
                let one = crate::exact::value_bytes(dt, 2);
                b[..one.len()].copy_from_slice(&one);
                b
            })]) {
                let n = 37;
                let a = crate::exact::input(dt, op, 0, 3, n, 0);
                let b = crate::exact::input(dt, op, 1, 3, n, 0);
                let mut o = vec![0u8; a.len()];
                combine(dt, op, &mut o, Some(&a), Some(&b), Some(3));
                let mut io = b.clone();
                combine_inplace(dt, op, &mut io, Some(&a), Some(3));
                assert_eq!(o, io, "{dt:?} {op:?}");
            }
        }
    }
}

#[cfg(test)]
mod f16_tests {
    use super::*;

    /// The tiled f16 path equals the per-element path bit for bit, on values that round.
    #[test]
    fn f16_tiles_match_elementwise() {
        let n = 3000;
        let mk = |k: u32| -> Vec<u8> {
            let v: Vec<half::f16> = (0..n)
                .map(|i| {
                    half::f16::from_f32(
                        ((i as u32).wrapping_mul(2654435761u32).rotate_left(k) % 20011) as f32 / 97.0 - 100.0,
                    )
                })
                .collect();
            bytemuck::cast_slice(&v).to_vec()
        };
        let (a, b) = (mk(3), mk(11));
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let mut fast = vec![0u8; a.len()];
            combine(DataType::F16, op, &mut fast, Some(&a), Some(&b), None);
            let mut slow = vec![0u8; a.len()];
            combine_t::<half::f16>(op, &mut slow, Some(&a), Some(&b), None);
            assert_eq!(fast, slow, "{op:?}");
            let mut io = b.clone();
            combine_inplace(DataType::F16, op, &mut io, Some(&a), None);
            assert_eq!(io, slow, "{op:?} in place");
        }
    }

    /// The bf16 kernel equals the per-element path bit for bit on every bf16 value against a
    /// spread of others: rounding ties, subnormals, infinities, signalling and quiet NaNs.
    #[test]
    fn bf16_kernel_matches_elementwise_on_every_value() {
        let a: Vec<u16> = (0..=u16::MAX).collect();
        let b: Vec<u16> =
            (0..=u16::MAX as u32).map(|i| (i.wrapping_mul(40503).rotate_left(7) ^ 0x3F80) as u16).collect();
        let (a, b): (&[u8], &[u8]) = (bytemuck::cast_slice(&a), bytemuck::cast_slice(&b));
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg] {
            let mut fast = vec![0u8; a.len()];
            combine(DataType::BF16, op, &mut fast, Some(a), Some(b), None);
            let mut slow = vec![0u8; a.len()];
            combine_t::<half::bf16>(op, &mut slow, Some(a), Some(b), None);
            assert!(
                fast == slow,
                "{op:?}: {} elements differ",
                fast.chunks(2).zip(slow.chunks(2)).filter(|(x, y)| x != y).count()
            );
            let mut io = b.to_vec();
            combine_inplace(DataType::BF16, op, &mut io, Some(a), None);
            let mut slow_io = b.to_vec();
            combine_inplace_t::<half::bf16>(op, &mut slow_io, Some(a), None);
            assert!(io == slow_io, "{op:?} in place");
        }
    }
}
