//! Tests of the shared-memory transport: rings, wrap-around, single copy (CMA), doorbells, and a
//! fuzz of the setup blob.

use super::*;

fn ctx(rank: usize) -> TransportCtx {
    TransportCtx { rank, nranks: 2, comm_id: 9, secret: [0; 32], peers: vec![] }
}

/// A connection from rank 0 to rank 1 of one process.
fn pair(cfg: ShmConfig) -> (Box<dyn SendConn>, Box<dyn RecvConn>) {
    let a = ShmTransport::new(ctx(0), cfg).unwrap();
    let b = ShmTransport::new(ctx(1), cfg).unwrap();
    let (pending, blob) = b.setup_recv(0).unwrap();
    let dl = Instant::now() + Duration::from_secs(5);
    let s = a.connect_send(1, &blob, dl).unwrap();
    (s, pending.accept(dl).unwrap())
}

#[test]
fn ring_in_one_process_keeps_order_and_wraps() {
    let (mut s, mut r) = pair(ShmConfig { slots: 2, slot_bytes: 64, cma: true, ..Default::default() });
    assert!(r.peek().unwrap().is_none());
    for round in 0..5u8 {
        for i in 0..2u8 {
            let slot = s.reserve().unwrap().expect("room");
            slot[..3].copy_from_slice(&[round, i, 7]);
            s.commit(Header { len: 3, step: i as u32, ..Default::default() }).unwrap();
        }
        assert!(s.reserve().unwrap().is_none(), "full after 2 slots");
        assert!(s.arm().unwrap().is_some());
        s.disarm();
        for i in 0..2u8 {
            let (h, p) = r.peek().unwrap().expect("message");
            assert_eq!(h.step, i as u32);
            assert_eq!(p, &[round, i, 7]);
            r.consume().unwrap();
        }
    }
    assert!(r.arm().unwrap().is_some());
    r.disarm();
    drop(s);
    assert!(r.peek().is_err(), "sender closed is reported");
}

#[test]
fn inline_and_slot_payloads_interleave() {
    let (mut s, mut r) = pair(ShmConfig { slots: 3, slot_bytes: 128, cma: true, ..Default::default() });
    // lengths around the inline limit, through several laps of the ring
    let lens = [0usize, 1, INLINE_MAX, INLINE_MAX + 1, 128, 7, 64];
    for (i, &len) in lens.iter().cycle().take(40).enumerate() {
        let msg: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
        let slot = s.reserve().unwrap().expect("room");
        slot[..len].copy_from_slice(&msg);
        s.commit(Header { len: len as u32, step: i as u32, ..Default::default() }).unwrap();
        let (h, p) = r.peek().unwrap().expect("message");
        assert_eq!((h.step, p), (i as u32, &msg[..]), "message {i} of {len} bytes");
        r.consume().unwrap();
        assert!(r.peek().unwrap().is_none(), "no stale message after {i}");
    }
}

/// Small slots with single copy allowed, for the tests of messages sent by reference.
const CMA_CFG: ShmConfig = ShmConfig {
    slots: 2,
    slot_bytes: 4096,
    cma: true,
    cma_min_op: 32 << 20,
    cma_forward_min: 0,
    cma_forward_max: 0,
    cma_forward_far_only: false,
    cma_far_min_op: 64 << 10,
    placement: Placement::Measured,
};

