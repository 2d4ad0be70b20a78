//! The reliable-connected queue pair's state machine, as pure functions: the attributes and
//! masks of each `ibv_modify_qp` call (RESET → INIT → RTR → RTS), and the checks the kernel
//! applies to them (`ib_modify_qp_is_ok`'s table for RC). The hardware device passes these
//! attributes to `ibv_modify_qp` unchanged; the simulated device of the tests enforces the
//! checks, so a missing attribute fails here, not first on a cluster.

use super::sys::*;

/// Queue pair states (the `ibv_qp_state` values used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created.
    Reset,
    /// Bound to a port, receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: every posted request completes with a flush error.
    Error,
}

impl QpState {
    /// From `ibv_qp_state`.
    pub fn from_raw(v: i32) -> Option<QpState> {
        match v {
            0 => Some(QpState::Reset),
            IBV_QPS_INIT => Some(QpState::Init),
            IBV_QPS_RTR => Some(QpState::Rtr),
            IBV_QPS_RTS => Some(QpState::Rts),
            IBV_QPS_ERR => Some(QpState::Error),
            _ => None,
        }
    }
}

/// What a peer needs to connect its queue pair to one of ours (sent in the connection
/// handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAddr {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number it sends with.
    pub psn: u32,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// Port GID (RoCE: the selected GID; InfiniBand: index 0).
    pub gid: [u8; 16],
    /// Active MTU (`ibv_mtu`: 1 = 256 B ... 5 = 4096 B).
    pub mtu: u8,
}

/// The local side of every path: port, GID index, link layer and the NCCL-style settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathCfg {
    /// Port number (1-based).
    pub port: u8,
    /// Index of the local GID (RoCE).
    pub gid_index: u8,
    /// Ethernet link layer (RoCE): addressed by GID with a global route header.
    pub ethernet: bool,
    /// Local active MTU.
    pub mtu: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout): `NCCL_IB_TIMEOUT`, default 20.
    pub timeout: u8,
    /// Retransmissions: `NCCL_IB_RETRY_CNT`, default 7.
    pub retry_cnt: u8,
    /// Service level: `NCCL_IB_SL`, default 0.
    pub sl: u8,
    /// Traffic class (RoCE): `NCCL_IB_TC`, default 0.
    pub tc: u8,
}

/// `given` (the value of `NCCL_IB_<name>`) as a number up to `max`, or `default` when unset.
fn setting_u8(name: &str, given: Option<&str>, default: u8, max: u8) -> Result<u8, String> {
    match given {
        None => Ok(default),
        Some(v) => v.trim().parse::<u8>().ok().filter(|x| *x <= max).ok_or(format!("NCCL_IB_{name}={v:?} (0..={max})")),
    }
}

impl PathCfg {
    /// The path settings `ib` gives (TIMEOUT, RETRY_CNT, SL, TC), over NCCL's defaults.
    pub fn new(port: u8, gid_index: u8, ethernet: bool, mtu: u8, ib: &crate::IbSettings) -> Result<PathCfg, String> {
        Ok(PathCfg {
            port,
            gid_index,
            ethernet,
            mtu,
            timeout: setting_u8("TIMEOUT", ib.timeout.as_deref(), 20, 31)?,
            retry_cnt: setting_u8("RETRY_CNT", ib.retry_cnt.as_deref(), 7, 7)?,
            sl: setting_u8("SL", ib.sl.as_deref(), 0, 15)?,
            tc: setting_u8("TC", ib.tc.as_deref(), 0, 255)?,
        })
    }
}

/// One `ibv_modify_qp` call.
#[derive(Clone, Copy)]
pub struct Transition {
    /// The attributes.
    pub attr: IbvQpAttr,
    /// Which of them are set (`IBV_QP_*`).
    pub mask: i32,
}

impl Transition {
    /// The state it moves to.
    pub fn target(&self) -> Option<QpState> {
        QpState::from_raw(self.attr.qp_state)
    }
}

/// Access rights of our queue pairs: peers write into our rings (and nothing else).
pub const QP_ACCESS: i32 = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;

