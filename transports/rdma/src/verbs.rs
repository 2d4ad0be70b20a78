//! InfiniBand/RoCE verbs, without rdma-core at build time.
//!
//! `libibverbs.so.1` is opened with `dlopen` at run time ([`sys`]), so builds and CI never need
//! rdma-core and a machine without it (or without a device) gets a clean `Unavailable`.
//! - selection: `NCCL_IB_HCA`/`OXCCL_IB_HCA` filters (NCCL's syntax), the first active port of
//!   a selected device, GID tables read from sysfs and RoCE v2 GID selection
//!   (`NCCL_IB_GID_INDEX`/`OXCCL_IB_GID_INDEX`);
//! - the data path: [`fabric::VerbsFabric`] (reliable-connected queue pairs, one set per pair
//!   of processes, built by a handshake over TCP), over a [`device::Device`]: the hardware one
//!   ([`device::HwDevice`]) or, in tests, a simulated one; the queue pair state machine is pure
//!   ([`qp`]) and checked by both;
//! - GPUDirect RDMA: device memory registered from a dma-buf (`ibv_reg_dmabuf_mr`) where the
//!   library and driver offer it.
//!
//! Nothing of it has run on RDMA hardware (there is none here): `docs/transports.md`.

pub mod device;
pub mod fabric;
pub mod qp;
#[cfg(test)]
pub(crate) mod sim;
pub mod sys;

use oxccl_transport::{Error, ErrorKind, Result};

/// One entry of an `NCCL_IB_HCA` list: a device name and an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name, or its prefix unless the list is exact.
    pub name: String,
    /// Port (1-based), if given.
    pub port: Option<u32>,
}

/// A parsed `NCCL_IB_HCA` value: `[^][=]name[:port][,name[:port]...]`. `^` excludes the listed
/// devices, `=` makes names match exactly (otherwise they are prefixes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    /// Exclude instead of include.
    pub exclude: bool,
    /// Exact names instead of prefixes.
    pub exact: bool,
    /// The entries (empty: every device).
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parse; an empty string selects everything.
    pub fn parse(s: &str) -> Result<HcaFilter> {
        let mut s = s.trim();
        let mut f = HcaFilter::default();
        if let Some(r) = s.strip_prefix('^') {
            f.exclude = true;
            s = r;
        }
        if let Some(r) = s.strip_prefix('=') {
            f.exact = true;
            s = r;
        }
        for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p.parse::<u32>().ok().filter(|p| *p >= 1).ok_or_else(|| {
                        Error::invalid_argument(format!("NCCL_IB_HCA entry {item:?}: port must be a number from 1"))
                    })?;
                    (n, Some(port))
                }
                None => (item, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(Error::invalid_argument(format!("NCCL_IB_HCA entry {item:?} is not a device name")));
            }
            f.entries.push(HcaEntry { name: name.to_string(), port });
        }
        Ok(f)
    }

    /// Whether `device` port `port` is selected.
    pub fn selects(&self, device: &str, port: u32) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self.entries.iter().any(|e| {
            let name = if self.exact { device == e.name } else { device.starts_with(&e.name) };
            name && e.port.is_none_or(|p| p == port)
        });
        hit != self.exclude
    }
}

/// What kind of address a GID is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
}

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gid {
    /// Index in the port's table.
    pub index: u32,
    /// The 16 bytes.
    pub raw: [u8; 16],
    /// Its type.
    pub kind: GidKind,
}

impl Gid {
    /// Whether it is unset (all zeros).
    pub fn is_zero(&self) -> bool {
        self.raw == [0; 16]
    }
    /// Whether it carries an IPv4 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4(&self) -> bool {
        self.raw[..10] == [0; 10] && self.raw[10..12] == [0xff, 0xff]
    }
    /// Whether it is an IPv6 link-local address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.raw[0] == 0xfe && self.raw[1] & 0xc0 == 0x80
    }
}

/// Parse a GID as sysfs prints it: eight groups of four hex digits separated by colons.
pub fn parse_gid(s: &str) -> Result<[u8; 16]> {
    let bad = || Error::invalid_argument(format!("{s:?} is not a GID (8 colon-separated groups of 4 hex digits)"));
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.len() != 4 {
            return Err(bad());
        }
        let v = u16::from_str_radix(g, 16).map_err(|_| bad())?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Ok(out)
}

