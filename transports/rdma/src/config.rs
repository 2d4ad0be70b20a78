//! Settings of the RDMA transport: the network choice, the sizes, the verbs path. The
//! environment is read by oxccl's `Config::from_env`, which hands the values to
//! [`RdmaConfig::from_lookup`]: this crate parses them, and reads no variable itself.

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
    /// Most bytes of user memory kept registered (`OXCCL_NET_REG_CACHE_BYTES`, default 8 GiB).
    pub reg_cache_bytes: usize,
    /// Whether a write carries its notification where the provider can (`OXCCL_NET_WRITE_NOTIFY`,
    /// default on).
    pub write_notify: bool,
    /// The verbs device and path settings.
    pub ib: IbSettings,
    /// Encrypt every message under keys derived from this master key (docs/security.md): the
    /// staging slot is sealed in place before its write and opened in the receiver's ring
    /// before use, so messages always take the copy path. `None`: plaintext.
    pub encrypt: Option<oxccl_transport::seal::MasterKey>,
}

/// The verbs settings, as given (`OXCCL_IB_*`, else NCCL's `NCCL_IB_*`); checked when a device
/// opens, where a bad value is an error naming the variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IbSettings {
    /// `NCCL_IB_HCA`: which devices and ports (empty: any).
    pub hca: String,
    /// `NCCL_IB_GID_INDEX` (unset or negative: automatic).
    pub gid_index: Option<String>,
    /// `NCCL_IB_TIMEOUT` (ACK timeout exponent, default 20).
    pub timeout: Option<String>,
    /// `NCCL_IB_RETRY_CNT` (default 7).
    pub retry_cnt: Option<String>,
    /// `NCCL_IB_SL` (service level, default 0).
    pub sl: Option<String>,
    /// `NCCL_IB_TC` (traffic class, default 0).
    pub tc: Option<String>,
}

impl Default for RdmaConfig {
    /// The built-in settings, nothing read from the environment.
    fn default() -> Self {
        RdmaConfig {
            slots: 8,
            max_message: 512 << 10,
            endpoints: 1,
            zero_copy_min_op: None,
            linger: std::time::Duration::from_secs(5),
            reg_cache_bytes: 8 << 30,
            write_notify: true,
            ib: IbSettings::default(),
            encrypt: None,
        }
    }
}

impl RdmaConfig {
    /// The settings `get` gives (the first set variable among the names it is asked for, as
    /// oxccl's `Config::from_env` reads them), over the defaults.
    pub fn from_lookup(get: &dyn Fn(&[&str]) -> Option<String>) -> RdmaConfig {
        let d = RdmaConfig::default();
        let num = |names: &[&str]| get(names).and_then(|v| v.trim().parse::<usize>().ok());
        let min = num(&["OXCCL_NET_ZERO_COPY_MIN_BYTES"]);
        let zero_copy_min_op = match get(&["OXCCL_NET_ZERO_COPY"]).as_deref().map(str::trim) {
            Some("0") => Some(usize::MAX),
            Some("1") => Some(min.unwrap_or(ZERO_COPY_MIN)),
            _ => min,
        };
        RdmaConfig {
            endpoints: num(&["OXCCL_NET_ENDPOINTS", "NCCL_IB_QPS_PER_CONNECTION"]).unwrap_or(1).clamp(1, MAX_ENDPOINTS),
            zero_copy_min_op,
            linger: num(&["OXCCL_NET_LINGER_MS"])
                .map(|ms| std::time::Duration::from_millis(ms as u64))
                .unwrap_or(d.linger),
            reg_cache_bytes: num(&["OXCCL_NET_REG_CACHE_BYTES"]).unwrap_or(d.reg_cache_bytes),
            write_notify: get(&["OXCCL_NET_WRITE_NOTIFY"]).is_none_or(|v| v.trim() != "0"),
            ib: IbSettings {
                hca: get(&["OXCCL_IB_HCA", "NCCL_IB_HCA"]).unwrap_or_default(),
                gid_index: get(&["OXCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX"]),
                timeout: get(&["OXCCL_IB_TIMEOUT", "NCCL_IB_TIMEOUT"]),
                retry_cnt: get(&["OXCCL_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT"]),
                sl: get(&["OXCCL_IB_SL", "NCCL_IB_SL"]),
                tc: get(&["OXCCL_IB_TC", "NCCL_IB_TC"]),
            },
            ..d
        }
    }
}

/// Default smallest operation sent from user memory (hardware providers).
pub(crate) const ZERO_COPY_MIN: usize = 1 << 20;
