//! The verbs backend on simulated devices: the conformance suite, ordering with credits and
//! striping, a stranger refused, abort, user memory, and failures named with the status.

use super::*;

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
