//! A simulated RDMA device for tests (this machine has none): devices of one process joined by
//! an in-memory wire. It is strict where hardware is: queue pairs must go RESET → INIT → RTR →
//! RTS with the attributes the kernel requires ([`qp::check`]); posting on a queue pair that is
//! not ready to send is refused; a write needs a valid remote key and range and is copied
//! into the peer's registered memory; a send consumes a receive of the peer's shared receive
//! queue (waiting, as an RNR retry would, when none is posted); a dead peer or a bad key gives
//! the error completions hardware gives (retry exceeded, remote access error) and moves the
//! queue pair to ERROR, after which requests complete flushed.

use super::device::{Device, Mr, SendWr, Wc};
use super::qp::{self, PathCfg, QpAddr, QpState, Transition};
use oxccl_transport::{Error, ErrorKind, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

const WC_SUCCESS: i32 = 0;
const WC_FLUSH_ERR: i32 = 5;
const WC_REM_ACCESS_ERR: i32 = 10;
const WC_RETRY_EXC_ERR: i32 = 12;

struct SimQp {
    ep: usize,
    state: QpState,
    /// (peer GID, peer queue pair) once RTR.
    remote: Option<([u8; 16], u32)>,
}

struct Dev {
    alive: bool,
    gid: [u8; 16],
    qps: HashMap<u32, SimQp>,
    /// rkey → (address, length).
    mrs: HashMap<u32, (u64, usize)>,
    srq: Vec<VecDeque<(u64, u64, u32)>>,
    /// Sends (bytes) and writes with immediate (the immediate) that found no receive posted.
    rnr: Vec<VecDeque<Arrival>>,
    cq: VecDeque<Wc>,
    armed: bool,
    efd: i32,
    /// Fault injection: flip a bit of the next RDMA write this device sends (a corrupted link).
    flip_next_write: bool,
}

/// What consumes a receive.
#[derive(Clone)]
enum Arrival {
    Send(Vec<u8>),
    Imm(u32),
}

#[derive(Default)]
struct World {
    devs: HashMap<u64, Dev>,
    next_id: u64,
    next_qpn: u32,
    next_key: u32,
}

static WORLD: Mutex<Option<World>> = Mutex::new(None);

fn world<T>(f: impl FnOnce(&mut World) -> T) -> T {
    let mut g = WORLD.lock().unwrap();
    f(g.get_or_insert_with(|| World { next_qpn: 0x100, next_key: 0x1000, ..Default::default() }))
}

fn push_wc(d: &mut Dev, wc: Wc) {
    d.cq.push_back(wc);
    if std::mem::take(&mut d.armed) {
        wake(d);
    }
}

/// A simulated device.
pub struct SimDevice {
    id: u64,
    name: String,
    path: PathCfg,
    addr: QpAddr,
    eps: usize,
    efd: i32,
}

impl SimDevice {
    /// A new device with `eps` endpoints, addressed by RoCE GID `gid_last` (last byte).
    pub fn new(name: &str, eps: usize) -> SimDevice {
        // SAFETY: plain system call; checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        world(|w| {
            w.next_id += 1;
            let id = w.next_id;
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..16].copy_from_slice(&(id as u32).to_be_bytes());
            w.devs.insert(
                id,
                Dev {
                    alive: true,
                    gid,
                    qps: HashMap::new(),
                    mrs: HashMap::new(),
                    srq: vec![VecDeque::new(); eps],
                    rnr: vec![VecDeque::new(); eps],
                    cq: VecDeque::new(),
                    armed: false,
                    efd,
                    flip_next_write: false,
                },
            );
            SimDevice {
                id,
                name: name.to_string(),
                path: PathCfg {
                    port: 1,
                    gid_index: 3,
                    ethernet: true,
                    mtu: 5,
                    timeout: 20,
                    retry_cnt: 7,
                    sl: 0,
                    tc: 0,
                },
                addr: QpAddr { qpn: 0, psn: 0, lid: 0, gid, mtu: 5 },
                eps,
                efd,
            }
        })
    }

    /// Fault injection: the next RDMA write this device sends arrives with bit 4 of its byte 16
    /// flipped (a link that corrupts data past its checksums).
    pub fn flip_bit_of_next_write(&self) {
        world(|w| w.devs.get_mut(&self.id).unwrap().flip_next_write = true);
    }

    /// The device dies (its host crashed): peers' requests to it fail with retry exceeded.
    pub fn kill(&self) {
        world(|w| w.devs.get_mut(&self.id).unwrap().alive = false);
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        world(|w| w.devs.remove(&self.id));
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.efd) };
    }
}

