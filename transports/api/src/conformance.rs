//! The conformance suite every transport passes (feature `conformance`; each transport crate's
//! tests run it): FIFO order and exact payloads, message limits, the never-block rule, sleeping
//! and waking, abort, a closed peer, and bad setup blobs.
//!
//! A transport under test is a [`Make`]: a function returning two fresh instances, ranks 0 and 1
//! of one communicator in this process (or `None` when the transport is not available here,
//! which the caller decides to allow or not). Every check connects rank 0 → rank 1 and drives
//! both halves from this thread, except where a call may wait for the other side.

use crate::wait::wait_any;
use crate::{Cause, Header, RecvConn, SendConn, Transport};
use std::time::{Duration, Instant};

/// Two instances of the transport under test, ranks 0 and 1 of one communicator (`None`: not
/// available here).
pub type Instances = Option<(Box<dyn Transport>, Box<dyn Transport>)>;

/// What makes fresh [`Instances`].
pub type Make<'a> = &'a dyn Fn() -> Instances;

/// One check of the suite.
pub type Check = fn(Make<'_>);

/// Every check, by name.
pub const CHECKS: [(&str, Check); 7] = [
    ("messages arrive in order, bit for bit", fifo_order),
    ("a slot holds max_message bytes and a full message arrives", message_limits),
    ("reserve and peek never block", never_blocks),
    ("a sleeping receiver wakes for a message", sleeping_receiver_wakes),
    ("an abort reaches the receiver as PeerAborted", abort_reaches_receiver),
    ("a closed sender is reported after its messages", closed_sender_is_reported),
    ("bad setup blobs are refused", bad_blobs_are_refused),
];

/// Run every check (each on fresh instances); a failure names the check. Returns how many ran
/// (0: the transport is unavailable here).
pub fn run_all(make: Make<'_>) -> usize {
    if make().is_none() {
        return 0;
    }
    for (name, check) in CHECKS {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(make)));
        if let Err(p) = r {
            let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("conformance check {name:?} failed: {}", why.unwrap_or_default());
        }
    }
    CHECKS.len()
}

const LIMIT: Duration = Duration::from_secs(20);

/// Connect rank 0 (`a`) → rank 1 (`b`). The sender is connected and progressed on a second
/// thread while the receiver accepts (some transports need both sides moving to connect).
pub fn connect(a: &dyn Transport, b: &dyn Transport) -> (Box<dyn SendConn>, Box<dyn RecvConn>) {
    let (pending, blob) = b.setup_recv(0).expect("setup_recv");
    let deadline = Instant::now() + LIMIT;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let mut s = a.connect_send(1, &blob, deadline).expect("connect_send");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                s.progress().expect("progress while connecting");
                std::thread::sleep(Duration::from_micros(200));
            }
            s
        });
        let r = pending.accept(deadline);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let s = h.join().expect("the connecting thread");
        (s, r.expect("accept"))
    })
}

fn pair(make: Make<'_>) -> (Box<dyn Transport>, Box<dyn Transport>) {
    make().expect("the transport was available a moment ago")
}

/// A payload every byte of which depends on (message, position).
fn pattern(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u32).wrapping_mul(31).wrapping_add(i.wrapping_mul(97)) as u8).collect()
}

fn header(i: u32, len: usize) -> Header {
    Header { len: len as u32, comm: 0xC0FFEE, seq: 1000 + i as u64, count: 7 * i as u64, step: i, call: i ^ 0x5A5A }
}

/// Send message `i` of `len` bytes if there is room; returns whether it was sent.
fn try_send(s: &mut dyn SendConn, i: u32, len: usize) -> bool {
    match s.reserve().expect("reserve") {
        None => false,
        Some(slot) => {
            slot[..len].copy_from_slice(&pattern(i, len));
            s.commit(header(i, len)).expect("commit");
            true
        }
    }
}

