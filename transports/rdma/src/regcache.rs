//! The registration cache: memory registrations of user buffers, keyed by address range.
//!
//! Registering memory is expensive on real hardware (the kernel pins the pages and programs the
//! adapter's translation table), so a buffer used again is looked up here instead. The cache is
//! a pure data structure; what keeps it honest is invalidation: when memory is unmapped or its
//! pages are given back (`munmap`, `free` of a large block, `madvise(DONTNEED)`, `mremap`), the
//! [`crate::memmon`] monitor calls [`RegCache::invalidate`] for the range before the unmapping
//! call returns to the program, so a later buffer at the same address is never sent from a
//! stale registration.
//!
//! Rules:
//! - live entries are page-aligned and never overlap: a new registration absorbs every live
//!   entry it overlaps or touches (their union is registered once, so a buffer sent chunk by
//!   chunk ends as one registration);
//! - an entry in use (a write from it not yet complete) is never deregistered: invalidating or
//!   absorbing it only marks it stale, and its last [`RegCache::release`] hands it back for
//!   deregistration;
//! - bounded: beyond `max_entries` live entries or `max_bytes` registered bytes, the least
//!   recently used entries not in use are evicted.

use std::collections::{BTreeMap, HashMap};

/// Page size used for alignment.
pub const PAGE: usize = 4096;

/// Statistics (tests and logs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served by a live entry.
    pub hits: u64,
    /// Registrations made.
    pub registrations: u64,
    /// Entries removed because their memory was unmapped or given back.
    pub invalidated: u64,
    /// Entries evicted to stay within bounds.
    pub evicted: u64,
}

struct Entry<R> {
    start: usize,
    end: usize,
    reg: R,
    refs: usize,
    used: u64,
    /// Removed from the address map (invalidated or absorbed) while in use.
    stale: bool,
}

/// What a lookup that missed must register: `[start, end)`, page aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

/// The cache. `R` is the backend's registration (copied out on every hit).
pub struct RegCache<R: Copy> {
    /// start → entry id, live entries only.
    map: BTreeMap<usize, u64>,
    entries: HashMap<u64, Entry<R>>,
    next_id: u64,
    tick: u64,
    live_bytes: usize,
    max_entries: usize,
    max_bytes: usize,
    stats: CacheStats,
}

fn align(addr: usize, len: usize) -> (usize, usize) {
    let start = addr & !(PAGE - 1);
    let end = (addr.saturating_add(len.max(1))).saturating_add(PAGE - 1) & !(PAGE - 1);
    (start, end)
}

