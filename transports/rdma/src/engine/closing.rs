//! Closing the engine: waiting (at most the linger time) for the FLUSH answers of closed
//! connections, then deregistering its memory.

use super::*;

impl Net {
    /// Wait (at most `linger`) until every FLUSH of the closed connections was answered, or its
    /// peer is known to be gone; nothing after an abort.
    pub(crate) fn linger(&self) {
        let deadline = Instant::now() + self.linger;
        let mut st = self.st.lock().unwrap();
        if st.abandoned {
            return;
        }
        // senders to this rank stop waiting for answers to their FLUSHes (best effort: a
        // FLUSH that comes later than this is not answered)
        let closed: Vec<u32> = st.closed_recvs.keys().copied().collect();
        for key in closed {
            let c = st.closed_recvs.get_mut(&key).unwrap();
            let (dest, m) = (c.0[0], seal_ctl(c.2.as_mut(), control(T_CLOSED, c.1, 0, true)));
            let _ = self.send_msg(&mut st, 0, dest, &m, Owner::Reply);
        }
        while !st.flushes.is_empty() {
            if self.progress_locked(&mut st).is_err() {
                return;
            }
            if st.flushes.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let mut peers: Vec<usize> = st.flushes.values().map(|f| f.0).collect();
                peers.sort_unstable();
                peers.dedup();
                tracing::warn!(
                    "NET ({}): closing although rank(s) {peers:?} did not confirm receiving this rank's last messages within {:?} (OXCCL_NET_LINGER_MS)",
                    self.where_(),
                    self.linger
                );
                break;
            }
            drop(st);
            let fd = self.fab.try_wait().then(|| WaitSource::read(self.fab.wait_fd()));
            let slept = match fd {
                Some(src) => {
                    oxccl_transport::wait::wait_any(&[src], std::time::Duration::from_millis(10)).unwrap_or(false)
                }
                None => true,
            };
            st = self.st.lock().unwrap();
            if !slept {
                // a quiet 10 ms: a peer on this machine that is gone will not answer
                st.flushes.retain(|_, f| self.check_peer(f.0).is_ok());
            }
        }
        // the CLOSED and FLUSHED messages leave before the endpoint closes (briefly)
        let until = Instant::now() + std::time::Duration::from_millis(100);
        while (!st.outbox.is_empty() || st.tx_free.len() < TX_BUFS) && Instant::now() < until {
            if self.progress_locked(&mut st).is_err() {
                return;
            }
            if st.tx_free.len() < TX_BUFS {
                drop(st);
                std::thread::sleep(std::time::Duration::from_micros(200));
                st = self.st.lock().unwrap();
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.linger();
        if let Some(user) = self.user.take().flatten() {
            for r in user.drain() {
                self.fab.deregister(&r);
            }
        }
        let st = self.st.get_mut().unwrap();
        self.fab.deregister(&st.rx_region);
        self.fab.deregister(&st.tx_region);
    }
}
