//! Receive from any source: the Rust API over [`crate::runtime`]'s probe.

use super::*;
use crate::runtime::RECV_ANY;
use crate::types::Element;
use crate::{Error, ErrorKind, Result};

impl Communicator {
    /// Receive `buf.len()` elements from whichever of `peers` (every other rank when empty)
    /// sends to this rank first, and return that rank. Among peers whose sends are all waiting,
    /// they are taken in turn. The peer's send is an ordinary [`Communicator::send`].
    pub fn recv_any<T: Element>(&self, buf: &mut [T], peers: &[usize]) -> Result<usize> {
        if buf.is_empty() {
            // a send of nothing puts nothing on the wire, so there is nothing to match
            return Err(Error::invalid_argument("a receive from any source needs at least one element")
                .with_rank(self.sh.rank)
                .with_op(RECV_ANY));
        }
        let src = self.probe_any(peers)?;
        self.recv(buf, src)?;
        Ok(src)
    }

    /// Wait (up to the communicator's timeout) until the next message from one of `peers`
    /// (every other rank when empty) is its next send to this rank, and return that rank. Nothing
    /// is received: follow it with [`Communicator::recv`] from the returned rank (MPI's
    /// `MPI_Probe` with `MPI_ANY_SOURCE`). A timeout leaves the communicator usable; a dead or
    /// failed candidate fails it, naming the peer.
    pub fn probe_any(&self, peers: &[usize]) -> Result<usize> {
        let sh = &*self.sh;
        let _scope = crate::log::RankScope::new(sh.rank);
        let peers = self.candidates(peers)?;
        let _guard = self.enter()?;
        sh.wait_async_idle();
        check_state(sh, &sh.state.lock().unwrap())?;
        sh.probe_any(&peers).inspect_err(|e| {
            if e.kind != ErrorKind::Timeout && e.kind != ErrorKind::InvalidArgument {
                sh.set_error(e.clone());
            }
        })
    }

    /// `peers` checked (valid, distinct, not this rank), or every other rank when empty.
    fn candidates(&self, peers: &[usize]) -> Result<Vec<usize>> {
        let (n, me) = (self.sh.nranks, self.sh.rank);
        if peers.is_empty() {
            return match n {
                1 => Err(Error::invalid_argument("a receive from any source on a 1-rank communicator has no source")
                    .with_rank(me)
                    .with_op(RECV_ANY)),
                _ => Ok((0..n).filter(|&p| p != me).collect()),
            };
        }
        let mut seen = vec![false; n];
        for &p in peers {
            let why = if p >= n {
                format!("rank {p} is out of range (the communicator has {n})")
            } else if p == me {
                format!("rank {p} is this rank")
            } else if std::mem::replace(&mut seen[p], true) {
                format!("rank {p} is listed twice")
            } else {
                continue;
            };
            return Err(Error::invalid_argument(format!("receive from any of {peers:?}: {why}"))
                .with_rank(me)
                .with_op(RECV_ANY));
        }
        Ok(peers.to_vec())
    }
}
