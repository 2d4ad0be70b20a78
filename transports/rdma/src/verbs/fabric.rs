//! The verbs backend of the RDMA protocol: [`VerbsFabric`] implements [`Fabric`] over a
//! [`Device`] with reliable-connected queue pairs.
//!
//! RC queue pairs are point to point, while the protocol addresses endpoints like libfabric's
//! reliable datagram endpoints (one address per endpoint, any peer may write to it). So each
//! pair of processes that talk gets a set of queue pairs, one per (local endpoint, remote
//! endpoint), built by a handshake over a TCP side channel (as NCCL's `net_ib` does):
//! - an endpoint address is this process's nonce, the address of its handshake listener and
//!   the endpoint's index;
//! - the first `insert_peer` of an address of an unknown process connects to its listener and
//!   sends a request: its port's LID/GID/MTU, one queue pair number and PSN per pair, and a
//!   proof keyed by the job secret over both nonces and those numbers (a stranger gets nothing:
//!   no queue pair is created for it); the listener creates its queue pairs, moves them to RTS
//!   and answers with its numbers; the initiator moves its own to RTS and confirms;
//! - completion tokens are the protocol's; a destination is (set, remote endpoint).
//!
//! Writes, sends and receives are posted as `IBV_WR_RDMA_WRITE`, `IBV_WR_SEND` and receives
//! on one shared receive queue per endpoint; a queue pair executes in order, so a NOTIFY sent
//! after a write on the same pair is seen after the written data (the protocol's ordering
//! rule). Idle ranks sleep on the completion channel's descriptor after arming the CQ.

use super::device::{Device, SendWr, Wc};
use super::qp::{self, QpAddr};
use crate::{Completion, Fabric, Region, MAX_ENDPOINTS};
use oxccl_transport::{proof, random_bytes, verify_proof, Error, ErrorKind, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x4f58_4942; // "OXIB"
const K_REQUEST: u8 = 1;
const K_REPLY: u8 = 2;
const K_READY: u8 = 3;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint address: process nonce, handshake listener, endpoint index and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpAddr {
    /// The process's (fabric instance's) random nonce.
    pub nonce: u64,
    /// Its handshake listener.
    pub cm: SocketAddr,
    /// Endpoint index.
    pub ep: u8,
    /// Endpoints of that process.
    pub eps: u8,
}

impl EpAddr {
    /// 28 bytes: nonce, IPv6 (or v4-mapped) address, port, index, count.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.nonce.to_le_bytes().to_vec();
        let ip = match self.cm.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        b.extend_from_slice(&ip.octets());
        b.extend_from_slice(&self.cm.port().to_le_bytes());
        b.push(self.ep);
        b.push(self.eps);
        b
    }
    /// Decode; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<EpAddr> {
        if b.len() != 28 {
            return None;
        }
        let nonce = u64::from_le_bytes(b[..8].try_into().ok()?);
        let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).ok()?);
        let ip = v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6));
        let port = u16::from_le_bytes([b[24], b[25]]);
        let (ep, eps) = (b[26], b[27]);
        if eps == 0 || eps as usize > MAX_ENDPOINTS || ep >= eps || port == 0 {
            return None;
        }
        Some(EpAddr { nonce, cm: SocketAddr::new(ip, port), ep, eps })
    }
}

/// Queue pairs to one peer process: `qps[local_ep * remote_eps + remote_ep]`.
struct PeerSet {
    nonce: u64,
    remote_eps: usize,
    qps: Vec<u32>,
    ready: bool,
}

struct Inner {
    dev: Arc<dyn Device>,
    nonce: u64,
    secret: [u8; 32],
    sets: Mutex<Vec<Option<PeerSet>>>,
    changed: Condvar,
    stop: AtomicBool,
}

/// The verbs fabric.
pub struct VerbsFabric {
    inner: Arc<Inner>,
    cm: SocketAddr,
    listener: Option<std::thread::JoinHandle<()>>,
    stash: Mutex<Vec<Wc>>,
}

/// A handshake message: its fixed header, then queue pair numbers and PSNs.
struct Hello {
    kind: u8,
    from: u64,
    to: u64,
    /// (initiator endpoints, acceptor endpoints).
    eps: (u8, u8),
    port: QpAddr,
    /// (qpn, psn) per pair.
    pairs: Vec<(u32, u32)>,
    proof: [u8; 32],
}