/// The GID kind from sysfs' `gid_attrs/types/N` text (`IB/RoCE v1`, `RoCE v2`).
pub fn parse_gid_kind(s: &str, link_is_ethernet: bool) -> GidKind {
    match s.trim() {
        "RoCE v2" => GidKind::RoceV2,
        _ if link_is_ethernet => GidKind::RoceV1,
        _ => GidKind::Ib,
    }
}

/// Pick the GID to use: the index asked for (`NCCL_IB_GID_INDEX`), else, on RoCE, a RoCE v2
/// IPv4 GID, then a RoCE v2 IPv6 GID that is not link-local, then any RoCE v2, then v1; on
/// InfiniBand index 0. Unset (zero) entries are never chosen.
pub fn select_gid(table: &[Gid], want: Option<u32>) -> Result<Gid> {
    let usable = || table.iter().filter(|g| !g.is_zero());
    if let Some(i) = want {
        return usable().find(|g| g.index == i).copied().ok_or_else(|| {
            Error::invalid_argument(format!("GID index {i} (NCCL_IB_GID_INDEX) is not set on this port"))
        });
    }
    let rank = |g: &Gid| match (g.kind, g.is_ipv4(), g.is_link_local()) {
        (GidKind::RoceV2, true, _) => 0,
        (GidKind::RoceV2, false, false) => 1,
        (GidKind::RoceV2, false, true) => 2,
        (GidKind::RoceV1, ..) => 3,
        (GidKind::Ib, ..) => 4,
    };
    usable()
        .min_by_key(|g| (rank(g), g.index))
        .copied()
        .ok_or_else(|| Error::new(ErrorKind::Unavailable, "the port has no usable GID"))
}

/// `NCCL_IB_GID_INDEX`/`OXCCL_IB_GID_INDEX` as given (unset or negative: automatic).
pub fn gid_index(given: Option<&str>) -> Result<Option<u32>> {
    match given {
        None => Ok(None),
        Some(v) => {
            let n: i64 = v.trim().parse().map_err(|_| Error::invalid_argument(format!("NCCL_IB_GID_INDEX={v:?}")))?;
            Ok(u32::try_from(n).ok())
        }
    }
}

/// The RDMA devices `libibverbs` lists. `Unavailable` when the library is not installed.
pub fn devices() -> Result<Vec<String>> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the functions have these signatures in
    // every libibverbs; the list is freed with its own function; the names are copied out.
    unsafe {
        let h = libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return Err(Error::new(ErrorKind::Unavailable, "libibverbs.so.1 (rdma-core) is not installed"));
        }
        let get = libc::dlsym(h, c"ibv_get_device_list".as_ptr());
        let free = libc::dlsym(h, c"ibv_free_device_list".as_ptr());
        let name = libc::dlsym(h, c"ibv_get_device_name".as_ptr());
        if get.is_null() || free.is_null() || name.is_null() {
            return Err(Error::new(ErrorKind::Unavailable, "libibverbs.so.1 lacks ibv_get_device_list"));
        }
        type Get = unsafe extern "C" fn(*mut libc::c_int) -> *mut *mut libc::c_void;
        type Free = unsafe extern "C" fn(*mut *mut libc::c_void);
        type Name = unsafe extern "C" fn(*mut libc::c_void) -> *const libc::c_char;
        let (get, free, name) = (
            std::mem::transmute::<*mut libc::c_void, Get>(get),
            std::mem::transmute::<*mut libc::c_void, Free>(free),
            std::mem::transmute::<*mut libc::c_void, Name>(name),
        );
        let mut n: libc::c_int = 0;
        let list = get(&mut n);
        if list.is_null() {
            return Ok(Vec::new());
        }
        let out = (0..n.max(0) as usize)
            .map(|i| std::ffi::CStr::from_ptr(name(*list.add(i))).to_string_lossy().into_owned())
            .collect();
        free(list);
        Ok(out)
    }
}

