//! Single copy between ranks of one process (Linux CMA, `process_vm_readv` on the process's own
//! memory): exact, and used where it should be. A test binary of its own, so that no other test
//! moves the process's single-copy counters meanwhile.

mod common;
use common::on_all;

use oxccl::{Coll, Communicator, Config, DataType, ReduceOp};
use std::sync::Mutex;
use std::time::Duration;

/// The tests read process-wide counters: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn cfg() -> Config {
    // small slots: many chunks even for small counts
    Config { timeout: Duration::from_secs(60), chunk_bytes: 4096, ..Default::default() }
}

/// Run `coll` through the untyped API and check it bit for bit.
fn check(c: &Communicator, coll: Coll, dt: DataType, op: ReduceOp, count: usize, root: usize, inplace: bool) {
    let wrong = common::run_and_count_wrong(c, coll, dt, op, count, root, inplace, 3);
    assert_eq!(wrong, 0, "rank {}: {coll:?} {dt:?} {op:?} count {count} root {root} inplace {inplace}", c.rank());
}

/// Single copy (CMA): large out-of-place operations send stable values by reference to
/// receivers that only copy, which read them straight from the sender's memory (a receiver that
/// combines would only copy it into a slot first, with the kernel's slower copy: every message
/// sent by reference is received directly); results are exact with it and without it, and
/// turning it off sends nothing by reference. The cores are taken as close: far apart, the
/// receivers that combine get messages by reference too (tested below), and a VM can move
/// the cores while the tests run.
#[test]
fn single_copy_by_reference_is_exact_and_used() {
    use oxccl::exec::single_copy_counts;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for cma in [true, false] {
        let mut cf = cfg();
        cf.shm_placement = Some("near".into());
        cf.chunk_bytes = 64 << 10;
        cf.cma = cma;
        cf.cma_min_bytes = 4096;
        let comms = Communicator::init_all_with_config(4, cf).unwrap();
        let before = single_copy_counts();
        on_all(comms, |c| {
            for coll in Coll::COLLECTIVES {
                check(c, coll, DataType::F32, ReduceOp::Sum, 50_001, 1, false);
                if coll != Coll::AllToAll {
                    check(c, coll, DataType::F32, ReduceOp::Sum, 20_003, 2, true);
                }
            }
            check(c, Coll::AllReduce, DataType::BF16, ReduceOp::Avg, 77_777, 0, false);
            check(c, Coll::AllReduce, DataType::F16, oxccl::exact::premul_two(DataType::F16), 40_000, 0, false);
        });
        let after = single_copy_counts();
        if cma {
            assert!(after.0 > before.0 && after.1 > before.1, "single copy was not used: {before:?} -> {after:?}");
            assert_eq!(after.0 - before.0, after.1 - before.1, "sent by reference to a receiver that combines");
        }
    }
}

/// Smaller operations (`Config::cma_forward`) send by reference only the messages that pass the
/// sender's unchanged input on, committed before its own copy, and only where that saves a
/// copy: over the whole range for a rank that receives too (each rank of a 2-rank all-gather),
/// while the operation is a few messages out of place or one in place for a rank that only
/// sends (a broadcast's root), never for a rank that also passes on what it received (an
/// all-gather of 3). All exact; nothing goes by reference where receivers combine (all-reduce,
/// reduce-scatter) or outside the range.
#[test]
fn forwarded_inputs_go_by_reference_in_small_operations() {
    use oxccl::exec::single_copy_counts;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cf = cfg();
    cf.chunk_bytes = 16 << 10; // messages of 4096 f32
    cf.cma_min_bytes = usize::MAX;
    cf.cma_forward = 4096..(1 << 20);
    // the role rules, whatever this machine's kernel copy (the probe is tested below)
    cf.cma_forward_probe = false;
    let two = Communicator::init_all_with_config(2, cf.clone()).unwrap();
    let three = Communicator::init_all_with_config(3, cf).unwrap();
    // (ranks, collectives, count, in place, whether anything goes by reference)
    let cases: [(usize, &[Coll], usize, bool, bool); 11] = [
        (3, &[Coll::AllReduce, Coll::ReduceScatter], 30_001, false, false),
        (3, &[Coll::AllReduce, Coll::ReduceScatter], 30_001, true, false),
        (2, &[Coll::AllGather], 600_001, false, false),
        (2, &[Coll::AllGather], 20_003, false, true),
        (2, &[Coll::AllGather], 20_003, true, true),
        (3, &[Coll::AllGather], 20_003, false, false),
        (3, &[Coll::AllGather], 20_003, true, false),
        (3, &[Coll::Broadcast], 12_000, false, true),
        (3, &[Coll::Broadcast], 20_003, false, false),
        (3, &[Coll::Broadcast], 3_000, true, true),
        (3, &[Coll::Broadcast], 12_000, true, false),
    ];
    for (n, colls, count, inplace, used) in cases {
        let before = single_copy_counts();
        on_all(if n == 2 { &two } else { &three }, |c| {
            for &coll in colls {
                for root in [0, n - 1] {
                    check(c, coll, DataType::F32, ReduceOp::Sum, count, root, inplace);
                }
            }
        });
        let after = single_copy_counts();
        let (sent, direct) = (after.0 - before.0, after.1 - before.1);
        let what = format!("{n} ranks {colls:?} count {count} in place {inplace}: {before:?} -> {after:?}");
        if used {
            assert!(sent > 0 && sent == direct, "{what}");
        } else {
            assert_eq!((sent, direct), (0, 0), "{what}");
        }
    }
}

