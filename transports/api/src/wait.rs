//! Blocking without spinning: doorbells (non-blocking pipes) and `poll(2)` over many sources.
//!
//! Every wait in oxccl ends in [`wait_any`], which sleeps in the kernel until one source is ready,
//! the timeout expires, or a doorbell is rung. Callers spin briefly before they call it.

use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Readiness a wait asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Readable (data arrived, doorbell rung, peer closed).
    Read,
    /// Writable (socket send buffer has room).
    Write,
}

/// One thing a blocked rank waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitSource {
    /// The file descriptor to poll.
    pub fd: RawFd,
    /// What readiness is wanted.
    pub interest: Interest,
    /// Read and discard everything readable after the wait (doorbells).
    pub drain: bool,
}

impl WaitSource {
    /// Wait for `fd` to be readable.
    pub fn read(fd: RawFd) -> Self {
        WaitSource { fd, interest: Interest::Read, drain: false }
    }
    /// Wait for `fd` to be writable.
    pub fn write(fd: RawFd) -> Self {
        WaitSource { fd, interest: Interest::Write, drain: false }
    }
    /// Wait for a doorbell to be rung; drains it afterwards.
    pub fn doorbell(fd: RawFd) -> Self {
        WaitSource { fd, interest: Interest::Read, drain: true }
    }
}

/// Sleep until one of `sources` is ready or `timeout` passes. Doorbells that fired are drained.
/// Duplicate sources are allowed. Returns whether anything was ready.
pub fn wait_any(sources: &[WaitSource], timeout: Duration) -> Result<bool> {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(sources.len());
    for s in sources {
        let events = match s.interest {
            Interest::Read => libc::POLLIN,
            Interest::Write => libc::POLLOUT,
        };
        if let Some(p) = fds.iter_mut().find(|p| p.fd == s.fd) {
            p.events |= events;
        } else {
            fds.push(libc::pollfd { fd: s.fd, events, revents: 0 });
        }
    }
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(Error::system("poll", &err));
    }
    for p in &fds {
        if p.revents & libc::POLLIN != 0 && sources.iter().any(|s| s.fd == p.fd && s.drain) {
            drain_fd(p.fd);
        }
    }
    Ok(n > 0)
}

fn drain_fd(fd: RawFd) {
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: `buf` is valid for writes of its length; `fd` is a non-blocking descriptor owned
        // by the caller for the duration of the call.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r < buf.len() as isize {
            break;
        }
    }
}

/// Whether this process ignores SIGPIPE (Rust programs do; C programs that load oxccl's
/// `libnccl.so` usually do not), checked once.
fn sigpipe_ignored() -> bool {
    static IGNORED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        // SAFETY: a zeroed sigaction is a valid out-parameter; a NULL new action only queries.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
        }
    })
}

/// Write one byte to a non-blocking doorbell write end. A full pipe already means "rung".
///
/// The read end may belong to a process that has exited: the write then fails with EPIPE and
/// raises SIGPIPE, whose default action would kill a C program that uses oxccl. So unless the
/// process ignores SIGPIPE, the signal is blocked in this thread for the write and, if the write
/// raised it, consumed before it is unblocked (the usual technique of libraries that write to
/// pipes on behalf of their host).
pub fn ring_fd(fd: RawFd) {
    let b = 1u8;
    if sigpipe_ignored() {
        // SAFETY: writes one byte from a valid local; a bad or closed fd only yields an error code.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
        return;
    }
    // SAFETY: sigset operations on locals; pthread_sigmask changes this thread's mask only and
    // is restored below; sigtimedwait with a zero timeout consumes a pending SIGPIPE of this
    // thread without blocking; the write is as above.
    unsafe {
        let mut pipe_set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe_set);
        libc::sigaddset(&mut pipe_set, libc::SIGPIPE);
        libc::sigpending(&mut pending);
        let was_pending = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe_set, &mut old);
        let r = libc::write(fd, (&b as *const u8).cast(), 1);
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE) && !was_pending {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            while libc::sigtimedwait(&pipe_set, std::ptr::null_mut(), &zero) < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// A doorbell: a non-blocking pipe. The owner waits on the read end; others (possibly in other
/// processes, through `/proc/<pid>/fd/<n>`) write a byte to wake it.
#[derive(Debug)]
pub struct Doorbell {
    read: OwnedFd,
    write: OwnedFd,
}

impl Doorbell {
    /// Create a doorbell.
    pub fn new() -> Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if r != 0 {
            return Err(Error::system("pipe2 (doorbell)", &std::io::Error::last_os_error()));
        }
        // SAFETY: pipe2 succeeded, so both fds are fresh descriptors that nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Doorbell { read, write })
    }
    /// The end to wait on.
    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
    /// The end to ring (shared with peers through `/proc/<pid>/fd/<n>`).
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }
    /// Ring it.
    pub fn ring(&self) {
        ring_fd(self.write.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn doorbell_wakes_and_drains() {
        let d = Doorbell::new().unwrap();
        let t = Instant::now();
        assert!(!wait_any(&[WaitSource::doorbell(d.read_fd())], Duration::from_millis(20)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(15));
        for _ in 0..1000 {
            d.ring();
        }
        assert!(wait_any(&[WaitSource::doorbell(d.read_fd())], Duration::from_secs(5)).unwrap());
        // drained: the next wait times out again
        assert!(!wait_any(&[WaitSource::doorbell(d.read_fd())], Duration::from_millis(1)).unwrap());
    }
}
