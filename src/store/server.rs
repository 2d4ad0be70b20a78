//! [`StoreServer`]: oxccl's c10d-compatible store server, authenticated with a unique id's secret.

use super::sealed::{mode_word, Conn};
use super::wire::*;
use super::AUTH_TIMEOUT;
use oxccl_transport::seal::MasterKey;
use crate::{Error, Result};
use oxccl_transport::{random_bytes, verify_proof};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

// ---- server ----------------------------------------------------------------------------------

struct ServerState {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
    stop: AtomicBool,
    clients: Mutex<Vec<TcpStream>>,
    /// Notified when a client connects or its connection ends (the lingering drop waits for
    /// the last to go).
    left: Condvar,
    secret: Option<[u8; 32]>,
    master: Option<MasterKey>,
    rejected: std::sync::atomic::AtomicUsize,
}

/// How long a dropped server keeps serving clients that are still connected: the rank hosting
/// it may destroy its communicator while the others still read their last answers (a split's
/// records), so it stops once they have all gone, or after this.
pub const LINGER: Duration = Duration::from_secs(10);

/// A c10d-compatible store server: one accept thread plus one thread per client, all blocked in
/// the kernel when idle. When dropped it returns at once and stops in the background, once its
/// clients have all disconnected or after `LINGER` (and joins nothing it could hang on).
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
        Self::start_sealed(listener, secret, None)
    }

    /// [`StoreServer::start`]; with a `secret` and a `master` key, every request and answer is
    /// also encrypted (the job encrypts its traffic, docs/security.md), and clients that do not
    /// encrypt, or hold another key, are refused at the challenge.
    pub fn start_sealed(
        listener: TcpListener,
        secret: Option<[u8; 32]>,
        master: Option<MasterKey>,
    ) -> Result<StoreServer> {
        let addr = listener.local_addr().map_err(|e| Error::system("store local_addr", &e))?;
        let state = Arc::new(ServerState {
            map: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            clients: Mutex::new(Vec::new()),
            left: Condvar::new(),
            secret,
            master: secret.and(master),
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
                        st.left.notify_all();
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
        let (state, addr, accept) = (self.state.clone(), self.addr, self.accept.take());
        let stop = move || stop(&state, addr, accept);
        if let Err(e) = std::thread::Builder::new().name("oxccl-store-linger".into()).spawn(stop) {
            tracing::warn!("oxccl store: no thread to linger in ({e}): stopping at once");
            stop_now(&self.state, self.addr, self.accept.take());
        }
    }
}

/// How long a lingering server waits with no client before it stops.
const GRACE: Duration = Duration::from_millis(200);

/// Wait (bounded by [`LINGER`]) for the clients still connected to go, then stop.
fn stop(st: &ServerState, addr: SocketAddr, accept: Option<std::thread::JoinHandle<()>>) {
    let until = std::time::Instant::now() + LINGER;
    let mut clients = st.clients.lock().unwrap();
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        if clients.is_empty() {
            // none for a moment: a connection the kernel completed but the accept thread has not
            // taken yet would be reset by stopping now
            let (g, quiet) = st.left.wait_timeout(clients, GRACE.min(left)).unwrap();
            clients = g;
            if quiet.timed_out() && clients.is_empty() {
                break;
            }
            continue;
        }
        clients = st.left.wait_timeout(clients, left).unwrap().0;
    }
    drop(clients);
    stop_now(st, addr, accept);
}

fn stop_now(st: &ServerState, addr: SocketAddr, accept: Option<std::thread::JoinHandle<()>>) {
    st.stop.store(true, Ordering::SeqCst);
    st.cv.notify_all();
    // only the read side: a client thread blocked for the next request wakes and ends, while
    // one writing a response finishes it first
    for c in st.clients.lock().unwrap().drain(..) {
        let _ = c.shutdown(Shutdown::Read);
    }
    // wake the accept loop
    let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(200));
    if let Some(h) = accept {
        let _ = h.join();
    }
}

