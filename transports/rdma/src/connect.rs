//! The transport: opening a network, and connecting pairs (the HELLO handshake).

use super::*;
use oxccl_transport::seal::{derive, mode_mismatch, mode_word, Opener, Sealer};
use oxccl_transport::{
    proof, random_bytes, Error, PeerInfo, PendingRecv, RecvConn, Result, SendConn, Transport, TransportCtx,
};
use std::sync::Arc;
use std::time::Instant;

/// The RDMA transport of one rank.
pub struct RdmaTransport {
    pub(crate) net: Arc<Net>,
    pub(crate) cfg: RdmaConfig,
}

impl RdmaTransport {
    /// Open the network `choice` for this rank, bound to `ip`.
    pub fn open(choice: &NetChoice, ctx: TransportCtx, ip: std::net::IpAddr, cfg: RdmaConfig) -> Result<RdmaTransport> {
        let fab: Box<dyn Fabric> = match choice {
            NetChoice::Ofi(provider) => open_ofi(provider, &ip, cfg.endpoints)?,
            NetChoice::Ib => verbs::open_ib(cfg.endpoints, ip, ctx.secret, &cfg.ib)?,
            NetChoice::Socket => return Err(Error::invalid_argument("the socket network is oxccl's TCP transport")),
        };
        tracing::info!("NET: provider {} on {}", fab.provider(), fab.device());
        Ok(RdmaTransport { net: Net::open(fab, ctx, &cfg)?, cfg })
    }

    /// Provider and device, for logs.
    pub fn describe(&self) -> String {
        self.net.where_()
    }

    /// Whether the provider is libfabric's software emulation over TCP or UDP sockets (tested
    /// here, but no faster than oxccl's own TCP transport).
    pub fn is_software(&self) -> bool {
        is_software_provider(self.net.fab.provider())
    }
}

/// Whether libfabric offers a hardware provider here (its first RDM provider with RMA is not a
/// TCP/UDP/sockets emulation). Probed once per process; false without libfabric.
pub fn hardware_provider_available() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        open_ofi("", &std::net::IpAddr::from([0, 0, 0, 0]), 1)
            .map(|f| !is_software_provider(f.provider()))
            .unwrap_or(false)
    })
}

pub(crate) fn is_software_provider(p: &str) -> bool {
    p.split(';').next().is_some_and(|core| matches!(core, "tcp" | "sockets" | "udp" | "shm" | "net"))
}

/// The libfabric backend (`Unavailable` in builds without libfabric's headers).
pub(crate) fn open_ofi(provider: &str, ip: &std::net::IpAddr, endpoints: usize) -> Result<Box<dyn Fabric>> {
    let node = (!ip.is_unspecified()).then(|| ip.to_string());
    let ofi = ofi::Ofi::open(provider, node.as_deref(), endpoints)?;
    #[cfg(oxccl_ofi)]
    return Ok(Box::new(ofi));
    #[cfg(not(oxccl_ofi))]
    {
        drop(ofi);
        Err(Error::internal("libfabric opened in a build without its backend"))
    }
}

/// This rank's endpoint addresses.
pub(crate) fn addresses(fab: &dyn Fabric) -> Result<Vec<Vec<u8>>> {
    (0..fab.endpoints()).map(|e| fab.address(e)).collect()
}

pub(crate) struct RdmaPending {
    pub(crate) net: Arc<Net>,
    pub(crate) id: u32,
    pub(crate) peer: usize,
    pub(crate) ring: Option<(Mem, Region)>,
    pub(crate) slots: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) max_message: usize,
    pub(crate) open: Option<Opener>,
}

impl RdmaTransport {
    /// This side's encryption word for the connection with token `token`.
    fn word(&self, token: &[u8; 16]) -> [u8; oxccl_transport::seal::WORD_BYTES] {
        mode_word(self.cfg.encrypt.as_ref(), &conn_context(self.net.ctx.comm_id, token))
    }

    /// The control keys of the connection with token `token`, for its sender or receiver side.
    fn ctl_keys(&self, token: &[u8; 16], sender: bool) -> Option<CtlKeys> {
        let m = self.cfg.encrypt.as_ref()?;
        Some(CtlKeys::new(m, &conn_context(self.net.ctx.comm_id, token), sender))
    }

