//! Settings of the RDMA transport: the network choice, the sizes, and their environment.

use super::*;
use oxccl_transport::{Error, Result};

/// Which network a communicator uses between hosts: `OXCCL_NET` (or NCCL's `NCCL_NET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetChoice {
    /// oxccl's TCP sockets (the default).
    Socket,
    /// libfabric, with an optional provider (`OXCCL_OFI_PROVIDER`, default `tcp;ofi_rxm`... any).
    Ofi(String),
    /// InfiniBand/RoCE verbs.
    Ib,
}

impl NetChoice {
    /// From `OXCCL_NET`/`NCCL_NET` (`socket`, `ofi`/`libfabric`/`aws-ofi-nccl`, `ib`/`verbs`),
    /// case-insensitive; unset: socket. `OXCCL_OFI_PROVIDER` (or `FI_PROVIDER`) picks the
    /// libfabric provider.
    pub fn from_env() -> Result<NetChoice> {
        let v = std::env::var("OXCCL_NET").or_else(|_| std::env::var("NCCL_NET")).unwrap_or_default();
        let prov = std::env::var("OXCCL_OFI_PROVIDER").or_else(|_| std::env::var("FI_PROVIDER")).unwrap_or_default();
        NetChoice::parse(&v, &prov)
    }
    /// Parse a value of `OXCCL_NET` with a provider name.
    pub fn parse(v: &str, provider: &str) -> Result<NetChoice> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "socket" | "tcp" => Ok(NetChoice::Socket),
            "ofi" | "libfabric" | "aws-ofi-nccl" | "aws libfabric" => Ok(NetChoice::Ofi(provider.to_string())),
            "ib" | "verbs" | "ibverbs" => Ok(NetChoice::Ib),
            other => Err(Error::invalid_argument(format!(
                "OXCCL_NET={other:?} is not a network oxccl knows (socket, ofi, ib)"
            ))),
        }
    }
}

/// Bounds of the registration cache of user memory.
pub(crate) const USER_CACHE_ENTRIES: usize = 256;

/// `OXCCL_NET_REG_CACHE_BYTES`: most bytes of user memory kept registered (default 8 GiB).
pub(crate) fn user_cache_bytes() -> usize {
    std::env::var("OXCCL_NET_REG_CACHE_BYTES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(8 << 30)
}

/// Settings of the RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Slots per connection ring.
    pub slots: usize,
    /// Largest payload of one message.
    pub max_message: usize,
    /// Endpoints per rank; a connection's messages are striped across them (NCCL's
    /// `NCCL_IB_QPS_PER_CONNECTION`; `OXCCL_NET_ENDPOINTS`), 1..=[`MAX_ENDPOINTS`].
    pub endpoints: usize,
    /// Messages of operations of at least this size (count × type size) are written from the
    /// user's buffer, registered through the registration cache, instead of being copied into
    /// a staging ring first (`usize::MAX`: never). `None`: 1 MiB with a hardware provider,
    /// never with a software emulation (measured no faster there: bench/RESULTS.md). From
    /// `OXCCL_NET_ZERO_COPY` (`0` off, `1` on) and `OXCCL_NET_ZERO_COPY_MIN_BYTES` (sets it).
    pub zero_copy_min_op: Option<usize>,
    /// Longest wait, when closing, for receivers to confirm they have read this rank's last
    /// messages (`OXCCL_NET_LINGER_MS`, default 5 s); see the crate docs (Closing).
    pub linger: std::time::Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            slots: 8,
            max_message: 512 << 10,
            endpoints: endpoints_from_env(),
            zero_copy_min_op: zero_copy_min_from_env(),
            linger: std::time::Duration::from_millis(
                std::env::var("OXCCL_NET_LINGER_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(5000),
            ),
        }
    }
}

/// `OXCCL_NET_ZERO_COPY` (`0` off, `1` on) and `OXCCL_NET_ZERO_COPY_MIN_BYTES`; `None`: decide
/// by provider.
pub fn zero_copy_min_from_env() -> Option<usize> {
    let min = std::env::var("OXCCL_NET_ZERO_COPY_MIN_BYTES").ok().and_then(|v| v.trim().parse().ok());
    match std::env::var("OXCCL_NET_ZERO_COPY").map(|v| v.trim().to_string()).as_deref() {
        Ok("0") => Some(usize::MAX),
        Ok("1") => Some(min.unwrap_or(ZERO_COPY_MIN)),
        _ => min,
    }
}

/// Default smallest operation sent from user memory (hardware providers).
pub(crate) const ZERO_COPY_MIN: usize = 1 << 20;

/// `OXCCL_NET_ENDPOINTS` (or `NCCL_IB_QPS_PER_CONNECTION`), clamped to 1..=[`MAX_ENDPOINTS`];
/// default 1.
pub fn endpoints_from_env() -> usize {
    std::env::var("OXCCL_NET_ENDPOINTS")
        .or_else(|_| std::env::var("NCCL_IB_QPS_PER_CONNECTION"))
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, MAX_ENDPOINTS)
}
