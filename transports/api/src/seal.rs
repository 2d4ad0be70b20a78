//! Authenticated encryption of connection frames: AES-256-GCM, keys derived with HKDF-SHA256.
//!
//! **Why these.** AES-256-GCM runs on the AES-NI and carry-less multiply units that every x86
//! server of the last decade has (and on ARMv8's crypto extension), several GB/s per core, which
//! matters because every byte between hosts passes through it twice. `ring` supplies it: the
//! constant-time assembly of BoringSSL behind an API that takes a nonce by value and cannot
//! return unauthenticated plaintext. ChaCha20-Poly1305 would be the choice on CPUs without AES
//! instructions; none of the machines oxccl targets lacks them.
//!
//! **Keys.** A job's master key comes from its pre-shared key ([`master_from_psk`]) or from the
//! unique id's secret ([`master_from_secret`]). Every connection (and every lane of one) derives
//! its own key with [`derive()`] from the master key and the connection's fresh random token, so
//! no two connections share a key and nonces can be plain counters.
//!
//! **Nonces.** A [`Sealer`] numbers its frames 0, 1, 2, ... and the matching [`Opener`] expects
//! exactly that sequence: the counter is never sent, so a replayed, dropped or reordered frame
//! fails authentication like an altered one. Both refuse to go on after [`FRAME_LIMIT`] frames,
//! far before the 64-bit counter could wrap.

use crate::{Cause, Error, Result};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;

/// Bytes of the authentication tag after each sealed frame.
pub const TAG_BYTES: usize = 16;
/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Frames one key may seal or open; the connection fails rather than go past it (2^40 frames:
/// about 280 PB at 256 KiB per frame, and far below GCM's limits for one key).
pub const FRAME_LIMIT: u64 = 1 << 40;
/// Shortest pre-shared key accepted (as NCCL's `ncclSetEncryption`).
pub const PSK_MIN_BYTES: usize = 32;

/// A job's master key (what [`master_from_psk`] or [`master_from_secret`] returns), with a
/// `Debug` that does not print it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MasterKey(pub [u8; KEY_BYTES]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn hkdf32(salt: &[u8], ikm: &[u8], info: &[&[u8]]) -> [u8; KEY_BYTES] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let mut out = [0u8; KEY_BYTES];
    prk.expand(info, Len(KEY_BYTES)).and_then(|okm| okm.fill(&mut out)).expect("HKDF-SHA256 can expand 32 bytes");
    out
}

/// The master key of a pre-shared key (at least [`PSK_MIN_BYTES`] bytes, checked by the caller).
pub fn master_from_psk(psk: &[u8]) -> [u8; KEY_BYTES] {
    hkdf32(b"oxccl encryption v1: psk", psk, &[b"master"])
}

/// The master key derived from a job's unique-id secret (encryption with no extra setup: anyone
/// who holds the unique id can read the traffic, as anyone who holds it can join the job).
pub fn master_from_secret(secret: &[u8; 32]) -> [u8; KEY_BYTES] {
    hkdf32(b"oxccl encryption v1: unique id", secret, &[b"master"])
}

/// The key of one connection direction: `purpose` names the protocol (`b"tcp frames"`),
/// `context` is what makes the connection unique (its communicator and fresh token).
pub fn derive(master: &[u8; KEY_BYTES], purpose: &[u8], context: &[u8]) -> [u8; KEY_BYTES] {
    hkdf32(context, master, &[b"oxccl connection key v1: ", purpose])
}

/// A value that tells whether two sides hold the same master key without revealing it (a keyed
/// hash of `context`): published at connection setup so that a wrong key fails there, on both
/// sides, instead of on the first frame.
pub fn key_check(master: &[u8; KEY_BYTES], context: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new_keyed(master);
    h.update(b"oxccl key check v1");
    h.update(context);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// Bytes of a connection's encryption word: mode (u32 LE, 0 plain, 1 AES-256-GCM) and a 16-byte
/// key check.
pub const WORD_BYTES: usize = 20;

/// A side's encryption word for a connection identified by `context`: what the receiver's setup
/// blob and the sender's hello carry, so that sides that disagree fail at setup.
pub fn mode_word(master: Option<&MasterKey>, context: &[u8]) -> [u8; WORD_BYTES] {
    let mut w = [0u8; WORD_BYTES];
    if let Some(m) = master {
        w[..4].copy_from_slice(&1u32.to_le_bytes());
        w[4..].copy_from_slice(&key_check(&m.0, context));
    }
    w
}

/// The setup error when `peer`'s encryption word (`theirs`) is not this rank's (`mine`), on a
/// connection of `what` ("TCP", "RDMA").
pub fn mode_mismatch(peer: usize, what: &str, mine: &[u8; WORD_BYTES], theirs: &[u8; WORD_BYTES]) -> Error {
    let enc = |w: &[u8; WORD_BYTES]| w[..4] != [0; 4];
    let how = match (enc(mine), enc(theirs)) {
        (true, false) => format!("this rank encrypts its {what} traffic and rank {peer} does not"),
        (false, true) => format!("rank {peer} encrypts its {what} traffic and this rank does not"),
        _ => format!("this rank and rank {peer} encrypt their {what} traffic with different keys"),
    };
    Error::invalid_usage(format!(
        "{how}: every rank needs the same encryption setting and key (OXCCL_ENCRYPT, OXCCL_PSK_FILE or \
         ncclSetEncryption)"
    ))
    .with_peer(peer)
    .with_cause(Cause::Mismatch)
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn key(k: &[u8; KEY_BYTES]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k).expect("a 32-byte AES-256-GCM key"))
}

