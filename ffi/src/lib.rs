//! # oxccl-ffi: NCCL's C ABI over oxccl (`libnccl.so.2`)
//!
//! `cargo build --release` produces `target/release/libnccl.so` with SONAME `libnccl.so.2` (and a
//! `libnccl.so.2` link beside it). A program written against NCCL's `nccl.h` (or oxccl's copy in
//! `ffi/include/nccl.h`) links with it unchanged. The library exports every function of NCCL
//! 2.32.3's `libnccl.so.2` (`nccl.h` and the host side of `nccl_device.h`) as `ncclX` and
//! `pncclX`, and nothing else (`libnccl.map`).
//!
//! What works (host memory; see `docs/pytorch.md` and `docs/errors.md`):
//! - every collective, send/recv and groups (`ncclGroupStart`/`End` nest; one thread may drive
//!   many communicators in a group) on host buffers with a NULL stream: the call completes
//!   before it returns. A non-NULL stream is refused with `ncclInvalidUsage` until the CUDA path
//!   exists;
//! - `ncclCommInitRank`, `ncclCommInitRankConfig` (every historic `ncclConfig_t` layout, parsed
//!   from the caller's `size`/`version`; `blocking = 0` makes init and collectives asynchronous,
//!   polled with `ncclCommGetAsyncError`), `ncclCommInitRankScalable` with one id,
//!   `ncclCommInitAll`, `ncclCommSplit`, `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`
//!   (from any thread), the queries, `ncclRedOpCreatePreMulSum`/`Destroy`, `ncclMemAlloc`/`Free`
//!   (host memory) and `ncclCommRegister`/`Deregister` (host memory needs no registration);
//! - functions oxccl does not implement yet exist, return `ncclInvalidUsage` and say so by name
//!   in `ncclGetLastError`.
//!
//! Every entry point checks its arguments (null pointers, unknown or destroyed communicators,
//! types, ops, roots, peers, byte sizes that overflow) and runs behind a panic boundary: a bad
//! argument gets `ncclInvalidArgument` and a message, never a crash.
//!
//! All `unsafe` of this crate is the C boundary itself: reading and writing the caller's
//! pointers, each with a `// SAFETY:` comment stating NCCL's contract it relies on.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use libc::{c_char, c_int, c_void, size_t};

use oxccl::{CallOptions, Coll, Error};

// ---- the exported functions --------------------------------------------------------------------

macro_rules! export {
    ($list:ident; $( $(#[$m:meta])* fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) -> $ret:ty $body:block )*) => {
        $(
            $(#[$m])*
            ///
            /// # Safety
            /// NCCL's contract: pointers are NULL or valid for what `nccl.h` says they point to.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> $ret $body

            #[doc = concat!("`p", stringify!($name), "`: NCCL's profiling twin of [`", stringify!($name), "`].")]
            ///
            /// # Safety
            /// As for the function it forwards to.
            #[no_mangle]
            pub unsafe extern "C" fn $pname($($a: $t),*) -> $ret {
                // SAFETY: same contract as the function it forwards to.
                unsafe { $name($($a),*) }
            }
        )*
        /// The functions this invocation exports (each also with a `p` prefix), for the header test.
        pub const $list: &[&str] = &[$(stringify!($name)),*];
    };
}

mod access;
mod collconfig;
mod config;
mod devapi;
mod device;
mod elastic;
mod encryption;
mod errors;
mod exports;
mod group;
mod handles;
mod last_error;
mod memory;
mod oxccl_ext;
mod probe;
#[cfg(test)]
mod tests;
mod types;

use config::*;
use errors::*;
pub use exports::*;
use group::*;
use handles::*;
use last_error::set_last_error;
use memory::*;
pub use oxccl_ext::*;
pub use types::*;
