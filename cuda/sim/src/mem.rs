//! Simulated device memory: host code cannot touch it.
//!
//! Each allocation is a memfd mapped twice: at the device address with `PROT_NONE` (so a host
//! dereference of a device pointer crashes, as it would on a GPU) and at a private shadow
//! address, read and written only by the simulated copy engine and kernels. IPC handles name the
//! owner's pid and memfd, which another process opens through `/proc/<pid>/fd`.

use crate::{Fail, CUDA_ERROR_ALREADY_MAPPED, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// Allocations are aligned (and device addresses spaced) like a GPU's: 64 KiB pages.
pub const PAGE: usize = 64 << 10;

/// Where an allocation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `cuMemAlloc` in this process.
    Own,
    /// `cuIpcOpenMemHandle` of allocation `id` of process `pid`.
    Ipc { pid: i32, id: u64 },
}

struct Alloc {
    len: usize,
    map_len: usize,
    shadow: usize,
    fd: OwnedFd,
    device: i32,
    id: u64,
    origin: Origin,
}

#[derive(Default)]
struct Table {
    /// Live allocations by device address.
    live: BTreeMap<u64, Alloc>,
    /// Ranges freed lately (device address, length), to name use-after-free.
    freed: Vec<(u64, usize)>,
    bytes: usize,
    next_id: u64,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut g = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Table::default))
}

fn os(what: &str) -> Fail {
    Fail::new(CUDA_ERROR_OUT_OF_MEMORY, format!("{what}: {}", std::io::Error::last_os_error()))
}

/// Map `fd` (`len` bytes) at a fresh 64 KiB-aligned device address (`PROT_NONE`) and at a shadow
/// address (read-write); returns (device address, mapped length, shadow).
fn map_twice(fd: &OwnedFd, len: usize) -> Result<(u64, usize, usize), Fail> {
    let map_len = len.max(1).div_ceil(PAGE) * PAGE;
    // SAFETY: a fresh reservation of map_len + PAGE bytes, no fixed address.
    let res = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len + PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if res == libc::MAP_FAILED {
        return Err(os("reserving device addresses"));
    }
    let aligned = (res as usize).div_ceil(PAGE) * PAGE;
    // SAFETY: [aligned, aligned + map_len) lies inside the reservation just made; MAP_FIXED
    // replaces that part of it with the memfd, still PROT_NONE.
    let dev = unsafe {
        libc::mmap(aligned as *mut _, map_len, libc::PROT_NONE, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0)
    };
    if dev == libc::MAP_FAILED {
        // SAFETY: the reservation made above.
        unsafe { libc::munmap(res, map_len + PAGE) };
        return Err(os("mapping device memory"));
    }
    // SAFETY: a fresh shared read-write mapping of the memfd.
    let shadow = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if shadow == libc::MAP_FAILED {
        // SAFETY: the reservation made above.
        unsafe { libc::munmap(res, map_len + PAGE) };
        return Err(os("mapping device memory for the simulated copy engine"));
    }
    // give back the reservation's slack around the aligned window
    let (lo, hi) = (res as usize, res as usize + map_len + PAGE);
    // SAFETY: both ranges are parts of the reservation outside the device window.
    unsafe {
        if aligned > lo {
            libc::munmap(lo as *mut _, aligned - lo);
        }
        if hi > aligned + map_len {
            libc::munmap((aligned + map_len) as *mut _, hi - aligned - map_len);
        }
    }
    Ok((aligned as u64, map_len, shadow as usize))
}

/// `cuMemAlloc` on `device`.
pub fn alloc(len: usize, device: i32) -> Result<u64, Fail> {
    let limit = crate::config().mem_bytes;
    if with(|t| t.bytes + len > limit) {
        return Err(Fail::new(CUDA_ERROR_OUT_OF_MEMORY, format!("{len} bytes exceed the simulated device's {limit}")));
    }
    // SAFETY: plain system call with a NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"oxccl-cuda-sim".as_ptr(), 0) };
    if raw < 0 {
        return Err(os("memfd_create"));
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let map_len = len.max(1).div_ceil(PAGE) * PAGE;
    // SAFETY: sizes the memfd just made.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) } != 0 {
        return Err(os("sizing device memory"));
    }
    let (dev, map_len, shadow) = map_twice(&fd, len)?;
    with(|t| {
        t.next_id += 1;
        let id = t.next_id;
        t.bytes += len;
        t.freed.retain(|&(a, l)| !(a < dev + map_len as u64 && dev < a + l as u64));
        t.live.insert(dev, Alloc { len, map_len, shadow, fd, device, id, origin: Origin::Own });
    });
    Ok(dev)
}

fn unmap(a: &Alloc, dev: u64) {
    // SAFETY: both mappings were made by map_twice for this allocation and are dropped once.
    unsafe {
        libc::munmap(dev as *mut _, a.map_len);
        libc::munmap(a.shadow as *mut _, a.map_len);
    }
}