/// A port's GID table from sysfs (`<root>/<device>/ports/<port>/gids/N` and
/// `gid_attrs/types/N`) and whether its link layer is Ethernet (RoCE).
pub fn read_gid_table(root: &std::path::Path, device: &str, port: u32) -> Result<(Vec<Gid>, bool)> {
    let dir = root.join(device).join("ports").join(port.to_string());
    let ethernet = std::fs::read_to_string(dir.join("link_layer")).map(|l| l.trim() == "Ethernet").unwrap_or(false);
    let mut table = Vec::new();
    let entries = std::fs::read_dir(dir.join("gids"))
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("{device}:{port}: no GID table ({e})")))?;
    for e in entries.flatten() {
        let Some(index) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // unreadable entries (EINVAL for unset ones on some kernels) are skipped
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let Ok(raw) = parse_gid(&text) else { continue };
        let kind = std::fs::read_to_string(dir.join("gid_attrs/types").join(index.to_string()))
            .map(|t| parse_gid_kind(&t, ethernet))
            .unwrap_or(if ethernet { GidKind::RoceV1 } else { GidKind::Ib });
        table.push(Gid { index, raw, kind });
    }
    table.sort_by_key(|g| g.index);
    Ok((table, ethernet))
}

/// Active ports of `device` in sysfs, in order.
fn active_ports(root: &std::path::Path, device: &str) -> Vec<u32> {
    let mut ports: Vec<u32> = std::fs::read_dir(root.join(device).join("ports"))
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    ports.sort();
    ports.retain(|p| {
        std::fs::read_to_string(root.join(device).join(format!("ports/{p}/state"))).is_ok_and(|s| s.contains("ACTIVE"))
    });
    ports
}

/// Pick the device, port and GID: the first active port of a device `NCCL_IB_HCA` selects.
pub fn choose_port(ib: &crate::IbSettings) -> Result<(String, u32, Gid)> {
    let filter = HcaFilter::parse(&ib.hca)?;
    let devs = devices()?;
    if devs.is_empty() {
        return Err(Error::new(ErrorKind::Unavailable, "no RDMA device (libibverbs lists none)"));
    }
    let root = std::path::Path::new("/sys/class/infiniband");
    let want = gid_index(ib.gid_index.as_deref())?;
    for d in &devs {
        if let Some(p) = active_ports(root, d).into_iter().find(|p| filter.selects(d, *p)) {
            let (table, _) = read_gid_table(root, d, p)?;
            return Ok((d.clone(), p, select_gid(&table, want)?));
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("no active port of the RDMA devices {devs:?} is selected (NCCL_IB_HCA)"),
    ))
}

