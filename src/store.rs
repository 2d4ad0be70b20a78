//! The bootstrap key-value store, and its implementations.
//!
//! Bootstrap (peer discovery, connection setup blobs, split) goes through a [`Store`], as in Gloo
//! and PyTorch. [`TcpStore`] speaks the wire protocol of PyTorch's c10d `TCPStore`, so under
//! torchrun oxccl is a client of torchrun's store on `MASTER_PORT`, and standalone rank 0 serves a
//! compatible one ([`StoreServer`]). With a [`crate::UniqueId`], the server requires every client
//! to prove it knows the id's secret first (a challenge answered with a keyed hash) before it
//! reads anything else; strangers are dropped after [`AUTH_TIMEOUT`] at most.
//! [`MemStore`] serves threads-as-ranks in one process.

use crate::{Error, ErrorKind, Result};
use oxccl_transport::{proof, random_bytes, verify_proof};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an authenticating client may take.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(2);
const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
const MAX_KEY: u64 = 8 << 10;
const MAX_VALUE: u64 = 64 << 20;
const MAX_KEYS: u64 = 1 << 20;

/// A bootstrap key-value store.
pub trait Store: Send + Sync {
    /// Set `key` to `value`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Wait (up to `timeout`) for all `keys`, then return their values.
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>>;
    /// Add `delta` to the integer at `key` (0 if absent); returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Whether all `keys` exist, without waiting.
    fn check(&self, keys: &[String]) -> Result<bool>;
    /// Delete `key`; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;
    /// Wait (up to `timeout`) for `key`, then return its value.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        Ok(self.multi_get(&[key.to_string()], timeout)?.remove(0))
    }
    /// Wait up to `timeout` for all `keys`: `true` when they all exist, `false` at the timeout
    /// (for waits in slices, which check other conditions between them).
    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        match self.multi_get(keys, timeout) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::Timeout => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// An in-process store (threads as ranks).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

fn store_timeout(keys: &[String], timeout: Duration) -> Error {
    Error::timeout(format!("bootstrap store: keys {keys:?} not set within {:.1} s", timeout.as_secs_f64()))
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map.lock().unwrap().insert(key.to_string(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut g = self.map.lock().unwrap();
        loop {
            if keys.iter().all(|k| g.contains_key(k)) {
                return Ok(keys.iter().map(|k| g[k].clone()).collect());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = keys.iter().filter(|k| !g.contains_key(*k)).cloned().collect();
                return Err(store_timeout(&missing, timeout));
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut g = self.map.lock().unwrap();
        let v = g.get(key).and_then(|b| std::str::from_utf8(b).ok()?.parse::<i64>().ok()).unwrap_or(0) + delta;
        g.insert(key.to_string(), v.to_string().into_bytes());
        self.cv.notify_all();
        Ok(v)
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        let g = self.map.lock().unwrap();
        Ok(keys.iter().all(|k| g.contains_key(k)))
    }
    fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.map.lock().unwrap().remove(key).is_some())
    }
}

/// A store that prepends `prefix/` to every key (PyTorch's `PrefixStore`).
pub struct PrefixStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl PrefixStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Store>, prefix: impl Into<String>) -> Self {
        PrefixStore { inner, prefix: prefix.into() }
    }
    fn k(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.k(key), value)
    }
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.multi_get(&ks, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.k(key), delta)
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.check(&ks)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.k(key))
    }
    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.wait_all(&ks, timeout)
    }
}

// ---- wire protocol ---------------------------------------------------------------------------

mod q {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

fn put_bytes(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_ne_bytes());
    b.extend_from_slice(s);
}

/// Keys travel with c10d's `/` prefix (what `TCPStore` clients send), so keys are shared with
/// torch processes using the same store.
fn put_key(b: &mut Vec<u8>, k: &str) {
    b.extend_from_slice(&(k.len() as u64 + 1).to_ne_bytes());
    b.push(b'/');
    b.extend_from_slice(k.as_bytes());
}

