//! A communicator's transports: shared memory (unless disabled), the RDMA network when chosen,
//! and TCP, in that priority order. The only place that builds them (`Config::default()` reads
//! their crates' defaults).

use crate::config::Config;
use crate::Result;
use oxccl_transport::seal::MasterKey;
use oxccl_transport::{PeerInfo, Transport, TransportCtx};
#[cfg(feature = "rdma")]
use oxccl_transport_rdma::{NetChoice, RdmaConfig, RdmaTransport};
use oxccl_transport_shm::{ShmConfig, ShmTransport};
use oxccl_transport_tcp::{TcpConfig, TcpTransport};

/// Whether forwarded inputs go by reference only while the two processes run far apart
/// (`oxccl_transport_shm::ShmConfig::cma_forward_far_only`): where the kernel's copy runs at
/// under [`oxccl_transport_shm::FORWARD_MIN_RATIO`] of memcpy's speed
/// ([`oxccl_transport_shm::copy_probe`]). Between close cores two copies through the slots then
/// beat one through the kernel once they pipeline, from two messages on: inputs of operations of
/// one message still go by reference ([`oxccl_transport_shm::NEAR_FORWARD_MAX_OP`];
/// bench/RESULTS.md "Copies whose buffers are not aligned alike", "One message by reference
/// between close cores").
fn forward_far_only(cfg: &Config, rank: usize) -> bool {
    if !cfg.cma || !cfg.cma_forward_probe || cfg.cma_forward.is_empty() {
        return false;
    }
    let p = oxccl_transport_shm::copy_probe();
    let gbs = |r: f64| r / 1e9;
    tracing::info!(
        rank,
        "SHM process_vm_readv {:.1} GB/s, memcpy {:.1} GB/s ({:.2} of it; {} {}): small operations forward by reference {}",
        p.kernel.map_or(0.0, gbs),
        gbs(p.memcpy),
        p.ratio(),
        if p.forward_pays() { "at least" } else { "below" },
        oxccl_transport_shm::FORWARD_MIN_RATIO,
        if p.forward_pays() { "as configured" } else { "between cores far apart, and in one message between close ones" }
    );
    !p.forward_pays()
}

/// The transports of rank `ctx.rank`, in priority order (the last, TCP, connects any pair).
pub(crate) fn transports(ctx: TransportCtx, cfg: &Config, several_hosts: bool) -> Result<Vec<Box<dyn Transport>>> {
    let mut list: Vec<Box<dyn Transport>> = Vec::new();
    if !cfg.shm_disable {
        let shm = ShmConfig {
            slots: cfg.slots,
            slot_bytes: cfg.chunk_bytes,
            cma: cfg.cma,
            cma_min_op: cfg.cma_min_bytes,
            cma_forward_min: cfg.cma_forward.start,
            cma_forward_max: cfg.cma_forward.end,
            cma_forward_far_only: forward_far_only(cfg, ctx.rank),
            cma_far_min_op: cfg.cma_far_min_bytes,
            placement: cfg
                .shm_placement
                .as_deref()
                .map(crate::config::parse_placement)
                .transpose()?
                .unwrap_or_default(),
        };
        list.push(Box::new(ShmTransport::new(ctx.clone(), shm)?));
    }
    let (rank, peers) = (ctx.rank, ctx.peers.clone());
    // encryption between hosts (docs/security.md): the job's master key, read once
    let master = cfg.encryption.master(&ctx.secret)?;
    if let Some(net) = open_net(&ctx, &peers, rank, cfg, several_hosts, master)? {
        list.push(net);
    }
    let tcp = TcpConfig {
        slots: cfg.slots,
        slot_bytes: cfg.chunk_bytes,
        lanes: cfg.nsocks,
        socket_buffer: cfg.socket_buffer,
        encrypt: master,
    };
    let ip = peers[rank].ip;
    list.push(Box::new(TcpTransport::new(ctx, tcp, ip)));
    Ok(list)
}