fn exhausted() -> Error {
    Error::internal(format!(
        "an encrypted connection reached its limit of {FRAME_LIMIT} frames for one key; it stops rather than reuse a \
         nonce (recreate the communicator)"
    ))
}

/// The sending side of one encrypted direction: seals frames in place, numbering them.
pub struct Sealer {
    key: LessSafeKey,
    next: u64,
}

impl Sealer {
    /// A sealer whose first frame is number 0.
    pub fn new(k: &[u8; KEY_BYTES]) -> Sealer {
        Sealer { key: key(k), next: 0 }
    }

    /// Encrypt `buf` in place, authenticating it and `aad`; returns the tag to send after it.
    pub fn seal(&mut self, aad: &[u8], buf: &mut [u8]) -> Result<[u8; TAG_BYTES]> {
        if self.next >= FRAME_LIMIT {
            return Err(exhausted());
        }
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(self.next), Aad::from(aad), buf)
            .map_err(|_| Error::internal("AES-GCM refused to seal a frame"))?;
        self.next += 1;
        let mut t = [0u8; TAG_BYTES];
        t.copy_from_slice(tag.as_ref());
        Ok(t)
    }
}

/// The receiving side of one encrypted direction: opens frames in place, in order.
pub struct Opener {
    key: LessSafeKey,
    next: u64,
}

impl Opener {
    /// An opener that expects frame number 0 first.
    pub fn new(k: &[u8; KEY_BYTES]) -> Opener {
        Opener { key: key(k), next: 0 }
    }

    /// Decrypt `sealed` (ciphertext then the [`TAG_BYTES`]-byte tag) in place; on success the
    /// plaintext is `sealed[..len - TAG_BYTES]`. A frame that fails authentication is an error
    /// with [`Cause::Tampered`], and its bytes must not be used.
    pub fn open(&mut self, aad: &[u8], sealed: &mut [u8]) -> Result<()> {
        if self.next >= FRAME_LIMIT {
            return Err(exhausted());
        }
        if sealed.len() < TAG_BYTES {
            return Err(tampered(self.next));
        }
        match self.key.open_in_place(nonce(self.next), Aad::from(aad), sealed) {
            Ok(_) => {
                self.next += 1;
                Ok(())
            }
            Err(_) => Err(tampered(self.next)),
        }
    }
}

fn tampered(n: u64) -> Error {
    Error::remote(format!(
        "encrypted frame {n} failed authentication: it was altered, forged, replayed or reordered in transit, or the \
         two sides use different keys; nothing from it was delivered"
    ))
    .with_cause(Cause::Tampered)
}

/// A message authenticator for short messages that may arrive out of order (GMAC: AES-256-GCM
/// over no plaintext): the sender numbers its messages and sends the number; the receiver
/// checks the tag and refuses numbers it has seen ([`Window`]).
pub struct Mac {
    key: LessSafeKey,
}

impl Mac {
    /// An authenticator under `k` (one key per direction: numbers are nonces).
    pub fn new(k: &[u8; KEY_BYTES]) -> Mac {
        Mac { key: key(k) }
    }

    /// The tag of message number `n` with contents `data`.
    pub fn tag(&self, n: u64, data: &[u8]) -> [u8; TAG_BYTES] {
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(n), Aad::from(data), &mut [])
            .expect("AES-GCM seals an empty message");
        let mut t = [0u8; TAG_BYTES];
        t.copy_from_slice(tag.as_ref());
        t
    }

    /// Whether `tag` is message `n`'s with contents `data`.
    pub fn verify(&self, n: u64, data: &[u8], tag: &[u8]) -> bool {
        let mut buf = [0u8; TAG_BYTES];
        if tag.len() != TAG_BYTES {
            return false;
        }
        buf.copy_from_slice(tag);
        self.key.open_in_place(nonce(n), Aad::from(data), &mut buf).is_ok()
    }
}

