//! Host buffers are checked before use, so that a bad pointer is an error and never a crash: an
//! input must be readable and an output writable over its whole window (a read-only receive
//! buffer crashed the process). The protections come from `/proc/self/maps`, page range by page
//! range; verdicts are remembered per thread (training loops reuse their buffers), so the fast
//! path pays a lookup in a small array.

use oxccl::Error;
use std::cell::RefCell;

/// Remembered windows: (start, end, writable).
const SEEN: usize = 16;

thread_local! {
    static OK: RefCell<[(usize, usize, bool); SEEN]> = const { RefCell::new([(0, 0, false); SEEN]) };
}

/// The protections of `[p, end)`: `Some((readable, writable))` when every byte is mapped, `None`
/// when a part is not; `Err` when the maps cannot be read (then the caller is trusted).
fn protections(p: usize, end: usize) -> Result<Option<(bool, bool)>, ()> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| ())?;
    let (mut at, mut r, mut w) = (p, true, true);
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
        at = b;
        if at >= end {
            return Ok(Some((r, w)));
        }
    }
    Ok(None)
}

/// Check that `len` bytes at `p` can be read (and written, with `write`) by this process.
/// `cuda`: whether the CUDA driver is loaded (the message then says what an unmapped pointer
/// may be).
pub fn check(p: usize, len: usize, write: bool, what: &str, name: &str, cuda: bool) -> Result<(), Error> {
    if p == 0 || len == 0 {
        return Ok(());
    }
    let end = p.saturating_add(len);
    if OK.with(|s| s.borrow().iter().any(|&(a, b, wr)| a <= p && end <= b && (wr || !write))) {
        return Ok(());
    }
    let Ok(prot) = protections(p, end) else {
        return Ok(()); // no /proc: trust the caller, as NCCL does
    };
    let bad = |why: &str| Err(Error::invalid_argument(format!("{name}: {what} {p:#x} ({len} bytes) {why}")));
    match prot {
        None if cuda => bad("is not host memory of this process (and not device memory CUDA knows)"),
        None => bad(
            "is not host memory of this process, and CUDA is not loaded here (a device pointer needs the CUDA \
             driver in this process; otherwise the pointer is invalid)",
        ),
        Some((false, _)) => bad("is not readable memory"),
        Some((true, false)) if write => bad("is read-only memory, and the operation writes its results there"),
        Some((_, wr)) => {
            OK.with(|s| {
                let mut s = s.borrow_mut();
                s.rotate_right(1);
                s[0] = (p, end, wr);
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
        let mut v = vec![0u8; 1 << 16];
        let p = v.as_mut_ptr() as usize;
        assert!(check(p, v.len(), true, "recvbuff", "t", false).is_ok());
        assert!(check(p, v.len(), true, "recvbuff", "t", false).is_ok(), "remembered");
        let ro = c"read-only".as_ptr() as usize;
        assert!(check(ro, 4, false, "sendbuff", "t", false).is_ok());
        let e = check(ro, 4, true, "recvbuff", "t", false).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        assert!(check(16, 64, false, "sendbuff", "t", false).unwrap_err().to_string().contains("CUDA is not loaded"));
        // a window that runs off its mapping
        let e = check(usize::MAX - 100, 64, false, "sendbuff", "t", true).unwrap_err();
        assert!(e.to_string().contains("not host memory"), "{e}");
    }
}