/// Receive the next message if it arrived, checking it is message `i` of `len` bytes.
fn try_recv(r: &mut dyn RecvConn, i: u32, len: usize) -> bool {
    match r.peek().expect("peek") {
        None => false,
        Some((h, p)) => {
            assert_eq!(h, header(i, len), "message {i}: header");
            assert!(p == pattern(i, len).as_slice(), "message {i}: payload of {} bytes differs", p.len());
            r.consume().expect("consume");
            true
        }
    }
}

/// Move `lens.len()` messages through, sender and receiver interleaved on this thread.
fn stream(s: &mut dyn SendConn, r: &mut dyn RecvConn, lens: &[usize]) {
    let (mut sent, mut got) = (0, 0);
    let until = Instant::now() + LIMIT;
    while got < lens.len() {
        assert!(Instant::now() < until, "stalled after {sent} sent, {got} received");
        if sent < lens.len() && try_send(s, sent as u32, lens[sent]) {
            sent += 1;
        }
        s.progress().expect("progress");
        if try_recv(r, got as u32, lens[got]) {
            got += 1;
        }
    }
}

/// Many messages of mixed sizes (empty, one byte, half, full) cross in order, headers and
/// payloads exact, several times around any ring of slots.
pub fn fifo_order(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    let max = s.max_message();
    let lens: Vec<usize> = (0..64).map(|i| [0, 1, max / 2, max, 3][i % 5].min(max)).collect();
    stream(&mut *s, &mut *r, &lens);
}

/// `max_message` is positive, a reserved slot holds that many bytes, and a message of exactly
/// that size arrives whole.
pub fn message_limits(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    let max = s.max_message();
    assert!(max > 0, "max_message is 0");
    let slot = s.reserve().expect("reserve").expect("an empty connection has room");
    assert!(slot.len() >= max, "slot of {} bytes, max_message {max}", slot.len());
    slot[..max].copy_from_slice(&pattern(0, max));
    s.commit(header(0, max)).expect("commit");
    let until = Instant::now() + LIMIT;
    while !try_recv(&mut *r, 0, max) {
        s.progress().expect("progress");
        assert!(Instant::now() < until, "a full-size message did not arrive");
    }
}

/// With nobody reading, sending fills the connection and `reserve` then says so (`None`) instead
/// of waiting; `peek` on an empty connection returns `None` at once; nothing is lost.
pub fn never_blocks(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    assert!(r.peek().expect("peek").is_none(), "an empty connection shows a message");
    let mut n = 0u32;
    let until = Instant::now() + LIMIT;
    loop {
        if !try_send(&mut *s, n, 8) {
            s.progress().expect("progress");
            if !try_send(&mut *s, n, 8) {
                break;
            }
        }
        n += 1;
        assert!(n < 1 << 20 && Instant::now() < until, "the connection never filled ({n} messages)");
    }
    let lens = vec![8; n as usize];
    let (mut got, until) = (0usize, Instant::now() + LIMIT);
    while got < lens.len() {
        s.progress().expect("progress");
        if try_recv(&mut *r, got as u32, 8) {
            got += 1;
        }
        assert!(Instant::now() < until, "{got} of {n} messages came back");
    }
}

/// A receiver that arms on an empty connection gets a source to sleep on, and the sleep ends
/// when a message is sent.
pub fn sleeping_receiver_wakes(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    let src = r.arm().expect("arm").expect("an empty connection gives a source to sleep on");
    assert!(try_send(&mut *s, 0, 16), "room on an empty connection");
    s.progress().expect("progress");
    let woke = wait_any(&[src], LIMIT).expect("wait");
    r.disarm();
    assert!(woke, "the receiver slept through a message");
    let until = Instant::now() + LIMIT;
    while !try_recv(&mut *r, 0, 16) {
        s.progress().expect("progress");
        assert!(Instant::now() < until, "woke, but the message never showed");
    }
}

