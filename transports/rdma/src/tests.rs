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

/// The shared conformance suite over the verbs backend on simulated devices.
#[test]
fn verbs_on_simulated_devices_conforms() {
    let make = || {
        let a: Box<dyn Transport> = Box::new(open_sim(0, 4, 4096, 1).0);
        let b: Box<dyn Transport> = Box::new(open_sim(1, 4, 4096, 1).0);
        Some((a, b))
    };
    assert_eq!(oxccl_transport::conformance::run_all(&make), oxccl_transport::conformance::CHECKS.len());
}

#[test]
fn verbs_messages_cross_in_order_with_credits_and_striping() {
    let ((a, _), (b, _)) = (open_sim(0, 4, 4096, 1), open_sim(1, 4, 4096, 1));
    assert_eq!(b.name(), "NET/IB");
    stream(&a, &b);
    // both directions between the same processes reuse one set of queue pairs
    stream(&b, &a);
    let ((c, _), (d, _)) = (open_sim(0, 4, 4096, 2), open_sim(1, 4, 4096, 3));
    stream(&c, &d);
}

#[test]
fn verbs_handshake_refuses_a_stranger() {
    let (b, bdev) = open_sim(1, 2, 256, 1);
    let mut stranger_ctx = ctx(0);
    stranger_ctx.secret = [6; 32];
    let sdev = Arc::new(verbs::sim::SimDevice::new("stranger", 1));
    let fab = verbs::fabric::VerbsFabric::new(sdev, "127.0.0.1".parse().unwrap(), stranger_ctx.secret).unwrap();
    let stranger = RdmaTransport {
        net: Net::open(Box::new(fab), stranger_ctx, &RdmaConfig::default()).unwrap(),
        cfg: RdmaConfig {
            slots: 2,
            max_message: 256,
            endpoints: 1,
            zero_copy_min_op: None,
            linger: Duration::from_secs(5),
            ..Default::default()
        },
    };
    let (pending, blob) = b.setup_recv(0).unwrap();
    let e = stranger.connect_send(1, &blob, Instant::now() + Duration::from_secs(2)).err().expect("connected");
    assert!(e.message.contains("handshake"), "{e}");
    let e = pending.accept(Instant::now() + Duration::from_millis(300)).err().expect("the stranger was accepted");
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    drop(bdev);
}

#[test]
fn verbs_abort_and_user_memory() {
    let ((a, _), (b, _)) = (open_sim(0, 2, 256, 1), open_sim(1, 2, 256, 1));
    let (mut s, mut r) = connect(&a, &b);
    s.abort();
    let t = Instant::now();
    while r.peek().err().is_none() {
        assert!(t.elapsed() < Duration::from_secs(5), "abort never arrived");
    }
    // a message written from (registered, cached) user memory
    let ((c, _), (d, _)) = (open_sim(0, 4, 64 << 10, 1), open_sim(1, 4, 64 << 10, 1));
    let (mut s, mut r) = connect(&c, &d);
    let data: Vec<u8> = (0..(64 << 10)).map(|i| (i * 13) as u8).collect();
    if s.borrow_ready(data.len()).unwrap() == Some(true) {
        let h = Header { len: data.len() as u32, comm: 77, seq: 0, count: 0, step: 0, call: 0 };
        s.commit_borrowed(h, data.as_ptr() as usize).unwrap();
        let t = Instant::now();
        loop {
            s.progress().unwrap();
            if let Some((_, got)) = r.peek().unwrap() {
                assert!(got == &data[..], "user-memory payload differs");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5));
        }
    }
}

/// A peer whose device dies: the sender's next write completes with the device's error,
/// reported naming the peer rank, the provider, the device and the status.
#[test]
fn verbs_dead_peer_is_named_with_the_status() {
    let ((a, _), (b, bdev)) = (open_sim(0, 4, 256, 1), open_sim(1, 4, 256, 1));
    let (mut s, _r) = connect(&a, &b);
    bdev.kill();
    let t = Instant::now();
    let e = loop {
        let r = match s.reserve() {
            Ok(Some(_)) => s.commit(Header { len: 8, comm: 77, seq: 0, count: 0, step: 0, call: 0 }),
            Ok(None) => s.progress(),
            Err(e) => Err(e),
        };
        if let Err(e) = r.and_then(|_| s.progress()) {
            break e;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "the dead peer went unnoticed");
    };
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    for part in ["rank 1", "verbs", "sim0", "transport retry counter exceeded"] {
        assert!(e.to_string().contains(part), "{part:?} missing from: {e}");
    }
}

