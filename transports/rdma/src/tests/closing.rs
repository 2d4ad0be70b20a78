//! Closing a connection: the sender waits (at most the linger time) until the receiver read
//! its last messages, not after an abort, and a receiver that closed first releases it.

use super::*;

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
