//! The device kernels, generated as CUDA C from one table.
//!
//! [`TYPES`] × [`OPS`] is the table: every NCCL data type and every reduction op gets one
//! `oxccl_reduce_<type>_<op>` kernel, and one untyped `oxccl_copy` kernel moves bytes. A reduce
//! kernel reads `nin` inputs and writes the result to `nout` outputs in one pass: with one output
//! it is the reduce kernel, with several it is the fused copy-reduce (NCCL's `recvReduceCopy`,
//! used by the one-shot all-reduce that writes each reduced chunk straight into every rank's
//! buffer).
//!
//! Semantics are exactly those of the host path ([`oxccl::reduce::reference`]): the value is
//! `pre(x0) ⊕ pre(x1) ⊕ …` folded left in input order, where `pre` multiplies by the
//! pre-multiplied-sum scalar, then divided by the rank count for avg; integers wrap; f16, bf16 and
//! fp8 compute in f32 and round once per operation (round to nearest even; fp8 saturates to the
//! largest finite value like CUDA's `__NV_SATFINITE`); min and max return one of their inputs
//! unchanged. The conversions are written out in portable integer code rather than CUDA
//! intrinsics, so that the very same source compiles as host C++ and is checked bit for bit
//! against the host reductions by a test on machines without a GPU (`tests` below). NVRTC is
//! asked for `--fmad=false` so that `acc + s*x` is never contracted into one rounding.
//!
//! Shape: 16-byte vector loads and stores when every pointer is 16-byte aligned (a scalar tail
//! and a scalar path otherwise), grid-stride loops, `__launch_bounds__(512)`; the launcher sizes
//! the grid from the multiprocessor count (Hopper: 132 SMs × 4 blocks).

use oxccl::{DataType, ReduceOp};
use std::fmt::Write;

/// Threads per block of every kernel (the `__launch_bounds__`).
pub const BLOCK: u32 = 512;
/// Most inputs and outputs one kernel call takes (the size of [`KernelArgs`]' arrays).
pub const MAX_PTRS: usize = 8;

/// The reduction ops of the table, by the name used in kernel names.
pub const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "premulsum"];

/// How a type computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Two's-complement integer: wrapping add and mul through unsigned 64-bit arithmetic.
    Int,
    /// A native float type (`float`, `double`).
    Float,
    /// A narrow float stored as bits, computed in f32: the codec's name (`f16`, `bf16`, …).
    Narrow(&'static str),
}

/// One row of the type table.
#[derive(Clone, Copy, Debug)]
pub struct TypeRow {
    /// The data type.
    pub dtype: DataType,
    /// The C storage type.
    ctype: &'static str,
    kind: Kind,
}

/// The type table: every NCCL data type (a test checks it covers [`DataType`]).
pub const TYPES: [TypeRow; 12] = [
    TypeRow { dtype: DataType::I8, ctype: "signed char", kind: Kind::Int },
    TypeRow { dtype: DataType::U8, ctype: "unsigned char", kind: Kind::Int },
    TypeRow { dtype: DataType::I32, ctype: "int", kind: Kind::Int },
    TypeRow { dtype: DataType::U32, ctype: "unsigned int", kind: Kind::Int },
    TypeRow { dtype: DataType::I64, ctype: "long long", kind: Kind::Int },
    TypeRow { dtype: DataType::U64, ctype: "unsigned long long", kind: Kind::Int },
    TypeRow { dtype: DataType::F16, ctype: "unsigned short", kind: Kind::Narrow("f16") },
    TypeRow { dtype: DataType::F32, ctype: "float", kind: Kind::Float },
    TypeRow { dtype: DataType::F64, ctype: "double", kind: Kind::Float },
    TypeRow { dtype: DataType::BF16, ctype: "unsigned short", kind: Kind::Narrow("bf16") },
    TypeRow { dtype: DataType::F8E4M3, ctype: "unsigned char", kind: Kind::Narrow("e4m3") },
    TypeRow { dtype: DataType::F8E5M2, ctype: "unsigned char", kind: Kind::Narrow("e5m2") },
];

/// The table's name of an op.
pub fn op_name(op: ReduceOp) -> &'static str {
    OPS[op.code() as usize]
}

