//! The receiving side of a connection: a lane's frames out of its non-blocking socket, and the
//! lanes of a striped connection read in turn.

use super::conn::{framing, unreachable, LEN_BYTES};
use oxccl_transport::seal::{Opener, TAG_BYTES};
use oxccl_transport::wait::WaitSource;
use oxccl_transport::{Cause, Error, Header, RecvConn, Result, HEADER_BYTES};
use std::io::{ErrorKind as IoKind, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// The receiving side of a connection's lanes: frame i comes from lane i mod lanes.
pub(crate) struct StripedRecv {
    pub(crate) lanes: Vec<TcpRecv>,
    pub(crate) tail: usize,
}

impl RecvConn for StripedRecv {
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>> {
        let n = self.lanes.len();
        self.lanes[self.tail % n].peek()
    }

    fn take_into(&mut self, dst: &mut [u8], check: &dyn Fn(&Header) -> Result<()>) -> Result<Option<Header>> {
        let n = self.lanes.len();
        self.lanes[self.tail % n].take_into(dst, check)
    }

    fn consume(&mut self) -> Result<()> {
        let n = self.lanes.len();
        self.lanes[self.tail % n].consume()?;
        self.tail += 1;
        Ok(())
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        let n = self.lanes.len();
        self.lanes[self.tail % n].arm()
    }

    fn disarm(&mut self) {}

    fn memory(&self) -> usize {
        self.lanes.iter().map(|l| l.memory()).sum()
    }
}

/// A frame with at least this many bytes still to come sets the socket's low mark to them before
/// the reader sleeps ([`TcpRecv::wake_when`]).
const LOWAT_MIN: usize = 16 * 1024;

/// From an empty buffer a plain lane reads at most this many payload bytes with a frame's
/// header: the rest of a larger frame can then go straight into the caller's buffer
/// ([`RecvConn::take_into`]), and smaller frames still arrive several to a read. Below about
/// this size the copy it saves costs less than the system call it adds (bench/RESULTS.md).
const HEAD_READ: usize = 64 * 1024;

pub(crate) struct TcpRecv {
    s: TcpStream,
    peer: usize,
    max: usize,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    open: Option<Opener>,
    /// The frame at `start` once opened (decrypted in place): its header and length on the wire.
    opened: Option<(Header, usize)>,
    /// The authentication failure that ended an encrypted lane (every later call repeats it).
    failed: Option<Error>,
    /// The socket's `SO_RCVLOWAT` as last set ([`TcpRecv::wake_when`]).
    lowat: usize,
    /// The plain frame being read straight into the caller's buffer ([`RecvConn::take_into`]):
    /// its header and how many payload bytes are there. None of it is in `buf` any more.
    direct: Option<(Header, usize)>,
}

impl TcpRecv {
    pub(crate) fn new(s: TcpStream, max: usize, peer: usize, open: Option<Opener>) -> Self {
        let (pre, tag) = framing(open.is_some());
        let frame = pre + HEADER_BYTES + max + tag;
        TcpRecv {
            s,
            peer,
            max,
            buf: vec![0u8; 2 * frame],
            start: 0,
            end: 0,
            eof: false,
            open,
            opened: None,
            failed: None,
            lowat: 1,
            direct: None,
        }
    }

    /// Longest frame on the wire.
    fn frame_max(&self) -> usize {
        let (pre, tag) = framing(self.open.is_some());
        pre + HEADER_BYTES + self.max + tag
    }

    /// Bytes before the header of a frame.
    fn pre(&self) -> usize {
        framing(self.open.is_some()).0
    }

    /// The header and wire length of the complete frame at `start`, if there is one (an
    /// encrypted frame is authenticated and decrypted in place first, once).
    fn complete(&mut self) -> Result<Option<(Header, usize)>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.open.is_none() {
            let have = self.end - self.start;
            if have < HEADER_BYTES {
                return Ok(None);
            }
            let h = Header::decode(&self.buf[self.start..self.end], self.max).map_err(|e| e.with_peer(self.peer))?;
            let need = HEADER_BYTES + h.len as usize;
            return Ok((have >= need).then_some((h, need)));
        }
        if self.opened.is_none() {
            self.opened = self.open_next().inspect_err(|e| self.failed = Some(e.clone()))?;
        }
        Ok(self.opened)
    }

    /// Authenticate and decrypt the frame at `start` if it has fully arrived.
    fn open_next(&mut self) -> Result<Option<(Header, usize)>> {
        let (start, have) = (self.start, self.end - self.start);
        if have < LEN_BYTES {
            return Ok(None);
        }
        let body = u32::from_le_bytes(self.buf[start..start + LEN_BYTES].try_into().unwrap()) as usize;
        let peer = self.peer;
        let fail = |mut e: Error| {
            e.message = format!("rank {peer}'s encrypted TCP connection failed: {}", e.message);
            e.with_peer(peer)
        };
        if !(HEADER_BYTES..=HEADER_BYTES + self.max).contains(&body) {
            return Err(fail(
                Error::remote(format!("a frame claims a {body}-byte sealed body (altered in transit)"))
                    .with_cause(Cause::Tampered),
            ));
        }
        let need = LEN_BYTES + body + TAG_BYTES;
        if have < need {
            return Ok(None);
        }
        let (len, rest) = self.buf[start..start + need].split_at_mut(LEN_BYTES);
        self.open.as_mut().unwrap().open(len, rest).map_err(fail)?;
        let h = Header::decode(&rest[..body], self.max).map_err(|e| e.with_peer(peer))?;
        if HEADER_BYTES + h.len as usize != body {
            return Err(fail(Error::internal("a sealed frame's header disagrees with its length")));
        }
        Ok(Some((h, need)))
    }

    /// Bytes of the frame at `start` still to arrive, once its length is in: the length prefix
    /// of an encrypted frame, the header of a plain one (0 before). Not validated here: a bad
    /// length fails in [`TcpRecv::complete`], which the reader asks first.
    pub(crate) fn missing(&self) -> usize {
        let b = &self.buf[self.start..self.end];
        let need = match self.open {
            Some(_) => {
                b.get(..LEN_BYTES).map(|l| LEN_BYTES + u32::from_le_bytes(l.try_into().unwrap()) as usize + TAG_BYTES)
            }
            None => Header::decode(b, self.max).ok().map(|h| HEADER_BYTES + h.len as usize),
        };
        need.map_or(0, |n| n.saturating_sub(b.len()))
    }

    /// Before sleeping: be woken when the rest of a large frame is in, not at its first segment
    /// ([`oxccl_transport::set_rcvlowat`]). Besides saving wake-ups, this keeps Linux ACKing the
    /// frame as it arrives: while less than the low mark is unread it ACKs at once
    /// (`__tcp_ack_snd_check`); otherwise, on a connection past its first exchanges, it holds
    /// ACKs that would shrink the window until the reader wakes and reads, the sender stalls on
    /// them, and 256 KiB–1 MiB all-reduces ran at under half speed in steady state
    /// (bench/ANALYSIS.md). Small remainders keep a low mark of 1.
    fn wake_when(&mut self, missing: usize) {
        let mark = if missing >= LOWAT_MIN { missing } else { 1 };
        if mark != self.lowat && oxccl_transport::set_rcvlowat(&self.s, mark).is_ok() {
            self.lowat = mark;
        }
    }

    /// The peer's side of the connection closed before the frame we wait for.
    fn closed(&self) -> Error {
        Error::remote(format!(
            "rank {} closed the TCP connection unexpectedly (process died or connection reset)",
            self.peer
        ))
        .with_peer(self.peer)
        .with_cause(Cause::PeerClosed)
    }

    /// Start reading the plain frame at `start` straight into `dst` if its header is in and the
    /// frame is not (else `false`: [`RecvConn::peek`] reads it, the header first, so that a
    /// poll makes one system call): `check` it, move the payload bytes already buffered into
    /// `dst`, and empty the buffer (nothing follows an incomplete frame there).
    fn begin_direct(&mut self, dst: &mut [u8], check: &dyn Fn(&Header) -> Result<()>) -> Result<bool> {
        let have = self.end - self.start;
        if have < HEADER_BYTES {
            return Ok(false);
        }
        let h = Header::decode(&self.buf[self.start..self.end], self.max).map_err(|e| e.with_peer(self.peer))?;
        if have >= HEADER_BYTES + h.len as usize {
            return Ok(false);
        }
        check(&h)?;
        if dst.len() != h.len as usize {
            return Err(Error::internal("direct TCP read into a buffer of the wrong size").with_peer(self.peer));
        }
        let got = have - HEADER_BYTES;
        oxccl_simd::copy(&mut dst[..got], &self.buf[self.start + HEADER_BYTES..self.end]);
        (self.start, self.end) = (0, 0);
        self.direct = Some((h, got));
        Ok(true)
    }

    fn fill(&mut self) -> Result<()> {
        if self.eof {
            return Ok(());
        }
        if self.start > 0 && self.buf.len() - self.end < self.frame_max() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        // a large rest of a frame is read up to the frame's end only: bytes of the next frame
        // read with it would be moved to the buffer's start before that frame could grow
        // there; and a plain frame's start is read with at most HEAD_READ of its payload
        // (the header's length first: `missing` would build an error for a short header, and
        // this runs at every poll of a small message's wait)
        let stop = if self.open.is_none() && self.end - self.start < HEADER_BYTES {
            self.start + HEADER_BYTES + HEAD_READ
        } else {
            match self.missing() {
                m if m >= HEAD_READ => self.end + m,
                _ => self.buf.len(),
            }
        };
        let stop = stop.min(self.buf.len());
        loop {
            if self.end == stop {
                return Ok(());
            }
            let room = stop - self.end;
            match self.s.read(&mut self.buf[self.end..stop]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                // a short read emptied the socket: asking again would only say so (one system
                // call more per received frame, on the critical path of a small message)
                Ok(n) if n < room => {
                    self.end += n;
                    return Ok(());
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(unreachable(self.peer, "receive", &e)),
            }
        }
    }
}

impl RecvConn for TcpRecv {
    fn peek(&mut self) -> Result<Option<(Header, &[u8])>> {
        if self.direct.is_some() {
            return Ok(None); // the frame is going into the buffer take_into was given
        }
        let mut got = self.complete()?;
        if got.is_none() {
            self.fill()?;
            got = self.complete()?;
        }
        match got {
            Some((h, _)) if h.step == oxccl_transport::ABORT_STEP => Err(Error::peer_aborted(self.peer)),
            Some((h, _)) => {
                let s = self.start + self.pre() + HEADER_BYTES;
                Ok(Some((h, &self.buf[s..s + h.len as usize])))
            }
            None if self.eof => Err(self.closed()),
            None => Ok(None),
        }
    }

    fn take_into(&mut self, dst: &mut [u8], check: &dyn Fn(&Header) -> Result<()>) -> Result<Option<Header>> {
        if self.open.is_some() {
            return Ok(None); // nothing of a sealed frame is handed out before its tag verified
        }
        if self.direct.is_none() && !self.begin_direct(dst, check)? {
            return Ok(None);
        }
        let (h, mut done) = self.direct.expect("a direct read under way");
        if dst.len() != h.len as usize {
            return Err(Error::internal("a direct TCP read resumed into a buffer of another size").with_peer(self.peer));
        }
        while done < dst.len() {
            match self.s.read(&mut dst[done..]) {
                Ok(0) => {
                    self.eof = true;
                    return Err(self.closed());
                }
                // a short read emptied the socket
                Ok(n) if done + n < dst.len() => {
                    done += n;
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(unreachable(self.peer, "receive", &e)),
            }
        }
        self.direct = Some((h, done));
        Ok((done == dst.len()).then_some(h))
    }

    fn consume(&mut self) -> Result<()> {
        if let Some((h, done)) = self.direct {
            if done != h.len as usize {
                return Err(Error::internal("tcp consume of a frame still arriving").with_peer(self.peer));
            }
            self.direct = None;
            return Ok(());
        }
        let (_, need) = self.complete()?.ok_or_else(|| Error::internal("tcp consume without a frame"))?;
        self.start += need;
        self.opened = None;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(())
    }

    fn arm(&mut self) -> Result<Option<WaitSource>> {
        if let Some((h, done)) = self.direct {
            if self.eof {
                return Ok(None);
            }
            self.wake_when(h.len as usize - done);
            return Ok(Some(WaitSource::read(self.s.as_raw_fd())));
        }
        if self.eof || self.complete()?.is_some() {
            return Ok(None);
        }
        self.wake_when(self.missing());
        Ok(Some(WaitSource::read(self.s.as_raw_fd())))
    }

    fn disarm(&mut self) {}

    fn memory(&self) -> usize {
        self.buf.len()
    }
}