/// RESET → INIT.
pub fn to_init(cfg: &PathCfg) -> Transition {
    let attr = IbvQpAttr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: cfg.port,
        qp_access_flags: QP_ACCESS,
        ..Default::default()
    };
    Transition { attr, mask: IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS }
}

/// INIT → RTR, towards the peer's queue pair `remote`.
pub fn to_rtr(cfg: &PathCfg, remote: &QpAddr) -> Transition {
    let mut attr = IbvQpAttr {
        qp_state: IBV_QPS_RTR,
        path_mtu: cfg.mtu.min(remote.mtu) as i32,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..Default::default()
    };
    attr.ah_attr.port_num = cfg.port;
    attr.ah_attr.sl = cfg.sl;
    if cfg.ethernet {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = remote.gid;
        attr.ah_attr.grh.sgid_index = cfg.gid_index;
        attr.ah_attr.grh.hop_limit = 255;
        attr.ah_attr.grh.traffic_class = cfg.tc;
    } else {
        attr.ah_attr.dlid = remote.lid;
    }
    Transition {
        attr,
        mask: IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
    }
}

/// RTR → RTS, sending from packet sequence number `psn`.
pub fn to_rts(cfg: &PathCfg, psn: u32) -> Transition {
    let attr = IbvQpAttr {
        qp_state: IBV_QPS_RTS,
        sq_psn: psn,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: 7, // 7: retry forever while the receiver has no buffer posted
        max_rd_atomic: 1,
        ..Default::default()
    };
    Transition {
        attr,
        mask: IBV_QP_STATE
            | IBV_QP_SQ_PSN
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_MAX_QP_RD_ATOMIC,
    }
}

/// Any state → ERROR (flushes outstanding requests).
pub fn to_error() -> Transition {
    Transition { attr: IbvQpAttr { qp_state: IBV_QPS_ERR, ..Default::default() }, mask: IBV_QP_STATE }
}