impl Hello {
    fn signed_part(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(80 + 8 * self.pairs.len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[self.kind, self.eps.0, self.eps.1, 0]);
        b.extend_from_slice(&self.from.to_le_bytes());
        b.extend_from_slice(&self.to.to_le_bytes());
        b.extend_from_slice(&self.port.lid.to_le_bytes());
        b.extend_from_slice(&[self.port.mtu, 0]);
        b.extend_from_slice(&self.port.gid);
        for (q, p) in &self.pairs {
            b.extend_from_slice(&q.to_le_bytes());
            b.extend_from_slice(&p.to_le_bytes());
        }
        b
    }
    fn encode(&self) -> Vec<u8> {
        let mut b = self.signed_part();
        b.extend_from_slice(&self.proof);
        b
    }
    fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() < 76 || u32::from_le_bytes(b[..4].try_into().ok()?) != MAGIC {
            return None;
        }
        let (kind, l, r) = (b[4], b[5], b[6]);
        if l == 0 || r == 0 || l as usize > MAX_ENDPOINTS || r as usize > MAX_ENDPOINTS {
            return None;
        }
        let n = l as usize * r as usize;
        if b.len() != 44 + 8 * n + 32 {
            return None;
        }
        let pairs = (0..n)
            .map(|i| {
                let at = 44 + 8 * i;
                (
                    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()),
                    u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()),
                )
            })
            .collect();
        Some(Hello {
            kind,
            from: u64::from_le_bytes(b[8..16].try_into().ok()?),
            to: u64::from_le_bytes(b[16..24].try_into().ok()?),
            eps: (l, r),
            port: QpAddr {
                qpn: 0,
                psn: 0,
                lid: u16::from_le_bytes([b[24], b[25]]),
                gid: b[28..44].try_into().ok()?,
                mtu: b[26],
            },
            pairs,
            proof: b[b.len() - 32..].try_into().ok()?,
        })
    }
}

fn send_frame(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

fn recv_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > 4096 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "oversized handshake frame"));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// A send of `[buf, buf+len)` (the fields a write adds are set by the caller).
fn local(token: u64, buf: *const u8, len: usize, desc: usize) -> SendWr {
    SendWr {
        wr_id: token,
        write: false,
        addr: buf as u64,
        len: len as u32,
        lkey: desc as u32,
        remote_addr: 0,
        rkey: 0,
        imm: None,
    }
}

fn proof_context(h: &Hello) -> Vec<u8> {
    let mut c = b"oxccl-ib-handshake".to_vec();
    c.extend_from_slice(&h.signed_part());
    c
}

fn psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = random_bytes(&mut b);
    u32::from_le_bytes(b) & 0xff_ffff
}

impl Inner {
    fn proof_of(&self, h: &Hello) -> [u8; 32] {
        proof(&self.secret, &proof_context(h))
    }
    fn verify(&self, h: &Hello) -> bool {
        verify_proof(&self.secret, &proof_context(h), &h.proof)
    }

