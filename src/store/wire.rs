//! The c10d TCPStore wire protocol: request codes, limits, and the encoders and decoders both
//! sides use.

use std::io::Read;

pub(super) const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
pub(super) const MAX_KEY: u64 = 8 << 10;
pub(super) const MAX_VALUE: u64 = 64 << 20;
pub(super) const MAX_KEYS: u64 = 1 << 20;

// ---- wire protocol ---------------------------------------------------------------------------

pub(super) mod q {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

pub(super) fn put_bytes(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_ne_bytes());
    b.extend_from_slice(s);
}

/// Keys travel with c10d's `/` prefix (what `TCPStore` clients send), so keys are shared with
/// torch processes using the same store.
pub(super) fn put_key(b: &mut Vec<u8>, k: &str) {
    b.extend_from_slice(&(k.len() as u64 + 1).to_ne_bytes());
    b.push(b'/');
    b.extend_from_slice(k.as_bytes());
}

pub(super) fn read_exact(s: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

pub(super) fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

pub(super) fn read_sized(s: &mut impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let n = read_u64(s)?;
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("length {n} exceeds {max}")));
    }
    read_exact(s, n as usize)
}

pub(super) fn read_key(s: &mut impl Read) -> std::io::Result<String> {
    String::from_utf8(read_sized(s, MAX_KEY)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "key is not UTF-8"))
}
