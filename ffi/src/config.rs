//! `ncclConfig_t`: every historic layout, parsed from the caller's size and version.

use super::*;
use oxccl::Error;

// ---- config ---------------------------------------------------------------------------------

/// The settings a caller's `ncclConfig_t` asks for.
pub(crate) struct Parsed {
    pub(crate) blocking: Option<bool>,
    /// This communicator's bound on every wait, instead of `OXCCL_TIMEOUT`'s.
    pub(crate) timeout: Option<std::time::Duration>,
}

/// Parse a caller's `ncclConfig_t` of any historic layout (24..=120 bytes): only the fields its
/// `size` and `version` cover are read.
///
/// # Safety
/// `cfg` is NULL or points to at least `cfg->size` readable bytes (NCCL's contract).
pub(crate) unsafe fn parse_config(cfg: *const ncclConfig_t) -> Result<Parsed, Error> {
    let env_blocking = oxccl::Config::from_env().comm_blocking;
    if cfg.is_null() {
        return Ok(Parsed { blocking: env_blocking, timeout: None });
    }
    // SAFETY: non-null; the first field is the caller's size_t `size`.
    let size = unsafe { std::ptr::read_unaligned(cfg as *const size_t) };
    if size < 16 {
        return Err(arg(format!(
            "ncclConfig_t of {size} bytes is too small (not initialized with NCCL_CONFIG_INITIALIZER?)"
        )));
    }
    let mut raw = [0u8; std::mem::size_of::<ncclConfig_t>()];
    let n = size.min(raw.len());
    // SAFETY: the caller's struct has `size` readable bytes; we copy at most that many.
    unsafe { std::ptr::copy_nonoverlapping(cfg as *const u8, raw.as_mut_ptr(), n) };
    let u32_at = |o: usize| u32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
    let i32_at = |o: usize| i32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
    if u32_at(8) != NCCL_API_MAGIC {
        return Err(arg(format!(
            "ncclConfig_t has magic {:#x}, expected {NCCL_API_MAGIC:#x} (initialize it with NCCL_CONFIG_INITIALIZER)",
            u32_at(8)
        )));
    }
    let version = u32_at(12);
    let blocking = if n >= 20 && version >= 21400 { i32_at(16) } else { NCCL_CONFIG_UNDEF_INT };
    let blocking = match blocking {
        NCCL_CONFIG_UNDEF_INT => None,
        0 => Some(false),
        1 => Some(true),
        b => return Err(arg(format!("ncclConfig_t.blocking is {b}; it must be 0 or 1"))),
    };
    Ok(Parsed { blocking: env_blocking.or(blocking), timeout: None })
}
