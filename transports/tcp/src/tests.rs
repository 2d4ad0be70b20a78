//! Tests of the socket transport: connection setup, frames, failures, and a fuzz of the decoders.

use super::*;
use oxccl_transport::{Header, HEADER_BYTES};

fn ctx(secret: u8) -> TransportCtx {
    TransportCtx { rank: 0, nranks: 2, comm_id: 5, secret: [secret; 32], peers: vec![] }
}

fn lo() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

#[test]
fn a_data_port_nobody_listens_on_is_a_dead_peer_at_once() {
    let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let t = Instant::now();
    let e =
        connect_with_hello(3, gone, &[1; 32], 7, &[2; 16], &[0; CRYPT_BYTES], t + Duration::from_secs(30)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!((e.cause, e.peer), (Some(Cause::PeerClosed), Some(3)), "{e}");
    assert!(e.message.contains("rank 3 died or left"), "{e}");
}

#[test]
fn frames_flow_in_order_across_wraps() {
    let cfg = TcpConfig { slots: 2, slot_bytes: 1000, lanes: 3, socket_buffer: Some(1 << 20), encrypt: None };
    let a = TcpTransport::new(ctx(1), cfg, lo());
    let b = TcpTransport::new(ctx(1), cfg, lo());
    let (p, blob) = b.setup_recv(0).unwrap();
    let dl = Instant::now() + Duration::from_secs(5);
    let mut s = a.connect_send(1, &blob, dl).unwrap();
    let mut r = p.accept(dl).unwrap();
    let mut got = 0u32;
    let mut sent = 0u32;
    while got < 50 {
        if sent < 50 {
            if let Some(slot) = s.reserve().unwrap() {
                let len = (sent * 19 % 1000) as usize;
                slot[..len].fill(sent as u8);
                s.commit(Header { len: len as u32, step: sent, ..Default::default() }).unwrap();
                sent += 1;
            }
        }
        s.progress().unwrap();
        if let Some((h, p)) = r.peek().unwrap() {
            assert_eq!(h.step, got);
            assert_eq!(p.len(), (got * 19 % 1000) as usize);
            assert!(p.iter().all(|&x| x == got as u8));
            r.consume().unwrap();
            got += 1;
        }
    }
    drop(s);
    let t = Instant::now();
    loop {
        match r.peek() {
            Err(e) => {
                assert_eq!(e.kind, oxccl_transport::ErrorKind::Remote);
                break;
            }
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(5)),
        }
    }
}

#[test]
fn strangers_are_dropped_and_do_not_block() {
    let b = TcpTransport::new(ctx(1), TcpConfig::default(), lo());
    let (p, blob) = b.setup_recv(0).unwrap();
    let n = blob[0] as usize;
    let port = u16::from_le_bytes([blob[1 + n], blob[2 + n]]);
    let addr = SocketAddr::new(lo(), port);
    // a silent stranger, a garbage sender and one with the wrong secret
    let _silent = TcpStream::connect(addr).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0xAB; 4096]).unwrap();
    let wrong = TcpTransport::new(ctx(2), TcpConfig::default(), lo());
    let dl = Instant::now() + Duration::from_secs(5);
    let _w = wrong.connect_send(1, &blob, dl).unwrap();
    // the real sender still gets through at once
    let a = TcpTransport::new(ctx(1), TcpConfig::default(), lo());
    let _s = a.connect_send(1, &blob, dl).unwrap();
    let t = Instant::now();
    let _r = p.accept(dl).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    let acc = b.acceptor().unwrap();
    let dropped = acc.lock().unwrap().dropped;
    assert!(dropped >= 2, "garbage and wrong-secret hellos dropped, got {dropped}");
}

#[test]
fn malformed_blobs_are_rejected() {
    let a = TcpTransport::new(ctx(1), TcpConfig::default(), lo());
    let dl = Instant::now() + Duration::from_secs(1);
    for blob in [&[][..], &[200, 1, 2], &[3, b'a', b'b', b'c', 0, 0]] {
        assert!(a.connect_send(1, blob, dl).is_err());
    }
}

mod encrypted;

mod fuzz {
    use super::*;

    #[test]
    fn setup_blobs_of_random_bytes_are_refused_cleanly() {
        let a = TcpTransport::new(
            TransportCtx { rank: 0, nranks: 2, comm_id: 1, secret: [0; 32], peers: vec![] },
            TcpConfig::default(),
            "127.0.0.1".parse().unwrap(),
        );
        let dl = Instant::now() + Duration::from_millis(50);
        let mut z = 0xB10B_u64;
        for _ in 0..2000 {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = (z >> 58) as usize;
            let blob: Vec<u8> = (0..len).map(|i| (z >> (i % 56)) as u8).collect();
            // any outcome but a panic is fine; most must be refused
            let _ = a.connect_send(1, &blob, dl);
        }
    }
}

/// A plain lane's receiving side (peer 1, 256 KiB frames) on loopback, and a raw socket that
/// writes its frames.
fn raw_lane() -> (TcpStream, TcpRecv) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let s = l.accept().unwrap().0;
    s.set_nonblocking(true).unwrap();
    (w, TcpRecv::new(s, 256 << 10, 1, None))
}