/// The kernel that reduces `dtype` with `op`.
pub fn reduce_kernel_name(dtype: DataType, op: ReduceOp) -> String {
    format!("oxccl_reduce_{}_{}", dtype.name(), op_name(op))
}

/// The byte-copy kernel's name.
pub const COPY_KERNEL: &str = "oxccl_copy";

/// Every kernel name of the generated source, in table order.
pub fn kernel_names() -> Vec<String> {
    let mut v = vec![COPY_KERNEL.to_string()];
    for t in TYPES {
        for op in OPS {
            v.push(format!("oxccl_reduce_{}_{}", t.dtype.name(), op));
        }
    }
    v
}

/// The kernels' one argument, passed by value (`struct OxArgs` in the source; 168 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelArgs {
    /// Input pointers (device addresses); `nin` are used.
    pub inputs: [u64; MAX_PTRS],
    /// Output pointers; `nout` are used.
    pub outputs: [u64; MAX_PTRS],
    /// Elements (bytes for `oxccl_copy`).
    pub n: u64,
    /// The pre-multiplied-sum scalar's bytes (little-endian, the type's size).
    pub scalar: u64,
    /// Inputs used (1..=8).
    pub nin: u32,
    /// Outputs used (1..=8).
    pub nout: u32,
    /// Divide by this at the end (avg's rank count); 0: no division.
    pub post: u32,
    /// Padding (keeps the layout identical to the C struct's).
    pub pad: u32,
}

