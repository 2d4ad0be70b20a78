//! The sending side of a connection: a lane's frames through its non-blocking socket, and the
//! striping of a connection's frames over its lanes.

use super::lost_how;

/// A failed read or write on a lane: the peer is unreachable, said how (a remote error).
pub(crate) fn unreachable(peer: usize, what: &str, e: &std::io::Error) -> Error {
    let (how, cause) = lost_how(e);
    let mut err =
        Error::system(format!("rank {peer} is unreachable ({how}); TCP {what}"), e).with_peer(peer).with_cause(cause);
    err.kind = oxccl_transport::ErrorKind::Remote;
    err
}
use oxccl_transport::seal::{Sealer, TAG_BYTES};
use oxccl_transport::wait::WaitSource;
use oxccl_transport::{Error, Header, Result, SendConn, HEADER_BYTES};
use std::io::{ErrorKind as IoKind, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Bytes before an encrypted frame's sealed body: its length, authenticated as associated data.
pub(crate) const LEN_BYTES: usize = 4;

/// Bytes a frame carries before its header and after its payload: (length, tag) when encrypted.
pub(crate) fn framing(encrypted: bool) -> (usize, usize) {
    if encrypted {
        (LEN_BYTES, TAG_BYTES)
    } else {
        (0, 0)
    }
}

/// An encrypted frame on the wire: `len` (u32 LE, the sealed body's length), the body (header
/// then payload, AES-256-GCM under the lane's key), then the tag. A plain frame is the header
/// then the payload.
pub(crate) struct TcpSend {
    s: TcpStream,
    peer: usize,
    slot_bytes: usize,
    seal: Option<Sealer>,
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    head: usize,    // committed frames
    flushed: usize, // fully written frames
    offset: usize,  // bytes of frame `flushed` already written
}

impl TcpSend {
    pub(crate) fn new(s: TcpStream, slots: usize, slot_bytes: usize, peer: usize, seal: Option<Sealer>) -> Self {
        let (pre, tag) = framing(seal.is_some());
        let extra = pre + tag;
        TcpSend {
            s,
            peer,
            slot_bytes,
            seal,
            bufs: (0..slots).map(|_| vec![0u8; HEADER_BYTES + slot_bytes + extra]).collect(),
            lens: vec![0; slots],
            head: 0,
            flushed: 0,
            offset: 0,
        }
    }
    fn room(&self) -> bool {
        self.head - self.flushed < self.bufs.len()
    }

    /// Bytes before the header in a slot.
    fn pre(&self) -> usize {
        framing(self.seal.is_some()).0
    }

    /// Write `header` into slot `i` (its payload is in place) and seal the frame if the lane
    /// encrypts; returns the frame's length on the wire.
    fn finish(&mut self, i: usize, header: &Header) -> Result<usize> {
        let pre = self.pre();
        let body = HEADER_BYTES + header.len as usize;
        let buf = &mut self.bufs[i];
        buf[pre..pre + HEADER_BYTES].copy_from_slice(&header.encode());
        let Some(seal) = self.seal.as_mut() else { return Ok(body) };
        let (len, rest) = buf.split_at_mut(LEN_BYTES);
        len.copy_from_slice(&(body as u32).to_le_bytes());
        let tag = seal.seal(len, &mut rest[..body]).map_err(|e| e.with_peer(self.peer))?;
        rest[body..body + TAG_BYTES].copy_from_slice(&tag);
        Ok(LEN_BYTES + body + TAG_BYTES)
    }
}

impl SendConn for TcpSend {
    fn max_message(&self) -> usize {
        self.slot_bytes
    }

    fn reserve(&mut self) -> Result<Option<&mut [u8]>> {
        if !self.room() {
            self.progress()?;
            if !self.room() {
                return Ok(None);
            }
        }
        let (n, pre) = (self.bufs.len(), self.pre());
        let at = pre + HEADER_BYTES;
        let end = at + self.slot_bytes;
        Ok(Some(&mut self.bufs[self.head % n][at..end]))
    }

    fn commit(&mut self, header: Header) -> Result<()> {
        if !self.room() || header.len as usize > self.slot_bytes {
            return Err(Error::internal("tcp commit without a reserved slot"));
        }
        let n = self.bufs.len();
        let i = self.head % n;
        self.lens[i] = self.finish(i, &header)?;
        self.head += 1;
        self.progress()
    }

    fn progress(&mut self) -> Result<()> {
        let n = self.bufs.len();
        while self.flushed < self.head {
            let i = self.flushed % n;
            let frame = &self.bufs[i][self.offset..self.lens[i]];
            match self.s.write(frame) {
                Ok(0) => {
                    return Err(
                        Error::remote(format!("rank {} closed the TCP connection", self.peer)).with_peer(self.peer)
                    )
                }
                Ok(w) => {
                    self.offset += w;
                    if self.offset == self.lens[i] {
                        self.flushed += 1;
                        self.offset = 0;
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(unreachable(self.peer, "send", &e)),
            }
        }
        Ok(())
    }

    fn pending(&self) -> bool {
        self.flushed < self.head
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        self.progress()?;
        if self.room() && !self.pending() {
            return Ok(None);
        }
        Ok(Some(WaitSource::write(self.s.as_raw_fd())))
    }

    fn disarm(&mut self) {}

    fn memory(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }

    fn abort(&mut self) {
        // a header-only frame with the abort step, if the socket takes it now (after any
        // partially written frame it would be garbage, so only at a frame boundary). Sealed
        // frames are numbered, so an encrypted lane sends it only after every queued frame.
        if self.seal.is_some() {
            let _ = self.progress();
        }
        if self.offset != 0 || (self.seal.is_some() && self.flushed != self.head) {
            return;
        }
        let h = Header { step: oxccl_transport::ABORT_STEP, ..Default::default() };
        if self.seal.is_none() {
            let _ = self.s.write(&h.encode());
            return;
        }
        let i = self.head % self.bufs.len(); // free: every frame is flushed
        if let Ok(len) = self.finish(i, &h) {
            let _ = self.s.write(&self.bufs[i][..len]);
        }
    }
}

/// A connection's lanes, frames striped round robin.
pub(crate) struct StripedSend {
    pub(crate) lanes: Vec<TcpSend>,
    pub(crate) head: usize,
}

impl SendConn for StripedSend {
    fn max_message(&self) -> usize {
        self.lanes[0].max_message()
    }

    fn reserve(&mut self) -> Result<Option<&mut [u8]>> {
        let n = self.lanes.len();
        self.lanes[self.head % n].reserve()
    }

    fn commit(&mut self, header: Header) -> Result<()> {
        let n = self.lanes.len();
        self.lanes[self.head % n].commit(header)?;
        self.head += 1;
        Ok(())
    }

    fn progress(&mut self) -> Result<()> {
        self.lanes.iter_mut().try_for_each(|l| l.progress())
    }

    fn pending(&self) -> bool {
        self.lanes.iter().any(|l| l.pending())
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        // wait for the lane the next frame needs if it is full, else for any lane still flushing
        let n = self.lanes.len();
        let next = self.head % n;
        self.progress()?;
        if !self.lanes[next].room() {
            return self.lanes[next].arm();
        }
        match self.lanes.iter_mut().find(|l| l.pending()) {
            Some(l) => l.arm(),
            None => Ok(None),
        }
    }

    fn disarm(&mut self) {}

    fn memory(&self) -> usize {
        self.lanes.iter().map(|l| l.memory()).sum()
    }

    fn abort(&mut self) {
        self.lanes.iter_mut().for_each(|l| l.abort());
    }
}
