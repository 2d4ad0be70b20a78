//! Fork awareness: a process-wide generation number that a `fork(2)` child sees incremented.
//!
//! Process-wide state that owns threads or sockets (the bootstrap store servers, the progress
//! thread, the memory monitor, the CUDA probe, the C ABI's communicator registry) records the
//! generation it was made in. In a child (only the forking thread survives `fork`), state of an
//! older generation is known to have no threads behind it: it is abandoned (never joined, never
//! shut down, since its sockets are shared with the parent) and made afresh where that is
//! possible. The check is one relaxed atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn in_child() {
    // async-signal-safe: one atomic add
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current fork generation: 0 in the process that started, and one more in each `fork`
/// child than in its parent. The first call registers the `pthread_atfork` handler, so state
/// that records a generation is always tracked across later forks.
pub fn generation() -> u64 {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a child handler that only does an atomic add (async-signal-safe);
        // pthread_atfork has no other requirement.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            eprintln!("oxccl: pthread_atfork failed ({rc}): state made before fork() is not detected in children");
        }
    });
    GENERATION.load(Ordering::Relaxed)
}

/// A value tagged with the fork generation it was made in.
#[derive(Debug)]
pub struct ForkLocal<T> {
    generation: u64,
    value: T,
}

impl<T> ForkLocal<T> {
    /// Tag `value` with the current generation.
    pub fn new(value: T) -> Self {
        ForkLocal { generation: generation(), value }
    }

    /// The value, if it was made in this process (not inherited through `fork`).
    pub fn get(&self) -> Option<&T> {
        (self.generation == GENERATION.load(Ordering::Relaxed)).then_some(&self.value)
    }

    /// Whether it was inherited from a parent process.
    pub fn inherited(&self) -> bool {
        self.generation != GENERATION.load(Ordering::Relaxed)
    }

    /// The value, whichever process made it.
    pub fn into_inner(self) -> T {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_sees_the_next_generation() {
        let x = ForkLocal::new(5);
        assert_eq!(x.get(), Some(&5));
        let g = generation();
        // SAFETY: the child only reads atomics and exits with _exit (no allocation, no locks).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = generation() == g + 1 && x.inherited();
            // SAFETY: leaves the child at once, running no destructors or atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "status {st}");
        assert_eq!(generation(), g);
        assert!(!x.inherited());
    }
}
