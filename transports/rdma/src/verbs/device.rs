//! What the verbs fabric needs from a device ([`Device`]), and the hardware device over
//! `libibverbs` ([`HwDevice`]): one protection domain, one completion queue with a completion
//! channel (its file descriptor is what an idle rank sleeps on), one shared receive queue per
//! endpoint, and reliable-connected queue pairs created per peer.

use super::qp::{self, PathCfg, QpAddr, QpState, Transition};
use super::sys::*;
use oxccl_transport::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// A work request the fabric posts.
#[derive(Debug, Clone, Copy)]
pub struct SendWr {
    /// Completion token.
    pub wr_id: u64,
    /// RDMA write (`true`) or send.
    pub write: bool,
    /// Local buffer.
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// Its local key.
    pub lkey: u32,
    /// Remote address (writes).
    pub remote_addr: u64,
    /// Remote key (writes).
    pub rkey: u32,
    /// Immediate data: an RDMA write with immediate (the target consumes a receive and gets
    /// a completion carrying it).
    pub imm: Option<u32>,
}

/// One work completion.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    /// The token.
    pub wr_id: u64,
    /// `ibv_wc_status` (0: success).
    pub status: i32,
    /// Bytes received.
    pub byte_len: u32,
    /// Vendor error code.
    pub vendor_err: u32,
    /// Immediate data of a write with immediate that landed here.
    pub imm: Option<u32>,
}

