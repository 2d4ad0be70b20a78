//! Unit tests of the C ABI layer.

use super::*;
use oxccl::DataType;
use std::ffi::CStr;

/// The header declares exactly the exported functions, with NCCL's enum values, so the two
/// cannot drift.
#[test]
fn header_matches_the_library() {
    let h = include_str!("../include/nccl.h");
    let dev = include_str!("../include/nccl_device.h");
    let mut declared: Vec<&str> = h
        .lines()
        .chain(dev.lines())
        .filter_map(|l| {
            let l = l.trim();
            let rest = ["ncclResult_t ", "const char* ", "void ", "ncclTeam_t ", "int "]
                .iter()
                .find_map(|p| l.strip_prefix(p))?;
            let name = rest.split('(').next()?.trim();
            (name.starts_with("nccl") && rest.contains('(')).then_some(name)
        })
        .collect();
    declared.sort_unstable();
    declared.dedup();
    let mut exported: Vec<&str> = exported();
    exported.sort_unstable();
    assert_eq!(declared, exported, "nccl.h and the library declare different functions");
    for (name, v) in [
        ("ncclSuccess", 0),
        ("ncclUnhandledCudaError", 1),
        ("ncclSystemError", 2),
        ("ncclInternalError", 3),
        ("ncclInvalidArgument", 4),
        ("ncclInvalidUsage", 5),
        ("ncclRemoteError", 6),
        ("ncclInProgress", 7),
        ("ncclTimeout", 8),
        ("ncclNumResults", 9),
        ("ncclInt8", DataType::I8 as i32),
        ("ncclUint8", DataType::U8 as i32),
        ("ncclInt32", DataType::I32 as i32),
        ("ncclUint32", DataType::U32 as i32),
        ("ncclInt64", DataType::I64 as i32),
        ("ncclUint64", DataType::U64 as i32),
        ("ncclFloat16", DataType::F16 as i32),
        ("ncclFloat32", DataType::F32 as i32),
        ("ncclFloat64", DataType::F64 as i32),
        ("ncclBfloat16", DataType::BF16 as i32),
        ("ncclFloat8e4m3", DataType::F8E4M3 as i32),
        ("ncclFloat8e5m2", DataType::F8E5M2 as i32),
        ("ncclNumTypes", ncclNumTypes),
        ("ncclSum", 0),
        ("ncclProd", 1),
        ("ncclMax", 2),
        ("ncclMin", 3),
        ("ncclAvg", 4),
        ("ncclNumOps", ncclNumOps),
    ] {
        let needle = format!("{name} = {v},");
        assert!(h.contains(&needle), "nccl.h lacks `{needle}`");
    }
    assert!(h.contains(&format!("#define NCCL_VERSION_CODE {NCCL_VERSION_CODE}")));
    assert_eq!(std::mem::size_of::<ncclConfig_t>(), 120);
    assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
}

#[test]
fn internal_errors_point_to_this_project() {
    let _g = last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let code = boundary("ncclTest", || panic!("boom"));
    assert_eq!(code, ncclInternalError);
    // SAFETY: a static buffer, NUL-terminated.
    let msg = unsafe { CStr::from_ptr(last_error::current()) }.to_string_lossy().into_owned();
    assert!(msg.contains("boom") && msg.contains("oxccl project"), "{msg}");
    boundary("ncclTest", || Err(Error::internal("invariant")));
    // SAFETY: as above.
    let msg = unsafe { CStr::from_ptr(last_error::current()) }.to_string_lossy().into_owned();
    assert!(msg.contains("invariant") && msg.contains("not NCCL"), "{msg}");
}

#[test]
fn error_strings_are_nccls() {
    // SAFETY: valid result codes and out of range ones; the strings are static.
    let s = |r| unsafe { CStr::from_ptr(ncclGetErrorString(r)) }.to_str().unwrap().to_string();
    assert_eq!(s(0), "no error");
    assert_eq!(s(4), "invalid argument (run with NCCL_DEBUG=WARN for details)");
    assert_eq!(s(7), "NCCL operation in progress");
    assert_eq!(s(42), "unknown result code");
    assert_eq!(s(-1), "unknown result code");
}
