//! A shared memory segment (memfd) and the ring layout inside it. All `unsafe` of this crate is here.

use oxccl_transport::{Error, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Offsets inside the segment. Producer and consumer fields live on separate cache lines.
pub const OFF_TAIL: usize = 64; // u64, written by the receiver on every consume
/// The waiting flags sit on a line of their own, written only when a side goes to sleep, so
/// reading them after every commit and consume costs no cache miss.
pub const OFF_SENDER_WAITING: usize = 192; // u32
pub const OFF_RECEIVER_WAITING: usize = 196; // u32
pub const OFF_MAGIC: usize = 128; // u32
pub const OFF_ATTACHED: usize = 132; // u32: sender mapped it
pub const OFF_SENDER_PID: usize = 136; // u32
pub const OFF_SENDER_DOORBELL: usize = 140; // u32 (fd number in the sender's process)
pub const OFF_SENDER_CLOSED: usize = 144; // u32
pub const OFF_RECEIVER_CLOSED: usize = 148; // u32
/// Single copy by `process_vm_readv`: 0 untested, 1 works, 2 refused (set by the receiver).
pub const OFF_CMA: usize = 152; // u32
/// Address, in the sender's process, of [`CMA_PROBE`] (the receiver reads it to test CMA).
pub const OFF_SENDER_PROBE: usize = 160; // u64
/// How far apart the two processes run, as the receiver last measured it (`placement.rs`).
pub const OFF_PLACEMENT: usize = 168; // u32
pub const OFF_SLOT_HEADERS: usize = 256; // nslots * 64 bytes
/// Stride of a slot header: one cache line holding the frame header, an inline payload and the
/// slot's flag (LL-style: a small message and its flag arrive in one line).
pub const SLOT_HEADER_STRIDE: usize = 64;
/// Where an inline payload starts inside a slot header line.
pub const SLOT_INLINE: usize = 40;
/// Largest payload carried inline in the slot header line.
pub const INLINE_MAX: usize = 16;
/// The slot's flag (u64) inside its header line: the number of the message it holds, plus one,
/// stored last (release) by the sender; the receiver polls it.
pub const SLOT_FLAG: usize = 56;
/// Where payloads start.
pub const OFF_PAYLOAD: usize = 4096;
/// Most slots that fit the header page.
pub const MAX_SLOTS: usize = (OFF_PAYLOAD - OFF_SLOT_HEADERS) / SLOT_HEADER_STRIDE;
/// Segment magic.
pub const MAGIC: u32 = 0x0CC1_5400;
/// A message sent by reference: `[SLOT_INLINE, +8)` of its header line holds the address and
/// `[SLOT_INLINE + 8, +8)` this mark xor the message number.
pub const BORROWED_MARK: u64 = 0xB0_2203_0CC1_0000;

/// What a receiver reads from a new sender to learn whether `process_vm_readv` works between
/// them (Yama's ptrace scope, seccomp or containers may forbid it).
pub static CMA_PROBE: u64 = 0x0CC1_C3A5_0000_0001;

/// Copy `dst.len()` bytes at `addr` in process `pid` into `dst` (single copy through the
/// kernel). Fails with the OS error if the kernel refuses or the range is not mapped there.
pub fn read_remote(pid: u32, addr: usize, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr().cast(), iov_len: dst.len() - done };
        let remote = libc::iovec { iov_base: (addr + done) as *mut libc::c_void, iov_len: dst.len() - done };
        // SAFETY: `local` describes writable memory we own (`dst[done..]`) for its whole length;
        // `remote` is only read by the kernel in the other process, which checks it and fails
        // with EFAULT if it is not mapped there; one iovec each.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "process_vm_readv read nothing"));
        }
        done += n as usize;
    }
    Ok(())
}

/// A mapping of a memfd segment, unmapped on drop.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-thread access goes through atomics or
// through the SPSC protocol that gives each slot a single owner at a time.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` only hands out atomics and slices whose ownership the ring
// protocol serialises.
unsafe impl Sync for Segment {}