fn read_exact(s: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

fn read_sized(s: &mut impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let n = read_u64(s)?;
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("length {n} exceeds {max}")));
    }
    read_exact(s, n as usize)
}

fn read_key(s: &mut impl Read) -> std::io::Result<String> {
    String::from_utf8(read_sized(s, MAX_KEY)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "key is not UTF-8"))
}

/// A client of a c10d-compatible TCP store.
pub struct TcpStore {
    addr: SocketAddr,
    secret: Option<[u8; 32]>,
    conn: Mutex<Option<TcpStream>>,
    connect_timeout: Duration,
    /// Reached once: a refused reconnection then means the server's process is gone (a store
    /// is not restarted), said at once instead of retrying until the timeout.
    reached: std::sync::atomic::AtomicBool,
}

impl TcpStore {
    /// Connect to the store at `addr`, retrying until `timeout`. With `secret`, answer the
    /// server's challenge (oxccl's authenticated mode).
    pub fn connect(addr: SocketAddr, secret: Option<[u8; 32]>, timeout: Duration) -> Result<TcpStore> {
        let st = TcpStore {
            addr,
            secret,
            conn: Mutex::new(None),
            connect_timeout: timeout,
            reached: std::sync::atomic::AtomicBool::new(false),
        };
        let s = st.open()?;
        *st.conn.lock().unwrap() = Some(s);
        Ok(st)
    }

