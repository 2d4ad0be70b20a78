//! Host buffers are checked before use, so that a bad pointer is an error and never a crash: an
//! input must be readable and an output writable (a read-only receive buffer crashed the
//! process). Windows of up to two pages are probed at their first and last byte through the
//! kernel (`process_vm_readv`, and `process_vm_writev` writing the same bytes back for outputs),
//! which reports EFAULT instead of faulting; larger ones are checked page range by page range
//! against `/proc/self/maps`. Verdicts are remembered per thread, so the fast path pays a lookup
//! in a small array: a probed window as itself, a window checked against the maps as the whole
//! mappings it lies in (so the thousands of small buffers of one group, carved from one heap,
//! cost one read of the maps, not one each). Like NCCL's own registration caches, a verdict is
//! not revisited if the program later unmaps or protects that memory.

use oxccl::Error;
use std::cell::RefCell;

/// Remembered windows per kind: (start, end, writable).
const SEEN: usize = 8;

thread_local! {
    /// Kind 0: windows probed through the kernel; kind 1: whole mappings from the maps (kept
    /// apart, so that a stream of small probed inputs never evicts the mapping its outputs lie in).
    static OK: RefCell<[[(usize, usize, bool); SEEN]; 2]> = const { RefCell::new([[(0, 0, false); SEEN]; 2]) };
    /// Windows this thread probed through the kernel.
    static PROBES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// Reads of the maps by this thread (tests count them).
    static MAPS_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A verdict: the window it covers, whether readable, whether writable.
type Verdict = ((usize, usize), bool, bool);

/// The protections of `[p, end)`: `Some` when every byte is mapped, with the extent of the
/// mappings it lies in, `None` when a part is not; `Err` when the maps cannot be read (then the
/// caller is trusted).
fn protections(p: usize, end: usize) -> Result<Option<Verdict>, ()> {
    #[cfg(test)]
    MAPS_READS.with(|c| c.set(c.get() + 1));
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| ())?;
    let (mut at, mut r, mut w) = (p, true, true);
    let mut first = None;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
        if b <= at {
            continue;
        }
        if a > at {
            return Ok(None); // a hole
        }
        r &= perms.as_bytes().first() == Some(&b'r');
        w &= perms.as_bytes().get(1) == Some(&b'w');
        let from = *first.get_or_insert(a);
        at = b;
        if at >= end {
            return Ok(Some(((from, b), r, w)));
        }
    }
    Ok(None)
}

/// Probe the first and last byte of `[p, end)` for reading. (Not for writing: the kernel's
/// `process_vm_writev` was seen to succeed on a `PROT_READ` private mapping, so writability
/// always comes from the maps.)
fn probe(p: usize, end: usize) -> Result<Option<Verdict>, ()> {
    use libc::{c_void, iovec};
    let mut local = [0u8; 2];
    let remote =
        [iovec { iov_base: p as *mut c_void, iov_len: 1 }, iovec { iov_base: (end - 1) as *mut c_void, iov_len: 1 }];
    let liov = [iovec { iov_base: local.as_mut_ptr().cast(), iov_len: 2 }];
    // SAFETY: the kernel reads two bytes of our own address space, checking the addresses; the
    // local buffer holds two bytes.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), liov.as_ptr(), 1, remote.as_ptr(), 2, 0) };
    if n != 2 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        return if n < 0 && errno != Some(libc::EFAULT) { Err(()) } else { Ok(None) };
    }
    // readable; whether writable is not known, and a read-only verdict must not be cached as
    // writable: report it as not writable (only reads are probed)
    Ok(Some(((p, end), true, false)))
}

