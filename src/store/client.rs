//! [`TcpStore`]: a client of a c10d-compatible TCP store (torchrun's, or oxccl's own server).

use super::sealed::{mode_word, Conn, CHALLENGE_BYTES};
use super::wire::*;
use super::{store_timeout, Store, AUTH_TIMEOUT};
use crate::{Cause, Error, ErrorKind, Result};
use oxccl_transport::proof;
use oxccl_transport::seal::MasterKey;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A client of a c10d-compatible TCP store.
pub struct TcpStore {
    addr: SocketAddr,
    secret: Option<[u8; 32]>,
    master: Option<MasterKey>,
    /// What to leave in the store (key, text) if the server refuses this client's encryption.
    report: Option<(String, String)>,
    conn: Mutex<Option<Conn>>,
    connect_timeout: Duration,
    /// Reached once: a refused reconnection then means the server's process is gone (a store
    /// is not restarted), said at once instead of retrying until the timeout.
    reached: std::sync::atomic::AtomicBool,
}

impl TcpStore {
    /// Connect to the store at `addr`, retrying until `timeout`. With `secret`, answer the
    /// server's challenge (oxccl's authenticated mode).
    pub fn connect(addr: SocketAddr, secret: Option<[u8; 32]>, timeout: Duration) -> Result<TcpStore> {
        Self::connect_sealed(addr, secret, None, timeout)
    }

    /// [`TcpStore::connect`]; with a `secret` and a `master` key, every request and answer is
    /// encrypted (an oxccl server started with the same key). A server that does not agree on
    /// encryption or key is an error at once, naming it.
    pub fn connect_sealed(
        addr: SocketAddr,
        secret: Option<[u8; 32]>,
        master: Option<MasterKey>,
        timeout: Duration,
    ) -> Result<TcpStore> {
        let st = TcpStore {
            addr,
            secret,
            master: secret.and(master),
            report: None,
            conn: Mutex::new(None),
            connect_timeout: timeout,
            reached: std::sync::atomic::AtomicBool::new(false),
        };
        st.first_connection()
    }

    fn first_connection(self) -> Result<TcpStore> {
        let s = self.open()?;
        *self.conn.lock().unwrap() = Some(s);
        Ok(self)
    }