const PRELUDE: &str = r#"// Generated by oxccl-cuda (cuda/src/kernels.rs) from its type and op table. Do not edit.
#ifdef OXCCL_HOST_TEST
#include <string.h>
#include <math.h>
#define OX_DEV static inline
#define OX_GLOBAL
#define OX_BOUNDS
typedef struct { unsigned int x, y, z, w; } uint4;
static inline unsigned int ox_f2u(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float ox_u2f(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static thread_local unsigned long long ox_tid = 0, ox_nthreads = 1;
#define OX_TID ox_tid
#define OX_NTHREADS ox_nthreads
#else
#define OX_DEV __device__ __forceinline__
#define OX_GLOBAL __global__
#define OX_BOUNDS __launch_bounds__(512)
#define ox_f2u __float_as_uint
#define ox_u2f __uint_as_float
#define OX_TID ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x)
#define OX_NTHREADS ((unsigned long long)gridDim.x * blockDim.x)
#endif

struct OxArgs {
  unsigned long long in[8];
  unsigned long long out[8];
  unsigned long long n;
  unsigned long long scalar;
  unsigned int nin, nout, post, pad;
};

/* f16 <-> f32 as the `half` crate does (round to nearest even, NaN keeps its payload, quiet) */
OX_DEV float ox_f16_dec(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
  unsigned int e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
  if (e == 0x1fu) return ox_u2f(sign | 0x7f800000u | (m ? (0x00400000u | (m << 13)) : 0u));
  if (e == 0u) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }
  return ox_u2f(sign | ((e + 112u) << 23) | (m << 13));
}
OX_DEV unsigned short ox_f16_enc(float value) {
  unsigned int x = ox_f2u(value);
  unsigned int sign = x & 0x80000000u, exp = x & 0x7f800000u, man = x & 0x007fffffu;
  unsigned int hs = sign >> 16;
  if (exp == 0x7f800000u) return (unsigned short)(hs | 0x7c00u | (man ? 0x200u : 0u) | (man >> 13));
  int he = (int)(exp >> 23) - 127 + 15;
  if (he >= 0x1f) return (unsigned short)(hs | 0x7c00u);
  if (he <= 0) {
    if (14 - he > 24) return (unsigned short)hs;
    unsigned int mm = man | 0x00800000u;
    unsigned int hm = mm >> (14 - he);
    unsigned int rb = 1u << (13 - he);
    if ((mm & rb) != 0u && (mm & (3u * rb - 1u)) != 0u) hm += 1u;
    return (unsigned short)(hs | hm);
  }
  unsigned int r = hs | ((unsigned int)he << 10) | (man >> 13);
  if ((man & 0x1000u) != 0u && (man & 0x2fffu) != 0u) r += 1u;
  return (unsigned short)r;
}
/* bf16 <-> f32 (round to nearest even; a NaN keeps its high bits and gets its quiet bit) */
OX_DEV float ox_bf16_dec(unsigned short h) {
  unsigned int u = h;
  unsigned int quiet = (u & 0x7fffu) > 0x7f80u ? 0x40u : 0u;
  return ox_u2f((u | quiet) << 16);
}
OX_DEV unsigned short ox_bf16_enc(float v) {
  unsigned int x = ox_f2u(v);
  unsigned int up = ((x >> 15) & 1u) & ((unsigned int)((x & 0x7fffu) != 0u) | ((x >> 16) & 1u));
  unsigned int r = (x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : ((x >> 16) + up);
  return (unsigned short)r;
}
/* fp8: exact decode; encode rounds to nearest even and saturates (NaN -> the NaN code) */
OX_DEV float ox_e4m3_dec(unsigned char b) {
  unsigned int u = b, sign = (u & 0x80u) << 24, e = (u >> 3) & 0xfu, m = u & 7u;
  if ((u & 0x7fu) == 0x7fu) return ox_u2f(0x7fc00000u);
  if (e == 0u) { float v = (float)m * 0.001953125f; return sign ? -v : v; }
  return ox_u2f(sign | ((e + 120u) << 23) | (m << 20));
}
OX_DEV float ox_e5m2_dec(unsigned char b) {
  unsigned int u = b, sign = (u & 0x80u) << 24, e = (u >> 2) & 0x1fu, m = u & 3u;
  if (e == 0x1fu) return m ? ox_u2f(0x7fc00000u) : ox_u2f(sign | 0x7f800000u);
  if (e == 0u) { float v = (float)m * 1.52587890625e-05f; return sign ? -v : v; }
  return ox_u2f(sign | ((e + 112u) << 23) | (m << 21));
}
OX_DEV unsigned char ox_fp8_enc(float x, unsigned int man_bits, int bias, float sub_scale, int max_e,
                                unsigned int max_code) {
  if (x != x) return 0x7fu;
  unsigned int sign = (ox_f2u(x) & 0x80000000u) ? 0x80u : 0u;
  float a = fabsf(x);
  unsigned int bits = ox_f2u(a);
  int exp32 = (int)(bits >> 23) - 127;
  unsigned int code;
  if (exp32 < 1 - bias) {
    code = (unsigned int)rintf(a * sub_scale);
  } else {
    unsigned int shift = 23u - man_bits;
    unsigned int rounded = (bits + ((1u << (shift - 1u)) - 1u) + ((bits >> shift) & 1u)) >> shift;
    int e = (int)(rounded >> man_bits) - 127 + bias;
    code = e > max_e ? 0xffffffffu : (((unsigned int)e << man_bits) | (rounded & ((1u << man_bits) - 1u)));
  }
  return (unsigned char)(sign | (code < max_code ? code : max_code));
}
OX_DEV unsigned char ox_e4m3_enc(float x) { return ox_fp8_enc(x, 3u, 7, 512.0f, 15, 0x7eu); }
OX_DEV unsigned char ox_e5m2_enc(float x) { return ox_fp8_enc(x, 2u, 15, 65536.0f, 31, 0x7bu); }

OX_DEV bool ox_aligned(const struct OxArgs& a) {
  unsigned long long bits = 0;
  for (unsigned int j = 0; j < a.nin; j++) bits |= a.in[j];
  for (unsigned int j = 0; j < a.nout; j++) bits |= a.out[j];
  return (bits & 15ull) == 0ull;
}

/* bytes: 16 at a time when aligned, then a byte tail */
extern "C" OX_GLOBAL void OX_BOUNDS oxccl_copy(struct OxArgs a) {
  const unsigned long long n = a.n, tid = OX_TID, nt = OX_NTHREADS;
  const unsigned long long nvec = ox_aligned(a) ? n / 16ull : 0ull;
  const uint4* src = (const uint4*)a.in[0];
  for (unsigned long long v = tid; v < nvec; v += nt) {
    uint4 x = src[v];
    for (unsigned int j = 0; j < a.nout; j++) ((uint4*)a.out[j])[v] = x;
  }
  for (unsigned long long i = nvec * 16ull + tid; i < n; i += nt) {
    unsigned char x = ((const unsigned char*)a.in[0])[i];
    for (unsigned int j = 0; j < a.nout; j++) ((unsigned char*)a.out[j])[i] = x;
  }
}
"#;

/// The element functions of one type: `ox_<t>_<fn>` for add, mul, min, max, div.
fn element_fns(t: &TypeRow, out: &mut String) {
    let n = t.dtype.name();
    let c = t.ctype;
    match t.kind {
        Kind::Int => {
            // wrapping arithmetic in unsigned 64-bit, truncated to the type (exact modulo 2^k)
            let _ = writeln!(
                out,
                "OX_DEV {c} ox_{n}_add({c} a, {c} b) {{ return ({c})((unsigned long long)a + (unsigned long long)b); }}\n\
                 OX_DEV {c} ox_{n}_mul({c} a, {c} b) {{ return ({c})((unsigned long long)a * (unsigned long long)b); }}\n\
                 OX_DEV {c} ox_{n}_min({c} a, {c} b) {{ return b < a ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_max({c} a, {c} b) {{ return b > a ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_div({c} a, unsigned int k) {{ return ({c})(a / ({c})k); }}"
            );
        }
        Kind::Float => {
            let _ = writeln!(
                out,
                "OX_DEV {c} ox_{n}_add({c} a, {c} b) {{ return a + b; }}\n\
                 OX_DEV {c} ox_{n}_mul({c} a, {c} b) {{ return a * b; }}\n\
                 OX_DEV {c} ox_{n}_min({c} a, {c} b) {{ return b < a ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_max({c} a, {c} b) {{ return b > a ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_div({c} a, unsigned int k) {{ return a / ({c})k; }}"
            );
        }
        Kind::Narrow(codec) => {
            let (d, e) = (format!("ox_{codec}_dec"), format!("ox_{codec}_enc"));
            let _ = writeln!(
                out,
                "OX_DEV {c} ox_{n}_add({c} a, {c} b) {{ return {e}({d}(a) + {d}(b)); }}\n\
                 OX_DEV {c} ox_{n}_mul({c} a, {c} b) {{ return {e}({d}(a) * {d}(b)); }}\n\
                 OX_DEV {c} ox_{n}_min({c} a, {c} b) {{ return {d}(b) < {d}(a) ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_max({c} a, {c} b) {{ return {d}(b) > {d}(a) ? b : a; }}\n\
                 OX_DEV {c} ox_{n}_div({c} a, unsigned int k) {{ return {e}({d}(a) / (float)k); }}"
            );
        }
    }
}

/// One reduce kernel: `(type, op)` → `oxccl_reduce_<type>_<op>`.
fn reduce_kernel(t: &TypeRow, op: &str, out: &mut String) {
    let n = t.dtype.name();
    let c = t.ctype;
    let size = t.dtype.size();
    let v = 16 / size;
    // acc = pre(x0); acc = acc ⊕ pre(x); post
    let (pre, fold) = match op {
        "premulsum" => (format!("ox_{n}_mul(s, X)"), format!("ox_{n}_add(ACC, ox_{n}_mul(s, X))")),
        "prod" => ("X".into(), format!("ox_{n}_mul(ACC, X)")),
        "max" => ("X".into(), format!("ox_{n}_max(ACC, X)")),
        "min" => ("X".into(), format!("ox_{n}_min(ACC, X)")),
        _ => ("X".into(), format!("ox_{n}_add(ACC, X)")),
    };
    let pre_v = pre.replace('X', "x.e[k]");
    let fold_v = fold.replace("ACC", "acc.e[k]").replace('X', "x.e[k]");
    let pre_s = pre.replace('X', "((const T*)a.in[0])[i]");
    let fold_s = fold.replace("ACC", "acc").replace('X', "((const T*)a.in[j])[i]");
    let _ = writeln!(
        out,
        r#"extern "C" OX_GLOBAL void OX_BOUNDS oxccl_reduce_{n}_{op}(struct OxArgs a) {{
  typedef {c} T;
  union V {{ uint4 u; T e[{v}]; }};
  union {{ unsigned long long u; T t; }} sc; sc.u = a.scalar; const T s = sc.t; (void)s;
  const unsigned long long n = a.n, tid = OX_TID, nt = OX_NTHREADS;
  const unsigned long long nvec = ox_aligned(a) ? n / {v}ull : 0ull;
  for (unsigned long long w = tid; w < nvec; w += nt) {{
    union V acc, x;
    x.u = ((const uint4*)a.in[0])[w];
#pragma unroll
    for (int k = 0; k < {v}; k++) acc.e[k] = {pre_v};
    for (unsigned int j = 1; j < a.nin; j++) {{
      x.u = ((const uint4*)a.in[j])[w];
#pragma unroll
      for (int k = 0; k < {v}; k++) acc.e[k] = {fold_v};
    }}
    if (a.post) {{
#pragma unroll
      for (int k = 0; k < {v}; k++) acc.e[k] = ox_{n}_div(acc.e[k], a.post);
    }}
    for (unsigned int j = 0; j < a.nout; j++) ((uint4*)a.out[j])[w] = acc.u;
  }}
  for (unsigned long long i = nvec * {v}ull + tid; i < n; i += nt) {{
    T acc = {pre_s};
    for (unsigned int j = 1; j < a.nin; j++) acc = {fold_s};
    if (a.post) acc = ox_{n}_div(acc, a.post);
    for (unsigned int j = 0; j < a.nout; j++) ((T*)a.out[j])[i] = acc;
  }}
}}"#
    );
}