/// `cuMemFree` (`ipc`: `cuIpcCloseMemHandle`): only the base address of a live allocation of that
/// origin; a second free is an error naming the address.
pub fn free(dev: u64, ipc: bool) -> Result<(), Fail> {
    let what = if ipc { "cuIpcCloseMemHandle" } else { "cuMemFree" };
    with(|t| {
        let ok = t.live.get(&dev).is_some_and(|a| (a.origin != Origin::Own) == ipc);
        if !ok {
            let why = if t.freed.iter().any(|&(a, l)| a <= dev && dev < a + l as u64) {
                "was already freed (double free)"
            } else if t.live.range(..=dev).next_back().is_some_and(|(b, a)| dev < b + a.len as u64) {
                "is inside an allocation, not its start"
            } else {
                "is not a device allocation of this process"
            };
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("{what}({dev:#x}): the address {why}")));
        }
        let a = t.live.remove(&dev).unwrap();
        if a.origin == Origin::Own {
            t.bytes -= a.len;
        }
        unmap(&a, dev);
        t.freed.push((dev, a.map_len));
        if t.freed.len() > 4096 {
            t.freed.remove(0);
        }
        Ok(())
    })
}

/// The shadow address of `[dev, dev + len)`, which must lie inside one live allocation.
pub fn shadow(dev: u64, len: usize, what: &str) -> Result<*mut u8, Fail> {
    with(|t| {
        if let Some((&base, a)) = t.live.range(..=dev).next_back() {
            if dev < base + a.len as u64 {
                if dev + len as u64 > base + a.len as u64 {
                    return Err(Fail::new(
                        CUDA_ERROR_INVALID_VALUE,
                        format!(
                            "{what}: {len} bytes at {dev:#x} run past the end of the allocation at {base:#x} ({} bytes)",
                            a.len
                        ),
                    ));
                }
                return Ok((a.shadow + (dev - base) as usize) as *mut u8);
            }
        }
        let why = if t.freed.iter().any(|&(a, l)| a <= dev && dev < a + l as u64) {
            "freed device memory (use after free)"
        } else {
            "not device memory"
        };
        Err(Fail::new(CUDA_ERROR_INVALID_VALUE, format!("{what}: {dev:#x} is {why}")))
    })
}

/// The allocation containing `dev`: (base, length, device ordinal).
pub fn range(dev: u64) -> Option<(u64, usize, i32)> {
    with(|t| {
        let (&base, a) = t.live.range(..=dev).next_back()?;
        (dev < base + a.len as u64).then_some((base, a.len, a.device))
    })
}

/// An IPC handle's 64 bytes: magic, pid, memfd number, length, allocation id, device.
pub fn ipc_handle(dev: u64) -> Result<[u8; 64], Fail> {
    with(|t| {
        let (&base, a) =
            t.live.range(..=dev).next_back().filter(|(b, a)| dev < **b + a.len as u64).ok_or_else(|| {
                Fail::new(CUDA_ERROR_INVALID_VALUE, format!("cuIpcGetMemHandle: {dev:#x} is not device memory"))
            })?;
        if a.origin != Origin::Own {
            return Err(Fail::new(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle: memory opened from another process"));
        }
        let _ = base;
        let mut h = [0u8; 64];
        h[0..8].copy_from_slice(b"OXSIMIPC");
        h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        h[12..16].copy_from_slice(&a.fd.as_raw_fd().to_le_bytes());
        h[16..24].copy_from_slice(&(a.len as u64).to_le_bytes());
        h[24..32].copy_from_slice(&a.id.to_le_bytes());
        h[32..36].copy_from_slice(&a.device.to_le_bytes());
        Ok(h)
    })
}

/// `cuIpcOpenMemHandle`: map another process's allocation; opening one twice in a process, or
/// one's own, is an error.
pub fn ipc_open(h: &[u8; 64], device: i32) -> Result<u64, Fail> {
    let bad = |m: String| Fail::new(CUDA_ERROR_INVALID_VALUE, format!("cuIpcOpenMemHandle: {m}"));
    if &h[0..8] != b"OXSIMIPC" {
        return Err(bad("not a handle of the simulated driver".into()));
    }
    let pid = i32::from_le_bytes(h[8..12].try_into().unwrap());
    let fdn = i32::from_le_bytes(h[12..16].try_into().unwrap());
    let len = u64::from_le_bytes(h[16..24].try_into().unwrap()) as usize;
    let id = u64::from_le_bytes(h[24..32].try_into().unwrap());
    let _ = device;
    if pid as u32 == std::process::id() {
        return Err(bad("the handle is this process's own memory (CUDA refuses that too)".into()));
    }
    let origin = Origin::Ipc { pid, id };
    if with(|t| t.live.values().any(|a| a.origin == origin)) {
        return Err(Fail::new(
            CUDA_ERROR_ALREADY_MAPPED,
            format!("cuIpcOpenMemHandle: allocation {id} of process {pid} is already open in this process"),
        ));
    }
    let path = format!("/proc/{pid}/fd/{fdn}");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| bad(format!("process {pid}'s memory is gone or not reachable ({path}: {e})")))?;
    let fd: OwnedFd = file.into();
    let (dev, map_len, shadow) = map_twice(&fd, len)?;
    let owner_dev = i32::from_le_bytes(h[32..36].try_into().unwrap());
    with(|t| {
        t.next_id += 1;
        t.live.insert(dev, Alloc { len, map_len, shadow, fd, device: owner_dev, id: t.next_id, origin });
    });
    Ok(dev)
}

/// Device memory in use by this process's own allocations.
pub fn bytes_in_use() -> usize {
    with(|t| t.bytes)
}