fn serve_client(st: Arc<ServerState>, s: TcpStream) {
    let _ = s.set_nodelay(true);
    let Ok(keep) = s.try_clone() else { return };
    if let Err(e) = serve_inner(&st, s) {
        if e.kind() == std::io::ErrorKind::InvalidData || e.kind() == std::io::ErrorKind::PermissionDenied {
            st.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("oxccl store: dropped client {:?}: {e}", keep.peer_addr().ok());
        }
    }
    let _ = keep.shutdown(Shutdown::Both);
    let mut clients = st.clients.lock().unwrap();
    let me = keep.peer_addr().ok();
    clients.retain(|c| c.peer_addr().ok() != me);
    st.left.notify_all();
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

fn read_keys(s: &mut Conn) -> std::io::Result<Vec<String>> {
    let n = read_u64(s)?;
    if n > MAX_KEYS {
        return Err(invalid("too many keys"));
    }
    (0..n).map(|_| read_key(s)).collect()
}

fn serve_inner(st: &ServerState, mut s: TcpStream) -> std::io::Result<()> {
    let mut conn = match &st.secret {
        Some(secret) => match authenticate(secret, st.master.as_ref(), &mut s)? {
            Some(nonce) => Conn::new(s, st.master.as_ref(), &nonce, false),
            None => return take_refusal_report(st, &mut s),
        },
        None => Conn::Plain(s),
    };
    loop {
        let mut op = [0u8; 1];
        if conn.read(&mut op)? == 0 {
            return Ok(());
        }
        let out = answer(st, &mut conn, op[0])?;
        if !out.is_empty() {
            conn.write_all(&out)?;
        }
    }
}

/// The client proves it knows the secret: its encryption mode word and a keyed hash of a fresh
/// nonce and that word, within AUTH_TIMEOUT. Returns the nonce when the client's mode is the
/// server's; `None` for a member that does not agree on encryption (it may then only report
/// its refusal).
fn authenticate(
    secret: &[u8; 32],
    master: Option<&MasterKey>,
    s: &mut TcpStream,
) -> std::io::Result<Option<[u8; 16]>> {
    let mut nonce = [0u8; 16];
    random_bytes(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mode = mode_word(master, &nonce);
    s.write_all(&[&nonce[..], &mode[..]].concat())?;
    s.set_read_timeout(Some(AUTH_TIMEOUT))?;
    let answer = read_exact(s, 17 + 32)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no authentication in time"))?;
    let (theirs, claimed) = answer.split_at(17);
    if !verify_proof(secret, &super::client::proof_context(&nonce, theirs), claimed) {
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "bad secret proof"));
    }
    s.set_read_timeout(None)?;
    Ok((theirs == mode).then_some(nonce))
}

/// A member refused for its encryption setting may set one `.../init-failed` key (plain, at most
/// 4 KiB), so the ranks waiting in init fail at once with its reason instead of at the timeout;
/// then the connection ends.
fn take_refusal_report(st: &ServerState, s: &mut TcpStream) -> std::io::Result<()> {
    tracing::warn!("oxccl store: refused a rank that does not agree on encryption ({:?})", s.peer_addr().ok());
    s.set_read_timeout(Some(AUTH_TIMEOUT))?;
    if read_exact(s, 1)?[0] != q::SET {
        return Ok(());
    }
    let k = read_key(s)?;
    let v = read_sized(s, 4096)?;
    if k.ends_with("/init-failed") {
        st.map.lock().unwrap().entry(k).or_insert(v);
        st.cv.notify_all();
    }
    Ok(())
}

/// Read the rest of query `op` and carry it out; returns the answer (empty: none).
fn answer(st: &ServerState, s: &mut Conn, op: u8) -> std::io::Result<Vec<u8>> {
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
            let g = wait_keys(st, std::slice::from_ref(&k), s.stream())?;
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
            drop(wait_keys(st, &keys, s.stream())?);
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
            let g = wait_keys(st, &keys, s.stream())?;
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