/// The whole CUDA C source: prelude, element functions, every kernel of the table.
pub fn source() -> String {
    let mut s = String::from(PRELUDE);
    for t in &TYPES {
        element_fns(t, &mut s);
    }
    for t in &TYPES {
        for op in OPS {
            reduce_kernel(t, op, &mut s);
        }
    }
    s
}

/// The PTX of [`source`] for `compute_80`, compiled by `oxccl-kernels --ptx` with NVRTC and
/// committed: the fallback when a machine with a GPU has no NVRTC (it runs on sm_80 and later).
/// `.ci/run` regenerates it and fails if it differs from the source.
pub const EMBEDDED_PTX: &str = include_str!("../kernels/oxccl_kernels.ptx");

/// NVRTC options for the kernels (`arch` like `sm_90` or `compute_80`).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--std=c++17".into(),
        "-default-device".into(),
        "--extra-device-vectorization".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::reduce::reference;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    /// The simulated CUDA driver (cuda/sim) runs the committed copy of the source as host C++:
    /// it must be this source (regenerate it with `oxccl-kernels --source cuda/kernels/oxccl_kernels.cu`).
    #[test]
    fn the_committed_source_is_current() {
        let committed = include_str!("../kernels/oxccl_kernels.cu");
        assert!(
            committed == source(),
            "cuda/kernels/oxccl_kernels.cu is stale: run `cargo run --release -p oxccl-cuda --bin oxccl-kernels -- --source cuda/kernels/oxccl_kernels.cu`"
        );
    }

    #[test]
    fn the_table_covers_every_type_and_op() {
        let all = DataType::ALL;
        for raw in 0..12 {
            let dt = DataType::from_raw(raw).unwrap();
            assert!(all.contains(&dt));
            assert!(TYPES.iter().any(|t| t.dtype == dt), "{dt:?} missing from the table");
        }
        assert!(DataType::from_raw(12).is_err(), "a new DataType needs a row in TYPES");
        let src = source();
        let ops = ReduceOp::BASIC.iter().copied().chain([ReduceOp::pre_mul_sum(1.0f32)]);
        for op in ops {
            for t in TYPES {
                let name = reduce_kernel_name(t.dtype, op);
                assert!(src.contains(&format!("void OX_BOUNDS {name}(")), "{name} not generated");
            }
        }
        assert_eq!(kernel_names().len(), 1 + 12 * 6);
        assert_eq!(std::mem::size_of::<KernelArgs>(), 8 * 16 + 8 + 8 + 16);
    }

    /// The harness: reads one job from stdin, runs the named kernel on the host, writes the
    /// outputs. Grid-stride is emulated with 3 "threads" so the stride paths run.
    const HARNESS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