/// The message numbers a receiver has accepted, for numbers that may arrive out of order: the
/// highest, and which of the 64 below it were seen. A number seen before, or more than 64 below
/// the highest, is refused (a replay).
#[derive(Default)]
pub struct Window {
    top: Option<u64>,
    seen: u64,
}

impl Window {
    /// Accept `n` once: false if it was seen or is too old.
    pub fn accept(&mut self, n: u64) -> bool {
        let Some(top) = self.top else {
            self.top = Some(n);
            self.seen = 1;
            return true;
        };
        if n > top {
            let shift = n - top;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.top = Some(n);
            return true;
        }
        let back = top - n;
        if back >= 64 || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

/// Fill `out` with cryptographically secure random bytes (`ring`'s system generator).
pub fn random(out: &mut [u8]) -> Result<()> {
    use ring::rand::SecureRandom;
    ring::rand::SystemRandom::new().fill(out).map_err(|_| Error::internal("the system random generator failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Sealer, Opener) {
        let k = derive(&master_from_psk(&[7u8; 40]), b"test", b"conn 1");
        (Sealer::new(&k), Opener::new(&k))
    }

    fn frame(s: &mut Sealer, aad: &[u8], text: &[u8]) -> Vec<u8> {
        let mut b = text.to_vec();
        let tag = s.seal(aad, &mut b).unwrap();
        b.extend_from_slice(&tag);
        b
    }

    #[test]
    fn round_trip_in_order() {
        let (mut s, mut o) = pair();
        for i in 0..5u8 {
            let text = vec![i; 100 + i as usize];
            let mut f = frame(&mut s, b"hdr", &text);
            assert_ne!(&f[..text.len()], &text[..], "ciphertext differs from plaintext");
            o.open(b"hdr", &mut f).unwrap();
            assert_eq!(&f[..text.len()], &text[..]);
        }
    }

    #[test]
    fn any_flipped_bit_fails() {
        let (mut s, _) = pair();
        let f = frame(&mut s, b"aad", b"the marker OXCCL-SECRET-MARKER");
        for byte in 0..f.len() {
            let (_, mut o) = pair();
            let mut g = f.clone();
            g[byte] ^= 1 << (byte % 8);
            let e = o.open(b"aad", &mut g).unwrap_err();
            assert_eq!(e.cause, Some(Cause::Tampered), "byte {byte}");
        }
        let (_, mut o) = pair();
        assert_eq!(o.open(b"aaD", &mut f.clone()).unwrap_err().cause, Some(Cause::Tampered), "altered aad");
    }

    #[test]
    fn replay_and_reorder_fail() {
        let (mut s, mut o) = pair();
        let f0 = frame(&mut s, b"", b"first");
        let f1 = frame(&mut s, b"", b"second");
        assert!(o.open(b"", &mut f1.clone()).is_err(), "frame 1 before frame 0");
        let (_, mut o) = pair();
        o.open(b"", &mut f0.clone()).unwrap();
        assert!(o.open(b"", &mut f0.clone()).is_err(), "frame 0 replayed");
        o.open(b"", &mut f1.clone()).unwrap();
    }

    #[test]
    fn keys_differ_per_connection_and_key_check_tells() {
        let m = master_from_psk(&[1u8; 32]);
        assert_ne!(derive(&m, b"tcp", b"a"), derive(&m, b"tcp", b"b"));
        assert_ne!(derive(&m, b"tcp", b"a"), derive(&m, b"rdma", b"a"));
        assert_ne!(m, master_from_psk(&[2u8; 32]));
        assert_ne!(m, master_from_secret(&[1u8; 32]));
        assert_eq!(key_check(&m, b"t"), key_check(&master_from_psk(&[1u8; 32]), b"t"));
        assert_ne!(key_check(&m, b"t"), key_check(&master_from_psk(&[2u8; 32]), b"t"));
    }

    #[test]
    fn macs_verify_and_windows_refuse_replays() {
        let m = Mac::new(&[3; 32]);
        let t = m.tag(5, b"notify 7");
        assert!(m.verify(5, b"notify 7", &t));
        assert!(!m.verify(6, b"notify 7", &t) && !m.verify(5, b"notify 8", &t));
        assert!(!Mac::new(&[4; 32]).verify(5, b"notify 7", &t));
        let mut w = Window::default();
        for n in [3, 5, 4, 70, 10, 69] {
            assert!(w.accept(n), "{n}");
        }
        for n in [3, 5, 70, 6, 1000 - 1000] {
            assert!(!w.accept(n), "{n} again or too old");
        }
    }

    #[test]
    fn stops_at_the_frame_limit() {
        let (mut s, mut o) = pair();
        s.next = FRAME_LIMIT;
        o.next = FRAME_LIMIT;
        assert!(s.seal(b"", &mut [0u8; 4]).is_err());
        assert!(o.open(b"", &mut [0u8; 20]).is_err());
    }
}