    /// Create `n` queue pairs in INIT, the local endpoint of pair i being `ep_of(i)`.
    fn new_qps(&self, n: usize, ep_of: impl Fn(usize) -> usize) -> Result<Vec<(u32, u32)>> {
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(n);
        for i in 0..n {
            let made = self.dev.create_qp(ep_of(i)).and_then(|q| {
                self.dev.modify_qp(q, &qp::to_init(self.dev.path())).map(|_| q).inspect_err(|_| self.dev.destroy_qp(q))
            });
            match made {
                Ok(q) => out.push((q, psn())),
                Err(e) => {
                    out.iter().for_each(|(q, _)| self.dev.destroy_qp(*q));
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// INIT → RTR → RTS towards the peer's pairs.
    fn connect_qps(&self, mine: &[(u32, u32)], port: &QpAddr, theirs: impl Fn(usize) -> (u32, u32)) -> Result<()> {
        let path = self.dev.path();
        for (i, &(q, my_psn)) in mine.iter().enumerate() {
            let (qpn, psn) = theirs(i);
            let remote = QpAddr { qpn, psn, ..*port };
            self.dev.modify_qp(q, &qp::to_rtr(path, &remote))?;
            self.dev.modify_qp(q, &qp::to_rts(path, my_psn))?;
        }
        Ok(())
    }

    fn add_set(&self, set: PeerSet) -> usize {
        let mut sets = self.sets.lock().unwrap();
        let i = sets.iter().position(Option::is_none).unwrap_or(sets.len());
        if i == sets.len() {
            sets.push(None);
        }
        sets[i] = Some(set);
        self.changed.notify_all();
        i
    }

    fn drop_set(&self, i: usize) {
        let set = self.sets.lock().unwrap()[i].take();
        if let Some(s) = set {
            s.qps.iter().for_each(|q| self.dev.destroy_qp(*q));
        }
        self.changed.notify_all();
    }

    /// Serve one handshake (listener side).
    fn accept(&self, mut s: TcpStream, my_eps: usize) -> Result<()> {
        let bad = |why: &str| Error::remote(format!("RDMA handshake refused: {why}"));
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).ok();
        s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).ok();
        let req = recv_frame(&mut s).map_err(|e| bad(&e.to_string()))?;
        let h = Hello::decode(&req).ok_or_else(|| bad("malformed request"))?;
        if h.kind != K_REQUEST || h.to != self.nonce || h.eps.1 as usize != my_eps {
            return Err(bad("a request for another endpoint"));
        }
        if !self.verify(&h) {
            return Err(bad("bad proof (not a member of this job)"));
        }
        let (l, r) = (h.eps.0 as usize, my_eps);
        // my pair (b, a) = index b * l + a; theirs (a, b) = a * r + b
        let mine = self.new_qps(r * l, |i| i / l)?;
        let connected = self.connect_qps(&mine, &h.port, |i| h.pairs[(i % l) * r + i / l]);
        if let Err(e) = connected {
            mine.iter().for_each(|(q, _)| self.dev.destroy_qp(*q));
            return Err(e);
        }
        let idx = self.add_set(PeerSet {
            nonce: h.from,
            remote_eps: l,
            qps: mine.iter().map(|p| p.0).collect(),
            ready: false,
        });
        let mut reply = Hello {
            kind: K_REPLY,
            from: self.nonce,
            to: h.from,
            eps: h.eps,
            port: self.dev.port_addr(),
            pairs: mine,
            proof: [0; 32],
        };
        reply.proof = self.proof_of(&reply);
        let done = send_frame(&mut s, &reply.encode()).and_then(|_| recv_frame(&mut s));
        match done {
            Ok(b) if b.len() == 5 && b[4] == K_READY => {
                if let Some(set) = self.sets.lock().unwrap()[idx].as_mut() {
                    set.ready = true;
                }
                self.changed.notify_all();
                Ok(())
            }
            _ => {
                self.drop_set(idx);
                Err(bad("the initiator did not confirm"))
            }
        }
    }

    /// Build a set towards `to` (initiator side).
    fn initiate(&self, to: &EpAddr) -> Result<usize> {
        let (l, r) = (self.dev.endpoints(), to.eps as usize);
        let mine = self.new_qps(l * r, |i| i / r)?;
        let result = (|| {
            let mut req = Hello {
                kind: K_REQUEST,
                from: self.nonce,
                to: to.nonce,
                eps: (l as u8, r as u8),
                port: self.dev.port_addr(),
                pairs: mine.clone(),
                proof: [0; 32],
            };
            req.proof = self.proof_of(&req);
            let io = |e: std::io::Error| Error::remote(format!("RDMA handshake with {}: {e}", to.cm));
            let mut s = TcpStream::connect_timeout(&to.cm, HANDSHAKE_TIMEOUT).map_err(io)?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).ok();
            s.set_nodelay(true).ok();
            send_frame(&mut s, &req.encode()).map_err(io)?;
            let rep = recv_frame(&mut s).map_err(io)?;
            let h = Hello::decode(&rep)
                .ok_or_else(|| Error::remote(format!("malformed RDMA handshake reply from {}", to.cm)))?;
            if h.kind != K_REPLY || h.from != to.nonce || h.to != self.nonce || h.eps != req.eps || !self.verify(&h) {
                return Err(Error::remote(format!("RDMA handshake reply from {} does not match", to.cm)));
            }
            // my pair (a, b) = a * r + b; theirs (b, a) = b * l + a
            self.connect_qps(&mine, &h.port, |i| h.pairs[(i % r) * l + i / r])?;
            let mut ready = MAGIC.to_le_bytes().to_vec();
            ready.push(K_READY);
            send_frame(&mut s, &ready).map_err(io)?;
            Ok(())
        })();
        if let Err(e) = result {
            mine.iter().for_each(|(q, _)| self.dev.destroy_qp(*q));
            return Err(e);
        }
        Ok(self.add_set(PeerSet {
            nonce: to.nonce,
            remote_eps: r,
            qps: mine.iter().map(|p| p.0).collect(),
            ready: true,
        }))
    }
}

impl VerbsFabric {
    /// Open over `dev`, the handshake listener bound to `ip`; `secret` keys the handshake
    /// proofs.
    pub fn new(dev: Arc<dyn Device>, ip: IpAddr, secret: [u8; 32]) -> Result<VerbsFabric> {
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::new(ErrorKind::System, format!("RDMA handshake listener on {ip}: {e}")))?;
        let cm = listener.local_addr().map_err(|e| Error::new(ErrorKind::System, e.to_string()))?;
        let mut n = [0u8; 8];
        random_bytes(&mut n)?;
        let inner = Arc::new(Inner {
            dev,
            nonce: u64::from_le_bytes(n),
            secret,
            sets: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let i2 = inner.clone();
        let t = std::thread::Builder::new()
            .name("oxccl-ib-cm".into())
            .spawn(move || {
                for s in listener.incoming() {
                    if i2.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(s) = s else { continue };
                    let i3 = i2.clone();
                    let eps = i3.dev.endpoints();
                    std::thread::spawn(move || {
                        let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        if let Err(e) = i3.accept(s, eps) {
                            tracing::warn!("NET/IB: handshake from {peer}: {e}");
                        }
                    });
                }
            })
            .map_err(|e| Error::new(ErrorKind::System, format!("RDMA handshake thread: {e}")))?;
        Ok(VerbsFabric { inner, cm, listener: Some(t), stash: Mutex::new(Vec::new()) })
    }

    /// Post `wr` on the queue pair of local endpoint `ep` and destination `dest`.
    ///
    /// # Safety
    /// The local buffer stays valid until the completion of `wr.wr_id`.
    unsafe fn post(&self, ep: usize, dest: u64, wr: &SendWr) -> Result<bool> {
        let qpn = self.qp(ep, dest)?;
        // SAFETY: the caller's contract.
        unsafe { self.inner.dev.post(qpn, wr) }
    }

    /// The queue pair for local endpoint `ep` and destination `dest`.
    fn qp(&self, ep: usize, dest: u64) -> Result<u32> {
        let (set, rep) = ((dest >> 8) as usize, (dest & 0xff) as usize);
        let sets = self.inner.sets.lock().unwrap();
        let s = sets.get(set).and_then(Option::as_ref).ok_or_else(|| Error::internal("unknown RDMA destination"))?;
        Ok(s.qps[ep * s.remote_eps + rep])
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.cm, Duration::from_secs(1));
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
        let n = self.inner.sets.lock().unwrap().len();
        (0..n).for_each(|i| self.inner.drop_set(i));
    }
}

impl Fabric for VerbsFabric {
    fn provider(&self) -> &str {
        "verbs"
    }
    fn device(&self) -> &str {
        self.inner.dev.name()
    }
    fn endpoints(&self) -> usize {
        self.inner.dev.endpoints()
    }
    fn address(&self, ep: usize) -> Result<Vec<u8>> {
        Ok(EpAddr { nonce: self.inner.nonce, cm: self.cm, ep: ep as u8, eps: self.endpoints() as u8 }.encode())
    }
    fn insert_peer(&self, addr: &[u8]) -> Result<u64> {
        let a = EpAddr::decode(addr).ok_or_else(|| Error::remote("malformed verbs endpoint address"))?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut sets = self.inner.sets.lock().unwrap();
        loop {
            let of_peer = || {
                sets.iter().enumerate().filter_map(|(i, s)| Some((i, s.as_ref()?))).filter(|(_, s)| s.nonce == a.nonce)
            };
            if let Some((i, _)) = of_peer().find(|(_, s)| s.ready) {
                return Ok(((i as u64) << 8) | a.ep as u64);
            }
            // the peer is connecting to us: its set is ready once it confirms
            if of_peer().next().is_none() || Instant::now() >= deadline {
                break;
            }
            sets = self.inner.changed.wait_timeout(sets, Duration::from_millis(50)).unwrap().0;
        }
        drop(sets);
        let i = self.inner.initiate(&a)?;
        Ok(((i as u64) << 8) | a.ep as u64)
    }
    unsafe fn register(&self, buf: *mut u8, len: usize) -> Result<Region> {
        // SAFETY: the caller's contract (Fabric::register).
        let mr = unsafe { self.inner.dev.reg_mr(buf, len)? };
        Ok(Region { handle: mr.handle, desc: mr.lkey as usize, key: mr.rkey as u64, remote_base: buf as u64 })
    }
    fn register_dmabuf(&self, fd: i32, offset: u64, len: usize, iova: u64) -> Result<Region> {
        let mr = self.inner.dev.reg_dmabuf(fd, offset, len, iova)?;
        Ok(Region { handle: mr.handle, desc: mr.lkey as usize, key: mr.rkey as u64, remote_base: iova })
    }
    fn deregister(&self, r: &Region) {
        self.inner.dev.dereg_mr(r.handle);
    }
    unsafe fn write(
        &self,
        ep: usize,
        buf: *const u8,
        len: usize,
        desc: usize,
        dest: u64,
        raddr: u64,
        key: u64,
        notify: Option<u32>,
        token: u64,
    ) -> Result<bool> {
        // with a notification: RDMA write with immediate
        let wr =
            SendWr { write: true, remote_addr: raddr, rkey: key as u32, imm: notify, ..local(token, buf, len, desc) };
        // SAFETY: the caller keeps the buffer (Fabric::write).
        unsafe { self.post(ep, dest, &wr) }
    }
    fn notify_writes(&self) -> bool {
        true
    }
    unsafe fn send(&self, ep: usize, buf: *const u8, len: usize, desc: usize, dest: u64, token: u64) -> Result<bool> {
        // SAFETY: as for write.
        unsafe { self.post(ep, dest, &local(token, buf, len, desc)) }
    }
    unsafe fn post_recv(&self, ep: usize, buf: *mut u8, len: usize, desc: usize, token: u64) -> Result<bool> {
        // SAFETY: the caller keeps the buffer until its completion (Fabric::post_recv).
        unsafe { self.inner.dev.post_recv(ep, buf as u64, len as u32, desc as u32, token) }
    }
    fn poll(&self, out: &mut Vec<Completion>) -> Result<()> {
        let mut wcs = std::mem::take(&mut *self.stash.lock().unwrap());
        self.inner.dev.poll(&mut wcs)?;
        for w in wcs {
            let error = (w.status != 0).then(|| {
                format!(
                    "{} (status {}, vendor error {:#x})",
                    self.inner.dev.status_str(w.status),
                    w.status,
                    w.vendor_err
                )
            });
            out.push(Completion { token: w.wr_id, len: w.byte_len as usize, error, data: w.imm });
        }
        Ok(())
    }
    fn wait_fd(&self) -> i32 {
        self.inner.dev.fd()
    }
    fn try_wait(&self) -> bool {
        if self.inner.dev.arm().is_err() {
            return false;
        }
        // a completion that arrived before arming raises no event: look once more
        let mut stash = self.stash.lock().unwrap();
        if self.inner.dev.poll(&mut stash).is_err() {
            return false;
        }
        stash.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handshake and address decoders take any bytes without panicking and accept only
    /// well-formed input (random bytes and mutations of valid messages).
    #[test]
    fn decoders_survive_random_and_mutated_input() {
        let a = EpAddr { nonce: 5, cm: "10.1.2.3:4567".parse().unwrap(), ep: 1, eps: 2 };
        assert_eq!(EpAddr::decode(&a.encode()), Some(a));
        let h = Hello {
            kind: K_REQUEST,
            from: 1,
            to: 2,
            eps: (2, 3),
            port: QpAddr { qpn: 0, psn: 0, lid: 7, gid: [9; 16], mtu: 5 },
            pairs: (0..6).map(|i| (100 + i, 200 + i)).collect(),
            proof: [3; 32],
        };
        let enc = h.encode();
        let back = Hello::decode(&enc).unwrap();
        assert_eq!(
            (back.from, back.to, back.eps, back.pairs.clone(), back.port),
            (1, 2, (2, 3), h.pairs.clone(), h.port)
        );
        let mut z = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        for i in 0..100_000 {
            let base = if i % 2 == 0 { enc.clone() } else { a.encode() };
            let mut b = if i % 3 == 0 { (0..next() % 160).map(|_| next() as u8).collect() } else { base };
            if !b.is_empty() {
                let k = (next() % b.len() as u64) as usize;
                b[k] ^= (next() % 255 + 1) as u8;
            }
            if let Some(x) = Hello::decode(&b) {
                assert_eq!(x.pairs.len(), x.eps.0 as usize * x.eps.1 as usize);
                assert!(x.eps.0 as usize <= MAX_ENDPOINTS && x.eps.1 as usize <= MAX_ENDPOINTS);
            }
            if let Some(x) = EpAddr::decode(&b) {
                assert!(x.ep < x.eps && x.eps as usize <= MAX_ENDPOINTS && x.cm.port() != 0);
            }
        }
    }
}
