//! The store's tests: both implementations, the server against strangers, and fuzzing.

use super::wire::*;
use super::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

use basic::exercise as basic_exercise;

mod basic {
    use super::*;

    fn server(secret: Option<[u8; 32]>) -> StoreServer {
        StoreServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), secret).unwrap()
    }

    pub(super) fn exercise(st: &dyn Store) {
        st.set("a", b"1").unwrap();
        assert_eq!(st.get("a", Duration::from_secs(1)).unwrap(), b"1");
        assert_eq!(st.add("n", 5).unwrap(), 5);
        assert_eq!(st.add("n", -2).unwrap(), 3);
        assert!(st.check(&["a".into()]).unwrap());
        assert!(!st.check(&["a".into(), "zz".into()]).unwrap());
        let t = Instant::now();
        let e = st.get("zz", Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.contains("zz"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(st.delete("a").unwrap());
        assert!(!st.delete("a").unwrap());
        // usable after a timeout
        st.set("b", b"2").unwrap();
        assert_eq!(
            st.multi_get(&["b".into(), "n".into()], Duration::from_secs(1)).unwrap(),
            vec![b"2".to_vec(), b"3".to_vec()]
        );
    }

    #[test]
    fn mem_store() {
        exercise(&*MemStore::new());
    }

    #[test]
    fn tcp_store_plain_and_authenticated() {
        let s = server(None);
        exercise(&TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap());
        let secret = [3u8; 32];
        let s = server(Some(secret));
        exercise(&TcpStore::connect(s.addr(), Some(secret), Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn wait_is_released_by_another_client() {
        let s = server(None);
        let a = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        let h = std::thread::spawn(move || a.get("k", Duration::from_secs(10)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        b.set("k", b"v").unwrap();
        assert_eq!(h.join().unwrap(), b"v");
    }

    #[test]
    fn a_dropped_server_serves_its_connected_clients_until_they_go() {
        let s = server(None);
        let addr = s.addr();
        let a = TcpStore::connect(addr, None, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect(addr, None, Duration::from_secs(5)).unwrap();
        a.set("split/0", b"r0").unwrap();
        assert_eq!(b.add("ready", 1).unwrap(), 1);
        // the host's rank destroys its communicator before the last rank has read the records
        drop(s);
        drop(a);
        assert_eq!(b.get("split/0", Duration::from_secs(1)).unwrap(), b"r0");
        b.set("split/1", b"r1").unwrap();
        assert_eq!(b.add("done", 1).unwrap(), 1);
        // it stops once the last client has gone, well before LINGER
        drop(b);
        let t = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            assert!(t.elapsed() < server::LINGER / 2, "the server still accepts after its clients left");
            // (each probe is a client for a moment: probe less often than the server's grace)
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    #[test]
    fn strangers_are_dropped_without_blocking_members() {
        let secret = [9u8; 32];
        let s = server(Some(secret));
        // silent, garbage, wrong secret, oversized key after a good handshake of the wrong secret
        let _silent = TcpStream::connect(s.addr()).unwrap();
        let mut garbage = TcpStream::connect(s.addr()).unwrap();
        let _ = garbage.write_all(&[0xFF; 100]);
        let wrong = TcpStore::connect(s.addr(), Some([1u8; 32]), Duration::from_millis(300));
        if let Ok(w) = wrong {
            assert!(w.set("x", b"y").is_err() || w.check(&["x".into()]).is_err());
        }
        let t = Instant::now();
        let good = TcpStore::connect(s.addr(), Some(secret), Duration::from_secs(5)).unwrap();
        good.set("k", b"v").unwrap();
        assert_eq!(good.get("k", Duration::from_secs(1)).unwrap(), b"v");
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(!good.check(&["x".into()]).unwrap(), "the stranger could not write");
        std::thread::sleep(AUTH_TIMEOUT + Duration::from_millis(300));
        assert!(s.rejected() >= 2, "rejected {}", s.rejected());
    }

    #[test]
    fn oversized_lengths_are_rejected() {
        let s = server(None);
        let mut c = TcpStream::connect(s.addr()).unwrap();
        let mut b = vec![q::VALIDATE];
        b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
        b.push(q::SET);
        b.extend_from_slice(&u64::MAX.to_ne_bytes());
        c.write_all(&b).unwrap();
        let mut buf = [0u8; 1];
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "server closed the connection");
        // the server is still fine
        let ok = TcpStore::connect(s.addr(), None, Duration::from_secs(1)).unwrap();
        ok.set("a", b"b").unwrap();
    }
}

mod sealed {
    use super::*;
    use oxccl_transport::seal::MasterKey;

    const KEY: Option<MasterKey> = Some(MasterKey([7; 32]));
    const SECRET: [u8; 32] = [4; 32];

    fn server(master: Option<MasterKey>) -> StoreServer {
        StoreServer::start_sealed(TcpListener::bind("127.0.0.1:0").unwrap(), Some(SECRET), master).unwrap()
    }

    fn client(addr: std::net::SocketAddr, master: Option<MasterKey>) -> Result<TcpStore> {
        TcpStore::connect_sealed(addr, Some(SECRET), master, Duration::from_secs(5))
    }

    /// A one-connection proxy to `to` that flips bit 0x10 of byte `flip` of the client's stream
    /// (if given) and returns everything both ways, once the connection closes.
    fn proxy(to: std::net::SocketAddr, flip: Option<usize>) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut a, _) = l.accept().unwrap();
            let mut b = TcpStream::connect(to).unwrap();
            let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
            let back = std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = b2.read(&mut buf) {
                    seen.extend_from_slice(&buf[..n]);
                    let _ = a2.write_all(&buf[..n]);
                }
                let _ = a2.shutdown(Shutdown::Both);
                seen
            });
            let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
            while let Ok(n @ 1..) = a.read(&mut buf) {
                let at = seen.len();
                if let Some(f) = flip.filter(|f| (at..at + n).contains(f)) {
                    buf[f - at] ^= 0x10;
                }
                seen.extend_from_slice(&buf[..n]);
                let _ = b.write_all(&buf[..n]);
            }
            let _ = b.shutdown(Shutdown::Both);
            seen.extend(back.join().unwrap());
            let _ = tx.send(seen);
        });
        (addr, rx)
    }

    #[test]
    fn a_sealed_store_works_and_shows_no_key_or_value() {
        let s = server(KEY);
        basic_exercise(&client(s.addr(), KEY).unwrap());
        let (p, wire) = proxy(s.addr(), None);
        let c = client(p, KEY).unwrap();
        c.set("visible-key", b"VISIBLE-VALUE").unwrap();
        assert_eq!(c.get("visible-key", Duration::from_secs(1)).unwrap(), b"VISIBLE-VALUE");
        drop(c);
        let wire = wire.recv_timeout(Duration::from_secs(5)).unwrap();
        let has = |n: &[u8]| wire.windows(n.len()).any(|w| w == n);
        assert!(!has(b"VISIBLE-VALUE") && !has(b"visible-key"), "no plaintext on a sealed store connection");
        // the same through a plain authenticated store shows both
        let s = server(None);
        let (p, wire) = proxy(s.addr(), None);
        let c = client(p, None).unwrap();
        c.set("visible-key", b"VISIBLE-VALUE").unwrap();
        drop(c);
        let wire = wire.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(wire.windows(13).any(|w| w == b"VISIBLE-VALUE"));
    }

    #[test]
    fn disagreeing_clients_are_refused_at_once() {
        let other = Some(MasterKey([8; 32]));
        for (srv, cli, what) in [
            (KEY, None, "encrypts its traffic and this process does not"),
            (None, KEY, "does not encrypt its traffic and this process does"),
            (KEY, other, "different key"),
        ] {
            let s = server(srv);
            let t = Instant::now();
            let Err(e) = client(s.addr(), cli) else { panic!("accepted") };
            assert!(t.elapsed() < Duration::from_secs(1), "not retried until the timeout: {:?}", t.elapsed());
            assert_eq!((e.kind, e.cause), (ErrorKind::InvalidUsage, Some(crate::Cause::Mismatch)), "{e}");
            assert!(e.message.contains(what), "{e}");
        }
    }

    #[test]
    fn a_flipped_bit_is_refused_and_nothing_of_it_is_stored() {
        let s = server(KEY);
        // the client's stream: proof (32 bytes), the VALIDATE record (4 + 5 + 16), then the SET's
        let (p, _wire) = proxy(s.addr(), Some(32 + 25 + 8));
        let c = client(p, KEY).unwrap();
        assert!(c.set("k", b"altered").is_err() || c.check(&["k".into()]).is_err());
        assert!(s.rejected() >= 1, "the server dropped the connection as tampered");
        let ok = client(s.addr(), KEY).unwrap();
        assert!(!ok.check(&["k".into()]).unwrap(), "nothing of the altered request was applied");
    }
}

mod fuzz {
    use super::*;

    /// Random byte streams (after a valid preamble half of the time) never crash the server or
    /// keep it from serving a real client.
    #[test]
    fn the_server_survives_random_streams() {
        let s = StoreServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), None).unwrap();
        let mut z = 0xF00D_u64;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        for i in 0..300 {
            let mut c = TcpStream::connect(s.addr()).unwrap();
            let mut b = Vec::new();
            if i % 2 == 0 {
                b.push(q::VALIDATE);
                b.extend_from_slice(&VALIDATE_MAGIC.to_ne_bytes());
            }
            let len = (next() % 200) as usize;
            b.extend((0..len).map(|_| {
                let x = next() as u8;
                // favour small query codes and small lengths so parsing goes deep
                if x < 128 {
                    x % 14
                } else {
                    x
                }
            }));
            let _ = c.write_all(&b);
            let _ = c.shutdown(Shutdown::Write);
        }
        let ok = TcpStore::connect(s.addr(), None, Duration::from_secs(5)).unwrap();
        ok.set("still", b"serving").unwrap();
        assert_eq!(ok.get("still", Duration::from_secs(5)).unwrap(), b"serving");
    }
}