/// Open the verbs fabric: the chosen port, `endpoints` endpoints, the handshake listener on
/// `ip`. `Unavailable` without libibverbs or a usable device.
pub fn open_ib(
    endpoints: usize,
    ip: std::net::IpAddr,
    secret: [u8; 32],
    ib: &crate::IbSettings,
) -> Result<Box<dyn crate::Fabric>> {
    let (name, port, gid) = choose_port(ib)?;
    let dev = device::HwDevice::open(&name, port as u8, gid, endpoints, ib)?;
    tracing::info!("NET/IB: {name}:{port}, GID index {} ({:?})", gid.index, gid.kind);
    Ok(Box::new(fabric::VerbsFabric::new(std::sync::Arc::new(dev), ip, secret)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_filters_follow_nccl_syntax() {
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1").unwrap();
        assert!(!f.exclude && !f.exact);
        assert!(f.selects("mlx5_0", 1) && !f.selects("mlx5_0", 2) && f.selects("mlx5_1", 2));
        assert!(!f.selects("mlx4_0", 1));
        let prefix = HcaFilter::parse("mlx5").unwrap();
        assert!(prefix.selects("mlx5_3", 1) && !prefix.selects("bnxt_re0", 1));
        let exact = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(exact.exact && exact.selects("mlx5_1", 1) && !exact.selects("mlx5_10", 1));
        let excl = HcaFilter::parse("^=mlx5_1").unwrap();
        assert!(excl.exclude && !excl.selects("mlx5_1", 1) && excl.selects("mlx5_10", 1));
        let excl_prefix = HcaFilter::parse("^mlx5").unwrap();
        assert!(!excl_prefix.selects("mlx5_0", 1) && excl_prefix.selects("irdma0", 1));
        assert!(HcaFilter::parse("").unwrap().selects("anything", 7));
        for bad in ["mlx5_0:x", "mlx5_0:0", "ml x", ":1", "mlx5_0:-1"] {
            assert!(HcaFilter::parse(bad).is_err(), "{bad}");
        }
    }

    fn gid(index: u32, s: &str, kind: GidKind) -> Gid {
        Gid { index, raw: parse_gid(s).unwrap(), kind }
    }

    #[test]
    fn gids_parse_and_roce_v2_ipv4_is_preferred() {
        let g = parse_gid("fe80:0000:0000:0000:0202:c9ff:fe00:0001").unwrap();
        assert_eq!(g[0], 0xfe);
        assert_eq!(g[15], 0x01);
        for bad in ["", "fe80::1", "fe80:0000:0000:0000:0202:c9ff:fe00", "fe80:0000:0000:0000:0202:c9ff:fe00:00zz"] {
            assert!(parse_gid(bad).is_err(), "{bad:?}");
        }
        let table = [
            gid(0, "fe80:0000:0000:0000:0202:c9ff:fe00:0001", GidKind::RoceV1),
            gid(1, "fe80:0000:0000:0000:0202:c9ff:fe00:0001", GidKind::RoceV2),
            gid(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", GidKind::RoceV1),
            gid(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", GidKind::RoceV2),
            gid(4, "0000:0000:0000:0000:0000:0000:0000:0000", GidKind::RoceV2),
        ];
        assert!(table[3].is_ipv4() && table[1].is_link_local());
        assert_eq!(select_gid(&table, None).unwrap().index, 3);
        assert_eq!(select_gid(&table[..2], None).unwrap().index, 1, "RoCE v2 link-local beats v1");
        assert_eq!(select_gid(&table, Some(0)).unwrap().index, 0, "NCCL_IB_GID_INDEX wins");
        assert!(select_gid(&table, Some(4)).is_err(), "an unset entry is refused");
        assert!(select_gid(&table, Some(9)).is_err());
        let ib = [gid(0, "fe80:0000:0000:0000:0002:c903:0000:0001", GidKind::Ib)];
        assert_eq!(select_gid(&ib, None).unwrap().index, 0);
        assert_eq!(select_gid(&[], None).unwrap_err().kind, ErrorKind::Unavailable);
        assert_eq!(parse_gid_kind("RoCE v2\n", true), GidKind::RoceV2);
        assert_eq!(parse_gid_kind("IB/RoCE v1", true), GidKind::RoceV1);
        assert_eq!(parse_gid_kind("IB/RoCE v1", false), GidKind::Ib);
    }

    /// The GID table and link layer come from a sysfs tree (a fake one here, laid out as the
    /// kernel's); unset and unreadable entries are skipped, inactive ports are not chosen.
    #[test]
    fn gid_tables_are_read_from_sysfs() {
        let root = std::env::temp_dir().join(format!("oxccl-sysfs-{}", std::process::id()));
        let port = root.join("mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        std::fs::create_dir_all(root.join("mlx5_0/ports/2")).unwrap();
        std::fs::write(port.join("link_layer"), "Ethernet\n").unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(root.join("mlx5_0/ports/2/state"), "1: DOWN\n").unwrap();
        let gids = [
            ("0", "fe80:0000:0000:0000:0202:c9ff:fe00:0001", "IB/RoCE v1"),
            ("1", "fe80:0000:0000:0000:0202:c9ff:fe00:0001", "RoCE v2"),
            ("2", "0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"),
            ("3", "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"),
            ("4", "0000:0000:0000:0000:0000:0000:0000:0000", "RoCE v2"),
            ("5", "garbage", "RoCE v2"),
        ];
        for (i, g, t) in gids {
            std::fs::write(port.join("gids").join(i), format!("{g}\n")).unwrap();
            std::fs::write(port.join("gid_attrs/types").join(i), format!("{t}\n")).unwrap();
        }
        let (table, eth) = read_gid_table(&root, "mlx5_0", 1).unwrap();
        assert!(eth);
        assert_eq!(table.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(table[3].kind, GidKind::RoceV2);
        assert_eq!(select_gid(&table, None).unwrap().index, 3, "RoCE v2 with an IPv4 address");
        assert_eq!(active_ports(&root, "mlx5_0"), vec![1]);
        assert!(read_gid_table(&root, "mlx5_9", 1).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// No RDMA device here (CI): the ib network reports Unavailable with the reason, never a
    /// panic; with libibverbs installed the device list is just empty.
    #[test]
    fn no_device_is_a_clean_unavailable() {
        match devices() {
            Ok(d) if !d.is_empty() => eprintln!("RDMA devices here: {d:?}"),
            _ => {
                let e = open_ib(1, "127.0.0.1".parse().unwrap(), [0; 32], &Default::default())
                    .err()
                    .expect("no device, yet opened");
                assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
                assert!(e.message.contains("libibverbs") || e.message.contains("no RDMA device"), "{e}");
            }
        }
    }
}
