//! Data types, reduction operations and the element trait.

use crate::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Element types, numbered as `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    /// `ncclInt8`
    I8 = 0,
    /// `ncclUint8`
    U8 = 1,
    /// `ncclInt32`
    I32 = 2,
    /// `ncclUint32`
    U32 = 3,
    /// `ncclInt64`
    I64 = 4,
    /// `ncclUint64`
    U64 = 5,
    /// `ncclFloat16`
    F16 = 6,
    /// `ncclFloat32`
    F32 = 7,
    /// `ncclFloat64`
    F64 = 8,
    /// `ncclBfloat16`
    BF16 = 9,
    /// `ncclFloat8e4m3`
    F8E4M3 = 10,
    /// `ncclFloat8e5m2`
    F8E5M2 = 11,
}

impl DataType {
    /// Every type, in NCCL order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::BF16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// From the `ncclDataType_t` value.
    pub fn from_raw(v: i32) -> Result<DataType> {
        DataType::ALL.get(usize::try_from(v).map_err(|_| bad_dtype(v))?).copied().ok_or_else(|| bad_dtype(v))
    }

    /// Whether it is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::F32 | DataType::F64 | DataType::BF16 | DataType::F8E4M3 | DataType::F8E5M2
        )
    }

    /// nccl-tests' short name (`float`, `half`, `bfloat16`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::BF16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// Parse nccl-tests' names (and a few aliases).
    pub fn parse(s: &str) -> Option<DataType> {
        Some(match s {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" => DataType::F16,
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::BF16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" => DataType::F8E4M3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" => DataType::F8E5M2,
            _ => return None,
        })
    }
}

fn bad_dtype(v: i32) -> Error {
    Error::invalid_argument(format!("data type {v} is out of range (0..=11)"))
}

/// Reduction operations, numbered as `ncclRedOp_t` (pre-multiplied sum carries its scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`
    Sum,
    /// `ncclProd`
    Prod,
    /// `ncclMax`
    Max,
    /// `ncclMin`
    Min,
    /// `ncclAvg`: sum, then divided by the number of ranks once, at the end.
    Avg,
    /// `ncclRedOpCreatePreMulSum`: each rank's input is multiplied by the scalar, then summed.
    /// The scalar is stored as the little-endian bytes of the data type's value.
    PreMulSum([u8; 8]),
}

impl ReduceOp {
    /// The four plain ops and avg, in NCCL order (pre-multiplied sum needs a scalar).
    pub const BASIC: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    /// A pre-multiplied sum with a scalar of element type `T`.
    pub fn pre_mul_sum<T: Element>(scalar: T) -> ReduceOp {
        let mut b = [0u8; 8];
        b[..T::DTYPE.size()].copy_from_slice(bytemuck::bytes_of(&scalar));
        ReduceOp::PreMulSum(b)
    }

    /// From the `ncclRedOp_t` value of a built-in op.
    pub fn from_raw(v: i32) -> Result<ReduceOp> {
        ReduceOp::BASIC.get(usize::try_from(v).unwrap_or(usize::MAX)).copied().ok_or_else(|| {
            Error::invalid_argument(format!(
                "reduction op {v} is out of range (0..=4, or a handle from ncclRedOpCreatePreMulSum)"
            ))
        })
    }

    /// Index used in fingerprints and tables (0..=5).
    pub fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
        }
    }

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}

/// An 8-bit float, E4M3 (OCP "FN": no infinities, one NaN pattern per sign, max 448).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// An 8-bit float, E5M2 (IEEE-like: infinities and NaNs, max 57344).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

fn fp8_decode(b: u8, exp_bits: u32, man_bits: u32, bias: i32, ieee_special: bool) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b as u32 >> man_bits) & ((1 << exp_bits) - 1)) as i32;
    let m = (b as u32 & ((1 << man_bits) - 1)) as f32;
    let mscale = (1u32 << man_bits) as f32;
    let emax = (1 << exp_bits) - 1;
    if ieee_special && e == emax {
        return if m == 0.0 { sign * f32::INFINITY } else { f32::NAN };
    }
    if !ieee_special && e == emax && m as u32 == (1 << man_bits) - 1 {
        return f32::NAN;
    }
    if e == 0 {
        sign * (m / mscale) * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + m / mscale) * 2f32.powi(e - bias)
    }
}

