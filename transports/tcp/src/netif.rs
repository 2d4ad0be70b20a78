//! Interface selection with NCCL's `NCCL_SOCKET_IFNAME` syntax.
//!
//! The value is a comma-separated list. A leading `^` excludes the listed names; a leading `=`
//! makes the names exact instead of prefixes; both may combine (`^=eth0`). Without a value,
//! interfaces named `docker*`, `lo*` and `virbr*` are skipped unless nothing else is up, as NCCL does.

use oxccl_transport::{Error, Result};
use std::net::IpAddr;

/// A parsed `NCCL_SOCKET_IFNAME` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpec {
    /// Exclude the listed names instead of selecting them.
    pub exclude: bool,
    /// Names must match exactly instead of by prefix.
    pub exact: bool,
    /// The names or prefixes.
    pub names: Vec<String>,
}

impl IfSpec {
    /// Parse a spec string.
    pub fn parse(s: &str) -> IfSpec {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        IfSpec { exclude, exact, names: s.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect() }
    }

    /// Whether interface `name` is selected by this spec.
    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

/// An interface and its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// Interface name.
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
}

/// All up interfaces with a usable address (IPv4 first, IPv6 link-local skipped), in system order.
pub fn interfaces() -> Result<Vec<Iface>> {
    use nix::net::if_::InterfaceFlags;
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::system("getifaddrs", &std::io::Error::from(e)))?;
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for a in addrs {
        if !a.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(addr) = a.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            v4.push(Iface { name: a.interface_name.clone(), ip: IpAddr::V4(sin.ip()) });
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            let ip = sin6.ip();
            if (ip.segments()[0] & 0xffc0) == 0xfe80 {
                continue; // link-local needs a scope id; never pick it
            }
            v6.push(Iface { name: a.interface_name.clone(), ip: IpAddr::V6(ip) });
        }
    }
    v4.extend(v6);
    Ok(v4)
}

/// Choose the interface for bootstrap and data connections from `spec`
/// (the value of `NCCL_SOCKET_IFNAME`/`OXCCL_SOCKET_IFNAME`, if any).
pub fn select(spec: Option<&str>) -> Result<Iface> {
    let all = interfaces()?;
    select_from(&all, spec)
}

/// [`select`] over a given list (pure, for tests).
pub fn select_from(all: &[Iface], spec: Option<&str>) -> Result<Iface> {
    match spec.filter(|s| !s.trim().is_empty()) {
        Some(s) => {
            let spec = IfSpec::parse(s);
            all.iter().find(|i| spec.matches(&i.name)).cloned().ok_or_else(|| {
                // one name per interface (an interface with IPv4 and IPv6 addresses is listed once)
                let mut names: Vec<&str> = Vec::new();
                for i in all {
                    if !names.contains(&i.name.as_str()) {
                        names.push(&i.name);
                    }
                }
                Error::invalid_argument(format!(
                    "no network interface matches NCCL_SOCKET_IFNAME={s:?} (interfaces up: {})",
                    names.join(", ")
                ))
            })
        }
        None => {
            let default = IfSpec::parse("^docker,lo,virbr");
            all.iter()
                .find(|i| default.matches(&i.name))
                .or_else(|| all.iter().find(|i| i.name.starts_with("lo")))
                .or_else(|| all.first())
                .cloned()
                .ok_or_else(|| Error::new(oxccl_transport::ErrorKind::System, "no network interface is up"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs() -> Vec<Iface> {
        [
            ("lo", "127.0.0.1"),
            ("docker0", "172.17.0.1"),
            ("eth0", "10.0.0.2"),
            ("eth1", "10.0.1.2"),
            ("ib0", "10.1.0.2"),
        ]
        .iter()
        .map(|(n, a)| Iface { name: n.to_string(), ip: a.parse().unwrap() })
        .collect()
    }

    #[test]
    fn nccl_syntax() {
        let all = ifs();
        let pick = |s: Option<&str>| select_from(&all, s).map(|i| i.name);
        assert_eq!(pick(None).unwrap(), "eth0");
        assert_eq!(pick(Some("lo")).unwrap(), "lo");
        assert_eq!(pick(Some("eth")).unwrap(), "eth0");
        assert_eq!(pick(Some("=eth1")).unwrap(), "eth1");
        assert!(pick(Some("=eth")).is_err(), "exact does not prefix-match");
        assert_eq!(pick(Some("^lo,docker,eth")).unwrap(), "ib0");
        assert_eq!(pick(Some("^=eth0,lo,docker0")).unwrap(), "eth1");
        assert_eq!(pick(Some("ib,eth")).unwrap(), "eth0", "system order wins");
        let e = pick(Some("wlan")).unwrap_err();
        assert!(e.to_string().contains("wlan"));
        // an interface with IPv4 and IPv6 addresses is named once
        let mut dual = all.clone();
        dual.push(Iface { name: "eth0".into(), ip: "fe80::1".parse().unwrap() });
        let m = select_from(&dual, Some("wlan")).unwrap_err().to_string();
        assert_eq!(m.matches("eth0").count(), 1, "{m}");
        let only_lo = vec![all[0].clone()];
        assert_eq!(select_from(&only_lo, None).unwrap().name, "lo");
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let all = interfaces().unwrap();
        assert!(all.iter().any(|i| i.ip.is_loopback()));
        assert!(select(Some("lo")).unwrap().ip.is_loopback());
    }
}