impl Segment {
    /// Create an anonymous memfd of `len` bytes and map it; returns the mapping and the fd.
    pub fn create(len: usize) -> Result<(Segment, OwnedFd)> {
        let name = CString::new("oxccl-shm").unwrap();
        // SAFETY: `name` is a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::system("memfd_create for a shared-memory ring", &std::io::Error::last_os_error()));
        }
        // SAFETY: memfd_create returned a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a valid fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::system(
                format!("sizing a shared-memory ring to {len} bytes (is memory exhausted?)"),
                &e,
            ));
        }
        let seg = Self::map(fd.as_raw_fd(), len)?;
        Ok((seg, fd))
    }

    /// Open another process's memfd through `/proc/<pid>/fd/<fd>` and map it.
    pub fn open(pid: u32, fd: i32, len: usize) -> Result<Segment> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                died_or(pid, &e, || {
                    Error::system(
                        format!(
                            "opening peer's shared-memory segment {path} (peers on one host must be able to open each other's /proc/<pid>/fd; set NCCL_SHM_DISABLE=1 to use TCP)"
                        ),
                        &e,
                    )
                })
            })?;
        let meta = file.metadata().map_err(|e| Error::system("stat of a shared-memory segment", &e))?;
        if (meta.len() as usize) < len {
            return Err(Error::remote(format!("peer's shared-memory segment is {} bytes, expected {len}", meta.len())));
        }
        Self::map(file.as_raw_fd(), len)
    }

    fn map(fd: RawFd, len: usize) -> Result<Segment> {
        // SAFETY: mapping a valid fd of at least `len` bytes, shared, at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::system(
                format!("mmap of a {len}-byte shared-memory ring"),
                &std::io::Error::last_os_error(),
            ));
        }
        Ok(Segment { ptr: p.cast(), len })
    }

    /// A u64 atomic at `off` (8-aligned, inside the header page).
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= OFF_PAYLOAD);
        // SAFETY: in bounds and aligned (page-aligned mapping, 8-aligned offset); the memory lives
        // as long as `self`, and is only accessed atomically at this offset.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// A u32 atomic at `off` (4-aligned, inside the header page).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= OFF_PAYLOAD);
        // SAFETY: as in `u64_at`.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    /// Bytes `[off, off+len)`, read-only.
    ///
    /// The ring protocol guarantees that the other side does not write these bytes while the
    /// caller holds the slice (the slot belongs to the reader between `peek` and `consume`).
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds; exclusive ownership of the slot is given by the SPSC protocol.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// Bytes `[off, off+len)`, writable. `&mut self` makes the borrow unique on this side; the
    /// ring protocol guarantees the peer does not touch the slot meanwhile.
    pub fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds; unique on this side through `&mut self`; the peer does not access a
        // slot the SPSC protocol gave to us.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `map`; no borrow outlives `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Open a write end of a peer's doorbell (`/proc/<pid>/fd/<fd>`), non-blocking.
pub fn open_doorbell(pid: u32, fd: i32) -> Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/{pid}/fd/{fd}");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| died_or(pid, &e, || Error::system(format!("opening peer's doorbell {path}"), &e)))?;
    Ok(OwnedFd::from(f))
}

/// A failed open of `/proc/<pid>/fd/<n>` because the process is gone (or a zombie, whose
/// descriptors are closed) is the peer's death, said so; any other failure is `other()`.
fn died_or(pid: u32, e: &std::io::Error, other: impl FnOnce() -> Error) -> Error {
    let gone = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // the state is the field after the command name, which ends with the last ')'
        Ok(s) => {
            s.rsplit_once(')').is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
        }
    };
    if e.kind() != std::io::ErrorKind::NotFound || !gone {
        return other();
    }
    Error::remote(format!("its process (pid {pid}) died or exited before the connection was made"))
        .with_cause(oxccl_transport::Cause::PeerDied)
}