/// A memory registration on a device: its handle and keys.
#[derive(Debug, Clone, Copy)]
pub struct Mr {
    /// Backend handle.
    pub handle: usize,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// An RDMA device as the verbs fabric uses it.
pub trait Device: Send + Sync {
    /// Device name (`mlx5_0`).
    fn name(&self) -> &str;
    /// The local side of paths.
    fn path(&self) -> &PathCfg;
    /// This port's LID, GID and MTU (queue pair number and PSN left zero).
    fn port_addr(&self) -> QpAddr;
    /// Endpoints (shared receive queues).
    fn endpoints(&self) -> usize;
    /// A new RC queue pair receiving through endpoint `ep`'s shared receive queue.
    fn create_qp(&self, ep: usize) -> Result<u32>;
    /// Apply one state transition.
    fn modify_qp(&self, qpn: u32, t: &Transition) -> Result<()>;
    /// Destroy a queue pair.
    fn destroy_qp(&self, qpn: u32);
    /// Register memory.
    ///
    /// # Safety
    /// As for `Fabric::register`.
    unsafe fn reg_mr(&self, addr: *mut u8, len: usize) -> Result<Mr>;
    /// Register device memory exported as a dma-buf (GPUDirect RDMA).
    fn reg_dmabuf(&self, fd: i32, offset: u64, len: usize, iova: u64) -> Result<Mr>;
    /// Drop a registration.
    fn dereg_mr(&self, handle: usize);
    /// Post a work request; `Ok(false)`: the queue is full.
    ///
    /// # Safety
    /// The local buffer stays valid until the completion.
    unsafe fn post(&self, qpn: u32, wr: &SendWr) -> Result<bool>;
    /// Post a receive to endpoint `ep`'s shared receive queue; `Ok(false)`: full.
    ///
    /// # Safety
    /// As for `post`.
    unsafe fn post_recv(&self, ep: usize, addr: u64, len: u32, lkey: u32, wr_id: u64) -> Result<bool>;
    /// Collect completions.
    fn poll(&self, out: &mut Vec<Wc>) -> Result<()>;
    /// The text of a completion status.
    fn status_str(&self, status: i32) -> String;
    /// Ask for an event on the next completion.
    fn arm(&self) -> Result<()>;
    /// The completion channel's file descriptor.
    fn fd(&self) -> i32;
}

/// Completion queue entries.
const CQ_ENTRIES: i32 = 16384;
/// Send requests per queue pair.
const SQ_ENTRIES: u32 = 1024;
/// Receives per shared receive queue (the protocol posts 256 per endpoint).
const SRQ_ENTRIES: u32 = 512;

/// A device opened through `libibverbs`.
pub struct HwDevice {
    lib: &'static Lib,
    name: String,
    ctx: *mut IbvContext,
    pd: *mut c_void,
    channel: *mut IbvCompChannel,
    cq: *mut c_void,
    srqs: Vec<*mut c_void>,
    qps: Mutex<HashMap<u32, (*mut IbvQp, QpState)>>,
    path: PathCfg,
    addr: QpAddr,
}

// SAFETY: libibverbs objects may be used from any thread (the library locks internally where
// needed); the queue pair table is behind a mutex.
unsafe impl Send for HwDevice {}
// SAFETY: as above.
unsafe impl Sync for HwDevice {}

fn sys_err(what: String) -> Error {
    Error::new(ErrorKind::System, format!("{what}: {}", std::io::Error::last_os_error()))
}

impl HwDevice {
    /// Open device `name`, port `port`, with `endpoints` shared receive queues; `gid` is the
    /// selected GID (RoCE) or the port's GID 0 (InfiniBand).
    pub fn open(name: &str, port: u8, gid: super::Gid, endpoints: usize, ib: &crate::IbSettings) -> Result<HwDevice> {
        let lib = Lib::get().map_err(|e| Error::new(ErrorKind::Unavailable, e))?;
        // SAFETY: the calls follow libibverbs' documented sequence; every pointer returned is
        // checked before use and released in Drop (or here, on failure, by dropping `dev`).
        unsafe {
            let mut n = 0;
            let list = (lib.get_device_list)(&mut n);
            if list.is_null() {
                return Err(sys_err("ibv_get_device_list".into()));
            }
            let mut found = std::ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let d = *list.add(i);
                if std::ffi::CStr::from_ptr((lib.get_device_name)(d)).to_string_lossy() == name {
                    found = d;
                }
            }
            let ctx = if found.is_null() { std::ptr::null_mut() } else { (lib.open_device)(found) };
            (lib.free_device_list)(list);
            if found.is_null() {
                return Err(Error::new(ErrorKind::Unavailable, format!("RDMA device {name} not found")));
            }
            if ctx.is_null() {
                return Err(sys_err(format!("ibv_open_device({name})")));
            }
            let mut dev = HwDevice {
                lib,
                name: name.to_string(),
                ctx,
                pd: std::ptr::null_mut(),
                channel: std::ptr::null_mut(),
                cq: std::ptr::null_mut(),
                srqs: Vec::new(),
                qps: Mutex::new(HashMap::new()),
                path: PathCfg::new(port, 0, false, 5, ib).map_err(Error::invalid_argument)?,
                addr: QpAddr::default(),
            };
            let mut buf = IbvPortAttrBuf { attr: IbvPortAttr::default(), _spare: [0; 64] };
            if (lib.query_port)(ctx, port, &mut buf) != 0 {
                return Err(sys_err(format!("ibv_query_port({name}:{port})")));
            }
            let pa = buf.attr;
            if pa.state != 4 {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{name}:{port} is not active (state {})", pa.state),
                ));
            }
            let ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
            dev.path.ethernet = ethernet;
            dev.path.gid_index = gid.index as u8;
            dev.path.mtu = pa.active_mtu as u8;
            dev.addr = QpAddr { qpn: 0, psn: 0, lid: pa.lid, gid: gid.raw, mtu: pa.active_mtu as u8 };
            dev.pd = (lib.alloc_pd)(ctx);
            if dev.pd.is_null() {
                return Err(sys_err("ibv_alloc_pd".into()));
            }
            dev.channel = (lib.create_comp_channel)(ctx);
            if dev.channel.is_null() {
                return Err(sys_err("ibv_create_comp_channel".into()));
            }
            let fd = (*dev.channel).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            dev.cq = (lib.create_cq)(ctx, CQ_ENTRIES, std::ptr::null_mut(), dev.channel, 0);
            if dev.cq.is_null() {
                return Err(sys_err("ibv_create_cq".into()));
            }
            for _ in 0..endpoints {
                let mut a =
                    IbvSrqInitAttr { srq_context: std::ptr::null_mut(), max_wr: SRQ_ENTRIES, max_sge: 1, srq_limit: 0 };
                let srq = (lib.create_srq)(dev.pd, &mut a);
                if srq.is_null() {
                    return Err(sys_err("ibv_create_srq".into()));
                }
                dev.srqs.push(srq);
            }
            Ok(dev)
        }
    }

    fn op<T>(&self, i: usize) -> T {
        // SAFETY: `ctx` is a live context; ops[i] is the function verbs.h's inline wrapper
        // calls, of the type the caller names (layouts checked against the header in tests).
        unsafe { std::mem::transmute_copy::<*const c_void, T>(&(*self.ctx).ops[i]) }
    }
}

