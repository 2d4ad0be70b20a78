//! Watching a running job from inside: the straggler named from arrival times, the counters,
//! and the Prometheus endpoint scraped over HTTP (docs/watching.md).

use oxccl::{Coll, Communicator, Config, ReduceOp};
use std::time::Duration;

fn comms(n: usize, window: u64) -> Vec<Communicator> {
    let mut cfg = Config::from_env();
    cfg.watch.straggler_window = window;
    cfg.watch.metrics_port = Some(0);
    Communicator::init_all_with_config(n, cfg).unwrap()
}

/// 4 ranks, rank `late` sleeps 5 ms before each all-reduce of `count` floats: every rank's own
/// view names it or nobody, at least one names it, and every rank's [`Communicator::straggler`]
/// (all views added up through the store) names it.
fn straggler_case(count: usize, late: usize) {
    const OPS: usize = 40;
    let cs = comms(4, OPS as u64);
    let named: Vec<Option<oxccl::watch::Straggler>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let send: Vec<f32> = vec![c.rank() as f32; count];
                    let mut recv = vec![0f32; count];
                    for _ in 0..OPS {
                        if c.rank() == late {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                        assert!(recv.iter().all(|&x| x == 6.0));
                    }
                    assert_eq!(c.completed_totals(Coll::AllReduce), (OPS as u64, (OPS * count * 4) as u64));
                    // the others' views reach the store in the background
                    let t = std::time::Instant::now();
                    let mut job = c.straggler();
                    while job.as_ref().map(|s| s.rank) != Some(late) && t.elapsed() < Duration::from_secs(5) {
                        std::thread::sleep(Duration::from_millis(20));
                        job = c.straggler();
                    }
                    assert_eq!(job.as_ref().map(|s| s.rank), Some(late), "rank {}: {job:?}", c.rank());
                    c.lateness().straggler()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, s) in named.iter().enumerate() {
        if let Some(s) = s {
            assert_eq!(s.rank, late, "rank {r} named {s}");
            assert!(s.median_lag >= Duration::from_millis(3), "{s}");
            assert!(s.to_string().starts_with(&format!("rank {late} was last to arrive in ")), "{s}");
        }
    }
    assert!(named.iter().any(Option::is_some), "nobody named rank {late}: {named:?}");
}

#[test]
fn a_rank_sleeping_before_each_small_all_reduce_is_named_and_no_other() {
    straggler_case(8, 2); // recursive doubling: its first partner times it
}

#[test]
fn a_rank_sleeping_before_each_large_all_reduce_is_named_and_no_other() {
    straggler_case(64 << 10, 1); // ring: its right neighbour times it
}

#[test]
fn ranks_on_time_name_nobody() {
    // (2 ranks: more threads than cores would make ranks late for real)
    let cs = comms(2, 50);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let mut x = vec![1f32; 8];
                for _ in 0..50 {
                    c.all_reduce_inplace(&mut x, ReduceOp::Max).unwrap();
                }
                assert_eq!(c.lateness().straggler(), None, "rank {}: {:?}", c.rank(), c.lateness());
                assert_eq!(c.straggler(), None, "rank {}", c.rank());
            });
        }
    });
}

#[test]
fn the_metrics_endpoint_serves_prometheus_text() {
    let cs = comms(2, 1000);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let mut x = vec![1u8; 1000];
                for _ in 0..7 {
                    c.all_reduce_inplace(&mut x, ReduceOp::Max).unwrap();
                }
            });
        }
    });
    let addr = oxccl::watch::metrics_endpoint().expect("endpoint started");
    assert!(addr.ip().is_loopback(), "binds loopback unless told otherwise: {addr}");
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    for c in &cs {
        let line = format!(
            "oxccl_operations_total{{comm=\"{:016x}\",rank=\"{}\",nranks=\"2\",op=\"allreduce\"}} 7",
            c.comm_id(),
            c.rank()
        );
        assert!(reply.lines().any(|l| l == line), "{line} missing:\n{reply}");
    }
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
}