/// What a connection answers about sending by reference, by placement: taken as far apart,
/// inputs forward whatever the role and every unchanged value goes by reference from
/// `cma_far_min_op` on, but for one message in 16, which gets the answer of close cores (the
/// same as measured far where the kernel's copy is slow); taken as close, or measured close,
/// the configured rules, or where the kernel's copy is slow inputs of operations of one message
/// only ([`NEAR_FORWARD_MAX_OP`]). A ring just made has no verdict yet: close.
#[test]
fn the_placement_decides_what_else_goes_by_reference() {
    let cfg = ShmConfig { slot_bytes: 256 << 10, cma_forward_min: 32 << 10, cma_forward_max: 32 << 20, ..CMA_CFG };
    let far = Forwarding { ops: (32 << 10)..(32 << 20), any_role: true, stable_min_op: 64 << 10 };
    let configured = Forwarding { ops: (32 << 10)..(32 << 20), ..Forwarding::default() };
    assert_eq!(configured.stable_min_op, usize::MAX);
    let one_message =
        Forwarding { ops: (32 << 10)..(NEAR_FORWARD_MAX_OP + 1), any_role: true, ..Forwarding::default() };
    // (the kernel's copy slow, or fast: what close cores get)
    for (slow, close) in [(true, one_message.clone()), (false, configured.clone())] {
        let (s, _r) = pair(ShmConfig { placement: Placement::Far, cma_forward_far_only: slow, ..cfg });
        let answers: Vec<Forwarding> = (0..32).map(|_| s.borrow_forward()).collect();
        assert_eq!(answers.iter().filter(|a| **a == close).count(), 2, "one in 16 as if close: {answers:?}");
        assert_eq!(answers.iter().filter(|a| **a == far).count(), 30, "{answers:?}");
    }
    // the kernel's copy slow: between close cores, or before a verdict, inputs of operations of
    // one message only, and never beyond the configured range
    for placement in [Placement::Near, Placement::Measured] {
        let (s, _r) = pair(ShmConfig { placement, cma_forward_far_only: true, ..cfg });
        assert!((0..32).all(|_| s.borrow_forward() == one_message), "{placement:?}");
        let narrow = ShmConfig { placement, cma_forward_far_only: true, cma_forward_max: 64 << 10, ..cfg };
        let (s, _r) = pair(narrow);
        assert_eq!(s.borrow_forward().ops, (32 << 10)..(64 << 10), "{placement:?}");
        let (s, _r) = pair(ShmConfig { placement, cma_forward_far_only: true, slot_bytes: 64 << 10, ..cfg });
        assert_eq!(s.borrow_forward().ops, (32 << 10)..((64 << 10) + 1), "{placement:?}: one slot's worth");
    }
    // the kernel's copy fast: inputs forward as configured, and nothing else
    for placement in [Placement::Near, Placement::Measured] {
        let (s, _r) = pair(ShmConfig { placement, ..cfg });
        assert!((0..32).all(|_| s.borrow_forward() == configured), "{placement:?}");
    }
    let (s, _r) = pair(ShmConfig { placement: Placement::Far, cma: false, ..cfg });
    assert_eq!(s.borrow_forward(), Forwarding::default(), "no single copy at all");
}

/// A connection that may send by reference, and 3000 bytes to send (`i * k` as bytes).
fn cma_pair(k: u32) -> (Box<dyn SendConn>, Box<dyn RecvConn>, Vec<u8>) {
    let (s, r) = pair(CMA_CFG);
    (s, r, (0..3000u32).map(|i| (i * k) as u8).collect())
}

#[test]
fn a_message_by_reference_that_comes_between_take_and_peek_waits_for_the_next_take() {
    let (mut s, mut r, data) = cma_pair(5);
    let ok = |_: &Header| Ok(());
    let mut dst = vec![0u8; 3000];
    assert!(r.take_into(&mut dst, &ok).unwrap().is_none(), "nothing yet");
    assert_eq!(s.borrow_ready(3000).unwrap(), Some(true));
    s.commit_borrowed(Header { len: 3000, step: 1, ..Default::default() }, data.as_ptr() as usize).unwrap();
    // the receiver's peek in the same pass leaves it, and arming does not sleep on it
    assert!(r.peek().unwrap().is_none(), "left for take_into");
    assert!(r.arm().unwrap().is_none(), "data is there: no sleep");
    let h = r.take_into(&mut dst, &ok).unwrap().expect("read straight into the destination");
    assert_eq!((h.step, &dst), (1, &data));
    r.consume().unwrap();
    // a peek with no missed take materialises as before
    s.commit_borrowed(Header { len: 3000, step: 2, ..Default::default() }, data.as_ptr() as usize).unwrap();
    assert_eq!(r.peek().unwrap().expect("message").1, &data[..]);
    r.consume().unwrap();
}

