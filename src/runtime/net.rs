//! The network between hosts: shared memory and TCP always, libfabric when chosen.

use crate::config::Config;
use crate::Result;
use oxccl_transport::{PeerInfo, TransportCtx};
use oxccl_transport_rdma::{NetChoice, RdmaConfig, RdmaTransport};

/// The network between hosts: `OXCCL_NET`/`NCCL_NET` (`socket`, `ofi`, `ib`); asked for and not
/// available is an error naming why. Unset, when the ranks span hosts: verbs if a device opens,
/// else libfabric if it offers a provider that is not itself TCP or sockets (EFA, CXI, verbs),
/// else oxccl's TCP.
pub(crate) fn open_net(
    ctx: &TransportCtx,
    peers: &[PeerInfo],
    rank: usize,
    cfg: &Config,
    several_hosts: bool,
) -> Result<Option<RdmaTransport>> {
    let rcfg = RdmaConfig { slots: cfg.slots.max(2), max_message: cfg.chunk_bytes, ..Default::default() };
    let explicit = std::env::var_os("OXCCL_NET").or_else(|| std::env::var_os("NCCL_NET")).is_some();
    match NetChoice::from_env().map_err(|e| e.with_rank(rank))? {
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
