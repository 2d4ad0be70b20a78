//! The kernel's id of the calling thread (`gettid`), for log prefixes (`host:pid:tid`, as NCCL
//! prints them).

/// The calling thread's kernel thread id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn threads_have_their_own_ids() {
        let me = super::thread_id();
        assert_eq!(me, super::thread_id());
        let other = std::thread::spawn(super::thread_id).join().unwrap();
        assert_ne!(me, other);
    }
}