#[test]
fn messages_by_reference_are_copied_once_or_materialised() {
    let (mut s, mut r, data) = cma_pair(7);
    let ok = |_: &Header| Ok(());
    for round in 0..4u32 {
        assert_eq!(s.borrow_ready(3000).unwrap(), Some(true), "CMA works within one process");
        assert_eq!(s.borrow_ready(8).unwrap(), Some(false), "inline messages never go by reference");
        s.commit_borrowed(Header { len: 3000, step: round, ..Default::default() }, data.as_ptr() as usize).unwrap();
        assert!(s.pending(), "the sender's memory is in use until consumed");
        if round % 2 == 0 {
            let mut dst = vec![0u8; 3000];
            let h = r.take_into(&mut dst, &ok).unwrap().expect("by reference");
            assert_eq!((h.step, &dst), (round, &data));
        } else {
            let (h, p) = r.peek().unwrap().expect("message");
            assert_eq!((h.step, p), (round, &data[..]), "materialised into the slot");
        }
        // an ordinary message is not taken by take_into
        r.consume().unwrap();
        assert!(!s.pending());
        let slot = s.reserve().unwrap().unwrap();
        slot[..100].copy_from_slice(&data[..100]);
        s.commit(Header { len: 100, step: 99, ..Default::default() }).unwrap();
        assert!(r.take_into(&mut [0u8; 100], &ok).unwrap().is_none());
        assert_eq!(r.peek().unwrap().unwrap().1, &data[..100]);
        r.consume().unwrap();
    }
    // a refused check leaves the message unread
    s.commit_borrowed(Header { len: 3000, step: 5, ..Default::default() }, data.as_ptr() as usize).unwrap();
    let refuse = |_: &Header| Err(Error::invalid_usage("mismatch"));
    assert!(r.take_into(&mut [0u8; 3000], &refuse).is_err());
    let a = ShmTransport::new(ctx(0), CMA_CFG).unwrap();
    let off = ShmTransport::new(ctx(1), ShmConfig { cma: false, ..CMA_CFG }).unwrap();
    let (pending, blob) = off.setup_recv(0).unwrap();
    let dl = Instant::now() + Duration::from_secs(5);
    let mut s2 = a.connect_send(1, &blob, dl).unwrap();
    let _r2 = pending.accept(dl).unwrap();
    assert_eq!(s2.borrow_ready(3000).unwrap(), Some(false), "a receiver that refuses CMA gets ordinary messages");
}

#[test]
fn bad_blob_is_rejected() {
    let a = ShmTransport::new(ctx(0), ShmConfig::default()).unwrap();
    let dl = Instant::now() + Duration::from_secs(1);
    assert!(a.connect_send(1, &[1, 2, 3], dl).is_err());
    let mut blob = vec![];
    for x in [std::process::id() as u64, 999_999, 4, 256 << 10, 1, 9] {
        put_u64(&mut blob, x);
    }
    let e = a.connect_send(1, &blob, dl).err().unwrap();
    assert_eq!(e.peer, Some(1));
}

#[test]
fn a_peer_that_died_before_connecting_is_named_dead() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let e = open_doorbell(pid, 3).unwrap_err();
    assert_eq!((e.kind, e.cause), (oxccl_transport::ErrorKind::Remote, Some(oxccl_transport::Cause::PeerDied)), "{e}");
    assert!(Segment::open(pid, 3, 4096).err().unwrap().message.contains("died"));
    // a live process without that descriptor is another failure, not a death
    let e = open_doorbell(std::process::id(), 99_999).unwrap_err();
    assert_eq!(e.cause, None, "{e}");
}

mod fuzz {
    use super::*;

    #[test]
    fn setup_blobs_of_random_bytes_are_refused_cleanly() {
        let a = ShmTransport::new(
            TransportCtx { rank: 0, nranks: 2, comm_id: 1, secret: [0; 32], peers: vec![] },
            ShmConfig::default(),
        )
        .unwrap();
        let dl = Instant::now() + Duration::from_millis(50);
        let mut z = 0x5EA7_u64;
        for _ in 0..2000 {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = (z >> 58) as usize;
            let blob: Vec<u8> = (0..len).map(|i| (z >> (i % 56)) as u8).collect();
            assert!(a.connect_send(1, &blob, dl).is_err(), "a random blob names no segment of this job");
        }
    }
}
