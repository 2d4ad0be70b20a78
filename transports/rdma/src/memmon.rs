//! Watching user memory for unmapping, so the registration cache is invalidated on free or
//! unmap ([`Watched`]: a [`RegCache`] and a `userfaultfd` monitor).
//!
//! Every cached range is registered with a `userfaultfd` in write-protect mode (nothing is ever
//! write-protected, so the program's own accesses never fault to us) with the non-cooperative
//! events `UNMAP`, `REMOVE` (`madvise(DONTNEED)`, `free` trimming its heap) and `REMAP`
//! (`mremap`). The kernel makes the unmapping call wait until a monitor thread has read the
//! event, and a lookup waits for any event being read to be queued and applies the queue before
//! it consults the cache; so once `munmap` or `free` returned, no lookup finds a registration of
//! the old memory. Memory that cannot be watched (file mappings, a range another monitor owns)
//! is never cached: the caller sends it the ordinary way.
//!
//! The monitor thread never allocates or frees memory and takes no lock the program may hold
//! while freeing memory (the queue's lock only guards a fixed array): an unmapping call waits
//! for it, so it must never wait for them.

use crate::regcache::{CacheStats, RegCache};
use oxccl_transport::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: u64 = 0xc018_aa3f;
const UFFDIO_REGISTER: u64 = 0xc020_aa00;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// `struct uffd_msg`: the event byte, padding, then three 64-bit arguments.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    _pad: [u8; 7],
    arg: [u64; 3],
}

const QUEUE: usize = 128;

/// Ranges unmapped, as read by the monitor, not yet applied to the cache. Fixed size: the
/// monitor thread must not allocate.
struct Queue {
    ranges: [(usize, usize); QUEUE],
    len: usize,
    /// More events than fit: everything is invalidated.
    overflow: bool,
}

/// The process's one monitor: one `userfaultfd` (two would fight over the same mappings: a
/// range is watched by one at most), its thread, and the queues of the caches it feeds.
struct Monitor {
    uffd: OwnedFd,
    /// Fixed slots: the monitor thread walks them without allocating.
    subs: Mutex<[Option<Arc<Mutex<Queue>>>; MAX_CACHES]>,
    /// The monitor is between starting a read and queueing what it read.
    reading: AtomicUsize,
}

/// Caches (communicators' networks) a process may have at once.
const MAX_CACHES: usize = 64;

/// The process's monitor, started on first use. A `fork` child (where the monitor thread does
/// not exist, and the parent's registrations do not apply) starts its own; the inherited one is
/// leaked as it is.
fn monitor_instance() -> Result<&'static Monitor> {
    type Started = std::result::Result<Monitor, String>;
    static M: Mutex<Option<(u64, &'static Started)>> = Mutex::new(None);
    let now = oxccl_transport::fork::generation();
    let mut g = M.lock().unwrap_or_else(|e| e.into_inner());
    let m = match *g {
        Some((gen, m)) if gen == now => m,
        _ => {
            let m: &'static Started = Box::leak(Box::new(start_monitor()));
            *g = Some((now, m));
            m
        }
    };
    m.as_ref().map_err(|e| Error::new(ErrorKind::Unavailable, e.clone()))
}

fn start_monitor() -> std::result::Result<Monitor, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(os("userfaultfd"));
    }
    // SAFETY: a new descriptor nothing else owns.
    let uffd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let want = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
    let mut api = UffdioApi { api: UFFD_API, features: want, ioctls: 0 };
    // SAFETY: UFFDIO_API takes a pointer to a struct uffdio_api, which `api` is.
    if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
        return Err(os("userfaultfd: the unmap events"));
    }
    let raw = uffd.as_raw_fd();
    std::thread::Builder::new()
        .name("oxccl-memmon".into())
        .spawn(move || monitor(raw))
        .map_err(|e| format!("memory monitor thread: {e}"))?;
    Ok(Monitor { uffd, subs: Mutex::new(std::array::from_fn(|_| None)), reading: AtomicUsize::new(0) })
}

