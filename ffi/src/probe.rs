//! Reading a caller's structs and strings without trusting the pointer: `process_vm_readv` on
//! our own process reports EFAULT for unmapped memory instead of faulting, so a garbage config
//! pointer is an `ncclInvalidArgument`, not a crash.

use libc::{c_char, c_void};
use oxccl::Error;

/// Copy `len` bytes from `p` in this process, or `None` if any of them is not readable. Where
/// the kernel refuses the call itself (seccomp, ptrace policy) the memory is read directly, as
/// NCCL would.
pub fn read_bytes(p: usize, len: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; len];
    if len == 0 {
        return Some(out);
    }
    let liov = [libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: len }];
    let riov = [libc::iovec { iov_base: p as *mut c_void, iov_len: len }];
    // SAFETY: the kernel reads our own address space and checks the remote range; the local
    // buffer holds `len` bytes.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), liov.as_ptr(), 1, riov.as_ptr(), 1, 0) };
    if n == len as isize {
        return Some(out);
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    if n < 0 && errno != Some(libc::EFAULT) {
        // SAFETY: the check is unavailable here: trust the caller (NCCL's contract), as NCCL does.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, out.as_mut_ptr(), len) };
        return Some(out);
    }
    None
}

/// Write `bytes` at `p` in this process; `false` if any of them is not writable (then the
/// bytes before the first unwritable page may have been written).
pub fn write_bytes(p: usize, bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let liov = [libc::iovec { iov_base: bytes.as_ptr() as *mut c_void, iov_len: bytes.len() }];
    let riov = [libc::iovec { iov_base: p as *mut c_void, iov_len: bytes.len() }];
    // SAFETY: the kernel writes our own address space and checks the remote range; the local
    // buffer holds `bytes.len()` bytes.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), liov.as_ptr(), 1, riov.as_ptr(), 1, 0) };
    if n == bytes.len() as isize {
        return true;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    if n < 0 && errno != Some(libc::EFAULT) {
        // SAFETY: the check is unavailable here: trust the caller (NCCL's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len()) };
        return true;
    }
    false
}

/// A NUL-terminated string of at most `max` bytes at `p` (NULL is `Ok(None)`).
pub fn read_cstr(p: *const c_char, max: usize, what: &str) -> Result<Option<String>, Error> {
    Ok(read_cstr_bytes(p, max, what)?.map(|s| String::from_utf8_lossy(&s).into_owned()))
}

/// [`read_cstr`]'s bytes as they are (for keys, which need not be UTF-8).
pub fn read_cstr_bytes(p: *const c_char, max: usize, what: &str) -> Result<Option<Vec<u8>>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    let mut s = Vec::new();
    let mut at = p as usize;
    while s.len() < max {
        // read up to the end of the page, so a string near unmapped memory is still readable
        let n = (4096 - at % 4096).min(max - s.len());
        let chunk = read_bytes(at, n)
            .ok_or_else(|| Error::invalid_argument(format!("{what} ({at:#x}) points to unreadable memory")))?;
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            s.extend_from_slice(&chunk[..end]);
            return Ok(Some(s));
        }
        s.extend_from_slice(&chunk);
        at += n;
    }
    Err(Error::invalid_argument(format!("{what} is not a NUL-terminated string of at most {max} bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_memory_is_reported_not_faulted() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        assert!(read_bytes(8, 16).is_none());
        let v = [1u8, 2, 3];
        assert_eq!(read_bytes(v.as_ptr() as usize, 3).unwrap(), v);
        assert_eq!(read_cstr(c"ring".as_ptr(), 64, "s").unwrap().as_deref(), Some("ring"));
        assert!(read_cstr(16 as *const c_char, 64, "s").is_err());
        assert_eq!(read_cstr(std::ptr::null(), 64, "s").unwrap(), None);
        let mut out = [0u8; 4];
        assert!(write_bytes(out.as_mut_ptr() as usize, &[9, 8, 7, 6]));
        assert_eq!(out, [9, 8, 7, 6]);
        assert!(!write_bytes(8, &[1]));
        assert!(!write_bytes(c"ro".as_ptr() as usize, &[1])); // read-only data
        let long = [b'a' as c_char; 100];
        assert!(read_cstr(long.as_ptr(), 50, "s").is_err());
    }
}