    fn open(&self) -> Result<Conn> {
        let deadline = Instant::now() + self.connect_timeout;
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let c = TcpStream::connect_timeout(&self.addr, left.max(Duration::from_millis(1)));
            let reached = self.reached.load(std::sync::atomic::Ordering::Relaxed);
            if let (true, Err(e)) = (reached, c.as_ref()) {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    let mut err = Error::system(
                        format!("the bootstrap store at {} is gone (its process exited): reconnecting", self.addr),
                        e,
                    );
                    err.kind = ErrorKind::Remote;
                    return Err(err);
                }
            }
            let r = c
                .map_err(|e| Error::system(format!("connecting to the bootstrap store at {}", self.addr), &e))
                .and_then(|s| self.handshake(s));
            match r {
                Ok(s) => {
                    self.reached.store(true, std::sync::atomic::Ordering::Relaxed);
                    return Ok(s);
                }
                Err(e) if e.cause == Some(Cause::Mismatch) => return Err(e),
                Err(e) if Instant::now() + backoff >= deadline => {
                    let mut e = Error::timeout(format!(
                        "could not reach the bootstrap store at {} within {:.1} s: {}",
                        self.addr,
                        self.connect_timeout.as_secs_f64(),
                        e.message
                    ));
                    e.kind = ErrorKind::Timeout;
                    return Err(e);
                }
                Err(_) => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
            }
        }
    }

    /// [`TcpStore::connect_sealed`] for a rank joining a job: if the server refuses this
    /// client's encryption setting, leave `text` under `key` (the job's `init-failed`) first,
    /// so the other ranks fail at once with it.
    pub(crate) fn connect_member(
        addr: SocketAddr,
        secret: [u8; 32],
        master: Option<MasterKey>,
        report: (String, String),
        timeout: Duration,
    ) -> Result<TcpStore> {
        let st = TcpStore {
            addr,
            secret: Some(secret),
            master,
            report: Some(report),
            conn: Mutex::new(None),
            connect_timeout: timeout,
            reached: std::sync::atomic::AtomicBool::new(false),
        };
        st.first_connection()
    }

    /// Ask the server for a store's ping (c10d's PING, a nonce echoed): an error within
    /// [`AUTH_TIMEOUT`] when the program on the port is not a store.
    pub fn ping(&self) -> Result<()> {
        let nonce = (std::process::id() ^ 0x5bd1_e995).to_ne_bytes();
        let mut b = vec![q::PING];
        b.extend_from_slice(&nonce);
        let echo = self.call(&b, Some(AUTH_TIMEOUT), |s| read_exact(s, 4))?;
        if echo != nonce {
            return Err(Error::remote(format!("the ping of {} was answered with {echo:02x?}", self.addr)));
        }
        Ok(())
    }

    fn handshake(&self, mut s: TcpStream) -> Result<Conn> {
        let io = |e: std::io::Error| Error::system("bootstrap store handshake", &e);
        s.set_nodelay(true).map_err(io)?;
        let mut conn = match &self.secret {
            None => Conn::Plain(s),
            Some(secret) => {
                s.set_read_timeout(Some(AUTH_TIMEOUT)).map_err(io)?;
                let chal = read_exact(&mut s, CHALLENGE_BYTES).map_err(io)?;
                let (nonce, theirs) = chal.split_at(16);
                let mine = mode_word(self.master.as_ref(), nonce);
                s.write_all(&[&mine[..], &proof(secret, &proof_context(nonce, &mine))[..]].concat()).map_err(io)?;
                if theirs != mine {
                    // a member the server refuses: it may leave the reason for the others
                    if let Some((k, v)) = &self.report {
                        let mut b = vec![q::SET];
                        put_key(&mut b, k);
                        put_bytes(&mut b, v.as_bytes());
                        let _ = s.write_all(&b);
                    }
                    return Err(self.mismatch(theirs[0] != 0));
                }
                Conn::new(s, self.master.as_ref(), nonce, true)
            }
        };
        let mut b = vec![q::VALIDATE];
        b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
        conn.write_all(&b).map_err(io)?;
        Ok(conn)
    }

    fn mismatch(&self, server_encrypts: bool) -> Error {
        let what = match (server_encrypts, self.master.is_some()) {
            (true, false) => "encrypts its traffic and this process does not",
            (false, true) => "does not encrypt its traffic and this process does",
            _ => "encrypts its traffic with a different key",
        };
        Error::invalid_usage(format!(
            "the bootstrap store at {} {what}: every rank needs the same encryption setting and key (OXCCL_ENCRYPT, \
             OXCCL_PSK_FILE or ncclSetEncryption, set before the unique id is made)",
            self.addr
        ))
        .with_cause(Cause::Mismatch)
    }

    /// Run one request/response exchange. On an I/O error or timeout the connection is dropped
    /// and re-opened by the next call.
    fn call<R>(
        &self,
        req: &[u8],
        timeout: Option<Duration>,
        resp: impl FnOnce(&mut Conn) -> std::io::Result<R>,
    ) -> Result<R> {
        let mut g = self.conn.lock().unwrap();
        if g.is_none() {
            *g = Some(self.open()?);
        }
        let s = g.as_mut().unwrap();
        let r = s
            .stream()
            .set_read_timeout(timeout.map(|t| t.max(Duration::from_millis(1))))
            .and_then(|_| s.write_all(req))
            .and_then(|_| resp(s));
        r.map_err(|e| {
            *g = None;
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                Error::timeout(format!("bootstrap store at {} did not answer in time", self.addr))
            } else {
                let mut err = Error::system(format!("bootstrap store at {}", self.addr), &e);
                err.kind = ErrorKind::Remote;
                err
            }
        })
    }

    fn keys_req(op: u8, keys: &[String]) -> Vec<u8> {
        let mut b = vec![op];
        b.extend_from_slice(&(keys.len() as u64).to_ne_bytes());
        for k in keys {
            put_key(&mut b, k);
        }
        b
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut b = vec![q::SET];
        put_key(&mut b, key);
        put_bytes(&mut b, value);
        self.call(&b, None, |_| Ok(()))
    }

    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        match self.call(&Self::keys_req(q::WAIT, keys), Some(timeout), |s| read_exact(s, 1)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::Timeout => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let w = self.call(&Self::keys_req(q::WAIT, keys), Some(timeout), |s| read_exact(s, 1));
        match w {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::Timeout => {
                let missing: Vec<String> =
                    keys.iter().filter(|k| !self.check(std::slice::from_ref(*k)).unwrap_or(false)).cloned().collect();
                return Err(store_timeout(&missing, timeout));
            }
            Err(e) => return Err(e),
        }
        self.call(&Self::keys_req(q::MULTI_GET, keys), Some(timeout), |s| {
            (0..keys.len()).map(|_| read_sized(s, MAX_VALUE)).collect()
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut b = vec![q::ADD];
        put_key(&mut b, key);
        b.extend_from_slice(&delta.to_ne_bytes());
        self.call(&b, Some(self.connect_timeout), |s| Ok(i64::from_ne_bytes(read_exact(s, 8)?.try_into().unwrap())))
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        self.call(&Self::keys_req(q::CHECK, keys), Some(self.connect_timeout), |s| Ok(read_exact(s, 1)?[0] == 0))
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let mut b = vec![q::DELETE_KEY];
        put_key(&mut b, key);
        self.call(&b, Some(self.connect_timeout), |s| Ok(i64::from_ne_bytes(read_exact(s, 8)?.try_into().unwrap()) > 0))
    }
}

/// What a client's proof covers: the server's nonce and its mode word.
pub(super) fn proof_context(nonce: &[u8], mode: &[u8]) -> Vec<u8> {
    [&b"oxccl-store"[..], nonce, mode].concat()
}