/// Whether `t` is a valid transition from `from` for an RC queue pair: the order, the
/// attributes the kernel requires for it, and the values (MTU, timers, a route to the peer).
pub fn check(from: QpState, t: &Transition) -> Result<QpState, String> {
    let to = t.target().ok_or_else(|| format!("unknown target state {}", t.attr.qp_state))?;
    if t.mask & IBV_QP_STATE == 0 {
        return Err("IBV_QP_STATE missing".into());
    }
    let required = match (from, to) {
        (_, QpState::Error) => IBV_QP_STATE,
        (QpState::Reset, QpState::Init) => IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        (QpState::Init, QpState::Rtr) => {
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        (QpState::Rtr, QpState::Rts) => {
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(format!("{from:?} -> {to:?} is not a transition")),
    };
    if t.mask & required != required {
        return Err(format!("{from:?} -> {to:?} lacks attributes {:#x}", required & !t.mask));
    }
    let a = &t.attr;
    match to {
        QpState::Init if a.port_num == 0 => return Err("port 0".into()),
        QpState::Rtr => {
            if !(1..=5).contains(&a.path_mtu) {
                return Err(format!("path MTU {}", a.path_mtu));
            }
            let route = if a.ah_attr.is_global == 1 { a.ah_attr.grh.dgid != [0; 16] } else { a.ah_attr.dlid != 0 };
            if !route {
                return Err("no route to the peer (GID on RoCE, LID on InfiniBand)".into());
            }
            if a.ah_attr.port_num == 0 || a.dest_qp_num == 0 || a.dest_qp_num > 0xff_ffff {
                return Err("bad port or destination queue pair".into());
            }
        }
        QpState::Rts if a.timeout > 31 || a.retry_cnt > 7 || a.rnr_retry > 7 || a.sq_psn > 0xff_ffff => {
            return Err("timer or retry count out of range".into());
        }
        _ => {}
    }
    Ok(to)
}

/// The MTU enum from bytes.
pub fn mtu_enum(bytes: u32) -> u8 {
    match bytes {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ethernet: bool) -> PathCfg {
        PathCfg { port: 1, gid_index: 3, ethernet, mtu: 5, timeout: 20, retry_cnt: 7, sl: 2, tc: 106 }
    }

    fn remote() -> QpAddr {
        QpAddr { qpn: 0x1234, psn: 77, lid: 9, gid: [0xfe; 16], mtu: 3 }
    }

    #[test]
    fn the_rc_sequence_is_valid_on_roce_and_infiniband() {
        for eth in [true, false] {
            let c = cfg(eth);
            let mut s = QpState::Reset;
            for t in [to_init(&c), to_rtr(&c, &remote()), to_rts(&c, 55)] {
                s = check(s, &t).unwrap();
            }
            assert_eq!(s, QpState::Rts);
            let rtr = to_rtr(&c, &remote());
            assert_eq!(rtr.attr.path_mtu, 3, "the smaller MTU of both sides");
            assert_eq!((rtr.attr.dest_qp_num, rtr.attr.rq_psn), (0x1234, 77));
            if eth {
                let ah = rtr.attr.ah_attr;
                assert_eq!((ah.is_global, ah.grh.sgid_index, ah.grh.traffic_class, ah.grh.hop_limit), (1, 3, 106, 255));
                assert_eq!(ah.grh.dgid, [0xfe; 16]);
            } else {
                assert_eq!((rtr.attr.ah_attr.is_global, rtr.attr.ah_attr.dlid, rtr.attr.ah_attr.sl), (0, 9, 2));
            }
            assert_eq!(check(QpState::Rts, &to_error()).unwrap(), QpState::Error);
        }
    }

    #[test]
    fn wrong_orders_missing_attributes_and_bad_values_are_refused() {
        let c = cfg(true);
        assert!(check(QpState::Reset, &to_rtr(&c, &remote())).is_err(), "RESET -> RTR");
        assert!(check(QpState::Init, &to_rts(&c, 1)).is_err(), "INIT -> RTS");
        assert!(check(QpState::Rts, &to_init(&c)).is_err());
        for bit in [IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MIN_RNR_TIMER] {
            let mut t = to_rtr(&c, &remote());
            t.mask &= !bit;
            assert!(check(QpState::Init, &t).unwrap_err().contains("lacks"), "{bit:#x}");
        }
        let mut t = to_rts(&c, 1);
        t.mask &= !IBV_QP_RETRY_CNT;
        assert!(check(QpState::Rtr, &t).is_err());
        let no_gid = QpAddr { gid: [0; 16], ..remote() };
        assert!(check(QpState::Init, &to_rtr(&c, &no_gid)).unwrap_err().contains("route"));
        let no_lid = QpAddr { lid: 0, ..remote() };
        assert!(check(QpState::Init, &to_rtr(&cfg(false), &no_lid)).is_err());
        let mut t = to_rts(&c, 1);
        t.attr.timeout = 32;
        assert!(check(QpState::Rtr, &t).is_err());
        assert!(check(QpState::Init, &to_rtr(&c, &QpAddr { qpn: 0, ..remote() })).is_err());
    }

    #[test]
    fn settings_come_from_nccl_variables() {
        // the defaults, then given values, then a bad one named
        let c = PathCfg::new(1, 0, false, 5, &crate::IbSettings::default()).unwrap();
        assert_eq!((c.timeout, c.retry_cnt, c.sl, c.tc), (20, 7, 0, 0));
        let ib = crate::IbSettings { timeout: Some("14".into()), sl: Some(" 3".into()), ..Default::default() };
        let c = PathCfg::new(1, 0, false, 5, &ib).unwrap();
        assert_eq!((c.timeout, c.retry_cnt, c.sl, c.tc), (14, 7, 3, 0));
        let bad = crate::IbSettings { retry_cnt: Some("9".into()), ..Default::default() };
        assert_eq!(PathCfg::new(1, 0, false, 5, &bad).unwrap_err(), "NCCL_IB_RETRY_CNT=\"9\" (0..=7)");
        assert_eq!((mtu_enum(256), mtu_enum(1024), mtu_enum(4096)), (1, 3, 5));
    }
}
