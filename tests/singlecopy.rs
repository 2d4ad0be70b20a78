//! Single copy between ranks of one process (Linux CMA, `process_vm_readv` on the process's own
//! memory): exact, and used where it should be. A test binary of its own, so that no other test
//! moves the process's single-copy counters meanwhile.

mod common;
use common::on_all;

use oxccl::{Coll, Communicator, Config, DataType, ReduceOp};
use std::time::Duration;

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
/// turning it off sends nothing by reference.
#[test]
fn single_copy_by_reference_is_exact_and_used() {
    use oxccl::exec::single_copy_counts;
    for cma in [true, false] {
        let mut cf = cfg();
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