impl<R: Copy> RegCache<R> {
    /// An empty cache holding at most `max_entries` live entries and `max_bytes` registered
    /// bytes (entries in use may exceed them until released).
    pub fn new(max_entries: usize, max_bytes: usize) -> RegCache<R> {
        RegCache {
            map: BTreeMap::new(),
            entries: HashMap::new(),
            next_id: 1,
            tick: 0,
            live_bytes: 0,
            max_entries: max_entries.max(1),
            max_bytes,
            stats: CacheStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries still referenced, live or stale.
    pub fn in_use(&self) -> usize {
        self.entries.values().filter(|e| e.refs > 0).count()
    }

    /// The live entry covering `[addr, addr+len)`, taken (released with
    /// [`RegCache::release`]): its id, registration and first byte.
    pub fn lookup(&mut self, addr: usize, len: usize) -> Option<(u64, R, usize)> {
        let end = addr.checked_add(len)?;
        let (_, &id) = self.map.range(..=addr).next_back()?;
        self.tick += 1;
        let e = self.entries.get_mut(&id)?;
        if e.end < end {
            return None;
        }
        e.refs += 1;
        e.used = self.tick;
        self.stats.hits += 1;
        Some((id, e.reg, e.start))
    }

    /// The range to register for `[addr, addr+len)` after a miss: page aligned and grown over
    /// every live entry it overlaps or touches.
    pub fn plan(&self, addr: usize, len: usize) -> Plan {
        let (mut start, mut end) = align(addr, len);
        // entries that start before `start` and reach it, then those starting inside the range
        if let Some((_, id)) = self.map.range(..start).next_back() {
            let e = &self.entries[id];
            if e.end >= start {
                start = e.start;
                end = end.max(e.end);
            }
        }
        for (_, id) in self.map.range(start..=end) {
            end = end.max(self.entries[id].end);
        }
        Plan { start, end }
    }

    /// Record the registration `reg` of `plan` (taken once, like a lookup). Returns its id and
    /// the registrations to deregister now (absorbed or evicted entries not in use).
    pub fn insert(&mut self, plan: Plan, reg: R) -> (u64, Vec<R>) {
        let mut dead = self.remove_range(plan.start, plan.end, false);
        let id = self.next_id;
        self.next_id += 1;
        self.tick += 1;
        self.entries
            .insert(id, Entry { start: plan.start, end: plan.end, reg, refs: 1, used: self.tick, stale: false });
        self.map.insert(plan.start, id);
        self.live_bytes += plan.end - plan.start;
        self.stats.registrations += 1;
        dead.extend(self.evict());
        (id, dead)
    }

    /// Give back a taken entry; returns the registrations to deregister now: its own if it
    /// went stale while in use, and entries evicted now that it is idle (bounds).
    pub fn release(&mut self, id: u64) -> Vec<R> {
        let Some(e) = self.entries.get_mut(&id) else { return Vec::new() };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 && e.stale {
            return self.entries.remove(&id).map(|e| e.reg).into_iter().collect();
        }
        if e.refs == 0 {
            return self.evict();
        }
        Vec::new()
    }

    /// The memory `[addr, addr+len)` was unmapped or its pages given back: every live entry
    /// overlapping it leaves the map. Returns the registrations to deregister now; entries in
    /// use are deregistered at their last release.
    pub fn invalidate(&mut self, addr: usize, len: usize) -> Vec<R> {
        let Some(end) = addr.checked_add(len) else { return Vec::new() };
        self.remove_range(addr, end, true)
    }

    /// Remove every live entry overlapping `[start, end)` (touching counts when absorbing).
    fn remove_range(&mut self, start: usize, end: usize, invalidation: bool) -> Vec<R> {
        let mut ids: Vec<u64> = Vec::new();
        if let Some((_, &id)) = self.map.range(..start).next_back() {
            let e = &self.entries[&id];
            if e.end > start || (!invalidation && e.end == start) {
                ids.push(id);
            }
        }
        let upper = if invalidation { end.saturating_sub(1) } else { end };
        if start <= upper {
            ids.extend(self.map.range(start..=upper).map(|(_, id)| *id));
        }
        let mut dead = Vec::new();
        for id in ids {
            let e = self.entries.get_mut(&id).unwrap();
            self.map.remove(&e.start);
            self.live_bytes -= e.end - e.start;
            if invalidation {
                self.stats.invalidated += 1;
            }
            if e.refs == 0 {
                dead.push(self.entries.remove(&id).unwrap().reg);
            } else {
                e.stale = true;
            }
        }
        dead
    }

    /// Evict least recently used entries not in use until within bounds.
    fn evict(&mut self) -> Vec<R> {
        let mut dead = Vec::new();
        while self.map.len() > self.max_entries || self.live_bytes > self.max_bytes {
            let victim = self
                .map
                .values()
                .map(|id| (*id, &self.entries[id]))
                .filter(|(_, e)| e.refs == 0)
                .min_by_key(|(_, e)| e.used)
                .map(|(id, e)| (id, e.start, e.end));
            let Some((id, start, end)) = victim else { break };
            self.map.remove(&start);
            self.live_bytes -= end - start;
            self.stats.evicted += 1;
            dead.push(self.entries.remove(&id).unwrap().reg);
        }
        dead
    }

    /// Every registration, live or stale, for deregistration at teardown.
    pub fn drain(&mut self) -> Vec<R> {
        self.map.clear();
        self.live_bytes = 0;
        self.entries.drain().map(|(_, e)| e.reg).collect()
    }

    /// Live entries as `(start, end, refs)`, in address order (tests, logs).
    pub fn ranges(&self) -> Vec<(usize, usize, usize)> {
        self.map.values().map(|id| &self.entries[id]).map(|e| (e.start, e.end, e.refs)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Registrations are numbered; the model tracks which are registered and which are held.
    #[test]
    fn random_use_keeps_the_invariants() {
        let mut z = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z % n
        };
        for round in 0..20 {
            let max_entries = 1 + rnd(8) as usize;
            let mut c: RegCache<u64> = RegCache::new(max_entries, 64 * PAGE);
            let mut registered: HashSet<u64> = HashSet::new();
            let mut next = 0u64;
            // taken: (id, reg, range)
            let mut taken: Vec<(u64, u64, usize, usize)> = Vec::new();
            let mut freed: HashSet<u64> = HashSet::new();
            for _ in 0..3000 {
                match rnd(10) {
                    0..=4 => {
                        let addr = (rnd(48) as usize) * 1000 + 0x10_0000;
                        let len = 1 + rnd(12_000) as usize;
                        let (id, reg, start) = match c.lookup(addr, len) {
                            Some(hit) => hit,
                            None => {
                                let plan = c.plan(addr, len);
                                assert!(plan.start <= addr && plan.end >= addr + len, "{plan:?} {addr} {len}");
                                assert_eq!(plan.start % PAGE, 0);
                                assert_eq!(plan.end % PAGE, 0);
                                next += 1;
                                registered.insert(next);
                                let (id, dead) = c.insert(plan, next);
                                for d in dead {
                                    assert!(registered.remove(&d), "deregistered twice: {d}");
                                    assert!(taken.iter().all(|t| t.1 != d), "deregistered while in use: {d}");
                                    freed.insert(d);
                                }
                                (id, next, plan.start)
                            }
                        };
                        assert!(registered.contains(&reg), "a lookup returned a dead registration");
                        assert!(start <= addr);
                        taken.push((id, reg, addr, len));
                    }
                    5..=7 if !taken.is_empty() => {
                        let (id, ..) = taken.swap_remove(rnd(taken.len() as u64) as usize);
                        for d in c.release(id) {
                            assert!(taken.iter().all(|t| t.1 != d), "deregistered while in use");
                            assert!(registered.remove(&d), "deregistered twice: {d}");
                        }
                    }
                    _ => {
                        let addr = (rnd(60) as usize) * 1000 + 0x10_0000;
                        let len = 1 + rnd(20_000) as usize;
                        for d in c.invalidate(addr, len) {
                            assert!(registered.remove(&d), "deregistered twice: {d}");
                            assert!(taken.iter().all(|t| t.1 != d), "deregistered while in use");
                        }
                        for (s, e, _) in c.ranges() {
                            assert!(e <= addr || s >= addr + len, "a live entry survived invalidation");
                        }
                    }
                }
                // live entries: aligned, disjoint, not touching (they would have merged)
                let r = c.ranges();
                for w in r.windows(2) {
                    assert!(w[0].1 < w[1].0, "entries overlap or touch: {r:?}");
                }
                assert!(r.iter().all(|(s, e, _)| s % PAGE == 0 && e % PAGE == 0 && s < e));
                let idle = r.iter().filter(|x| x.2 == 0).count();
                assert!(r.len() <= max_entries || idle == 0, "round {round}: over the entry bound with idle entries");
            }
            for (id, ..) in taken.drain(..) {
                for d in c.release(id) {
                    assert!(registered.remove(&d), "deregistered twice: {d}");
                }
            }
            for d in c.drain() {
                registered.remove(&d);
            }
            assert!(registered.is_empty(), "registrations leaked: {registered:?}");
        }
    }

    #[test]
    fn chunks_of_one_buffer_merge_into_one_registration() {
        let mut c: RegCache<u32> = RegCache::new(16, usize::MAX);
        let base = 0x40_0000;
        let mut regs = 0;
        for k in 0..8 {
            let (addr, len) = (base + k * 3 * PAGE, 3 * PAGE);
            if c.lookup(addr, len).is_none() {
                regs += 1;
                let (id, dead) = c.insert(c.plan(addr, len), regs);
                assert_eq!(dead.len(), usize::from(k > 0), "the previous entry is absorbed");
                assert!(c.release(id).is_empty());
            } else {
                panic!("chunk {k} cannot be cached yet");
            }
        }
        assert_eq!(c.ranges(), vec![(base, base + 24 * PAGE, 0)]);
        // the second pass is all hits
        for k in 0..8 {
            let (id, reg, _) = c.lookup(base + k * 3 * PAGE, 3 * PAGE).expect("hit");
            assert_eq!(reg, 8);
            assert!(c.release(id).is_empty());
        }
        assert_eq!(c.stats().hits, 8);
    }

    #[test]
    fn an_entry_in_use_is_deregistered_at_its_last_release() {
        let mut c: RegCache<u32> = RegCache::new(4, usize::MAX);
        let (id, _) = c.insert(c.plan(0x1000, 100), 7);
        let (id2, ..) = c.lookup(0x1000, 50).unwrap();
        assert!(c.invalidate(0x1800, 1).is_empty(), "in use: not deregistered yet");
        assert!(c.lookup(0x1000, 50).is_none(), "but no longer found");
        assert!(c.release(id).is_empty());
        assert_eq!(c.release(id2), vec![7]);
        assert_eq!(c.stats().invalidated, 1);
        // touching is not overlapping for invalidation
        let (id, _) = c.insert(c.plan(0x4000, 0x1000), 8);
        assert!(c.release(id).is_empty());
        assert!(c.invalidate(0x5000, 0x1000).is_empty());
        assert!(c.invalidate(0x3000, 0x1000).is_empty());
        assert_eq!(c.invalidate(0x4fff, 1), vec![8]);
    }
}