/// A registration cache whose entries are invalidated when their memory is unmapped.
pub struct Watched<R: Copy + Send> {
    mon: &'static Monitor,
    queue: Arc<Mutex<Queue>>,
    cache: Mutex<(RegCache<R>, Vec<R>)>,
}

impl<R: Copy + Send> Watched<R> {
    /// A cache fed by the process's monitor (started on first use). `Unavailable` where
    /// `userfaultfd` is not allowed (unprivileged users when `vm.unprivileged_userfaultfd` is
    /// 0, seccomp) or lacks the unmap events.
    pub fn new(max_entries: usize, max_bytes: usize) -> Result<Watched<R>> {
        let mon = monitor_instance()?;
        let queue = Arc::new(Mutex::new(Queue { ranges: [(0, 0); QUEUE], len: 0, overflow: false }));
        {
            let mut subs = mon.subs.lock().unwrap();
            let free = subs.iter_mut().find(|s| s.is_none()).ok_or_else(|| {
                Error::new(ErrorKind::Unavailable, format!("more than {MAX_CACHES} registration caches"))
            })?;
            *free = Some(queue.clone());
        }
        Ok(Watched { mon, queue, cache: Mutex::new((RegCache::new(max_entries, max_bytes), Vec::new())) })
    }

    /// Take the registration covering `[addr, addr+len)`, registering (with `register`, given
    /// a page-aligned start and length) on a miss. `Ok(None)`: this memory cannot be watched,
    /// so it is not cached (send it another way). Give it back with [`Watched::release`].
    pub fn get(
        &self,
        addr: usize,
        len: usize,
        register: impl FnOnce(usize, usize) -> Result<R>,
    ) -> Result<Option<(u64, R, usize)>> {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        self.apply_events(cache, dead);
        if let Some(hit) = cache.lookup(addr, len) {
            return Ok(Some(hit));
        }
        let plan = cache.plan(addr, len);
        if !self.watch(plan.start, plan.end - plan.start) {
            return Ok(None);
        }
        let reg = register(plan.start, plan.end - plan.start)?;
        let (id, gone) = cache.insert(plan, reg);
        dead.extend(gone);
        Ok(Some((id, reg, plan.start)))
    }

    /// Give back what [`Watched::get`] took.
    pub fn release(&self, id: u64) {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        dead.extend(cache.release(id));
    }

    /// Registrations to deregister now (invalidated, evicted or absorbed, and not in use).
    pub fn take_dead(&self) -> Vec<R> {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        self.apply_events(cache, dead);
        std::mem::take(dead)
    }

    /// Every registration, for teardown.
    pub fn drain(&self) -> Vec<R> {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        let mut all = std::mem::take(dead);
        all.extend(cache.drain());
        all
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        self.apply_events(cache, dead);
        cache.stats()
    }

    /// Live entries (tests).
    pub fn ranges(&self) -> Vec<(usize, usize, usize)> {
        let mut g = self.cache.lock().unwrap();
        let (cache, dead) = &mut *g;
        self.apply_events(cache, dead);
        cache.ranges()
    }