    /// The key of the connection with token `token` (one direction: sender to receiver).
    fn conn_key(&self, token: &[u8; 16]) -> Option<[u8; 32]> {
        let m = self.cfg.encrypt?;
        Some(derive(&m.0, b"rdma slots", &conn_context(self.net.ctx.comm_id, token)))
    }
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        if self.net.fab.provider() == "verbs" {
            "NET/IB"
        } else {
            "NET/OFI"
        }
    }
    fn can_connect(&self, _me: &PeerInfo, _peer: &PeerInfo) -> bool {
        true
    }
    fn setup_recv(&self, peer: usize) -> Result<(Box<dyn PendingRecv>, Vec<u8>)> {
        let tag = if self.cfg.encrypt.is_some() { TAG } else { 0 };
        let slot_bytes = SLOT_HEADER + self.cfg.max_message + tag;
        let mut ring = Mem::new(slot_bytes * self.cfg.slots);
        // SAFETY: the ring moves into the pending/receiving half, which deregisters it in Drop
        // before freeing it; Mem's heap buffer does not move when the Mem value does.
        let region = unsafe { self.net.fab.register(ring.ptr(), ring.len())? };
        let mut token = [0u8; 16];
        random_bytes(&mut token)?;
        let id = {
            let mut st = self.net.st.lock().unwrap();
            let id = st.next_id;
            st.next_id += 1;
            let word = self.word(&token);
            let ctl = self.ctl_keys(&token, false);
            let notified = vec![0; self.cfg.slots];
            st.recvs.insert(id, RecvSide { token, word, notified, peer, ctl, ..Default::default() });
            id
        };
        let blob = Blob {
            addrs: addresses(self.net.fab.as_ref())?,
            id,
            raddr: region.remote_base,
            key: region.key,
            slots: self.cfg.slots as u32,
            slot_bytes: slot_bytes as u32,
            token,
            word: self.word(&token),
        };
        let p = RdmaPending {
            net: self.net.clone(),
            id,
            peer,
            ring: Some((ring, region)),
            slots: self.cfg.slots,
            slot_bytes,
            max_message: self.cfg.max_message,
            open: self.conn_key(&token).map(|k| Opener::new(&k)),
        };
        Ok((Box::new(p), blob.encode()))
    }

    fn connect_send(&self, peer: usize, blob: &[u8], _deadline: Instant) -> Result<Box<dyn SendConn>> {
        let b = Blob::decode(blob).map_err(|e| e.with_peer(peer))?;
        let dests: Vec<u64> = b
            .addrs
            .iter()
            .map(|a| self.net.fab.insert_peer(a))
            .collect::<Result<_>>()
            .map_err(|e| e.with_peer(peer))?;
        let slots = b.slots as usize;
        let slot_bytes = b.slot_bytes as usize;
        let mut ring = Mem::new(slot_bytes * slots);
        // SAFETY: as in setup_recv: deregistered by the sending half's Drop.
        let region = unsafe { self.net.fab.register(ring.ptr(), ring.len())? };
        let my_addrs = encode_addrs(&addresses(self.net.fab.as_ref())?);
        let mut st = self.net.st.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        let ctl = self.ctl_keys(&b.token, true);
        st.sends
            .insert(id, SendSide { peer, busy: vec![0; slots], held: vec![None; slots], ctl, ..Default::default() });
        let mut hello = vec![0u8; HELLO_ADDRS + my_addrs.len()];
        hello[0] = T_HELLO;
        hello[4..8].copy_from_slice(&b.id.to_le_bytes());
        hello[8..12].copy_from_slice(&id.to_le_bytes());
        hello[12..28].copy_from_slice(&b.token);
        let mine = self.word(&b.token);
        let ctx = hello_context(self.net.ctx.comm_id, &b.token, &mine);
        hello[28..HELLO_WORD].copy_from_slice(&proof(&self.ctx_secret(), &ctx));
        hello[HELLO_WORD..HELLO_ADDRS].copy_from_slice(&mine);
        hello[HELLO_ADDRS..].copy_from_slice(&my_addrs);
        self.net.send_msg(&mut st, 0, dests[0], &hello, Owner::Send(id)).map_err(|e| e.with_peer(peer))?;
        if mine != b.word {
            // the HELLO tells the receiver, so both sides fail now, not at a timeout
            let _ = self.net.flush(&mut st);
            return Err(mode_mismatch(peer, "RDMA", &mine, &b.word));
        }
        drop(st);
        let seal = self.conn_key(&b.token).map(|k| Sealer::new(&k));
        Ok(Box::new(RdmaSend {
            net: self.net.clone(),
            id,
            peer,
            dests,
            remote_id: b.id,
            raddr: b.raddr,
            key: b.key,
            ring: Some((ring, region)),
            slots,
            slot_bytes,
            posted: 0,
            // sealed messages are sealed in their staging slot: never written from user memory
            zero_copy_min_op: match (&seal, self.cfg.zero_copy_min_op) {
                (Some(_), _) => usize::MAX,
                (None, Some(m)) => m,
                (None, None) if self.is_software() => usize::MAX,
                (None, None) => ZERO_COPY_MIN,
            },
            seal,
        }))
    }
}

impl RdmaTransport {
    pub(crate) fn ctx_secret(&self) -> [u8; 32] {
        self.net.ctx.secret
    }
}

impl PendingRecv for RdmaPending {
    fn accept(mut self: Box<Self>, deadline: Instant) -> Result<Box<dyn RecvConn>> {
        loop {
            self.net.progress().map_err(|e| e.with_peer(self.peer))?;
            let (hello, error) = {
                let st = self.net.st.lock().unwrap();
                let r = st.recvs.get(&self.id);
                (r.and_then(|r| r.hello.clone()), r.and_then(|r| r.error.clone()))
            };
            if let Some(e) = error {
                return Err(e);
            }
            if let Some((dests, sender_id)) = hello {
                return Ok(Box::new(RdmaRecv {
                    net: self.net.clone(),
                    id: self.id,
                    peer: self.peer,
                    dest: dests[0],
                    sender_id,
                    ring: self.ring.take(),
                    slots: self.slots,
                    slot_bytes: self.slot_bytes,
                    max_message: self.max_message,
                    next: 0,
                    credited: 0,
                    peeked: false,
                    open: self.open.take(),
                    failed: None,
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "connection setup: rank {} did not connect over {}",
                    self.peer,
                    self.net.where_()
                ))
                .with_peer(self.peer));
            }
            if let Some(src) = self.net.arm()? {
                let left = (deadline - now).min(std::time::Duration::from_millis(100));
                oxccl_transport::wait::wait_any(&[src], left)?;
            }
        }
    }
}

impl Drop for RdmaPending {
    fn drop(&mut self) {
        if let Some((_, r)) = &self.ring {
            self.net.fab.deregister(r);
            self.net.st.lock().unwrap().recvs.remove(&self.id);
        }
    }
}
