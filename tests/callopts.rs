//! Per-call options (`Communicator::run_with`, NCCL's `ncclCollConfig_t`): algorithm
//! restrictions, their refusal, mismatched selections across ranks, and the profiler tag in the
//! flight record. Threads as ranks over shm.

mod common;
use common::on_all;

use oxccl::schedule::Algo;
use oxccl::{AlgoSelection, CallOptions, Coll, Communicator, Config, DataType, ErrorKind, OpDesc, OpMem, ReduceOp};
use std::time::Duration;

fn desc(coll: Coll, count: usize) -> OpDesc {
    OpDesc { coll, dtype: DataType::I32, op: ReduceOp::Sum, count, root: 0 }
}

fn opts(algos: &[Algo], force: bool, tag: u64) -> CallOptions {
    CallOptions { algos: AlgoSelection::only(algos, force), profiler_tag: tag }
}

/// An all-reduce of `rank + i` with `o`, checked exactly.
fn all_reduce(c: &Communicator, o: CallOptions, n: usize) -> oxccl::Result<()> {
    let input: Vec<i32> = (0..n as i32).map(|i| i + c.rank() as i32).collect();
    let mut out = vec![0i32; n];
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let inb = bytes(&input);
    let mut outb = vec![0u8; n * 4];
    c.run_with(desc(Coll::AllReduce, n), o, OpMem::Split { input: &inb, output: &mut outb })?;
    for (i, ch) in outb.chunks(4).enumerate() {
        out[i] = i32::from_ne_bytes(ch.try_into().unwrap());
    }
    let k = c.size() as i32;
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, k * i as i32 + k * (k - 1) / 2, "rank {} element {i}", c.rank());
    }
    Ok(())
}

#[test]
fn every_restriction_is_exact_and_unsatisfiable_ones_are_refused_locally() {
    let cfg = Config { timeout: Duration::from_secs(60), chunk_bytes: 4096, ..Default::default() };
    let comms = Communicator::init_all_with_config(3, cfg).unwrap();
    on_all(&comms, |c| {
        for a in oxccl::config::TUNED {
            all_reduce(c, opts(&[a], true, 1), 3000).unwrap();
        }
        all_reduce(c, CallOptions::default(), 3000).unwrap();
        // tree has no all-gather here: refused when forced (nothing sent, the communicator stays
        // usable), the ring when not
        let inb = vec![1u8; 40];
        let mut outb = vec![0u8; 120];
        let e = c
            .run_with(
                desc(Coll::AllGather, 10),
                opts(&[Algo::Tree], true, 0),
                OpMem::Split { input: &inb, output: &mut outb },
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(e.to_string().contains("leaves no algorithm for allgather"), "{e}");
        c.run_with(
            desc(Coll::AllGather, 10),
            opts(&[Algo::Tree], false, 0),
            OpMem::Split { input: &inb, output: &mut outb },
        )
        .unwrap();
        assert!(outb.iter().all(|&b| b == 1));
        all_reduce(c, CallOptions::default(), 10).unwrap();
    });
}

#[test]
fn different_selections_fail_as_a_mismatch_and_every_call_is_recorded_once_with_its_tag() {
    let dir = std::env::temp_dir().join(format!("oxccl-callopts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = Config { timeout: Duration::from_secs(30), dump_dir: Some(dir.clone()), ..Default::default() };
    let comms = Communicator::init_all_with_config(2, cfg).unwrap();
    on_all(&comms, |c| {
        // before it: small calls that complete in their quick polls, and ones that wait in
        // the engine for a late peer (rank 1 calls 30 ms late): each recorded once, done
        for i in 0..4u64 {
            if i % 2 == 1 && c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(30));
            }
            all_reduce(c, opts(&[], false, 10 + i), 1).unwrap();
        }
        let mine =
            if c.rank() == 0 { opts(&[Algo::Ring], true, 99) } else { opts(&[Algo::Ring, Algo::Tree], true, 99) };
        let e = all_reduce(c, mine, 1000).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "rank {}: {e}", c.rank());
        let m = e.to_string();
        assert!(m.contains("mismatched") && m.contains("algSelection=ring,tree"), "rank {}: {m}", c.rank());
    });
    for r in 0..2 {
        let f = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(&format!("rank{r}.json")))
            .expect("flight record");
        let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let ops = j["ops"].as_array().unwrap();
        let last = ops.last().unwrap().clone();
        assert_eq!(last["tag"], 99, "rank {r}: {last}");
        assert_eq!(last["state"], "failed", "rank {r}: {last}");
        assert!(last["op"].as_str().unwrap().contains("algSelection"), "{last}");
        // the four before it, in order, each once
        let before: Vec<_> = ops.iter().filter(|o| o["tag"] != 99).collect();
        assert_eq!(before.len(), 4, "rank {r}: {ops:?}");
        for (i, o) in before.iter().enumerate() {
            assert_eq!(o["tag"], 10 + i as u64, "rank {r}: {o}");
            assert_eq!(o["seq"], i as u64, "rank {r}: {o}");
            assert_eq!(o["state"], "done", "rank {r}: {o}");
            assert!(o["end_us"].as_u64().unwrap() >= o["start_us"].as_u64().unwrap(), "rank {r}: {o}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selections_parse_per_collective() {
    let s = AlgoSelection::parse("allreduce:tree;allgather:ring", Coll::AllReduce, true).unwrap();
    assert!(s.allows(Algo::Tree) && !s.allows(Algo::Ring));
    assert!(!AlgoSelection::parse("reducescatter:ring", Coll::AllReduce, true).unwrap().is_restricted());
}
