//! The protocol's tests: over libfabric (software provider) and simulated verbs devices.

use super::*;
use oxccl_transport::{ErrorKind, Header, RecvConn, SendConn, Transport, TransportCtx};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ctx(rank: usize) -> TransportCtx {
    TransportCtx { rank, nranks: 2, comm_id: 77, secret: [5; 32], peers: vec![] }
}

/// The provider under test: `OXCCL_TEST_PROVIDER` (hw-check.sh sets a hardware one),
/// default libfabric's TCP emulation.
fn provider() -> String {
    std::env::var("OXCCL_TEST_PROVIDER").unwrap_or_else(|_| "tcp;ofi_rxm".into())
}

fn open(rank: usize, slots: usize, max: usize) -> Option<RdmaTransport> {
    open_eps(rank, slots, max, 1)
}

fn open_eps(rank: usize, slots: usize, max: usize, endpoints: usize) -> Option<RdmaTransport> {
    let cfg = RdmaConfig {
        slots,
        max_message: max,
        endpoints,
        zero_copy_min_op: Some(0),
        linger: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    open_ofi_with(rank, cfg)
}

/// A transport of libfabric's provider under test with `cfg` (`None`: skipped, no provider).
fn open_ofi_with(rank: usize, cfg: RdmaConfig) -> Option<RdmaTransport> {
    match RdmaTransport::open(&NetChoice::Ofi(provider()), ctx(rank), "127.0.0.1".parse().unwrap(), cfg) {
        Ok(t) => Some(t),
        Err(e) if e.kind == ErrorKind::Unavailable && std::env::var_os("OXCCL_REQUIRE_OFI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Connect a → b. Both endpoints need progress while the provider connects (manual data
/// progress), as two ranks give it: the sender's side runs on a second thread here.
fn connect(a: &RdmaTransport, b: &RdmaTransport) -> (Box<dyn SendConn>, Box<dyn RecvConn>) {
    let (pending, blob) = b.setup_recv(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = a.connect_send(1, &blob, deadline).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                s.progress().unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            s
        });
        let r = pending.accept(deadline).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (h.join().unwrap(), r)
    })
}

/// Messages cross in order, several times around the ring (credits), with payloads of every
/// size up to the maximum; an idle receiver can arm and sleep.
#[test]
fn messages_cross_in_order_with_credits() {
    let (Some(a), Some(b)) = (open(0, 4, 4096), open(1, 4, 4096)) else { return };
    stream(&a, &b);
}

/// Striped over several endpoints, with a different count on each side (2 → 3): messages
/// still arrive whole and in order.
#[test]
fn striped_messages_arrive_in_order() {
    let (Some(a), Some(b)) = (open_eps(0, 4, 4096, 2), open_eps(1, 4, 4096, 3)) else { return };
    stream(&a, &b);
    let (Some(c), Some(d)) = (open_eps(0, 3, 512, 4), open_eps(1, 3, 512, 1)) else { return };
    stream(&c, &d);
}

fn stream(a: &RdmaTransport, b: &RdmaTransport) {
    let (mut s, mut r) = connect(a, b);
    let max = s.max_message();
    assert!(r.peek().unwrap().is_none());
    let total = 64u64;
    let mut sent = 0u64;
    let mut got = 0u64;
    let t = Instant::now();
    while got < total {
        assert!(t.elapsed() < Duration::from_secs(20), "stuck at sent {sent} got {got}");
        if sent < total {
            if let Some(slot) = s.reserve().unwrap() {
                let len = (sent as usize * 61) % (max + 1);
                for (i, b) in slot[..len].iter_mut().enumerate() {
                    *b = (i as u64 + sent) as u8;
                }
                s.commit(Header { len: len as u32, comm: 77, seq: sent, count: 0, step: 0, call: 0 }).unwrap();
                sent += 1;
            }
        }
        s.progress().unwrap();
        if let Some((h, p)) = r.peek().unwrap() {
            assert_eq!(h.seq, got);
            assert_eq!(p.len(), (got as usize * 61) % (max + 1));
            assert!(p.iter().enumerate().all(|(i, b)| *b == (i as u64 + got) as u8), "payload {got}");
            r.consume().unwrap();
            got += 1;
        } else if sent == total {
            if let Some(src) = r.arm().unwrap() {
                oxccl_transport::wait::wait_any(&[src], Duration::from_millis(50)).unwrap();
            }
        }
    }
    let t = Instant::now();
    while s.pending() {
        s.progress().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}

/// Large messages go from user memory through the registration cache: a second pass over
/// the same buffer hits the cache; after the buffer is unmapped and new memory is mapped at
/// the same address, the new bytes arrive (a fresh registration, the old one invalidated
/// and deregistered).
#[test]
fn messages_from_user_memory_follow_unmapping() {
    let (Some(a), Some(b)) = (open(0, 4, 64 << 10), open(1, 4, 64 << 10)) else { return };
    let (mut s, mut r) = connect(&a, &b);
    let chunk = 64 << 10;
    let len = 4 * chunk;
    let map = |at: *mut libc::c_void, fill: u8| {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at.is_null() { 0 } else { libc::MAP_FIXED_NOREPLACE };
        // SAFETY: a fresh anonymous mapping (never over existing memory: FIXED_NOREPLACE).
        let p = unsafe { libc::mmap(at, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        // SAFETY: the mapping is ours and `len` long.
        let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        for (i, x) in buf.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(7) ^ fill;
        }
        p
    };
    let mut seq = 0u64;
    let mut pass = |p: *mut libc::c_void, fill: u8, s: &mut Box<dyn SendConn>, r: &mut Box<dyn RecvConn>| {
        for k in 0..4 {
            let t = Instant::now();
            let ok = loop {
                match s.borrow_ready(chunk).unwrap() {
                    Some(ok) => break ok,
                    None => assert!(t.elapsed() < Duration::from_secs(10), "no room"),
                }
                assert!(r.peek().unwrap().is_none(), "nothing sent yet");
            };
            if !ok {
                return false;
            }
            let h = Header { len: chunk as u32, comm: 77, seq, count: 0, step: 0, call: 0 };
            s.commit_borrowed(h, p as usize + k * chunk).unwrap();
            let t = Instant::now();
            loop {
                s.progress().unwrap();
                if let Some((h, data)) = r.peek().unwrap() {
                    assert_eq!(h.seq, seq);
                    assert!(
                        data.iter().enumerate().all(|(i, x)| *x == ((k * chunk + i) as u8).wrapping_mul(7) ^ fill),
                        "chunk {k} of pass {fill}"
                    );
                    r.consume().unwrap();
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "message {seq} never arrived");
            }
            seq += 1;
        }
        let t = Instant::now();
        while s.pending() {
            s.progress().unwrap();
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        true
    };
    let p = map(std::ptr::null_mut(), 1);
    if !pass(p, 1, &mut s, &mut r) {
        assert!(std::env::var_os("OXCCL_REQUIRE_UFFD").is_none(), "no registration cache");
        eprintln!("skipped: user memory cannot be watched here");
        return;
    }
    let user = a.net.user().unwrap();
    let st1 = user.stats();
    assert!(pass(p, 1, &mut s, &mut r));
    let st2 = user.stats();
    assert_eq!(st2.registrations, st1.registrations, "the second pass registered again");
    assert_eq!(st2.hits, st1.hits + 4);
    assert_eq!(user.ranges().len(), 1, "the chunks merged into one registration");
    // SAFETY: our mapping, no write in flight (pending is false).
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    assert!(user.ranges().is_empty(), "the unmapped buffer is still cached");
    let q = map(p, 2);
    assert_eq!(q, p, "same address");
    assert!(pass(q, 2, &mut s, &mut r));
    let st3 = user.stats();
    assert!(st3.registrations > st2.registrations && st3.invalidated > st2.invalidated, "{st3:?}");
    // SAFETY: our mapping.
    unsafe { libc::munmap(q, len) };
}

/// A HELLO with a wrong proof is ignored: the receiver times out rather than accepting.
#[test]
fn a_sender_without_the_secret_is_not_accepted() {
    let (Some(a), Some(b)) = (open(0, 2, 256), open(1, 2, 256)) else { return };
    let mut stranger_ctx = ctx(0);
    stranger_ctx.secret = [6; 32];
    let stranger = RdmaTransport {
        net: Net::open(
            open_ofi(&provider(), &"127.0.0.1".parse().unwrap(), 1).unwrap(),
            stranger_ctx,
            &RdmaConfig::default(),
        )
        .unwrap(),
        cfg: RdmaConfig {
            slots: 2,
            max_message: 256,
            endpoints: 1,
            zero_copy_min_op: Some(0),
            linger: std::time::Duration::from_secs(5),
            ..Default::default()
        },
    };
    let (pending, blob) = b.setup_recv(0).unwrap();
    let _s = stranger.connect_send(1, &blob, Instant::now() + Duration::from_secs(2)).unwrap();
    let e = pending.accept(Instant::now() + Duration::from_millis(800)).err().expect("the stranger was accepted");
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    drop(a);
}

#[test]
fn abort_reaches_the_receiver() {
    let (Some(a), Some(b)) = (open(0, 2, 256), open(1, 2, 256)) else { return };
    let (mut s, mut r) = connect(&a, &b);
    s.abort();
    let t = Instant::now();
    loop {
        match r.peek() {
            Err(e) => {
                assert_eq!(e.cause, Some(oxccl_transport::Cause::PeerAborted), "{e}");
                break;
            }
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "abort never arrived"),
        }
    }
}

/// The setup blob decoder takes any bytes without panicking and accepts only well-formed
/// blobs (fuzzed with random bytes and with mutations of a valid blob).
#[test]
fn blob_decoder_survives_random_and_mutated_input() {
    let good = Blob {
        addrs: vec![vec![1, 2, 3, 4, 5, 6, 7, 8], vec![9; 16]],
        id: 3,
        raddr: 4096,
        key: 9,
        slots: 8,
        slot_bytes: 1088,
        token: [7; 16],
        word: [3; 20],
    };
    let enc = good.encode();
    assert_eq!(Blob::decode(&enc).unwrap(), good);
    let mut z = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        z
    };
    let mut accepted = 0;
    for i in 0..200_000 {
        let b: Vec<u8> = if i % 2 == 0 {
            let len = (next() % 96) as usize;
            (0..len).map(|_| next() as u8).collect()
        } else {
            let mut b = enc.clone();
            let k = (next() % b.len() as u64) as usize;
            b[k] ^= (next() % 255 + 1) as u8;
            if next() % 4 == 0 {
                b.truncate((next() % b.len() as u64) as usize);
            }
            b
        };
        if let Ok(x) = Blob::decode(&b) {
            assert!(x.slots > 0 && x.slots <= 4096 && x.slot_bytes as usize > SLOT_HEADER);
            assert!(x.slots as u64 * x.slot_bytes as u64 <= 4 << 30, "a blob may not ask for a huge ring");
            assert!(!x.addrs.is_empty() && x.addrs.len() <= MAX_ENDPOINTS);
            assert!(x.addrs.iter().all(|a| !a.is_empty()));
            assert!(encode_addrs(&x.addrs).len() <= MSG_BYTES - HELLO_ADDRS);
            assert_eq!(Blob::decode(&x.encode()).unwrap(), x);
            accepted += 1;
        }
    }
    assert!(accepted > 0, "mutations that keep a blob valid were accepted");
}

/// The protocol over the verbs backend on simulated devices (strict about queue pair states,
/// keys and ranges): the handshake builds the queue pairs, then the same checks as over
/// libfabric.
fn open_sim(rank: usize, slots: usize, max: usize, eps: usize) -> (RdmaTransport, Arc<verbs::sim::SimDevice>) {
    let cfg = RdmaConfig {
        slots,
        max_message: max,
        endpoints: eps,
        zero_copy_min_op: Some(0),
        linger: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    open_sim_with(rank, cfg)
}

/// [`open_sim`] with `cfg`.
fn open_sim_with(rank: usize, cfg: RdmaConfig) -> (RdmaTransport, Arc<verbs::sim::SimDevice>) {
    let dev = Arc::new(verbs::sim::SimDevice::new(&format!("sim{rank}"), cfg.endpoints));
    let fab = verbs::fabric::VerbsFabric::new(dev.clone(), "127.0.0.1".parse().unwrap(), ctx(rank).secret).unwrap();
    (RdmaTransport { net: Net::open(Box::new(fab), ctx(rank), &cfg).unwrap(), cfg }, dev)
}

/// The shared conformance suite over libfabric (skipped where no provider opens, unless
/// `OXCCL_REQUIRE_OFI` is set, as CI sets it).
#[test]
fn ofi_conforms() {
    let make = || match (open(0, 4, 4096), open(1, 4, 4096)) {
        (Some(a), Some(b)) => Some((Box::new(a) as Box<dyn Transport>, Box::new(b) as Box<dyn Transport>)),
        _ => None,
    };
    let ran = oxccl_transport::conformance::run_all(&make);
    assert!(ran == oxccl_transport::conformance::CHECKS.len() || std::env::var_os("OXCCL_REQUIRE_OFI").is_none());
}

#[test]
fn net_choice_parses() {
    assert_eq!(NetChoice::parse("", "").unwrap(), NetChoice::Socket);
    assert_eq!(NetChoice::parse("OFI", "tcp;ofi_rxm").unwrap(), NetChoice::Ofi("tcp;ofi_rxm".into()));
    assert_eq!(NetChoice::parse("IB", "").unwrap(), NetChoice::Ib);
    assert!(NetChoice::parse("carrier-pigeon", "").is_err());
}

mod closing;
mod on_verbs;
mod sealed;
