//! Encryption of the traffic between hosts: the setting, its process-wide override (what
//! `ncclSetEncryption` sets), and the job's master key.
//!
//! What is protected, and from whom, is in docs/security.md. In short: every TCP frame after the
//! authenticated hello is sealed with AES-256-GCM under a key of its own connection
//! (`oxccl_transport::seal`); shared memory between ranks of one host is not network traffic and
//! is not encrypted.

use crate::config::env_any;
use crate::{Error, Result};
/// Shortest pre-shared key accepted (32 bytes, as NCCL's `ncclSetEncryption`).
pub use oxccl_transport::seal::PSK_MIN_BYTES;
use oxccl_transport::seal::{master_from_psk, master_from_secret, MasterKey};
use std::path::PathBuf;
use std::sync::Mutex;

/// How a communicator protects its traffic between hosts ([`crate::Config::encryption`]).
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Encryption {
    /// Plaintext (authenticated hellos only): the default.
    #[default]
    Off,
    /// AES-256-GCM keyed from this pre-shared key (at least 32 bytes), the same on every rank.
    Psk(Vec<u8>),
    /// A pre-shared key read from this file at communicator creation (`OXCCL_PSK_FILE`; one
    /// trailing newline is ignored).
    PskFile(PathBuf),
    /// AES-256-GCM keyed from the unique id's secret: encryption with no extra setup, against
    /// anyone who does not hold the unique id (or the torchrun store's secret).
    UniqueId,
    /// A setting that could not be understood; communicator creation fails with this message.
    Invalid(String),
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Encryption::Off => f.write_str("Off"),
            Encryption::Psk(k) => write!(f, "Psk({} bytes)", k.len()),
            Encryption::PskFile(p) => write!(f, "PskFile({})", p.display()),
            Encryption::UniqueId => f.write_str("UniqueId"),
            Encryption::Invalid(m) => write!(f, "Invalid({m})"),
        }
    }
}

/// The process-wide setting, when [`set_encryption`] was called: it overrides the environment.
static PROCESS: Mutex<Option<Encryption>> = Mutex::new(None);

fn short_key(n: usize) -> Error {
    Error::invalid_argument(format!("a pre-shared key needs at least {PSK_MIN_BYTES} bytes, got {n}"))
}

/// Set how every communicator created afterwards in this process protects its traffic between
/// hosts (as NCCL's `ncclSetEncryption`; it overrides `OXCCL_ENCRYPT`). Every rank of a job must
/// make the same choice with the same key, or connection setup fails on both sides, naming the
/// peer. Communicators that exist keep their setting.
pub fn set_encryption(e: Encryption) -> Result<()> {
    match &e {
        Encryption::Psk(k) if k.len() < PSK_MIN_BYTES => return Err(short_key(k.len())),
        Encryption::Invalid(m) => return Err(Error::invalid_argument(m.clone())),
        _ => {}
    }
    *PROCESS.lock().unwrap() = Some(e);
    Ok(())
}

/// The setting [`crate::Config::from_env`] starts from: [`set_encryption`]'s if it was called,
/// else `OXCCL_ENCRYPT` (`off`, `psk` with `OXCCL_PSK_FILE`, or `uid`).
pub(crate) fn from_env() -> Encryption {
    if let Some(e) = PROCESS.lock().unwrap().clone() {
        return e;
    }
    match env_any(&["OXCCL_ENCRYPT"]).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("off" | "0" | "none") => Encryption::Off,
        Some("uid") => Encryption::UniqueId,
        Some("psk") => match env_any(&["OXCCL_PSK_FILE"]) {
            Some(p) => Encryption::PskFile(p.into()),
            None => Encryption::Invalid("OXCCL_ENCRYPT=psk needs OXCCL_PSK_FILE, the file holding the key".into()),
        },
        Some(v) => Encryption::Invalid(format!("OXCCL_ENCRYPT={v} is not one of off, psk, uid")),
    }
}

impl Encryption {
    /// The job's master key (`None`: plaintext), from the pre-shared key or from `secret`, the
    /// unique id's.
    pub(crate) fn master(&self, secret: &[u8; 32]) -> Result<Option<MasterKey>> {
        Ok(Some(MasterKey(match self {
            Encryption::Off => return Ok(None),
            Encryption::Psk(k) if k.len() < PSK_MIN_BYTES => return Err(short_key(k.len())),
            Encryption::Psk(k) => master_from_psk(k),
            Encryption::PskFile(p) => {
                let mut k = std::fs::read(p).map_err(|e| {
                    Error::system(format!("reading the pre-shared key file {} (OXCCL_PSK_FILE)", p.display()), &e)
                })?;
                if k.last() == Some(&b'\n') {
                    k.pop();
                }
                if k.len() < PSK_MIN_BYTES {
                    return Err(short_key(k.len()));
                }
                master_from_psk(&k)
            }
            Encryption::UniqueId => master_from_secret(secret),
            Encryption::Invalid(m) => return Err(Error::invalid_argument(m.clone())),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_refusals() {
        let s = [3u8; 32];
        assert_eq!(Encryption::Off.master(&s).unwrap(), None);
        let a = Encryption::Psk(vec![1; 32]).master(&s).unwrap().unwrap();
        assert_ne!(Some(a), Encryption::Psk(vec![2; 32]).master(&s).unwrap());
        assert_ne!(Some(a), Encryption::UniqueId.master(&s).unwrap());
        assert!(Encryption::Psk(vec![1; 31]).master(&s).is_err());
        assert!(Encryption::Invalid("x".into()).master(&s).is_err());
        let e = Encryption::PskFile("/nonexistent/oxccl-psk".into()).master(&s).unwrap_err();
        assert!(e.message.contains("OXCCL_PSK_FILE"), "{e}");
        let f = std::env::temp_dir().join(format!("oxccl-psk-{}", std::process::id()));
        std::fs::write(&f, [vec![1u8; 32], b"\n".to_vec()].concat()).unwrap();
        assert_eq!(Encryption::PskFile(f.clone()).master(&s).unwrap(), Some(a), "trailing newline ignored");
        std::fs::remove_file(f).unwrap();
        assert!(format!("{:?}", Encryption::Psk(vec![7; 40])).contains("40 bytes"), "Debug hides the key");
    }
}