/// Poll `r` until it fails; returns the error.
fn recv_error(r: &mut dyn RecvConn) -> crate::Error {
    let until = Instant::now() + LIMIT;
    loop {
        match r.peek() {
            Err(e) => return e,
            Ok(Some(_)) => panic!("a message where the end of the connection was expected"),
            Ok(None) => {}
        }
        if let Ok(Some(src)) = r.arm() {
            let _ = wait_any(&[src], Duration::from_millis(50));
        }
        r.disarm();
        assert!(Instant::now() < until, "the receiver never heard the connection end");
    }
}

/// A sender that aborts is reported to the receiver as [`Cause::PeerAborted`].
pub fn abort_reaches_receiver(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    s.abort();
    let e = recv_error(&mut *r);
    assert_eq!(e.cause, Some(Cause::PeerAborted), "{e}");
}

/// A sender that closes normally (dropped after its last message) has that message delivered,
/// then the receiver's next call fails instead of waiting forever.
pub fn closed_sender_is_reported(make: Make<'_>) {
    let (a, b) = pair(make);
    let (mut s, mut r) = connect(&*a, &*b);
    assert!(try_send(&mut *s, 0, 32));
    std::thread::scope(|sc| {
        // closing may wait (bounded) for the receiver to read the last message
        sc.spawn(move || {
            let until = Instant::now() + LIMIT;
            while s.pending() && Instant::now() < until {
                s.progress().expect("progress");
                std::thread::sleep(Duration::from_micros(200));
            }
            drop(s);
        });
        let until = Instant::now() + LIMIT;
        while !try_recv(&mut *r, 0, 32) {
            assert!(Instant::now() < until, "the last message before the close was lost");
        }
        let e = recv_error(&mut *r);
        assert!(e.cause.is_some() || !e.message.is_empty(), "{e}");
    });
}

/// Blobs that are empty, random, from another connection kind or truncated are refused with an
/// error (not a panic, not a hang).
pub fn bad_blobs_are_refused(make: Make<'_>) {
    let (a, b) = pair(make);
    let (_pending, real) = b.setup_recv(0).expect("setup_recv");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut blobs: Vec<Vec<u8>> = vec![vec![], vec![0xff; 7], real[..real.len() / 2].to_vec()];
    blobs.extend((0..8).map(|_| (0..(random() % 96) as usize).map(|_| random() as u8).collect()));
    for blob in blobs {
        let deadline = Instant::now() + Duration::from_secs(3);
        let r = a.connect_send(1, &blob, deadline);
        assert!(r.is_err(), "a blob of {} bytes was accepted", blob.len());
        assert!(Instant::now() < deadline + Duration::from_secs(2), "refusing a bad blob overran its deadline");
    }
}

#[cfg(test)]
mod tests {
    use crate::mem::{MemConfig, MemTransport};
    use crate::TransportCtx;

    fn mem() -> super::Instances {
        let ctx = |rank| TransportCtx { rank, nranks: 2, comm_id: 5, secret: [1; 32], peers: vec![] };
        let cfg = MemConfig { slots: 3, max_message: 4096 };
        Some((Box::new(MemTransport::new(ctx(0), cfg)), Box::new(MemTransport::new(ctx(1), cfg))))
    }

    #[test]
    fn the_in_memory_transport_conforms() {
        assert_eq!(super::run_all(&mem), super::CHECKS.len());
    }

    #[test]
    fn the_suite_catches_a_transport_that_reorders() {
        // a check must be able to fail: one that loses the second message of every pair
        let (a, b) = mem().unwrap();
        let (mut s, mut r) = super::connect(&*a, &*b);
        assert!(super::try_send(&mut *s, 0, 4));
        assert!(super::try_send(&mut *s, 1, 4));
        let swapped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::try_recv(&mut *r, 1, 4)));
        assert!(swapped.is_err(), "receiving message 0 as message 1 passed");
    }
}
