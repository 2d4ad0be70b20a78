//! `ncclGetLastError`'s storage: static buffers that are never freed, so a pointer handed out
//! stays valid memory for the life of the process, whichever thread reads it while another
//! thread records a new error (PyTorch's watchdog reads it from its own thread).
//!
//! A new message goes into the next of [`SLOTS`] buffers and then becomes the current one: a
//! reader holding an older pointer sees its text unchanged until `SLOTS - 1` further errors
//! have been recorded, and always a NUL-terminated string.

use libc::c_char;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Buffers in rotation.
const SLOTS: usize = 16;
/// Bytes per buffer, the terminating NUL included (longer messages are cut).
const LEN: usize = 2048;

#[allow(clippy::declare_interior_mutable_const)] // a template for the array below, never used alone
const ZERO: AtomicU8 = AtomicU8::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: [AtomicU8; LEN] = [ZERO; LEN];
static BUFS: [[AtomicU8; LEN]; SLOTS] = [EMPTY; SLOTS];
/// The slot holding the newest message (`usize::MAX`: none yet).
static CURRENT: AtomicUsize = AtomicUsize::new(usize::MAX);
static WRITER: Mutex<()> = Mutex::new(());

/// Record `msg` as the last error.
pub fn set_last_error(msg: &str) {
    let _g = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let slot = CURRENT.load(Ordering::Relaxed).wrapping_add(1) % SLOTS;
    let buf = &BUFS[slot];
    let mut bytes: Vec<u8> = msg.bytes().map(|b| if b == 0 { b' ' } else { b }).collect();
    if bytes.len() > LEN - 1 {
        let mut cut = LEN - 1;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        bytes.truncate(cut);
    }
    for (i, b) in bytes.iter().enumerate() {
        buf[i].store(*b, Ordering::Relaxed);
    }
    buf[bytes.len()].store(0, Ordering::Relaxed);
    CURRENT.store(slot, Ordering::Release);
}

/// The newest message, NUL-terminated ("" before any error).
pub fn current() -> *const c_char {
    match CURRENT.load(Ordering::Acquire) {
        usize::MAX => c"".as_ptr(),
        // AtomicU8 has u8's layout: C reads the bytes as a string; the last byte of every
        // buffer is never written, so the string always ends inside it
        slot => BUFS[slot].as_ptr().cast(),
    }
}

/// Tests that read the last error take this, so they do not see each other's errors.
#[cfg(test)]
pub static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn old_pointers_stay_valid_and_terminated() {
        let _g = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        set_last_error("first");
        let p = current();
        // SAFETY: a static buffer, NUL-terminated.
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), "first");
        for i in 0..SLOTS - 2 {
            set_last_error(&format!("error {i}"));
        }
        // SAFETY: as above; not yet reused.
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), "first");
        let long = "é".repeat(3 * LEN);
        set_last_error(&long);
        // SAFETY: as above.
        let got = unsafe { CStr::from_ptr(current()) }.to_str().unwrap().to_string();
        assert!(got.len() < LEN && got.chars().all(|c| c == 'é'));
        // readers on other threads while errors are recorded: always a terminated string
        let r = std::thread::spawn(|| {
            for _ in 0..20_000 {
                // SAFETY: as above.
                let s = unsafe { CStr::from_ptr(current()) };
                assert!(s.to_bytes().len() < LEN);
            }
        });
        for i in 0..2_000 {
            set_last_error(&"x".repeat(i % (2 * LEN)));
        }
        r.join().unwrap();
    }
}