    /// Watch the mappings that hold `[start, start+len)` with the userfaultfd (write-protect
    /// mode, never armed). Whole mappings are watched: watching part of one would split it, and
    /// a later `mremap` of the whole (glibc's `realloc` of a large block) would then fail.
    fn watch(&self, start: usize, len: usize) -> bool {
        let Some((start, end)) = mappings_covering(start, start + len) else {
            tracing::debug!("NET: not caching {start:#x}+{len}: not one run of mappings");
            return false;
        };
        let len = end - start;
        let mut r = UffdioRegister { start: start as u64, len: len as u64, mode: UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER takes a pointer to a struct uffdio_register, which `r` is; it
        // only changes how the kernel reports events on the range.
        let rc = unsafe { libc::ioctl(self.mon.uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut r) };
        if rc != 0 {
            tracing::debug!(
                "NET: not caching the registration of {start:#x}+{len}: {}",
                std::io::Error::last_os_error()
            );
        }
        rc == 0
    }

    /// Apply every unmapping the monitor read (waiting out a read in progress: the unmapping
    /// call it reports may already have returned).
    fn apply_events(&self, cache: &mut RegCache<R>, dead: &mut Vec<R>) {
        loop {
            while self.mon.reading.load(Ordering::SeqCst) != 0 {
                std::thread::yield_now();
            }
            let (ranges, n, overflow) = {
                let mut q = self.queue.lock().unwrap();
                // the common case, on every progress call: nothing queued, nothing copied
                if q.len == 0 && !q.overflow {
                    return;
                }
                let out = (q.ranges, q.len, q.overflow);
                q.len = 0;
                q.overflow = false;
                out
            };
            if overflow {
                dead.extend(cache.invalidate(0, usize::MAX));
            }
            for &(s, e) in &ranges[..n] {
                dead.extend(cache.invalidate(s, e - s));
            }
        }
    }
}

impl<R: Copy + Send> Drop for Watched<R> {
    fn drop(&mut self) {
        let mine = {
            let mut subs = self.mon.subs.lock().unwrap();
            subs.iter_mut().find(|s| s.as_ref().is_some_and(|q| Arc::ptr_eq(q, &self.queue))).and_then(Option::take)
        };
        drop(mine); // outside the lock (no freeing while holding what the monitor takes)
    }
}

/// The span of the run of adjacent mappings that covers `[start, end)` (from
/// `/proc/self/maps`), or `None` if a hole lies inside.
fn mappings_covering(start: usize, end: usize) -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut span: Option<(usize, usize)> = None;
    for line in maps.lines() {
        let range = line.split_whitespace().next()?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
        if b <= start || a >= end {
            continue;
        }
        span = match span {
            None if a <= start => Some((a, b)),
            Some((s, e)) if a == e => Some((s, b)),
            _ => return None,
        };
    }
    span.filter(|&(_, e)| e >= end)
}