/// Check that `len` bytes at `p` can be read (and written, with `write`) by this process.
/// `cuda`: whether the CUDA driver is loaded (the message then says what an unmapped pointer
/// may be).
pub fn check(p: usize, len: usize, write: bool, what: &str, name: &str, cuda: bool) -> Result<(), Error> {
    if p == 0 || len == 0 {
        return Ok(());
    }
    let end = p.saturating_add(len);
    if OK.with(|s| s.borrow().iter().flatten().any(|&(a, b, wr)| a <= p && end <= b && (wr || !write))) {
        return Ok(());
    }
    // small inputs are probed (one system call), except every 4th miss, which reads the maps so
    // that a stream of inputs from one allocation ends up covered by its mapping's verdict
    let quick = len <= 8192
        && !write
        && PROBES.with(|c| {
            c.set(c.get().wrapping_add(1));
            c.get() % 4 != 0
        });
    let probed = if quick { probe(p, end) } else { protections(p, end) };
    let kind = usize::from(!quick);
    let Ok(prot) = probed else {
        return Ok(()); // neither check is available here: trust the caller, as NCCL does
    };
    let bad = |why: &str| Err(Error::invalid_argument(format!("{name}: {what} {p:#x} ({len} bytes) {why}")));
    match prot {
        None if cuda => bad("is not host memory of this process (and not device memory CUDA knows)"),
        None => {
            bad("is not host memory of this process, and CUDA is not loaded here (a device pointer needs the CUDA \
             driver in this process; otherwise the pointer is invalid)")
        }
        Some((_, false, _)) => bad("is not readable memory"),
        Some((_, true, false)) if write => bad("is read-only memory, and the operation writes its results there"),
        Some(((a, b), _, wr)) => {
            OK.with(|s| {
                let s = &mut s.borrow_mut()[kind];
                s.rotate_right(1);
                s[0] = (a, b, wr);
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_and_unmapped_windows_are_refused() {
        // (the last error is per process: tests that record errors take turns)
        let _g = crate::last_error::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let page = 4096;
        // a hole: a mapping with its middle page unmapped before anything is checked (a verdict
        // covers whole mappings, and is not revisited when they change)
        // SAFETY: a fresh anonymous mapping of this test, then its own middle page unmapped.
        let h = unsafe {
            let h = libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as usize;
            libc::munmap((h + page) as *mut libc::c_void, page);
            h
        };
        let mut v = vec![0u8; 1 << 16];
        let p = v.as_mut_ptr() as usize;
        assert!(check(p, v.len(), true, "recvbuff", "t", false).is_ok());
        assert!(check(p, v.len(), true, "recvbuff", "t", false).is_ok(), "remembered");
        let ro = c"read-only".as_ptr() as usize;
        assert!(check(ro, 4, false, "sendbuff", "t", false).is_ok());
        let e = check(ro, 4, true, "recvbuff", "t", false).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        assert!(check(16, 64, false, "sendbuff", "t", false).unwrap_err().to_string().contains("CUDA is not loaded"));
        // large windows: a read-only page in the middle, then a hole in the middle
        // SAFETY: a fresh anonymous mapping of this test, then changes to its own pages.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        // (a verdict is remembered: a window's protections changed after its first use are not seen)
        // SAFETY: the middle page of the mapping above.
        unsafe { libc::mprotect((m + page) as *mut libc::c_void, page, libc::PROT_READ) };
        let e = check(m + 8, 3 * page - 16, true, "recvbuff", "t", true).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        assert!(check(m + 8, 3 * page - 16, false, "sendbuff", "t", true).is_ok());
        assert!(check(m + 2 * page, page, true, "recvbuff", "t", true).is_ok());
        // SAFETY: the mapping above.
        unsafe { libc::munmap(m as *mut libc::c_void, 3 * page) };
        let e = check(h + 4, 3 * page - 8, false, "sendbuff", "t", true).unwrap_err();
        assert!(e.to_string().contains("not host memory"), "{e}");
        // SAFETY: the rest of that mapping.
        unsafe {
            libc::munmap(h as *mut libc::c_void, page);
            libc::munmap((h + 2 * page) as *mut libc::c_void, page);
        }
    }

    #[test]
    fn many_windows_of_one_mapping_read_the_maps_once() {
        // the buffers of a group of thousands of small operations, carved from one allocation
        let mut v = vec![0f32; 1 << 20];
        let base = v.as_mut_ptr() as usize;
        let before = MAPS_READS.with(|c| c.get());
        let inputs = vec![0f32; 1 << 20];
        for i in 0..10_000 {
            check(inputs.as_ptr() as usize + i * 4, 4, false, "sendbuff", "t", false).unwrap();
            check(base + i * 4, 4, true, "recvbuff", "t", false).unwrap();
        }
        assert!(MAPS_READS.with(|c| c.get()) - before <= 2);
    }
}