/// With the probe of the kernel's copy on (the default), its verdict decides: where that copy
/// pays, a broadcast of a few messages from its root and each rank's block of a 2-rank
/// all-gather go by reference; where it does not, between cores that are close or not measured,
/// only operations of one message do (`NEAR_FORWARD_MAX_OP`: the slots cannot overlap its two
/// copies; from two messages on they do, and are faster). Messages here are too small to be
/// timed (`placement.rs` in the shm transport), so the placement stays unmeasured.
#[test]
fn the_probe_decides_whether_small_operations_forward_by_reference() {
    use oxccl::exec::single_copy_counts;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cf = cfg();
    cf.chunk_bytes = 8 << 10;
    cf.cma_min_bytes = usize::MAX;
    cf.cma_forward = 4096..(1 << 20);
    assert!(cf.cma_forward_probe, "the probe is on by default");
    let pays = oxccl_transport_shm::copy_probe().forward_pays();
    let two = Communicator::init_all_with_config(2, cf).unwrap();
    // (the all-gather first: a first operation runs while its connections are being accepted,
    // before the receiver has said that it can read by reference)
    // (count, in 4-byte elements, against 8 KiB slots; whether it goes by reference where the
    // kernel's copy pays, and where it does not)
    let cases = [
        (Coll::AllGather, 20_003, true, false),
        (Coll::Broadcast, 3_000, true, false),
        (Coll::AllGather, 1_500, true, true),
        (Coll::Broadcast, 2_000, true, true),
        (Coll::Broadcast, 900, false, false), // (below the range: 3,600 bytes)
    ];
    for (coll, count, if_pays, if_not) in cases {
        let before = single_copy_counts();
        on_all(&two, |c| check(c, coll, DataType::F32, ReduceOp::Sum, count, 0, false));
        let after = single_copy_counts();
        let (sent, direct) = (after.0 - before.0, after.1 - before.1);
        let seen =
            format!("{coll:?} count {count}, probe {:?}: {before:?} -> {after:?}", oxccl_transport_shm::copy_probe());
        let used = if pays { if_pays } else { if_not };
        if used {
            assert!(sent > 0 && sent == direct, "{seen}");
        } else {
            assert!(sent == 0 && direct == 0, "{seen}");
        }
    }
}

/// Cores far apart (`OXCCL_SHM_PLACEMENT=far`, as the receiver would measure them): from
/// `cma_far_min_bytes` on, every value that stays unchanged goes by reference, to receivers that
/// combine it too (they copy it into their slot through the kernel; one message in 16 still
/// goes through the slots): exact for every collective, type and op tried, out of place and in
/// place. Taken as close, an all-reduce or a reduce-scatter sends nothing by reference. A value
/// other than measure, near or far fails the communicator's creation, naming the variable.
#[test]
fn far_apart_unchanged_values_go_by_reference_to_combining_receivers_too() {
    use oxccl::exec::single_copy_counts;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cf = cfg();
    cf.chunk_bytes = 16 << 10;
    cf.cma_min_bytes = usize::MAX;
    cf.cma_far_min_bytes = 64 << 10;
    for n in [2, 3] {
        let far =
            Communicator::init_all_with_config(n, Config { shm_placement: Some("far".into()), ..cf.clone() }).unwrap();
        let before = single_copy_counts();
        on_all(&far, |c| {
            for coll in [Coll::AllReduce, Coll::ReduceScatter] {
                check(c, coll, DataType::F32, ReduceOp::Sum, 50_001, 0, false);
            }
        });
        let after = single_copy_counts();
        let (sent, direct) = (after.0 - before.0, after.1 - before.1);
        assert!(sent > direct, "{n} ranks: combining receivers got messages by reference: {before:?} -> {after:?}");
        on_all(&far, |c| {
            for coll in Coll::COLLECTIVES {
                check(c, coll, DataType::F32, ReduceOp::Sum, 50_001, n - 1, false);
                if coll != Coll::AllToAll {
                    check(c, coll, DataType::F32, ReduceOp::Sum, 20_003, 1, true);
                }
                check(c, coll, DataType::F32, ReduceOp::Sum, 3_001, 0, false);
            }
            check(c, Coll::AllReduce, DataType::BF16, ReduceOp::Avg, 77_777, 0, false);
            check(c, Coll::AllReduce, DataType::F16, oxccl::exact::premul_two(DataType::F16), 40_000, 0, false);
            check(c, Coll::ReduceScatter, DataType::I32, ReduceOp::Max, 60_000, 0, false);
            check(c, Coll::Reduce, DataType::F64, ReduceOp::Prod, 30_000, n - 1, false);
        });
        let near =
            Communicator::init_all_with_config(n, Config { shm_placement: Some("Near".into()), ..cf.clone() }).unwrap();
        let before = single_copy_counts();
        on_all(&near, |c| {
            for coll in [Coll::AllReduce, Coll::ReduceScatter] {
                check(c, coll, DataType::F32, ReduceOp::Sum, 50_001, 0, false);
            }
        });
        assert_eq!(single_copy_counts(), before, "{n} ranks taken as close");
    }
    let err =
        Communicator::init_all_with_config(2, Config { shm_placement: Some("sideways".into()), ..cf }).unwrap_err();
    assert_eq!(err.kind, oxccl::ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("OXCCL_SHM_PLACEMENT=\"sideways\""), "{err}");
}