    fn open(&self) -> Result<TcpStream> {
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

    fn handshake(&self, mut s: TcpStream) -> Result<TcpStream> {
        let io = |e: std::io::Error| Error::system("bootstrap store handshake", &e);
        s.set_nodelay(true).map_err(io)?;
        if let Some(secret) = &self.secret {
            s.set_read_timeout(Some(AUTH_TIMEOUT)).map_err(io)?;
            let nonce = read_exact(&mut s, 16).map_err(io)?;
            let mut ctx = b"oxccl-store".to_vec();
            ctx.extend_from_slice(&nonce);
            s.write_all(&proof(secret, &ctx)).map_err(io)?;
        }
        let mut b = vec![q::VALIDATE];
        b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
        s.write_all(&b).map_err(io)?;
        Ok(s)
    }

    /// Run one request/response exchange. On an I/O error or timeout the connection is dropped
    /// and re-opened by the next call.
    fn call<R>(
        &self,
        req: &[u8],
        timeout: Option<Duration>,
        resp: impl FnOnce(&mut TcpStream) -> std::io::Result<R>,
    ) -> Result<R> {
        let mut g = self.conn.lock().unwrap();
        if g.is_none() {
            *g = Some(self.open()?);
        }
        let s = g.as_mut().unwrap();
        let r = s
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

// ---- server ----------------------------------------------------------------------------------

struct ServerState {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
    stop: AtomicBool,
    clients: Mutex<Vec<TcpStream>>,
    secret: Option<[u8; 32]>,
    rejected: std::sync::atomic::AtomicUsize,
}

/// A c10d-compatible store server: one accept thread plus one thread per client, all blocked in
/// the kernel when idle. Stops (and joins nothing it could hang on) when dropped.
pub struct StoreServer {
    state: Arc<ServerState>,
    addr: SocketAddr,
    accept: Option<std::thread::JoinHandle<()>>,
    /// The fork generation that started it: in a `fork` child its threads do not exist.
    generation: u64,
}

impl StoreServer {
    /// Serve on `listener`. With `secret`, clients must answer a challenge first.
    pub fn start(listener: TcpListener, secret: Option<[u8; 32]>) -> Result<StoreServer> {
        let addr = listener.local_addr().map_err(|e| Error::system("store local_addr", &e))?;
        let state = Arc::new(ServerState {
            map: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            clients: Mutex::new(Vec::new()),
            secret,
            rejected: Default::default(),
        });
        let st = state.clone();
        let accept = std::thread::Builder::new()
            .name("oxccl-store".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(s) = conn else { continue };
                    if let Ok(c) = s.try_clone() {
                        st.clients.lock().unwrap().push(c);
                    }
                    let st2 = st.clone();
                    let _ = std::thread::Builder::new()
                        .name("oxccl-store-client".into())
                        .spawn(move || serve_client(st2, s));
                }
            })
            .map_err(|e| Error::system("spawning the store thread", &e))?;
        Ok(StoreServer { state, addr, accept: Some(accept), generation: oxccl_transport::fork::generation() })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Clients dropped for failing authentication or breaking the protocol.
    pub fn rejected(&self) -> usize {
        self.state.rejected.load(Ordering::Relaxed)
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        if self.generation != oxccl_transport::fork::generation() {
            // inherited through fork: its threads live in the parent only, and its sockets are
            // shared with the parent's, so nothing is shut down or joined; the child's copies of
            // the descriptors are closed with the state
            std::mem::forget(self.accept.take());
            return;
        }
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.cv.notify_all();
        // only the read side: a client thread blocked for the next request wakes and ends, while
        // one writing a response finishes it first (a client that read all it needed, such as the
        // last rank of a split, must not lose its answer because the host's rank went on and
        // destroyed its communicator)
        for c in self.state.clients.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Read);
        }
        // wake the accept loop
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve_client(st: Arc<ServerState>, mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    if let Err(e) = serve_inner(&st, &mut s) {
        if e.kind() == std::io::ErrorKind::InvalidData || e.kind() == std::io::ErrorKind::PermissionDenied {
            st.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("oxccl store: dropped client {:?}: {e}", s.peer_addr().ok());
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    let mut clients = st.clients.lock().unwrap();
    let me = s.peer_addr().ok();
    clients.retain(|c| c.peer_addr().ok() != me);
}

fn invalid(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Block until all `keys` exist. Gives up when the server stops or the client goes away (a
/// client whose wait timed out reconnects, so its old connection must not keep a thread here).
fn wait_keys<'a>(
    st: &'a ServerState,
    keys: &[String],
    client: &TcpStream,
) -> std::io::Result<std::sync::MutexGuard<'a, HashMap<String, Vec<u8>>>> {
    let mut g = st.map.lock().unwrap();
    while !keys.iter().all(|k| g.contains_key(k)) {
        if st.stop.load(Ordering::SeqCst) || client_gone(client) {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "store stopping or client gone"));
        }
        g = st.cv.wait_timeout(g, Duration::from_millis(250)).unwrap().0;
    }
    Ok(g)
}

fn client_gone(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let _ = s.set_nonblocking(true);
    let gone = matches!(s.peek(&mut b), Ok(0))
        || matches!(s.peek(&mut b), Err(e) if e.kind() != std::io::ErrorKind::WouldBlock);
    let _ = s.set_nonblocking(false);
    gone
}

fn read_keys(s: &mut TcpStream) -> std::io::Result<Vec<String>> {
    let n = read_u64(s)?;
    if n > MAX_KEYS {
        return Err(invalid("too many keys"));
    }
    (0..n).map(|_| read_key(s)).collect()
}

fn serve_inner(st: &ServerState, s: &mut TcpStream) -> std::io::Result<()> {
    if let Some(secret) = &st.secret {
        authenticate(secret, s)?;
    }
    loop {
        let mut op = [0u8; 1];
        if s.read(&mut op)? == 0 {
            return Ok(());
        }
        let out = answer(st, s, op[0])?;
        if !out.is_empty() {
            s.write_all(&out)?;
        }
    }
}

/// The client proves it knows the secret: a keyed hash of a fresh nonce, within AUTH_TIMEOUT.
fn authenticate(secret: &[u8; 32], s: &mut TcpStream) -> std::io::Result<()> {
    let mut nonce = [0u8; 16];
    random_bytes(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    s.write_all(&nonce)?;
    s.set_read_timeout(Some(AUTH_TIMEOUT))?;
    let claimed = read_exact(s, 32)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no authentication in time"))?;
    let mut ctx = b"oxccl-store".to_vec();
    ctx.extend_from_slice(&nonce);
    if !verify_proof(secret, &ctx, &claimed) {
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "bad secret proof"));
    }
    s.set_read_timeout(None)
}

/// Read the rest of query `op` and carry it out; returns the answer (empty: none).
fn answer(st: &ServerState, s: &mut TcpStream, op: u8) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    match op {
        q::VALIDATE => {
            let m = read_exact(s, 4)?;
            if u32::from_ne_bytes(m.try_into().unwrap()) != VALIDATE_MAGIC {
                return Err(invalid("bad validation magic"));
            }
        }
        q::SET => {
            let k = read_key(s)?;
            let v = read_sized(s, MAX_VALUE)?;
            st.map.lock().unwrap().insert(k, v);
            st.cv.notify_all();
        }
        q::COMPARE_SET => {
            let k = read_key(s)?;
            let expected = read_sized(s, MAX_VALUE)?;
            let desired = read_sized(s, MAX_VALUE)?;
            let mut g = st.map.lock().unwrap();
            let cur = g.get(&k).cloned();
            let result = match cur {
                None if expected.is_empty() => {
                    g.insert(k, desired.clone());
                    desired
                }
                None => expected,
                Some(c) if c == expected => {
                    g.insert(k, desired.clone());
                    desired
                }
                Some(c) => c,
            };
            st.cv.notify_all();
            put_bytes(&mut out, &result);
        }
        q::GET => {
            let k = read_key(s)?;
            let g = wait_keys(st, std::slice::from_ref(&k), s)?;
            put_bytes(&mut out, &g[&k]);
        }
        q::ADD => {
            let k = read_key(s)?;
            let d = i64::from_ne_bytes(read_exact(s, 8)?.try_into().unwrap());
            let mut g = st.map.lock().unwrap();
            let v =
                g.get(&k).and_then(|b| std::str::from_utf8(b).ok()?.parse::<i64>().ok()).unwrap_or(0).wrapping_add(d);
            g.insert(k, v.to_string().into_bytes());
            st.cv.notify_all();
            out.extend_from_slice(&v.to_ne_bytes());
        }
        q::CHECK => {
            let keys = read_keys(s)?;
            let g = st.map.lock().unwrap();
            out.push(if keys.iter().all(|k| g.contains_key(k)) { 0 } else { 1 });
        }
        q::WAIT => {
            let keys = read_keys(s)?;
            drop(wait_keys(st, &keys, s)?);
            out.push(0);
        }
        q::GETNUMKEYS => {
            out.extend_from_slice(&(st.map.lock().unwrap().len() as i64).to_ne_bytes());
        }
        q::DELETE_KEY => {
            let k = read_key(s)?;
            let n = st.map.lock().unwrap().remove(&k).is_some() as i64;
            out.extend_from_slice(&n.to_ne_bytes());
        }
        q::APPEND => {
            let k = read_key(s)?;
            let v = read_sized(s, MAX_VALUE)?;
            st.map.lock().unwrap().entry(k).or_default().extend_from_slice(&v);
            st.cv.notify_all();
        }
        q::MULTI_GET => {
            let keys = read_keys(s)?;
            let g = wait_keys(st, &keys, s)?;
            for k in &keys {
                put_bytes(&mut out, &g[k]);
            }
        }
        q::MULTI_SET => {
            let n = read_u64(s)?;
            if n > MAX_KEYS {
                return Err(invalid("too many keys"));
            }
            for _ in 0..n {
                let k = read_key(s)?;
                let v = read_sized(s, MAX_VALUE)?;
                st.map.lock().unwrap().insert(k, v);
            }
            st.cv.notify_all();
        }
        q::CANCEL_WAIT => out.push(1),
        q::PING => out.extend_from_slice(&read_exact(s, 4)?),
        other => return Err(invalid(&format!("unknown query type {other}"))),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(secret: Option<[u8; 32]>) -> StoreServer {
        StoreServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), secret).unwrap()
    }

    fn exercise(st: &dyn Store) {
        st.set("a", b"1").unwrap();
        assert_eq!(st.get("a", Duration::from_secs(1)).unwrap(), b"1");
        assert_eq!(st.add("n", 5).unwrap(), 5);
        assert_eq!(st.add("n", -2).unwrap(), 3);
        assert!(st.check(&["a".into()]).unwrap());
        assert!(!st.check(&["a".into(), "zz".into()]).unwrap());
        let t = Instant::now();
        let e = st.get("zz", Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.contains("zz"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(st.delete("a").unwrap());
        assert!(!st.delete("a").unwrap());
        // usable after a timeout
        st.set("b", b"2").unwrap();
        assert_eq!(
            st.multi_get(&["b".into(), "n".into()], Duration::from_secs(1)).unwrap(),
            vec![b"2".to_vec(), b"3".to_vec()]
        );
    }

    #[test]
    fn mem_store() {
        exercise(&*MemStore::new());
    }

    #[test]
    fn tcp_store_plain_and_authenticated() {
        let s = server(None);
        exercise(&TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap());
        let secret = [3u8; 32];
        let s = server(Some(secret));
        exercise(&TcpStore::connect(s.addr(), Some(secret), Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn wait_is_released_by_another_client() {
        let s = server(None);
        let a = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        let h = std::thread::spawn(move || a.get("k", Duration::from_secs(10)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        b.set("k", b"v").unwrap();
        assert_eq!(h.join().unwrap(), b"v");
    }

    #[test]
    fn strangers_are_dropped_without_blocking_members() {
        let secret = [9u8; 32];
        let s = server(Some(secret));
        // silent, garbage, wrong secret, oversized key after a good handshake of the wrong secret
        let _silent = TcpStream::connect(s.addr()).unwrap();
        let mut garbage = TcpStream::connect(s.addr()).unwrap();
        let _ = garbage.write_all(&[0xFF; 100]);
        let wrong = TcpStore::connect(s.addr(), Some([1u8; 32]), Duration::from_millis(300));
        if let Ok(w) = wrong {
            assert!(w.set("x", b"y").is_err() || w.check(&["x".into()]).is_err());
        }
        let t = Instant::now();
        let good = TcpStore::connect(s.addr(), Some(secret), Duration::from_secs(5)).unwrap();
        good.set("k", b"v").unwrap();
        assert_eq!(good.get("k", Duration::from_secs(1)).unwrap(), b"v");
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(!good.check(&["x".into()]).unwrap(), "the stranger could not write");
        std::thread::sleep(AUTH_TIMEOUT + Duration::from_millis(300));
        assert!(s.rejected() >= 2, "rejected {}", s.rejected());
    }

    #[test]
    fn oversized_lengths_are_rejected() {
        let s = server(None);
        let mut c = TcpStream::connect(s.addr()).unwrap();
        let mut b = vec![q::VALIDATE];
        b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
        b.push(q::SET);
        b.extend_from_slice(&u64::MAX.to_ne_bytes());
        c.write_all(&b).unwrap();
        let mut buf = [0u8; 1];
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "server closed the connection");
        // the server is still fine
        let ok = TcpStore::connect(s.addr(), None, Duration::from_secs(1)).unwrap();
        ok.set("a", b"b").unwrap();
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;

    /// Random byte streams (after a valid preamble half of the time) never crash the server or
    /// keep it from serving a real client.
    #[test]
    fn the_server_survives_random_streams() {
        let s = StoreServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), None).unwrap();
        let mut z = 0xF00D_u64;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        for i in 0..300 {
            let mut c = TcpStream::connect(s.addr()).unwrap();
            let mut b = Vec::new();
            if i % 2 == 0 {
                b.push(q::VALIDATE);
                b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
            }
            let len = (next() % 200) as usize;
            b.extend((0..len).map(|_| {
                let x = next() as u8;
                // favour small query codes and small lengths so parsing goes deep
                if x < 128 {
                    x % 14
                } else {
                    x
                }
            }));
            let _ = c.write_all(&b);
            let _ = c.shutdown(Shutdown::Write);
        }
        let ok = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        ok.set("still", b"serving").unwrap();
        assert_eq!(ok.get("still", Duration::from_secs(5)).unwrap(), b"serving");
    }
}
