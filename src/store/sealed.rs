//! An authenticated store connection: plain, or sealed (every request and answer encrypted and
//! authenticated with AES-256-GCM, keys per connection and direction) when the job encrypts.
//!
//! After the server's challenge (a fresh 16-byte nonce, then its mode and a key check) and the
//! client's proof, a sealed connection carries records: `len` (u32 LE, associated data), the
//! sealed bytes of one `write_all`, the tag. The reader opens one record at a time and hands its
//! plaintext out; a record that fails authentication is an `InvalidData` error and nothing of it
//! is read.

use oxccl_transport::seal::{derive, key_check, MasterKey, Opener, Sealer, TAG_BYTES};
use std::io::{Error, ErrorKind, Read, Result, Write};
use std::net::TcpStream;

/// The largest record (a request or an answer): values are at most 64 MiB, plus keys.
const MAX_RECORD: usize = 256 << 20;
/// Bytes of the server's challenge: nonce, mode, key check.
pub(super) const CHALLENGE_BYTES: usize = 16 + 1 + 16;

/// The mode and key check that follow the nonce in the challenge.
pub(super) fn mode_word(master: Option<&MasterKey>, nonce: &[u8]) -> [u8; 17] {
    let mut w = [0u8; 17];
    if let Some(m) = master {
        w[0] = 1;
        w[1..].copy_from_slice(&key_check(&m.0, nonce));
    }
    w
}

/// A store connection after authentication.
pub(crate) enum Conn {
    /// c10d's protocol as it is.
    Plain(TcpStream),
    /// The protocol inside sealed records.
    Sealed(Box<Sealed>),
}

/// The sealed form of a connection.
pub(crate) struct Sealed {
    s: TcpStream,
    tx: Sealer,
    rx: Opener,
    buf: Vec<u8>,
    at: usize,
}

impl Conn {
    /// The connection on `s`, sealed under keys derived from `master` and the challenge's
    /// `nonce` when there is a master key; `client` says which direction is whose.
    pub(super) fn new(s: TcpStream, master: Option<&MasterKey>, nonce: &[u8], client: bool) -> Conn {
        let Some(m) = master else { return Conn::Plain(s) };
        let c2s = derive(&m.0, b"store: client to server", nonce);
        let s2c = derive(&m.0, b"store: server to client", nonce);
        let (tx, rx) = if client { (c2s, s2c) } else { (s2c, c2s) };
        Conn::Sealed(Box::new(Sealed { s, tx: Sealer::new(&tx), rx: Opener::new(&rx), buf: Vec::new(), at: 0 }))
    }

    /// The socket underneath (timeouts, peeking, shutdown).
    pub(super) fn stream(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Sealed(x) => &x.s,
        }
    }
}

fn bad(e: oxccl_transport::Error) -> Error {
    Error::new(ErrorKind::InvalidData, e.message)
}

impl Sealed {
    fn next_record(&mut self) -> Result<()> {
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len)?;
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_RECORD {
            return Err(Error::new(ErrorKind::InvalidData, format!("a sealed store record claims {n} bytes")));
        }
        self.buf.resize(n + TAG_BYTES, 0);
        self.s.read_exact(&mut self.buf)?;
        self.rx.open(&len, &mut self.buf).map_err(bad)?;
        self.buf.truncate(n);
        self.at = 0;
        Ok(())
    }
}

impl Read for Conn {
    fn read(&mut self, out: &mut [u8]) -> Result<usize> {
        let x = match self {
            Conn::Plain(s) => return s.read(out),
            Conn::Sealed(x) => x,
        };
        if x.at == x.buf.len() {
            match x.next_record() {
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                r => r?,
            }
        }
        let n = out.len().min(x.buf.len() - x.at);
        out[..n].copy_from_slice(&x.buf[x.at..x.at + n]);
        x.at += n;
        Ok(n)
    }
}

impl Write for Conn {
    /// Plain: the socket's write. Sealed: all of `data` as one record.
    fn write(&mut self, data: &[u8]) -> Result<usize> {
        let x = match self {
            Conn::Plain(s) => return s.write(data),
            Conn::Sealed(x) => x,
        };
        if data.len() > MAX_RECORD {
            return Err(Error::new(ErrorKind::InvalidInput, "store record too large"));
        }
        let len = (data.len() as u32).to_le_bytes();
        let mut rec = Vec::with_capacity(4 + data.len() + TAG_BYTES);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(data);
        let tag = x.tx.seal(&len, &mut rec[4..]).map_err(bad)?;
        rec.extend_from_slice(&tag);
        x.s.write_all(&rec)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Sealed(x) => x.s.flush(),
        }
    }
}
