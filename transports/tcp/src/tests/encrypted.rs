//! Encrypted connections: no plaintext on the wire, mismatches fail at setup on both sides, and
//! an altered, replayed or dropped frame fails the connection naming the peer.

use super::*;
use oxccl_transport::seal::MasterKey;
use oxccl_transport::HEADER_BYTES;
use std::sync::mpsc;
use std::thread;

const MARKER: &[u8] = b"OXCCL-PLAINTEXT-MARKER";

fn cfg(key: Option<u8>) -> TcpConfig {
    TcpConfig { slots: 4, slot_bytes: 4096, lanes: 1, socket_buffer: None, encrypt: key.map(|k| MasterKey([k; 32])) }
}

/// The receiver's port in a setup blob, and the blob with the port replaced.
fn blob_port(blob: &[u8]) -> (u16, impl Fn(u16) -> Vec<u8> + '_) {
    let n = blob[0] as usize;
    let port = u16::from_le_bytes([blob[1 + n], blob[2 + n]]);
    (port, move |p: u16| {
        let mut b = blob.to_vec();
        b[1 + n..3 + n].copy_from_slice(&p.to_le_bytes());
        b
    })
}

/// A one-connection TCP proxy to `to` that passes every byte through `edit` (which sees the
/// byte stream's offset and may change, drop or repeat bytes) and records what it forwarded.
fn proxy(to: u16, edit: impl Fn(usize, &[u8]) -> Vec<u8> + Send + 'static) -> (u16, mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut a, _) = l.accept().unwrap();
        let mut b = TcpStream::connect(("127.0.0.1", to)).unwrap();
        let (mut off, mut seen) = (0, Vec::new());
        let mut buf = [0u8; 65536];
        while let Ok(n) = a.read(&mut buf) {
            if n == 0 {
                break;
            }
            let out = edit(off, &buf[..n]);
            off += n;
            seen.extend_from_slice(&out);
            if b.write_all(&out).is_err() {
                break;
            }
        }
        let _ = tx.send(seen);
    });
    (port, rx)
}