/// A reader waiting on a large frame sleeps until all of it is in (`SO_RCVLOWAT` set to what is
/// missing), which also keeps Linux ACKing it as it arrives; a small frame after it still wakes it
/// at once (the mark is back at 1), and the bytes are exact.
#[test]
fn a_reader_sleeps_until_a_large_frame_is_whole() {
    let (mut w, mut r) = raw_lane();
    const LEN: usize = 48 << 10; // within the fresh connection's receive window
    let body: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    let mut frame = Header { len: LEN as u32, step: 4, ..Default::default() }.encode().to_vec();
    frame.extend_from_slice(&body);
    let readable = |r: &mut TcpRecv| match r.arm().unwrap() {
        None => true,
        Some(src) => wait_any(&[src], Duration::from_millis(200)).unwrap(),
    };

    w.write_all(&frame[..HEADER_BYTES + 1000]).unwrap();
    assert!(readable(&mut r), "the frame's first bytes wake a reader that knows no length yet");
    assert!(r.peek().unwrap().is_none());
    w.write_all(&frame[HEADER_BYTES + 1000..HEADER_BYTES + 20_000]).unwrap();
    assert!(!readable(&mut r), "woken with {} bytes still missing", r.missing());
    w.write_all(&frame[HEADER_BYTES + 20_000..]).unwrap();
    assert!(readable(&mut r), "not woken when the frame was whole");
    let (h, p) = r.peek().unwrap().expect("the whole frame");
    assert_eq!((h.step, p), (4, &body[..]));
    r.consume().unwrap();

    assert!(!readable(&mut r), "woken with nothing sent");
    let small = Header { len: 3, step: 5, ..Default::default() }.encode();
    w.write_all(&small).unwrap();
    w.write_all(&[1, 2, 3]).unwrap();
    assert!(readable(&mut r), "a small frame did not wake the reader");
    let (h, p) = r.peek().unwrap().expect("the small frame");
    assert_eq!((h.step, p), (5, &[1u8, 2, 3][..]));
}

/// A frame whose header came while its payload was still arriving is read straight into the
/// caller's buffer (`take_into`), resumed across calls while `peek` answers nothing, and is
/// exact; a reader waiting on it sleeps until the rest is in. A frame that is whole in the
/// lane's buffer, a small one, and one whose header fails the caller's check are not taken
/// (the check's error is returned and the buffer untouched), and a peer that closes mid-frame
/// is an error that names it.
#[test]
fn the_rest_of_a_large_frame_goes_straight_into_the_destination() {
    let (mut w, mut r) = raw_lane();
    const LEN: usize = 100 << 10;
    let frame = |step: u32, len: usize| {
        let mut f = Header { len: len as u32, step, ..Default::default() }.encode().to_vec();
        f.extend((0..len).map(|i| (i * 7 % 251) as u8 ^ step as u8));
        f
    };
    let ok = |_: &Header| Ok(());
    let readable = |r: &mut TcpRecv| match r.arm().unwrap() {
        None => true,
        Some(src) => wait_any(&[src], Duration::from_millis(200)).unwrap(),
    };

    let f = frame(1, LEN);
    w.write_all(&f[..HEADER_BYTES + 1000]).unwrap();
    assert!(readable(&mut r));
    let mut dst = vec![0u8; LEN];
    assert!(r.take_into(&mut dst, &ok).unwrap().is_none(), "taken before its header was read");
    assert!(r.peek().unwrap().is_none(), "a frame with most of it missing");
    assert!(r.take_into(&mut dst, &ok).unwrap().is_none(), "taken with most of it missing");
    assert!(r.peek().unwrap().is_none(), "peek saw a frame that is going into the destination");
    assert!(r.consume().is_err(), "consumed a frame still arriving");
    w.write_all(&f[HEADER_BYTES + 1000..HEADER_BYTES + 60_000]).unwrap();
    assert!(!readable(&mut r), "woken with the frame's end still missing");
    let _ = r.take_into(&mut dst, &ok).unwrap();
    w.write_all(&f[HEADER_BYTES + 60_000..]).unwrap();
    assert!(readable(&mut r), "not woken when the frame was whole");
    let h = r.take_into(&mut dst, &ok).unwrap().expect("the whole frame");
    assert_eq!((h.step, &dst[..]), (1, &f[HEADER_BYTES..]));
    r.consume().unwrap();

    // whole before it is asked for, small, or failing the check: left to peek
    let (whole, small, bad) = (frame(2, 20_000), frame(3, 5_000), frame(9, LEN));
    w.write_all(&whole).unwrap();
    w.write_all(&small).unwrap();
    w.write_all(&bad[..HEADER_BYTES + 10]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut dst2 = vec![0u8; 20_000];
    while r.peek().unwrap().is_none() {}
    assert!(r.take_into(&mut dst2, &ok).unwrap().is_none(), "a buffered frame was taken");
    assert_eq!(r.peek().unwrap().unwrap().1, &whole[HEADER_BYTES..]);
    r.consume().unwrap();
    let mut dst3 = vec![0u8; 5_000];
    assert!(r.take_into(&mut dst3, &ok).unwrap().is_none(), "a small frame was taken");
    assert_eq!(r.peek().unwrap().unwrap().1, &small[HEADER_BYTES..]);
    r.consume().unwrap();
    let mut dst4 = vec![0xeeu8; LEN];
    let refuse = |h: &Header| Err(oxccl_transport::Error::internal(format!("step {} refused", h.step)));
    let e = r.take_into(&mut dst4, &refuse).unwrap_err();
    assert!(e.message.contains("step 9 refused"), "{e}");
    assert!(dst4.iter().all(|&b| b == 0xee), "bytes written before the header was checked");

    // the peer goes away in the middle of a frame taken directly
    assert!(r.take_into(&mut dst4, &ok).unwrap().is_none());
    drop(w);
    let t = Instant::now();
    let e = loop {
        match r.take_into(&mut dst4, &ok) {
            Err(e) => break e,
            Ok(got) => assert!(got.is_none() && t.elapsed() < Duration::from_secs(5)),
        }
    };
    assert_eq!((e.cause, e.peer), (Some(Cause::PeerClosed), Some(1)), "{e}");
}
