//! Liveness of peers on other machines while no data connection joins us.
//!
//! A rank waiting in init or connection setup waits on the bootstrap store, which cannot tell a
//! slow peer from a dead one. On this machine the peer's pid answers that
//! ([`oxccl_transport::process_alive`]); across machines every process listens on one TCP port,
//! its beacon, whose only job is to exist: a thread accepts and closes each connection at once
//! (blocked in `accept`, it costs no CPU). A waiting rank connects to the peer's beacon:
//! - accepted: the process is alive (perhaps stopped: the kernel answers for it, into an accept
//!   queue of 4096);
//! - refused: nothing listens on the port any more, so the process is gone (its kernel said so
//!   at once);
//! - no answer: the host or the network between us stopped answering; after
//!   [`SILENT_LIMIT`] of that the peer is declared unreachable.
//!
//! The beacon sends and reads nothing, so a stranger who connects learns only that it exists.

use oxccl_transport::Cause;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a peer's beacon may stay silent (no answer at all) before it is declared unreachable.
pub const SILENT_LIMIT: Duration = Duration::from_secs(3);

/// How long one probe waits for the connection to be answered.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// This process's beacons: (fork generation, the beacon while a communicator holds it).
static BEACONS: Mutex<Vec<(u64, Weak<Beacon>)>> = Mutex::new(Vec::new());

/// A running beacon. Communicators hold it; the last one to go stops it (its thread and port are
/// gone after the last destroy, like every other resource of a communicator).
#[derive(Debug)]
pub struct Beacon {
    /// Its port on every address of the family of `ip`.
    pub port: u16,
    ip: IpAddr,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Beacon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // wake the accepting thread, which sees the flag and exits, closing the port (joined,
        // so the port is closed when this returns; not if it could not be woken)
        let woke = TcpStream::connect_timeout(&SocketAddr::new(self.ip, self.port), PROBE_TIMEOUT).is_ok();
        let t = self.thread.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let (true, Some(t)) = (woke, t) {
            let _ = t.join();
        }
    }
}

/// This process's beacon for addresses of `ip`'s family, started if no communicator holds one
/// (and in a fork child, which has no accepting thread). `None` when it cannot be started:
/// peers then fall back to the timeout, as before.
pub fn start(ip: IpAddr) -> Option<Arc<Beacon>> {
    let gen = crate::fork_generation();
    let mut g = BEACONS.lock().unwrap_or_else(|e| e.into_inner());
    g.retain(|(gn, w)| *gn == gen && w.strong_count() > 0);
    if let Some(b) = g.iter().filter_map(|(_, w)| w.upgrade()).find(|b| b.ip.is_ipv6() == ip.is_ipv6()) {
        return Some(b);
    }
    let any: IpAddr = if ip.is_ipv6() { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    let l = TcpListener::bind(SocketAddr::new(any, 0)).ok()?;
    // a stopped process (a debugger attached) must not look silent: its kernel answers probes
    // into the queue, which lasts far longer than a timeout at the probe rates of the waits
    let _ = oxccl_transport::deepen_backlog(&l, 4096);
    let port = l.local_addr().ok()?.port();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("oxccl-beacon".into())
        .spawn(move || {
            for s in l.incoming() {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                drop(s);
            }
        })
        .ok()?;
    let b = Arc::new(Beacon { port, ip, stop, thread: Mutex::new(Some(thread)) });
    g.push((gen, Arc::downgrade(&b)));
    Some(b)
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
    pub fn check(&mut self, ip: IpAddr, port: u16) -> Option<(String, Cause)> {
        self.observe(probe(ip, port), Instant::now(), ip, port)
    }

    /// What one probe's outcome at `now` means, given the earlier ones.
    fn observe(&mut self, seen: Probe, now: Instant, ip: IpAddr, port: u16) -> Option<(String, Cause)> {
        match seen {
            Probe::Alive => {
                self.silent_since = None;
                None
            }
            Probe::Gone => Some((
                format!("died: its liveness port {ip}:{port} refuses connections (process gone)"),
                Cause::PeerDied,
            )),
            Probe::Silent => {
                let silent = now - *self.silent_since.get_or_insert(now);
                (silent >= SILENT_LIMIT).then(|| {
                    let why = format!(
                        "stopped answering: its host did not answer on {ip}:{port} for {:.0} s (host down or network cut)",
                        silent.as_secs_f64()
                    );
                    (why, Cause::PeerUnreachable)
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
        let b = start(lo).unwrap();
        let p = b.port;
        assert_eq!(start(lo).unwrap().port, p, "one beacon per process while one is held");
        for _ in 0..50 {
            assert_eq!(probe(lo, p), Probe::Alive);
        }
        drop(b);
        assert_eq!(probe(lo, p), Probe::Gone, "the last holder stops it");
        // a port nobody listens on any more
        let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        assert_eq!(probe(lo, gone), Probe::Gone);
        assert!(Watch::default().check(lo, gone).is_some_and(|(w, c)| w.contains("died") && c == Cause::PeerDied));
        let live = start(lo).unwrap();
        assert_eq!(Watch::default().check(lo, live.port), None);
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
        let (v, c) = w.observe(Probe::Silent, t + 2 * SILENT_LIMIT, lo, 9).unwrap();
        assert!(v.contains("stopped answering") && v.contains("3 s") && c == Cause::PeerUnreachable, "{v}");
    }
}