impl Device for HwDevice {
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
        self.srqs.len()
    }
    fn create_qp(&self, ep: usize) -> Result<u32> {
        let mut a = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: self.srqs[ep],
            cap: IbvQpCap {
                max_send_wr: SQ_ENTRIES,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a valid init attribute with this device's CQ and SRQ.
        let qp = unsafe { (self.lib.create_qp)(self.pd, &mut a) };
        if qp.is_null() {
            return Err(sys_err(format!("ibv_create_qp on {}", self.name)));
        }
        // SAFETY: a live queue pair.
        let qpn = unsafe { (*qp).qp_num };
        self.qps.lock().unwrap().insert(qpn, (qp, QpState::Reset));
        Ok(qpn)
    }
    fn modify_qp(&self, qpn: u32, t: &Transition) -> Result<()> {
        let mut qps = self.qps.lock().unwrap();
        let (qp, state) = qps.get_mut(&qpn).ok_or_else(|| Error::internal(format!("no queue pair {qpn}")))?;
        let to = qp::check(*state, t).map_err(|e| Error::internal(format!("queue pair {qpn}: {e}")))?;
        let mut attr = t.attr;
        // SAFETY: a live queue pair and a complete attribute structure.
        let rc = unsafe { (self.lib.modify_qp)(*qp, &mut attr, t.mask) };
        if rc != 0 {
            return Err(Error::new(
                ErrorKind::System,
                format!("ibv_modify_qp({qpn}) to {to:?} on {}: {}", self.name, std::io::Error::from_raw_os_error(rc)),
            ));
        }
        *state = to;
        Ok(())
    }
    fn destroy_qp(&self, qpn: u32) {
        if let Some((qp, _)) = self.qps.lock().unwrap().remove(&qpn) {
            // SAFETY: a live queue pair, removed from the table.
            unsafe { (self.lib.destroy_qp)(qp) };
        }
    }
    unsafe fn reg_mr(&self, addr: *mut u8, len: usize) -> Result<Mr> {
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // SAFETY: the caller's contract: mapped memory.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr.cast(), len, access) };
        if mr.is_null() {
            return Err(sys_err(format!("ibv_reg_mr({len} bytes) on {}", self.name)));
        }
        // SAFETY: a live registration.
        Ok(unsafe { Mr { handle: mr as usize, lkey: (*mr).lkey, rkey: (*mr).rkey } })
    }
    fn reg_dmabuf(&self, fd: i32, offset: u64, len: usize, iova: u64) -> Result<Mr> {
        let f = self.lib.reg_dmabuf_mr.ok_or_else(|| {
            Error::new(ErrorKind::Unavailable, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)")
        })?;
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // SAFETY: the dma-buf descriptor and range come from the GPU driver's export.
        let mr = unsafe { f(self.pd, offset, len, iova, fd, access) };
        if mr.is_null() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "ibv_reg_dmabuf_mr on {}: {} (no GPUDirect RDMA here)",
                    self.name,
                    std::io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: a live registration.
        Ok(unsafe { Mr { handle: mr as usize, lkey: (*mr).lkey, rkey: (*mr).rkey } })
    }
    fn dereg_mr(&self, handle: usize) {
        // SAFETY: a registration this device made, dropped once.
        unsafe { (self.lib.dereg_mr)(handle as *mut IbvMr) };
    }
    unsafe fn post(&self, qpn: u32, wr: &SendWr) -> Result<bool> {
        let Some(&(qp, _)) = self.qps.lock().unwrap().get(&qpn) else {
            return Err(Error::internal(format!("no queue pair {qpn}")));
        };
        let mut sge = IbvSge { addr: wr.addr, length: wr.len, lkey: wr.lkey };
        let mut w = IbvSendWr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: match (wr.write, wr.imm) {
                (true, Some(_)) => IBV_WR_RDMA_WRITE_WITH_IMM,
                (true, None) => IBV_WR_RDMA_WRITE,
                _ => IBV_WR_SEND,
            },
            send_flags: IBV_SEND_SIGNALED,
            imm_data: wr.imm.unwrap_or(0).to_be(),
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            _rest: [0; 76],
        };
        let mut bad = std::ptr::null_mut();
        let post: PostSend = self.op(OP_POST_SEND);
        // SAFETY: a live queue pair, a complete request whose buffer the caller keeps valid.
        match unsafe { post(qp, &mut w, &mut bad) } {
            0 => Ok(true),
            libc::ENOMEM => Ok(false),
            rc => Err(Error::new(
                ErrorKind::System,
                format!("ibv_post_send on {}: {}", self.name, std::io::Error::from_raw_os_error(rc)),
            )),
        }
    }
    unsafe fn post_recv(&self, ep: usize, addr: u64, len: u32, lkey: u32, wr_id: u64) -> Result<bool> {
        let mut sge = IbvSge { addr, length: len, lkey };
        let mut w = IbvRecvWr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        let post: PostSrqRecv = self.op(OP_POST_SRQ_RECV);
        // SAFETY: a live shared receive queue and a complete request.
        match unsafe { post(self.srqs[ep], &mut w, &mut bad) } {
            0 => Ok(true),
            libc::ENOMEM => Ok(false),
            rc => Err(Error::new(
                ErrorKind::System,
                format!("ibv_post_srq_recv on {}: {}", self.name, std::io::Error::from_raw_os_error(rc)),
            )),
        }
    }
    fn poll(&self, out: &mut Vec<Wc>) -> Result<()> {
        // acknowledge channel events (the descriptor is non-blocking)
        let mut events = 0u32;
        let (mut cq, mut cq_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the live channel; returns -1 with EAGAIN when no event is queued.
        while unsafe { (self.lib.get_cq_event)(self.channel, &mut cq, &mut cq_ctx) } == 0 {
            events += 1;
        }
        if events > 0 {
            // SAFETY: acknowledging the events just read on our CQ.
            unsafe { (self.lib.ack_cq_events)(self.cq, events) };
        }
        let poll: PollCq = self.op(OP_POLL_CQ);
        let mut wc = [IbvWc::default(); 32];
        loop {
            // SAFETY: the live CQ and room for 32 entries.
            let n = unsafe { poll(self.cq, 32, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(Error::new(ErrorKind::System, format!("ibv_poll_cq on {} failed", self.name)));
            }
            for w in &wc[..n as usize] {
                let imm = (w.status == 0 && w.opcode == IBV_WC_RECV_RDMA_WITH_IMM).then(|| u32::from_be(w.imm_data));
                out.push(Wc { wr_id: w.wr_id, status: w.status, byte_len: w.byte_len, vendor_err: w.vendor_err, imm });
            }
            if n < 32 {
                return Ok(());
            }
        }
    }
    fn status_str(&self, status: i32) -> String {
        // SAFETY: returns a static string for any value.
        unsafe { std::ffi::CStr::from_ptr((self.lib.wc_status_str)(status)).to_string_lossy().into_owned() }
    }
    fn arm(&self) -> Result<()> {
        let req: ReqNotifyCq = self.op(OP_REQ_NOTIFY_CQ);
        // SAFETY: the live CQ.
        match unsafe { req(self.cq, 0) } {
            0 => Ok(()),
            rc => Err(Error::new(ErrorKind::System, format!("ibv_req_notify_cq on {}: error {rc}", self.name))),
        }
    }
    fn fd(&self) -> i32 {
        // SAFETY: the live channel.
        unsafe { (*self.channel).fd }
    }
}

impl Drop for HwDevice {
    fn drop(&mut self) {
        // SAFETY: every object was created by this device, is destroyed once, in dependency
        // order (queue pairs, receive queues, CQ, channel, PD, context); null ones are skipped.
        unsafe {
            for (_, (qp, _)) in self.qps.get_mut().unwrap().drain() {
                (self.lib.destroy_qp)(qp);
            }
            for s in self.srqs.drain(..) {
                (self.lib.destroy_srq)(s);
            }
            if !self.cq.is_null() {
                (self.lib.destroy_cq)(self.cq);
            }
            if !self.channel.is_null() {
                (self.lib.destroy_comp_channel)(self.channel);
            }
            if !self.pd.is_null() {
                (self.lib.dealloc_pd)(self.pd);
            }
            (self.lib.close_device)(self.ctx);
        }
    }
}
