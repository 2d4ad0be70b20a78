//! Over the RDMA protocol, large messages of stable values are written from user memory (the
//! registration cache) rather than copied into a staging slot, to receivers that combine as well
//! (`SendConn::borrow_for_combining`): results stay exact, and it is used. A process of its own,
//! so that no other test moves the single-copy counters meanwhile. Skipped where libfabric does
//! not open, unless `OXCCL_REQUIRE_OFI` is set.
#![cfg(feature = "rdma")]

mod common;

use oxccl::exec::single_copy_counts;
use oxccl::{Coll, Config, DataType, ReduceOp};
use std::time::Duration;

fn ofi(zero_copy: bool) -> Config {
    let mut cf = Config {
        timeout: Duration::from_secs(60),
        chunk_bytes: 64 << 10,
        shm_disable: true,
        socket_ifname: Some("lo".into()),
        net: Some("ofi".into()),
        ofi_provider: "tcp;ofi_rxm".into(),
        ..Default::default()
    };
    // libfabric's TCP emulation is a software provider: user memory is off unless asked for
    cf.rdma.zero_copy_min_op = Some(if zero_copy { 4096 } else { usize::MAX });
    cf
}

#[test]
fn rdma_sends_from_user_memory_to_receivers_that_combine() {
    for zero_copy in [true, false] {
        let Some(comms) = common::init_ofi_or_skip(3, ofi(zero_copy)) else { return };
        let before = single_copy_counts();
        // reduce-scatter: every receiver combines, so only `borrow_for_combining` sends by
        // reference (a ring's first step sends the input, a stable value)
        common::on_all(&comms, |c| {
            for (dt, op) in [(DataType::F32, ReduceOp::Sum), (DataType::BF16, ReduceOp::Avg)] {
                let wrong = common::run_and_count_wrong(c, Coll::ReduceScatter, dt, op, 100_001, 0, false, 2);
                assert_eq!(wrong, 0, "rank {}: {dt:?} {op:?} zero copy {zero_copy}", c.rank());
            }
        });
        let after = single_copy_counts();
        let (sent, direct) = (after.0 - before.0, after.1 - before.1);
        if zero_copy {
            // a receiver over RDMA never reads straight from the sender's memory: every message
            // sent by reference went through its ring to be combined
            assert!(sent > 0, "nothing was sent from user memory: {before:?} -> {after:?}");
            assert_eq!(direct, 0, "{before:?} -> {after:?}");
        } else {
            assert_eq!((sent, direct), (0, 0), "sent by reference with zero copy off");
        }
        // and all-reduce, which sends by reference in both phases, stays exact
        common::on_all(&comms, |c| {
            let wrong =
                common::run_and_count_wrong(c, Coll::AllReduce, DataType::F32, ReduceOp::Sum, 300_001, 0, false, 2);
            assert_eq!(wrong, 0, "rank {}: all-reduce, zero copy {zero_copy}", c.rank());
        });
    }
}