/// Send `frames` messages holding the marker from `s`; receive on `r` until `n` arrived or an
/// error; returns the messages and the error.
fn exchange(s: &mut dyn SendConn, r: &mut dyn RecvConn, frames: u32) -> (Vec<Vec<u8>>, Option<Error>) {
    let (mut sent, mut got) = (0, Vec::new());
    let t = Instant::now();
    while got.len() < frames as usize && t.elapsed() < Duration::from_secs(10) {
        if sent < frames {
            if let Some(slot) = s.reserve().unwrap() {
                slot[..MARKER.len()].copy_from_slice(MARKER);
                slot[MARKER.len()] = sent as u8;
                s.commit(Header { len: MARKER.len() as u32 + 1, step: sent, ..Default::default() }).unwrap();
                sent += 1;
            }
        }
        let _ = s.progress();
        match r.peek() {
            Ok(Some((_, p))) => {
                got.push(p.to_vec());
                r.consume().unwrap();
            }
            Ok(None) => {}
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Frames through a proxy; returns what the receiver got, its error, and the bytes on the wire.
fn through_proxy(
    key: Option<u8>,
    frames: u32,
    edit: impl Fn(usize, &[u8]) -> Vec<u8> + Send + 'static,
) -> (Vec<Vec<u8>>, Option<Error>, Vec<u8>) {
    let (a, b) = (TcpTransport::new(ctx(1), cfg(key), lo()), TcpTransport::new(ctx(1), cfg(key), lo()));
    let (p, blob) = b.setup_recv(0).unwrap();
    let (port, with_port) = blob_port(&blob);
    let (pport, wire) = proxy(port, edit);
    let dl = Instant::now() + Duration::from_secs(5);
    let mut s = a.connect_send(1, &with_port(pport), dl).unwrap();
    let mut r = p.accept(dl).unwrap();
    let (got, err) = exchange(s.as_mut(), r.as_mut(), frames);
    drop((s, r));
    (got, err, wire.recv_timeout(Duration::from_secs(10)).unwrap())
}

#[test]
fn plaintext_shows_the_marker_and_encryption_hides_it() {
    let (got, err, wire) = through_proxy(None, 3, |_, b| b.to_vec());
    assert!(err.is_none() && got.len() == 3);
    assert!(contains(&wire, MARKER), "plaintext frames carry the marker");
    let (got, err, wire) = through_proxy(Some(7), 3, |_, b| b.to_vec());
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 3);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(&m[..MARKER.len()], MARKER);
        assert_eq!(m[MARKER.len()], i as u8);
    }
    assert!(!contains(&wire, MARKER), "no plaintext on an encrypted connection");
}

#[test]
fn a_flipped_bit_fails_the_connection_naming_the_peer() {
    // the hello is 76 bytes; flip one bit in the second frame's sealed body
    let frame = 4 + HEADER_BYTES + MARKER.len() + 1 + 16;
    let target = HELLO_BYTES + frame + 10;
    let (got, err, _) = through_proxy(Some(7), 3, move |off, b| {
        let mut v = b.to_vec();
        if (off..off + b.len()).contains(&target) {
            v[target - off] ^= 0x10;
        }
        v
    });
    assert_eq!(got.len(), 1, "the frame before the altered one arrives, nothing after it");
    let e = err.expect("the altered frame is an error");
    assert_eq!((e.cause, e.peer), (Some(Cause::Tampered), Some(0)), "{e}");
    assert!(e.message.contains("rank 0's encrypted TCP connection"), "{e}");
}

#[test]
fn a_replayed_frame_fails_the_connection() {
    let frame = 4 + HEADER_BYTES + MARKER.len() + 1 + 16;
    let seen = std::sync::Mutex::new(Vec::new());
    let (got, err, _) = through_proxy(Some(7), 3, move |_, b| {
        // repeat the first frame after it has passed
        let mut s = seen.lock().unwrap();
        let before = s.len();
        s.extend_from_slice(b);
        let first = HELLO_BYTES..HELLO_BYTES + frame;
        let mut v = b.to_vec();
        if before < first.end && s.len() >= first.end {
            let at = first.end - before;
            let copy = s[first].to_vec();
            v.splice(at..at, copy);
        }
        v
    });
    assert_eq!(got.len(), 1);
    assert_eq!(err.expect("a replay is an error").cause, Some(Cause::Tampered));
}

/// Sender config `a`, receiver config `b`: both sides' setup errors.
fn setup_both(a: Option<u8>, b: Option<u8>) -> (Error, Error) {
    let (ta, tb) = (TcpTransport::new(ctx(1), cfg(a), lo()), TcpTransport::new(ctx(1), cfg(b), lo()));
    let (p, blob) = tb.setup_recv(0).unwrap();
    let dl = Instant::now() + Duration::from_secs(10);
    let t = Instant::now();
    let recv = thread::spawn(move || p.accept(dl).err());
    let e_send = ta.connect_send(1, &blob, dl).err().expect("the sender refuses");
    let e_recv = recv.join().unwrap().expect("the receiver refuses");
    assert!(t.elapsed() < Duration::from_secs(3), "no waiting for a timeout: {:?}", t.elapsed());
    (e_send, e_recv)
}

#[test]
fn mismatched_encryption_fails_on_both_sides_at_setup() {
    for (a, b, what) in [
        (Some(1), None, "encrypts its TCP traffic and"),
        (None, Some(1), "encrypts its TCP traffic and"),
        (Some(1), Some(2), "different keys"),
    ] {
        let (s, r) = setup_both(a, b);
        for e in [&s, &r] {
            assert_eq!((e.kind, e.cause), (oxccl_transport::ErrorKind::InvalidUsage, Some(Cause::Mismatch)), "{e}");
            assert!(e.message.contains(what), "{e}");
        }
        assert_eq!((s.peer, r.peer), (Some(1), Some(0)));
    }
}