typedef void (*ox_fn)(struct OxArgs);
int main(void) {
  char name[128]; unsigned long long n, scalar, size, off; unsigned int nin, nout, post;
  if (scanf("%127s %llu %llu %u %u %u %llu %llu", name, &n, &scalar, &nin, &nout, &post, &size, &off) != 8) return 2;
  getchar();
  ox_fn f = 0;
  for (int i = 0; ox_table[i].name; i++) if (!strcmp(ox_table[i].name, name)) f = ox_table[i].f;
  if (!f) return 3;
  struct OxArgs a; memset(&a, 0, sizeof a);
  a.n = n; a.scalar = scalar; a.nin = nin; a.nout = nout; a.post = post;
  size_t bytes = n * size;
  for (unsigned int j = 0; j < nin; j++) {
    unsigned char* p = (unsigned char*)aligned_alloc(64, bytes + 64) + off;
    if (fread(p, 1, bytes, stdin) != bytes) return 4;
    a.in[j] = (unsigned long long)p;
  }
  for (unsigned int j = 0; j < nout; j++) a.out[j] = (unsigned long long)((unsigned char*)aligned_alloc(64, bytes + 64) + off);
  for (ox_tid = 0, ox_nthreads = 3; ox_tid < 3; ox_tid++) f(a);
  for (unsigned int j = 0; j < nout; j++) fwrite((void*)a.out[j], 1, bytes, stdout);
  return 0;
}
"#;

    fn build_harness() -> Option<std::path::PathBuf> {
        let dir = std::env::temp_dir().join(format!("oxccl-kernel-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut src = String::from("#define OXCCL_HOST_TEST 1\n");
        src += &source();
        src += "\nstruct ox_entry { const char* name; void (*f)(struct OxArgs); };\nstruct ox_entry ox_table[] = {\n";
        for k in kernel_names() {
            src += &format!("  {{\"{k}\", {k}}},\n");
        }
        src += "  {0, 0}};\n";
        src += HARNESS;
        let cpp = dir.join("kernels_host.cpp");
        std::fs::write(&cpp, src).unwrap();
        let exe = dir.join("kernels_host");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let st = Command::new(&cxx)
            .args(["-O1", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Werror", "-Wno-unknown-pragmas", "-o"])
            .arg(&exe)
            .arg(&cpp)
            .status();
        match st {
            Ok(s) if s.success() => Some(exe),
            Ok(s) => panic!("{cxx} failed to compile the generated kernels as host C++: {s}"),
            Err(e) => {
                // a C++ compiler is part of the build requirements (.ci/run installs it)
                panic!("no C++ compiler ({cxx}): {e}")
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        exe: &std::path::Path,
        name: &str,
        n: usize,
        scalar: u64,
        inputs: &[Vec<u8>],
        nout: u32,
        post: u32,
        size: usize,
        off: usize,
    ) -> Vec<Vec<u8>> {
        let mut child = Command::new(exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        {
            let mut w = child.stdin.take().unwrap();
            writeln!(w, "{name} {n} {scalar} {} {nout} {post} {size} {off}", inputs.len()).unwrap();
            for i in inputs {
                w.write_all(i).unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{name}: harness exited with {}", out.status);
        out.stdout.chunks(n * size).map(|c| c.to_vec()).collect()
    }

    /// Inputs covering the type's interesting values: for 8- and 16-bit types every bit pattern
    /// appears (so every NaN, infinity, subnormal and tie of the codecs is exercised), for wider
    /// types a pseudo-random mix with specials.
    fn inputs(dt: DataType, n: usize, k: usize) -> Vec<Vec<u8>> {
        let size = dt.size();
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (k as u64) ^ ((dt as u64) << 32);
        (0..k)
            .map(|j| {
                let mut v = vec![0u8; n * size];
                for (i, e) in v.chunks_mut(size).enumerate() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let bits = match size {
                        1 | 2 if j == 0 => i as u64, // every pattern in the first input
                        _ => state,
                    };
                    e.copy_from_slice(&bits.to_le_bytes()[..size]);
                }
                // specials for wide floats
                if dt == DataType::F32 && n > 8 {
                    for (i, x) in [0.0f32, -0.0, f32::INFINITY, f32::NAN, 1e-40, -3.5, 1e38, 2.5].iter().enumerate() {
                        v[i * 4..i * 4 + 4].copy_from_slice(&x.to_le_bytes());
                    }
                }
                v
            })
            .collect()
    }

    fn scalar_for(dt: DataType) -> ReduceOp {
        use oxccl::{F8E4M3, F8E5M2};
        match dt {
            DataType::I8 => ReduceOp::pre_mul_sum(-3i8),
            DataType::U8 => ReduceOp::pre_mul_sum(3u8),
            DataType::I32 => ReduceOp::pre_mul_sum(-7i32),
            DataType::U32 => ReduceOp::pre_mul_sum(7u32),
            DataType::I64 => ReduceOp::pre_mul_sum(-11i64),
            DataType::U64 => ReduceOp::pre_mul_sum(11u64),
            DataType::F16 => ReduceOp::pre_mul_sum(half::f16::from_f32(0.3)),
            DataType::F32 => ReduceOp::pre_mul_sum(0.3f32),
            DataType::F64 => ReduceOp::pre_mul_sum(0.3f64),
            DataType::BF16 => ReduceOp::pre_mul_sum(half::bf16::from_f32(0.3)),
            DataType::F8E4M3 => ReduceOp::pre_mul_sum(F8E4M3::from_f32(0.75)),
            DataType::F8E5M2 => ReduceOp::pre_mul_sum(F8E5M2::from_f32(0.75)),
        }
    }

    /// Whether an element is a NaN of its type. Arithmetic with NaN operands gives NaN on both
    /// sides, but which payload survives is not specified (x86 keeps an operand's, a GPU returns
    /// the canonical NaN), so NaN results are compared as "both NaN"; every other value, and
    /// every min/max result (a NaN input is passed through unchanged), bit for bit.
    fn is_nan(dt: DataType, b: &[u8]) -> bool {
        match dt {
            DataType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan(),
            DataType::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan(),
            DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DataType::F8E4M3 => b[0] & 0x7f == 0x7f,
            DataType::F8E5M2 => b[0] & 0x7f > 0x7c,
            _ => false,
        }
    }

    /// Every kernel of the table, compiled as host C++, equals the host reductions bit for bit:
    /// 1, 2 and 3 inputs, aligned (vector path) and misaligned (scalar path), several outputs.
    #[test]
    fn generated_kernels_match_the_host_reductions_bit_for_bit() {
        let Some(exe) = build_harness() else { return };
        for t in TYPES {
            let dt = t.dtype;
            let n = if dt.size() <= 2 { 1 << (8 * dt.size()) } else { 4099 };
            let n = n + 5; // a tail after the vectors
            for op in ReduceOp::BASIC.iter().copied().chain([scalar_for(dt)]) {
                let name = reduce_kernel_name(dt, op);
                let scalar = match op {
                    ReduceOp::PreMulSum(b) => u64::from_le_bytes(b),
                    _ => 0,
                };
                for k in [1usize, 2, 3] {
                    let ins = inputs(dt, n, k);
                    let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                    let want = reference(dt, op, &refs);
                    let post = if op == ReduceOp::Avg { k as u32 } else { 0 };
                    for off in [0usize, dt.size()] {
                        let outs = run(&exe, &name, n, scalar, &ins, 2, post, dt.size(), off);
                        for o in &outs {
                            let size = dt.size();
                            let same = |i: usize| {
                                let (g, w) = (&o[i * size..(i + 1) * size], &want[i * size..(i + 1) * size]);
                                g == w || (is_nan(dt, g) && is_nan(dt, w))
                            };
                            if let Some(i) = (0..n).find(|&i| !same(i)) {
                                panic!(
                                    "{name} k={k} off={off}: element {i}: got {:02x?} want {:02x?} (inputs {:02x?})",
                                    &o[i * size..(i + 1) * size],
                                    &want[i * size..(i + 1) * size],
                                    refs.iter().map(|r| &r[i * size..(i + 1) * size]).collect::<Vec<_>>()
                                );
                            }
                        }
                    }
                }
            }
        }
        // the copy kernel, aligned and not
        let data: Vec<u8> = (0..100_003u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in [0, 3] {
            let outs = run(&exe, COPY_KERNEL, data.len(), 0, std::slice::from_ref(&data), 3, 0, 1, off);
            assert_eq!(outs.len(), 3);
            assert!(outs.iter().all(|o| *o == data));
        }
    }
}