/// Fast f32 -> fp8: round to nearest even on the bit pattern, saturating to the largest finite
/// value (CUDA's `__NV_SATFINITE`); NaN maps to `nan`.
#[inline]
fn fp8_encode_bits(x: f32, man_bits: u32, bias: i32, max_code: u8, nan: u8) -> u8 {
    if x.is_nan() {
        return nan;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    let bits = a.to_bits();
    let exp32 = (bits >> 23) as i32 - 127;
    let code: u32 = if exp32 < 1 - bias {
        // subnormal in the target (or zero): an integer multiple of the smallest subnormal
        (a * 2f32.powi(bias - 1 + man_bits as i32)).round_ties_even() as u32
    } else {
        let shift = 23 - man_bits;
        let rounded = (bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1)) >> shift;
        let e = (rounded >> man_bits) as i32 - 127 + bias;
        if e > 15 + (man_bits == 2) as i32 * 16 {
            u32::MAX
        } else {
            ((e as u32) << man_bits) | (rounded & ((1 << man_bits) - 1))
        }
    };
    sign | code.min(max_code as u32) as u8
}

/// Round to nearest even, saturating (the slow, obviously correct reference of
/// [`fp8_encode_bits`]; used by tests).
#[cfg_attr(not(test), allow(dead_code))]
fn fp8_encode(x: f32, decode: fn(u8) -> f32, max_code: u8, nan: u8) -> u8 {
    if x.is_nan() {
        return nan;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= decode(max_code) {
        return sign | max_code;
    }
    // positive codes 0..=max_code are monotonic in value: binary search the last one <= a
    let (mut lo, mut hi) = (0u8, max_code);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if decode(mid) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = decode(lo);
    let above = decode(lo + 1);
    let code = if a - below < above - a || (a - below == above - a && lo & 1 == 0) { lo } else { lo + 1 };
    sign | code
}

static E4M3_TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
static E5M2_TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();

impl F8E4M3 {
    /// To f32 (exact).
    #[inline]
    pub fn to_f32(self) -> f32 {
        E4M3_TABLE.get_or_init(|| std::array::from_fn(|c| fp8_decode(c as u8, 4, 3, 7, false)))[self.0 as usize]
    }
    /// From f32, rounding to nearest even and saturating.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F8E4M3(fp8_encode_bits(x, 3, 7, 0x7E, 0x7F))
    }
}

impl F8E5M2 {
    /// To f32 (exact).
    #[inline]
    pub fn to_f32(self) -> f32 {
        E5M2_TABLE.get_or_init(|| std::array::from_fn(|c| fp8_decode(c as u8, 5, 2, 15, true)))[self.0 as usize]
    }
    /// From f32, rounding to nearest even and saturating.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F8E5M2(fp8_encode_bits(x, 2, 15, 0x7B, 0x7F))
    }
}

