//! `ncclSetEncryption` (NCCL 2.32): the process-wide request to encrypt traffic between hosts.
//!
//! The config is validated as NCCL 2.32 does (magic, size, mode, a NUL-terminated key of at least
//! 32 bytes), and more strictly: a NULL config is an error, not a silent reset. The setting goes to
//! `oxccl::set_encryption`, so every communicator created afterwards in the process encrypts its
//! traffic between hosts (AES-256-GCM keyed from the PSK; docs/security.md), and
//! `NCCL_ENCRYPTION_MODE_NONE` turns it off again. Where NCCL uses TLS 1.3 with the PSK, oxccl
//! seals its own frames: the two do not interoperate on the wire, which mixing libraries never did.

use super::*;
use crate::probe::{read_bytes, read_cstr_bytes};
use oxccl::encryption::PSK_MIN_BYTES;

/// `NCCL_ENCRYPTION_MODE_NONE`: plaintext.
pub const NCCL_ENCRYPTION_MODE_NONE: c_int = 0;
/// `NCCL_ENCRYPTION_MODE_PSK`: TLS with a pre-shared key.
pub const NCCL_ENCRYPTION_MODE_PSK: c_int = 1;

/// `ncclEncryptionConfig_t` as NCCL 2.32.3 lays it out (32 bytes).
#[repr(C)]
pub struct ncclEncryptionConfig_t {
    /// Caller's `sizeof(ncclEncryptionConfig_t)`.
    pub size: size_t,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// Caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// `NCCL_ENCRYPTION_MODE_*`.
    pub mode: c_int,
    /// The pre-shared key (PSK mode).
    pub psk: *const c_char,
}

fn set(config: *const ncclEncryptionConfig_t) -> R {
    if config.is_null() {
        return Err(arg("config is NULL"));
    }
    let n = std::mem::size_of::<ncclEncryptionConfig_t>();
    let head =
        read_bytes(config as usize, 16).ok_or_else(|| arg(format!("config ({config:p}) is not readable memory")))?;
    let size = usize::from_ne_bytes(head[0..8].try_into().unwrap());
    let magic = u32::from_ne_bytes(head[8..12].try_into().unwrap());
    if magic != NCCL_API_MAGIC || size < n || size > 1 << 16 {
        return Err(arg(format!(
            "ncclEncryptionConfig_t has size {size} and magic {magic:#x}, expected at least {n} and {NCCL_API_MAGIC:#x} \
             (initialize it with NCCL_ENCRYPTION_CONFIG_INITIALIZER)"
        )));
    }
    let raw =
        read_bytes(config as usize, n).ok_or_else(|| arg(format!("config ({config:p}) is not readable memory")))?;
    let mode = i32::from_ne_bytes(raw[16..20].try_into().unwrap());
    let psk = usize::from_ne_bytes(raw[24..32].try_into().unwrap()) as *const c_char;
    match mode {
        NCCL_ENCRYPTION_MODE_NONE => oxccl::set_encryption(oxccl::Encryption::Off).map(|_| ncclSuccess),
        NCCL_ENCRYPTION_MODE_PSK => {
            let key = read_cstr_bytes(psk, 4096, "ncclEncryptionConfig_t.psk")?
                .ok_or_else(|| arg("NCCL_ENCRYPTION_MODE_PSK with a NULL psk"))?;
            if key.len() < PSK_MIN_BYTES {
                return Err(arg(format!(
                    "ncclEncryptionConfig_t.psk has {} bytes; a pre-shared key needs at least {PSK_MIN_BYTES}",
                    key.len()
                )));
            }
            oxccl::set_encryption(oxccl::Encryption::Psk(key)).map(|_| ncclSuccess)
        }
        m => {
            Err(arg(format!("ncclEncryptionConfig_t.mode {m} is not an NCCL_ENCRYPTION_MODE_* value (0 none, 1 PSK)")))
        }
    }
}

export! {
    EXPORTED;

    /// `ncclSetEncryption`: the process-wide encryption of traffic between hosts.
    fn ncclSetEncryption / pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
        boundary("ncclSetEncryption", || set(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::ErrorKind;

    #[test]
    fn configs_are_validated_and_a_psk_accepted() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(std::mem::size_of::<ncclEncryptionConfig_t>(), 32);
        let mk = |mode, psk| ncclEncryptionConfig_t { size: 32, magic: NCCL_API_MAGIC, version: 23203, mode, psk };
        assert_eq!(set(&mk(0, std::ptr::null())).unwrap(), ncclSuccess);
        assert_eq!(set(&mk(1, c"secret".as_ptr())).unwrap_err().kind, ErrorKind::InvalidArgument, "short key");
        assert_eq!(set(&mk(1, c"a pre-shared key of thirty-two bytes".as_ptr())).unwrap(), ncclSuccess);
        assert_eq!(
            oxccl::Config::from_env().encryption,
            oxccl::Encryption::Psk(b"a pre-shared key of thirty-two bytes".to_vec())
        );
        assert_eq!(set(&mk(0, std::ptr::null())).unwrap(), ncclSuccess);
        assert_eq!(oxccl::Config::from_env().encryption, oxccl::Encryption::Off);
        assert_eq!(set(&mk(1, std::ptr::null())).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert_eq!(set(&mk(1, c"".as_ptr())).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert_eq!(set(&mk(1, 8 as *const c_char)).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert_eq!(set(&mk(7, std::ptr::null())).unwrap_err().kind, ErrorKind::InvalidArgument);
        let mut bad = mk(0, std::ptr::null());
        bad.magic = 1;
        assert!(set(&bad).is_err());
        bad = mk(0, std::ptr::null());
        bad.size = 8;
        assert!(set(&bad).is_err());
        assert!(set(std::ptr::null()).is_err());
        assert!(set(16 as *const ncclEncryptionConfig_t).is_err());
    }
}