/// The network between hosts ([`Config::net`]: `socket`, `ofi`, `ib`); asked for and not
/// available is an error naming why. Unset, when the ranks span hosts: verbs if a device opens,
/// else libfabric if it offers a provider that is not itself TCP or sockets (EFA, CXI, verbs),
/// else oxccl's TCP.
#[cfg(feature = "rdma")]
fn open_net(
    ctx: &TransportCtx,
    peers: &[PeerInfo],
    rank: usize,
    cfg: &Config,
    several_hosts: bool,
    master: Option<MasterKey>,
) -> Result<Option<Box<dyn Transport>>> {
    let net = open_rdma(ctx, peers, rank, cfg, several_hosts, master)?;
    Ok(net.map(|t| Box::new(t) as Box<dyn Transport>))
}

/// Without the `rdma` feature, TCP is the network between hosts; asking for another is an error.
#[cfg(not(feature = "rdma"))]
fn open_net(
    _ctx: &TransportCtx,
    _peers: &[PeerInfo],
    rank: usize,
    cfg: &Config,
    _several_hosts: bool,
    _master: Option<MasterKey>,
) -> Result<Option<Box<dyn Transport>>> {
    match cfg.net.as_deref().map(|n| n.trim().to_ascii_lowercase()) {
        None => Ok(None),
        Some(n) if n == "socket" || n == "tcp" => Ok(None),
        Some(n) => Err(oxccl_transport::Error::new(
            oxccl_transport::ErrorKind::Unavailable,
            format!("OXCCL_NET={n}: this oxccl was built without the `rdma` feature (TCP only between hosts)"),
        )
        .with_rank(rank)
        .with_op("init: OXCCL_NET")),
    }
}

#[cfg(feature = "rdma")]
fn open_rdma(
    ctx: &TransportCtx,
    peers: &[PeerInfo],
    rank: usize,
    cfg: &Config,
    several_hosts: bool,
    master: Option<MasterKey>,
) -> Result<Option<RdmaTransport>> {
    // with encryption on, every message is sealed in its staging slot and opened in the
    // receiver's ring (the copy path; never written from user memory): docs/security.md
    let rcfg =
        RdmaConfig { slots: cfg.slots.max(2), max_message: cfg.chunk_bytes, encrypt: master, ..cfg.rdma.clone() };
    let explicit = cfg.net.is_some();
    let choice = NetChoice::parse(cfg.net.as_deref().unwrap_or(""), &cfg.ofi_provider);
    match choice.map_err(|e| e.with_rank(rank))? {
        NetChoice::Socket if explicit => Ok(None),
        NetChoice::Socket => {
            if !several_hosts {
                return Ok(None);
            }
            // automatic: verbs if a device is there, else a fast libfabric provider if it has
            // one (probed once per process); its TCP/sockets emulation is not faster than
            // oxccl's own sockets
            match RdmaTransport::open(&NetChoice::Ib, ctx.clone(), peers[rank].ip, rcfg.clone()) {
                Ok(t) => return Ok(Some(t)),
                Err(e) => tracing::debug!("NET/IB not used: {e}"),
            }
            if !oxccl_transport_rdma::hardware_provider_available() {
                return Ok(None);
            }
            Ok(RdmaTransport::open(&NetChoice::Ofi(String::new()), ctx.clone(), peers[rank].ip, rcfg).ok())
        }
        choice => RdmaTransport::open(&choice, ctx.clone(), peers[rank].ip, rcfg)
            .map(Some)
            .map_err(|e| e.with_rank(rank).with_op("init: OXCCL_NET")),
    }
}

#[cfg(all(test, not(feature = "rdma")))]
mod tests {
    use super::*;

    #[test]
    fn without_the_rdma_feature_only_tcp_is_a_network() {
        let ctx = TransportCtx { rank: 0, nranks: 1, comm_id: 1, secret: [0; 32], peers: vec![] };
        let with = |net: Option<&str>| Config { net: net.map(String::from), ..Config::default() };
        assert!(open_net(&ctx, &[], 0, &with(None), true, None).unwrap().is_none());
        assert!(open_net(&ctx, &[], 0, &with(Some("socket")), true, None).unwrap().is_none());
        let Err(e) = open_net(&ctx, &[], 0, &with(Some("ofi")), true, None) else { panic!("ofi opened without rdma") };
        assert_eq!(e.kind, oxccl_transport::ErrorKind::Unavailable);
        assert!(e.message.contains("without the `rdma` feature"), "{e}");
    }
}