/// A control message that fails (here a CREDIT to a sender whose device died) fails its
/// connection naming the peer, instead of leaving it to a timeout.
#[test]
fn verbs_failed_credit_is_named() {
    let ((a, adev), (b, _)) = (open_sim(0, 2, 256, 1), open_sim(1, 2, 256, 1));
    let (mut s, mut r) = connect(&a, &b);
    // two messages arrive, then the sender's device dies before the receiver credits them
    for seq in 0..2u64 {
        let t = Instant::now();
        while s.reserve().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        s.commit(Header { len: 8, comm: 77, seq, count: 0, step: 0, call: 0 }).unwrap();
    }
    let t = Instant::now();
    let mut got = 0;
    while got < 2 {
        s.progress().unwrap();
        if r.peek().unwrap().is_some() {
            if got == 1 {
                adev.kill();
            }
            r.consume().unwrap();
            got += 1;
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    let e = loop {
        match r.peek() {
            Err(e) => break e,
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "the failed CREDIT went unnoticed"),
        }
    };
    assert!(e.to_string().contains("rank 0") && e.to_string().contains("transport retry counter exceeded"), "{e}");
}

/// A transport over libfabric whose close waits at most `linger` for FLUSH answers.
fn open_linger(rank: usize, linger: Duration) -> Option<RdmaTransport> {
    let mut t = open(rank, 8, 4096)?;
    t.cfg.linger = linger;
    Arc::get_mut(&mut t.net).unwrap().linger = linger;
    Some(t)
}

/// `n` small messages (fewer than a credit batch: none gets credited), flushed out of the
/// sender.
fn send_some(s: &mut dyn SendConn, n: u64) {
    let t = Instant::now();
    let mut sent = 0;
    while sent < n || s.pending() {
        if sent < n {
            if let Some(slot) = s.reserve().unwrap() {
                slot[..8].copy_from_slice(&sent.to_le_bytes());
                s.commit(Header { len: 8, comm: 77, seq: sent, count: 0, step: 0, call: 0 }).unwrap();
                sent += 1;
            }
        }
        s.progress().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "stuck sending");
    }
}

fn read_some(r: &mut dyn RecvConn, n: u64) {
    let t = Instant::now();
    for k in 0..n {
        loop {
            if let Some((h, p)) = r.peek().unwrap() {
                assert_eq!((h.seq, p), (k, &k.to_le_bytes()[..]));
                r.consume().unwrap();
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "message {k} did not arrive");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Closing a rank whose last messages were not credited yet waits until the receiver has
/// read up to them (a FLUSH answered), not only until they left this process: a rank that
/// finishes and exits first must not take its last messages with it (a software provider
/// resets a socket closed with unread data, dropping what its send queue still held).
fn closing_waits_for_the_receiver(a: RdmaTransport, b: &RdmaTransport) {
    let (mut s, mut r) = connect(&a, b);
    send_some(&mut *s, 3);
    drop(s);
    let t = Instant::now();
    let closer = std::thread::spawn(move || {
        drop(a);
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!closer.is_finished(), "closed before the receiver read the last messages");
    read_some(&mut *r, 3);
    while !closer.is_finished() {
        // nothing more, and once the close is heard, it says so
        match r.peek() {
            Ok(None) => {}
            Err(e) => assert_eq!(e.cause, Some(oxccl_transport::Cause::PeerClosed), "{e}"),
            Ok(Some(_)) => panic!("a message after the last"),
        }
        std::thread::sleep(Duration::from_millis(1));
        assert!(t.elapsed() < Duration::from_secs(4), "the FLUSH was not answered");
    }
    assert!(closer.join().unwrap() < Duration::from_secs(4));
}

#[test]
fn closing_waits_until_the_receiver_read_the_last_messages() {
    let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
    closing_waits_for_the_receiver(a, &b);
}

#[test]
fn closing_waits_for_the_receiver_over_simulated_verbs() {
    let ((a, _), (b, _)) = (open_sim(0, 8, 4096, 2), open_sim(1, 8, 4096, 1));
    closing_waits_for_the_receiver(a, &b);
}

/// A receiver that never reads again: closing waits `linger`, then closes anyway (a bounded
/// wait, with a warning naming the rank).
#[test]
fn closing_waits_at_most_the_linger_time() {
    let (Some(a), Some(b)) = (open_linger(0, Duration::from_millis(400)), open(1, 8, 4096)) else { return };
    let (mut s, _r) = connect(&a, &b);
    send_some(&mut *s, 3);
    drop(s);
    let t = Instant::now();
    drop(a);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "{took:?}");
}

/// After an abort (the communicator failed), closing waits for nothing.
#[test]
fn closing_after_an_abort_does_not_wait() {
    let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
    let (mut s, _r) = connect(&a, &b);
    send_some(&mut *s, 3);
    s.abort();
    drop(s);
    let t = Instant::now();
    drop(a);
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
}

/// A receiver that closed first says so (CLOSED): its sender then closes without waiting
/// out the linger time, though nobody is left to answer its FLUSH.
#[test]
fn a_receiver_that_closed_first_releases_its_sender() {
    let (Some(a), Some(b)) = (open(0, 8, 4096), open(1, 8, 4096)) else { return };
    let (mut s, mut r) = connect(&a, &b);
    send_some(&mut *s, 3);
    read_some(&mut *r, 3);
    drop(r);
    drop(b);
    drop(s);
    let t = Instant::now();
    drop(a);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

/// A FLUSH for a connection this rank never accepted is not answered (a stranger learns
/// nothing and cannot make it send).
#[test]
fn a_stranger_flush_gets_no_answer() {
    let Some(b) = open(1, 8, 4096) else { return };
    let before = b.net.st.lock().unwrap().tx_free.len();
    let mut st = b.net.st.lock().unwrap();
    b.net.dispatch(&mut st, &control(T_FLUSH, 4242, 9, false));
    assert!(st.outbox.is_empty() && st.tx_free.len() == before, "answered a stranger");
}

#[test]
fn net_choice_parses() {
    assert_eq!(NetChoice::parse("", "").unwrap(), NetChoice::Socket);
    assert_eq!(NetChoice::parse("OFI", "tcp;ofi_rxm").unwrap(), NetChoice::Ofi("tcp;ofi_rxm".into()));
    assert_eq!(NetChoice::parse("IB", "").unwrap(), NetChoice::Ib);
    assert!(NetChoice::parse("carrier-pigeon", "").is_err());
}

mod sealed;
