//! Over TCP, the rest of a large message that a step only copies is read from the socket
//! straight into its destination (`RecvConn::take_into`), not through the lane's buffer:
//! results stay exact and it is used; on encrypted lanes (nothing of a frame before its tag
//! verified) it never is. A test binary of its own, so that no other test moves the process's
//! single-copy counters meanwhile.

mod common;

use oxccl::exec::single_copy_counts;
use oxccl::{Coll, Communicator, Config, DataType, Encryption, ReduceOp};
use std::time::Duration;

#[test]
fn tcp_reads_large_copied_messages_straight_into_the_output() {
    for enc in [Encryption::Off, Encryption::Psk(vec![0x3c; 32])] {
        let cf = Config {
            timeout: Duration::from_secs(60),
            shm_disable: true,
            socket_ifname: Some("lo".into()),
            encryption: enc.clone(),
            ..Default::default()
        };
        let comms = Communicator::init_all_with_config(3, cf).unwrap();
        let before = single_copy_counts();
        common::on_all(&comms, |c| {
            // counts whose messages are larger than a header's first read, and a remainder
            for (coll, count) in [(Coll::AllGather, 300_001), (Coll::Broadcast, 700_003), (Coll::AllReduce, 900_001)] {
                for inplace in [false, true] {
                    let wrong =
                        common::run_and_count_wrong(c, coll, DataType::F32, ReduceOp::Sum, count, 1, inplace, 5);
                    assert_eq!(wrong, 0, "rank {}: {coll:?} count {count} in place {inplace} {enc:?}", c.rank());
                }
            }
        });
        let direct = single_copy_counts().1 - before.1;
        match enc {
            Encryption::Off => assert!(direct > 0, "no message was read straight into its destination"),
            _ => assert_eq!(direct, 0, "an encrypted lane handed out a frame before its tag"),
        }
    }
}