/// The monitor thread: read events as they come, queue the ranges for every cache. It never
/// allocates or frees memory: an unmapping call waits for it.
fn monitor(uffd: i32) {
    let mon = loop {
        // the instance is stored once start_monitor returns
        if let Ok(m) = monitor_instance() {
            break m;
        }
        std::thread::yield_now();
    };
    let mut msgs = [UffdMsg { event: 0, _pad: [0; 7], arg: [0; 3] }; 16];
    loop {
        let mut fds = [libc::pollfd { fd: uffd, events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd entry.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) } <= 0 {
            continue;
        }
        mon.reading.fetch_add(1, Ordering::SeqCst);
        // SAFETY: reads whole uffd_msg records into `msgs`, whose size bounds the read.
        let n = unsafe { libc::read(uffd, msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        if n > 0 {
            let count = n as usize / std::mem::size_of::<UffdMsg>();
            let subs = mon.subs.lock().unwrap();
            for m in &msgs[..count] {
                let range = match m.event {
                    UFFD_EVENT_UNMAP | UFFD_EVENT_REMOVE => (m.arg[0] as usize, m.arg[1] as usize),
                    // the old range of an mremap
                    UFFD_EVENT_REMAP => (m.arg[0] as usize, (m.arg[0] + m.arg[2]) as usize),
                    _ => continue,
                };
                for q in subs.iter().flatten() {
                    let mut q = q.lock().unwrap();
                    if q.len == QUEUE {
                        q.overflow = true;
                    } else {
                        let i = q.len;
                        q.ranges[i] = range;
                        q.len += 1;
                    }
                }
            }
        }
        mon.reading.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> Option<Watched<u64>> {
        match Watched::new(64, usize::MAX) {
            Ok(w) => Some(w),
            Err(e) if std::env::var_os("OXCCL_REQUIRE_UFFD").is_none() => {
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn map(len: usize) -> *mut u8 {
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// munmap, madvise(DONTNEED), mremap and a large free each drop the entries of their
    /// memory by the time they return; a registration is counted each time memory is used anew.
    #[test]
    fn unmapping_invalidates_before_the_call_returns() {
        let Some(w) = watched() else { return };
        let mut next = 0u64;
        let mut reg = |_s: usize, _l: usize| {
            next += 1;
            Ok(next)
        };
        let len = 16 * 4096;
        let p = map(len);
        let (id, r, start) = w.get(p as usize + 100, 5000, &mut reg).unwrap().expect("anonymous memory is watched");
        assert_eq!((r, start), (1, p as usize));
        w.release(id);
        let (id, r, _) = w.get(p as usize + 200, 3000, &mut reg).unwrap().unwrap();
        assert_eq!(r, 1, "a hit");
        w.release(id);
        // SAFETY: our mapping; nothing uses it after.
        assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
        assert!(w.ranges().is_empty(), "munmap left an entry: {:?}", w.ranges());
        assert_eq!(w.take_dead(), vec![1]);

        // the same address again (MAP_FIXED over a fresh mapping) is registered anew
        let q = map(len);
        let (id, r, _) = w.get(q as usize, 4096, &mut reg).unwrap().unwrap();
        assert_eq!(r, 2);
        w.release(id);
        // SAFETY: our mapping: give its first pages back.
        assert_eq!(unsafe { libc::madvise(q.cast(), 2 * 4096, libc::MADV_DONTNEED) }, 0);
        assert!(w.ranges().is_empty(), "madvise(DONTNEED) left an entry");
        let (id, r, _) = w.get(q as usize + 8 * 4096, 4096, &mut reg).unwrap().unwrap();
        assert_eq!(r, 3);
        w.release(id);
        // SAFETY: our mapping moves; the old range is gone.
        let moved = unsafe { libc::mremap(q.cast(), len, 2 * len, libc::MREMAP_MAYMOVE) };
        assert_ne!(moved, libc::MAP_FAILED);
        if moved != q.cast() {
            assert!(w.ranges().is_empty(), "mremap left an entry of the old range");
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(moved, 2 * len) };
        assert!(w.ranges().is_empty());

        // a large Vec is its own mapping: dropping it invalidates
        let v = vec![7u8; 8 << 20];
        let (id, r, _) = w.get(v.as_ptr() as usize, v.len(), &mut reg).unwrap().unwrap();
        assert_eq!(r, 4);
        w.release(id);
        drop(v);
        assert!(w.ranges().is_empty(), "freeing a large block left an entry");
        let s = w.stats();
        assert_eq!((s.registrations, s.hits), (4, 1));
        assert!(s.invalidated >= 4, "{s:?}");
    }

    /// An entry in use when its memory goes is deregistered at its release, not before.
    #[test]
    fn an_entry_in_use_outlives_its_unmapping_until_released() {
        let Some(w) = watched() else { return };
        let p = map(4 * 4096);
        let (id, r, _) = w.get(p as usize, 4096, |_, _| Ok(9)).unwrap().unwrap();
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), 4 * 4096) };
        assert!(w.take_dead().is_empty());
        w.release(id);
        assert_eq!(w.take_dead(), vec![r]);
    }

    /// A file mapping cannot be watched in this mode: it is not cached.
    #[test]
    fn unwatchable_memory_is_not_cached() {
        let Some(w) = watched() else { return };
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: a read-only private mapping of a file we opened.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let got = w.get(p as usize, 4096, |_, _| Ok(1)).unwrap();
        assert!(got.is_none(), "a file mapping was cached");
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 4096) };
    }
}
