//! Liveness of peers on other machines while no data connection joins us.
//!
//! A rank waiting in init or connection setup waits on the bootstrap store, which cannot tell a
//! slow peer from a dead one. On this machine the peer's pid answers that
//! ([`oxccl_transport::process_alive`]); across machines every process listens on one TCP port,
//! its beacon, whose only job is to exist: a thread accepts and closes each connection at once
//! (blocked in `accept`, it costs no CPU). A waiting rank connects to the peer's beacon:
//! - accepted: the process is alive (perhaps stopped: the kernel answers for it);
//! - refused: nothing listens on the port any more, so the process is gone (its kernel said so
//!   at once);
//! - no answer: the host or the network between us stopped answering; after
//!   [`SILENT_LIMIT`] of that the peer is declared unreachable.
//!
//! The beacon sends and reads nothing, so a stranger who connects learns only that it exists.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a peer's beacon may stay silent (no answer at all) before it is declared unreachable.
pub const SILENT_LIMIT: Duration = Duration::from_secs(3);

/// How long one probe waits for the connection to be answered.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// This process's beacon: (fork generation, address family, port).
static BEACON: Mutex<Vec<(u64, bool, u16)>> = Mutex::new(Vec::new());

/// The port of this process's beacon for addresses of `ip`'s family, started on first use (and
/// again in a fork child, which has no accepting thread). 0 when it cannot be started: peers
/// then fall back to the timeout, as before.
pub fn port(ip: IpAddr) -> u16 {
    let v6 = ip.is_ipv6();
    let gen = crate::fork_generation();
    let mut g = BEACON.lock().unwrap_or_else(|e| e.into_inner());
    g.retain(|&(gn, _, _)| gn == gen);
    if let Some(&(_, _, p)) = g.iter().find(|b| b.1 == v6) {
        return p;
    }
    let any: IpAddr = if v6 { std::net::Ipv6Addr::UNSPECIFIED.into() } else { std::net::Ipv4Addr::UNSPECIFIED.into() };
    let Ok(l) = TcpListener::bind(SocketAddr::new(any, 0)) else { return 0 };
    let Ok(p) = l.local_addr().map(|a| a.port()) else { return 0 };
    let started = std::thread::Builder::new().name("oxccl-beacon".into()).spawn(move || {
        for s in l.incoming() {
            drop(s);
        }
    });
    if started.is_err() {
        return 0;
    }
    g.push((gen, v6, p));
    p
}

/// What one probe of a peer's beacon found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The connection was accepted.
    Alive,
    /// The connection was refused: no process listens there any more.
    Gone,
    /// No answer within the probe's timeout, or no route to the host.
    Silent,
}

/// Probe the beacon at `ip:port` (a port of 0 is never probed: [`Probe::Alive`]).
pub fn probe(ip: IpAddr, port: u16) -> Probe {
    if port == 0 {
        return Probe::Alive;
    }
    match TcpStream::connect_timeout(&SocketAddr::new(ip, port), PROBE_TIMEOUT) {
        Ok(_) => Probe::Alive,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Gone,
        Err(_) => Probe::Silent,
    }
}

/// Probes of one peer over time: a verdict once it is gone, or silent for [`SILENT_LIMIT`].
#[derive(Debug, Default, Clone)]
pub struct Watch {
    silent_since: Option<Instant>,
}

impl Watch {
    /// Probe once; `Some(why)` when the peer is dead or unreachable, in words that complete
    /// "rank 3 on host-b (10.0.0.2) …".
    pub fn check(&mut self, ip: IpAddr, port: u16) -> Option<String> {
        self.observe(probe(ip, port), Instant::now(), ip, port)
    }

    /// What one probe's outcome at `now` means, given the earlier ones.
    fn observe(&mut self, seen: Probe, now: Instant, ip: IpAddr, port: u16) -> Option<String> {
        match seen {
            Probe::Alive => {
                self.silent_since = None;
                None
            }
            Probe::Gone => Some(format!("died: its liveness port {ip}:{port} refuses connections (process gone)")),
            Probe::Silent => {
                let silent = now - *self.silent_since.get_or_insert(now);
                (silent >= SILENT_LIMIT).then(|| {
                    format!(
                        "stopped answering: its host did not answer on {ip}:{port} for {:.0} s (host down or network cut)",
                        silent.as_secs_f64()
                    )
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_beacon_answers_and_a_closed_port_is_gone() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let p = port(lo);
        assert_ne!(p, 0);
        assert_eq!(port(lo), p, "one beacon per process");
        for _ in 0..50 {
            assert_eq!(probe(lo, p), Probe::Alive);
        }
        // a port nobody listens on any more
        let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        assert_eq!(probe(lo, gone), Probe::Gone);
        assert!(Watch::default().check(lo, gone).unwrap().contains("died"));
        assert_eq!(Watch::default().check(lo, p), None);
        assert_eq!(probe(lo, 0), Probe::Alive, "no beacon: never probed");
    }

    #[test]
    fn silence_is_a_verdict_only_after_the_limit_and_an_answer_resets_it() {
        let (lo, t) = ("127.0.0.1".parse().unwrap(), Instant::now());
        let mut w = Watch::default();
        assert_eq!(w.observe(Probe::Silent, t, lo, 9), None);
        assert_eq!(w.observe(Probe::Silent, t + SILENT_LIMIT / 2, lo, 9), None);
        assert_eq!(w.observe(Probe::Alive, t + SILENT_LIMIT / 2, lo, 9), None);
        assert_eq!(w.observe(Probe::Silent, t + SILENT_LIMIT, lo, 9), None, "the silence starts again");
        let v = w.observe(Probe::Silent, t + 2 * SILENT_LIMIT, lo, 9).unwrap();
        assert!(v.contains("stopped answering") && v.contains("3 s"), "{v}");
    }
}