fn fail(w: &mut World, id: u64, qpn: u32, wr_id: u64, status: i32) {
    let d = w.devs.get_mut(&id).unwrap();
    if let Some(q) = d.qps.get_mut(&qpn) {
        q.state = QpState::Error;
    }
    push_wc(d, Wc { wr_id, status, byte_len: 0, vendor_err: 0x81, imm: None });
}

impl Device for SimDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn path(&self) -> &PathCfg {
        &self.path
    }
    fn port_addr(&self) -> QpAddr {
        self.addr
    }
    fn endpoints(&self) -> usize {
        self.eps
    }
    fn create_qp(&self, ep: usize) -> Result<u32> {
        world(|w| {
            w.next_qpn += 1;
            let n = w.next_qpn;
            w.devs.get_mut(&self.id).unwrap().qps.insert(n, SimQp { ep, state: QpState::Reset, remote: None });
            Ok(n)
        })
    }
    fn modify_qp(&self, qpn: u32, t: &Transition) -> Result<()> {
        world(|w| {
            let q = w.devs.get_mut(&self.id).unwrap().qps.get_mut(&qpn).ok_or_else(|| Error::internal("no such QP"))?;
            q.state = qp::check(q.state, t).map_err(|e| Error::new(ErrorKind::System, format!("modify_qp: {e}")))?;
            if q.state == QpState::Rtr {
                q.remote = Some((t.attr.ah_attr.grh.dgid, t.attr.dest_qp_num));
            }
            Ok(())
        })
    }
    fn destroy_qp(&self, qpn: u32) {
        world(|w| w.devs.get_mut(&self.id).map(|d| d.qps.remove(&qpn)));
    }
    unsafe fn reg_mr(&self, addr: *mut u8, len: usize) -> Result<Mr> {
        world(|w| {
            w.next_key += 1;
            let k = w.next_key;
            w.devs.get_mut(&self.id).unwrap().mrs.insert(k, (addr as u64, len));
            Ok(Mr { handle: k as usize, lkey: k, rkey: k })
        })
    }
    fn reg_dmabuf(&self, _fd: i32, _offset: u64, _len: usize, _iova: u64) -> Result<Mr> {
        Err(Error::new(ErrorKind::Unavailable, "the simulated device has no GPUDirect RDMA"))
    }
    fn dereg_mr(&self, handle: usize) {
        world(|w| w.devs.get_mut(&self.id).map(|d| d.mrs.remove(&(handle as u32))));
    }
    unsafe fn post(&self, qpn: u32, wr: &SendWr) -> Result<bool> {
        world(|w| {
            let me = w.devs.get(&self.id).unwrap();
            let q = me.qps.get(&qpn).ok_or_else(|| Error::internal("no such QP"))?;
            match q.state {
                QpState::Rts => {}
                QpState::Error => {
                    fail(w, self.id, qpn, wr.wr_id, WC_FLUSH_ERR);
                    return Ok(true);
                }
                s => return Err(Error::new(ErrorKind::System, format!("ibv_post_send on a QP in {s:?}: EINVAL"))),
            }
            if !me.mrs.contains_key(&wr.lkey) {
                return Err(Error::new(ErrorKind::System, "ibv_post_send with an unknown lkey"));
            }
            let (gid, rqpn) = q.remote.unwrap();
            let peer = w.devs.iter().find(|(_, d)| d.gid == gid && d.alive).map(|(id, _)| *id);
            let Some(peer) = peer.filter(|p| w.devs[p].qps.get(&rqpn).is_some_and(|r| r.state != QpState::Reset))
            else {
                fail(w, self.id, qpn, wr.wr_id, WC_RETRY_EXC_ERR);
                return Ok(true);
            };
            // SAFETY: the local buffer is registered and kept by the caller until completion.
            let mut bytes = unsafe { std::slice::from_raw_parts(wr.addr as *const u8, wr.len as usize) }.to_vec();
            if wr.write && bytes.len() > 16 && std::mem::take(&mut w.devs.get_mut(&self.id).unwrap().flip_next_write) {
                bytes[16] ^= 0x10;
            }
            let rep = w.devs[&peer].qps[&rqpn].ep;
            if wr.write {
                let ok = w.devs[&peer]
                    .mrs
                    .get(&wr.rkey)
                    .is_some_and(|&(a, l)| wr.remote_addr >= a && wr.remote_addr + wr.len as u64 <= a + l as u64);
                if !ok {
                    fail(w, self.id, qpn, wr.wr_id, WC_REM_ACCESS_ERR);
                    return Ok(true);
                }
                // SAFETY: inside the peer's live registration (checked above).
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), wr.remote_addr as *mut u8, bytes.len());
                }
                if let Some(imm) = wr.imm {
                    let d = w.devs.get_mut(&peer).unwrap();
                    d.rnr[rep].push_back(Arrival::Imm(imm));
                    deliver(d, rep);
                }
            } else {
                let d = w.devs.get_mut(&peer).unwrap();
                d.rnr[rep].push_back(Arrival::Send(bytes));
                deliver(d, rep);
            }
            push_wc(
                w.devs.get_mut(&self.id).unwrap(),
                Wc { wr_id: wr.wr_id, status: WC_SUCCESS, ..Default::default() },
            );
            Ok(true)
        })
    }
    unsafe fn post_recv(&self, ep: usize, addr: u64, len: u32, _lkey: u32, wr_id: u64) -> Result<bool> {
        world(|w| {
            let d = w.devs.get_mut(&self.id).unwrap();
            d.srq[ep].push_back((wr_id, addr, len));
            deliver(d, ep);
            Ok(true)
        })
    }
    fn poll(&self, out: &mut Vec<Wc>) -> Result<()> {
        let mut b = [0u8; 8];
        // SAFETY: an 8-byte read from our non-blocking eventfd.
        unsafe { libc::read(self.efd, b.as_mut_ptr().cast(), 8) };
        world(|w| out.extend(w.devs.get_mut(&self.id).unwrap().cq.drain(..)));
        Ok(())
    }
    fn status_str(&self, status: i32) -> String {
        match status {
            WC_SUCCESS => "success",
            WC_FLUSH_ERR => "Work Request Flushed Error",
            WC_REM_ACCESS_ERR => "remote access error",
            WC_RETRY_EXC_ERR => "transport retry counter exceeded",
            _ => "unknown",
        }
        .into()
    }
    fn arm(&self) -> Result<()> {
        world(|w| {
            let d = w.devs.get_mut(&self.id).unwrap();
            if d.cq.is_empty() {
                d.armed = true;
            } else {
                wake(d);
            }
        });
        Ok(())
    }
    fn fd(&self) -> i32 {
        self.efd
    }
}

/// Make the device's descriptor readable.
fn wake(d: &Dev) {
    let one = 1u64;
    // SAFETY: an 8-byte write to our eventfd.
    unsafe { libc::write(d.efd, (&one as *const u64).cast(), 8) };
}

/// Match queued sends with posted receives on endpoint `ep`.
fn deliver(d: &mut Dev, ep: usize) {
    while !d.rnr[ep].is_empty() && !d.srq[ep].is_empty() {
        let arrival = d.rnr[ep].pop_front().unwrap();
        let (wr_id, addr, len) = d.srq[ep].pop_front().unwrap();
        let wc = match arrival {
            Arrival::Send(bytes) => {
                let n = bytes.len().min(len as usize);
                // SAFETY: a posted receive buffer, kept by its owner until this completion.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, n) };
                Wc { wr_id, status: WC_SUCCESS, byte_len: n as u32, vendor_err: 0, imm: None }
            }
            Arrival::Imm(imm) => Wc { wr_id, status: WC_SUCCESS, byte_len: 0, vendor_err: 0, imm: Some(imm) },
        };
        push_wc(d, wc);
    }
}