/// An element type oxccl can move and reduce.
///
/// Implemented for the primitive integers and floats, `half::f16`, `half::bf16`, [`F8E4M3`] and
/// [`F8E5M2`]. The methods define the reduction arithmetic: integers wrap, half and fp8 types
/// compute in `f32` and round once per operation (as NCCL's kernels do).
pub trait Element: Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
    /// `a + b`
    fn add(a: Self, b: Self) -> Self;
    /// `a * b`
    fn mul(a: Self, b: Self) -> Self;
    /// The smaller.
    fn min(a: Self, b: Self) -> Self;
    /// The larger.
    fn max(a: Self, b: Self) -> Self;
    /// `a / n` (integer types truncate).
    fn div_count(a: Self, n: usize) -> Self;
    /// Convert a small integer (for generating test data).
    fn from_i64(v: i64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                a / (n as $t)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
int_element!(i8, I8);
int_element!(u8, U8);
int_element!(i32, I32);
int_element!(u32, U32);
int_element!(i64, I64);
int_element!(u64, U64);

macro_rules! float_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b < a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b > a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                a / (n as $t)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
float_element!(f32, F32);
float_element!(f64, F64);

macro_rules! narrow_float_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() * b.to_f32())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b.to_f32() < a.to_f32() {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b.to_f32() > a.to_f32() {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                <$t>::from_f32(a.to_f32() / n as f32)
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
        }
    };
}
narrow_float_element!(half::f16, F16);
narrow_float_element!(half::bf16, BF16);
narrow_float_element!(F8E4M3, F8E4M3);
narrow_float_element!(F8E5M2, F8E5M2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_match_nccl() {
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_raw(i as i32).unwrap(), *d);
            assert_eq!(DataType::parse(d.name()), Some(*d));
        }
        assert!(DataType::from_raw(12).is_err());
        assert!(DataType::from_raw(-1).is_err());
        assert_eq!(ReduceOp::from_raw(4).unwrap(), ReduceOp::Avg);
        assert!(ReduceOp::from_raw(5).is_err());
        assert!(ReduceOp::from_raw(-3).is_err());
    }

    #[test]
    fn fp8_roundtrips_every_code() {
        for c in 0..=255u8 {
            let a = F8E4M3(c);
            if !a.to_f32().is_nan() {
                assert_eq!(F8E4M3::from_f32(a.to_f32()).0 & 0x7f, c & 0x7f, "e4m3 {c:#x}");
            }
            let b = F8E5M2(c);
            if b.to_f32().is_finite() {
                assert_eq!(F8E5M2::from_f32(b.to_f32()).0 & 0x7f, c & 0x7f, "e5m2 {c:#x}");
            }
        }
        assert_eq!(F8E4M3(0x7E).to_f32(), 448.0);
        assert_eq!(F8E5M2(0x7B).to_f32(), 57344.0);
        assert_eq!(F8E4M3::from_f32(1e9).to_f32(), 448.0, "saturates");
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(F8E5M2(0x3C).to_f32(), 1.0);
        // 1.0625 lies halfway between 1.0 (mantissa 0, even) and 1.125: ties to even
        assert_eq!(F8E4M3::from_f32(1.0625).to_f32(), 1.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9), "smallest subnormal");
    }

    #[test]
    fn fast_fp8_encoding_matches_the_reference() {
        let mut xs: Vec<f32> = vec![0.0, -0.0, 1e-30, 1e30, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE];
        // every fp8 value, the midpoints between neighbours, and nudges around them
        for c in 0..=255u8 {
            for v in [F8E4M3(c).to_f32(), F8E5M2(c).to_f32()] {
                if v.is_finite() {
                    xs.extend([v, f32::from_bits(v.to_bits() + 1), f32::from_bits(v.to_bits().saturating_sub(1))]);
                }
            }
            for (a, b) in [(F8E4M3(c), F8E4M3(c.wrapping_add(1))), (F8E4M3(c), F8E4M3(c))] {
                let m = (a.to_f32() + b.to_f32()) / 2.0;
                xs.push(m);
            }
            let (a, b) = (F8E5M2(c).to_f32(), F8E5M2(c.wrapping_add(1)).to_f32());
            xs.push((a + b) / 2.0);
        }
        let mut z = 1u64;
        for _ in 0..200_000 {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            xs.push(f32::from_bits((z >> 32) as u32));
        }
        for x in xs {
            if x.is_nan() {
                continue;
            }
            let slow4 = fp8_encode(x, |c| F8E4M3(c).to_f32(), 0x7E, 0x7F);
            let slow5 = fp8_encode(x, |c| F8E5M2(c).to_f32(), 0x7B, 0x7F);
            assert_eq!(F8E4M3::from_f32(x).0, slow4, "e4m3 of {x:e}");
            assert_eq!(F8E5M2::from_f32(x).0, slow5, "e5m2 of {x:e}");
        }
    }

    #[test]
    fn premul_scalar_bytes() {
        let ReduceOp::PreMulSum(b) = ReduceOp::pre_mul_sum(2.0f32) else { panic!() };
        assert_eq!(f32::from_le_bytes(b[..4].try_into().unwrap()), 2.0);
    }
}
