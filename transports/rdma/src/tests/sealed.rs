//! Encrypted RDMA connections: sealed in the staging slot, opened in the receiver's ring, on
//! simulated verbs devices and over libfabric; disagreeing sides fail at setup on both ends; a
//! corrupted write fails the connection naming the peer.

use super::*;
use oxccl_transport::seal::MasterKey;
use oxccl_transport::Cause;

fn cfg(key: Option<u8>, eps: usize) -> RdmaConfig {
    RdmaConfig {
        slots: 4,
        max_message: 4096,
        endpoints: eps,
        zero_copy_min_op: Some(0),
        linger: Duration::from_secs(5),
        encrypt: key.map(|k| MasterKey([k; 32])),
        ..Default::default()
    }
}

#[test]
fn sealed_verbs_and_ofi_conform_and_stream() {
    for eps in [1, 2] {
        let make = || {
            let a: Box<dyn Transport> = Box::new(open_sim_with(0, cfg(Some(1), eps)).0);
            let b: Box<dyn Transport> = Box::new(open_sim_with(1, cfg(Some(1), eps)).0);
            Some((a, b))
        };
        assert_eq!(oxccl_transport::conformance::run_all(&make), oxccl_transport::conformance::CHECKS.len());
        let ((a, _), (b, _)) = (open_sim_with(0, cfg(Some(1), eps)), open_sim_with(1, cfg(Some(1), eps)));
        stream(&a, &b);
    }
    let make = || match (open_ofi_with(0, cfg(Some(1), 1)), open_ofi_with(1, cfg(Some(1), 1))) {
        (Some(a), Some(b)) => Some((Box::new(a) as Box<dyn Transport>, Box::new(b) as Box<dyn Transport>)),
        _ => None,
    };
    let ran = oxccl_transport::conformance::run_all(&make);
    assert!(ran == oxccl_transport::conformance::CHECKS.len() || std::env::var_os("OXCCL_REQUIRE_OFI").is_none());
}

#[test]
fn sealed_messages_are_never_written_from_user_memory() {
    let ((a, _), (b, _)) = (open_sim_with(0, cfg(Some(1), 1)), open_sim_with(1, cfg(Some(1), 1)));
    let (mut s, _r) = connect(&a, &b);
    assert_eq!(s.max_message(), 4096, "the tag does not eat into the message size");
    assert_eq!(s.borrow_ready(4096).unwrap(), Some(false), "encryption forces the copy path");
    assert_eq!(s.borrow_min_op(), usize::MAX);
}

#[test]
fn disagreeing_sides_fail_at_setup_on_both_ends() {
    for (ka, kb, what) in [
        (Some(1), None, "this rank encrypts its RDMA traffic and rank 1 does not"),
        (None, Some(1), "rank 1 encrypts its RDMA traffic and this rank does not"),
        (Some(1), Some(2), "different keys"),
    ] {
        let ((a, _), (b, _)) = (open_sim_with(0, cfg(ka, 1)), open_sim_with(1, cfg(kb, 1)));
        let (pending, blob) = b.setup_recv(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let e = a.connect_send(1, &blob, deadline).err().expect("the sender refuses");
        assert_eq!((e.cause, e.peer), (Some(Cause::Mismatch), Some(1)), "{e}");
        assert!(e.message.contains(what), "{e}");
        let t = Instant::now();
        let e = pending.accept(deadline).err().expect("the receiver refuses");
        assert!(t.elapsed() < Duration::from_secs(3), "not at a timeout: {:?}", t.elapsed());
        assert_eq!((e.cause, e.peer), (Some(Cause::Mismatch), Some(0)), "{e}");
    }
}

#[test]
fn a_corrupted_write_fails_the_connection_and_delivers_nothing() {
    let ((a, dev_a), (b, _)) = (open_sim_with(0, cfg(Some(1), 1)), open_sim_with(1, cfg(Some(1), 1)));
    let (mut s, mut r) = connect(&a, &b);
    dev_a.flip_bit_of_next_write();
    let slot = s.reserve().unwrap().unwrap();
    slot[..100].fill(0xAB);
    s.commit(Header { len: 100, comm: 77, seq: 0, count: 0, step: 0, call: 0 }).unwrap();
    let t = Instant::now();
    let e = loop {
        s.progress().unwrap();
        match r.peek() {
            Ok(None) => assert!(t.elapsed() < Duration::from_secs(10), "the message never arrived"),
            Ok(Some(_)) => panic!("an altered message was delivered"),
            Err(e) => break e,
        }
    };
    assert_eq!((e.cause, e.peer), (Some(Cause::Tampered), Some(0)), "{e}");
    assert!(e.message.contains("rank 0's encrypted RDMA connection failed"), "{e}");
    assert_eq!(r.peek().unwrap_err().cause, Some(Cause::Tampered), "and it stays failed");
}

/// On an encrypted connection, a control message without a valid tag, or one replayed, is
/// dropped: an unsigned ABORT aborts a plain connection, not an encrypted one; a replayed
/// (genuine) NOTIFY does not mark a slot again.
#[test]
fn forged_and_replayed_control_messages_change_nothing() {
    for key in [None, Some(1)] {
        let ((a, _), (b, _)) = (open_sim_with(0, cfg(key, 1)), open_sim_with(1, cfg(key, 1)));
        let (_s, mut r) = connect(&a, &b);
        let id = *b.net.st.lock().unwrap().recvs.keys().next().unwrap();
        {
            let mut st = b.net.st.lock().unwrap();
            b.net.dispatch(&mut st, &control(T_ABORT, id, 0, false));
        }
        let aborted = r.peek().is_err();
        assert_eq!(aborted, key.is_none(), "an unsigned ABORT acts on a plain connection only");
    }
    let ((a, _), (b, _)) = (open_sim_with(0, cfg(Some(1), 1)), open_sim_with(1, cfg(Some(1), 1)));
    let (_s, _r) = connect(&a, &b);
    let (sid, rid) = (
        *a.net.st.lock().unwrap().sends.keys().next().unwrap(),
        *b.net.st.lock().unwrap().recvs.keys().next().unwrap(),
    );
    // a genuine NOTIFY for message 0, as the sender would sign it, then the same bytes again
    let m = {
        let mut st = a.net.st.lock().unwrap();
        seal_ctl(st.sends.get_mut(&sid).unwrap().ctl.as_mut(), control(T_NOTIFY, rid, 0, false))
    };
    let mut st = b.net.st.lock().unwrap();
    b.net.dispatch(&mut st, &m);
    assert!(st.recvs[&rid].arrived(0), "the genuine NOTIFY marks message 0");
    st.recvs.get_mut(&rid).unwrap().notified[0] = 0;
    b.net.dispatch(&mut st, &m);
    assert!(!st.recvs[&rid].arrived(0), "its replay does not");
}
