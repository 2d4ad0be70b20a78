//! Depth 1: schedules alone, through the simulator (no transport, no threads).

use oxccl::exact::premul_two;
use oxccl::schedule::{build, cost, Algo, Coll, Params};
use oxccl::sim::{check_numeric, check_symbolic, schedules, Case};
use oxccl::{DataType, ReduceOp};

const COLLS: [Coll; 8] = Coll::COLLECTIVES;

fn counts(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 2, 7, 13, 31, n.saturating_sub(1), n, n + 1, 3 * n + 2, 257];
    v.sort_unstable();
    v.dedup();
    v
}

fn roots(coll: Coll, n: usize) -> Vec<usize> {
    if coll.rooted() {
        (0..n).collect()
    } else {
        vec![0]
    }
}

fn inplace_ok(coll: Coll) -> bool {
    oxccl::schedule::inplace_layout(coll, 2, 0, 1, 0).is_some()
}

#[test]
fn symbolic_every_rank_count_size_and_root() {
    let mut cases = 0;
    for n in (1..=16).chain([64]) {
        for coll in COLLS {
            for count in counts(n) {
                for root in roots(coll, n) {
                    for chunk in [1, 3, 64] {
                        for inplace in [false, true] {
                            if inplace && !inplace_ok(coll) {
                                continue;
                            }
                            if n == 64 && (chunk == 1 || root % 13 != 0) {
                                continue; // keep the 64-rank sweep short
                            }
                            let case = Case {
                                coll,
                                nranks: n,
                                count,
                                root,
                                chunk,
                                inplace,
                                avg: coll.reduces() && count % 2 == 1,
                                depth: 2,
                                algo: Algo::Ring,
                                hosts: 1,
                            };
                            if let Err(e) = check_symbolic(&case) {
                                panic!("{case:?}: {e}");
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 10_000, "{cases}");
}

#[test]
fn symbolic_large_counts() {
    for n in [2, 3, 7, 16] {
        for coll in COLLS {
            let count =
                if matches!(coll, Coll::AllReduce | Coll::Broadcast | Coll::Reduce) { 1_000_003 } else { 65_537 };
            let case = Case {
                coll,
                nranks: n,
                count,
                root: n - 1,
                chunk: 65_536,
                inplace: false,
                avg: false,
                depth: 2,
                algo: Algo::Ring,
                hosts: 1,
            };
            if let Err(e) = check_symbolic(&case) {
                panic!("{case:?}: {e}");
            }
        }
    }
}

#[test]
fn numeric_every_type_and_op_through_the_executor_step() {
    for n in [1, 2, 3, 4, 5, 8] {
        for coll in COLLS {
            for dt in DataType::ALL {
                for op in oxccl::exact::ops_for(coll, dt) {
                    for (count, chunk) in [(0, 4), (1, 1), (n * 5 + 3, 4), (97, 16)] {
                        for inplace in [false, true] {
                            if inplace && !inplace_ok(coll) {
                                continue;
                            }
                            let root = n / 2;
                            let case = Case {
                                coll,
                                nranks: n,
                                count,
                                root,
                                chunk,
                                inplace,
                                avg: op == ReduceOp::Avg,
                                depth: 2,
                                algo: Algo::Ring,
                                hosts: 1,
                            };
                            if let Err(e) = check_numeric(&case, dt, op) {
                                panic!("{case:?} {dt:?} {op:?}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn broken_schedules_are_caught() {
    let case = Case {
        coll: Coll::AllReduce,
        nranks: 4,
        count: 16,
        root: 0,
        chunk: 2,
        inplace: false,
        avg: false,
        depth: 2,
        algo: Algo::Ring,
        hosts: 1,
    };
    // drop a step: unreceived messages or deadlock
    let mut s = schedules(&case);
    s[1].steps.remove(3);
    assert!(oxccl::sim::check_symbolic_with(&case, &s).is_err());
    // reduce twice: double counting
    let mut s = schedules(&case);
    let st = s[2].steps.iter_mut().find(|x| x.recv.is_some() && x.src.is_none()).unwrap();
    st.src = Some(oxccl::schedule::Slice { buf: oxccl::schedule::Buf::Input, offset: 0 });
    assert!(oxccl::sim::check_symbolic_with(&case, &s).is_err());
    // misroute: send to the wrong peer
    let mut s = schedules(&case);
    s[0].steps[0].send = Some(2);
    assert!(oxccl::sim::check_symbolic_with(&case, &s).is_err());
    // wrong size
    let mut s = schedules(&case);
    s[3].steps[1].count -= 1;
    assert!(oxccl::sim::check_symbolic_with(&case, &s).is_err());
}

/// Tree and Rabenseifner at larger and awkward rank counts (one above and below powers of two).
#[test]
fn tree_and_rabenseifner_at_scale() {
    for n in [31, 32, 33, 63, 64, 100] {
        for algo in [Algo::Tree, Algo::Rabenseifner] {
            for (count, chunk) in [(1000, 7), (5, 2), (n * 64 + 3, 64)] {
                let case = Case {
                    coll: Coll::AllReduce,
                    nranks: n,
                    count,
                    root: 0,
                    chunk,
                    inplace: count % 2 == 0,
                    avg: count % 2 == 1,
                    depth: 2,
                    algo,
                    hosts: 1,
                };
                if let Err(e) = check_symbolic(&case) {
                    panic!("{case:?}: {e}");
                }
            }
        }
    }
}

/// docs/algorithms.md states these costs; the schedules must match them exactly.
#[test]
fn costs_match_the_documented_formulas() {
    let doc = include_str!("../docs/algorithms.md");
    for needle in ["2S - |B_r| - |B_(r+1)|", "(n-1)·c", "2(n-1)", "S - |B'_r|", "2(n-1)·S in all", "(n-1)·S at rank 0"]
    {
        assert!(doc.contains(needle), "docs/algorithms.md lost the formula {needle:?}");
    }
    for n in 1..=12 {
        for coll in COLLS {
            for count in [0, 1, 5, 64, 1000] {
                for root in roots(coll, n) {
                    for rank in 0..n {
                        let s = build(&Params {
                            coll,
                            nranks: n,
                            rank,
                            count,
                            root,
                            chunk: 7,
                            avg: false,
                            algo: Algo::Ring,
                        });
                        assert_eq!(
                            s.elements_sent(),
                            cost::elements_sent(coll, n, rank, count, root),
                            "{coll:?} n={n} rank={rank} count={count} root={root}"
                        );
                    }
                }
            }
        }
        for count in [0, 1, 5, 64, 1000] {
            let sched = |algo, rank| {
                build(&Params { coll: Coll::AllReduce, nranks: n, rank, count, root: 0, chunk: 7, avg: false, algo })
            };
            let mut tree_total = 0;
            for rank in 0..n {
                assert_eq!(
                    sched(Algo::Rabenseifner, rank).elements_sent(),
                    cost::rabenseifner_elements_sent(n, rank, count),
                    "rabenseifner n={n} rank={rank} count={count}"
                );
                tree_total += sched(Algo::Tree, rank).elements_sent();
                assert_eq!(
                    sched(Algo::Star, rank).elements_sent(),
                    cost::star_elements_sent(n, rank, count),
                    "star n={n} rank={rank} count={count}"
                );
            }
            assert_eq!(tree_total, cost::tree_total_elements_sent(n, count), "tree n={n} count={count}");
        }
        if n > 1 {
            // one chunk round of allreduce: 2(n-1) sends per rank
            let s = build(&Params {
                algo: Algo::Ring,
                coll: Coll::AllReduce,
                nranks: n,
                rank: 0,
                count: n * 7,
                root: 0,
                chunk: 7,
                avg: false,
            });
            assert_eq!(s.steps.iter().filter(|x| x.send.is_some()).count(), cost::allreduce_sends_per_round(n));
        }
    }
}

#[test]
fn point_to_point_pairs() {
    for count in [0, 1, 100] {
        let tx = build(&Params {
            coll: Coll::Send,
            nranks: 2,
            rank: 0,
            count,
            root: 1,
            chunk: 8,
            avg: false,
            algo: Algo::Ring,
        });
        let rx = build(&Params {
            coll: Coll::Recv,
            nranks: 2,
            rank: 1,
            count,
            root: 0,
            chunk: 8,
            avg: false,
            algo: Algo::Ring,
        });
        assert_eq!(tx.steps.len(), rx.steps.len());
        assert_eq!(tx.elements_sent(), count);
        for (a, b) in tx.steps.iter().zip(&rx.steps) {
            assert_eq!(a.count, b.count);
        }
    }
}

#[test]
fn snapshot_ring_allreduce_4_ranks() {
    let s = build(&Params {
        coll: Coll::AllReduce,
        nranks: 4,
        rank: 1,
        count: 8,
        root: 0,
        chunk: 2,
        avg: true,
        algo: Algo::Ring,
    });
    let want = "\
recv   -  src      in[0]  dst          -  send   2  n 2
recv   0  src      in[6]  dst          -  send   2  n 2
recv   0  src      in[4]  dst          -  send   2  n 2
recv   0  src      in[2]  dst     out[2]  send   2  n 2  /n
recv   0  src          -  dst     out[0]  send   2  n 2
recv   0  src          -  dst     out[6]  send   2  n 2
recv   0  src          -  dst     out[4]  send   -  n 2
";
    assert_eq!(s.to_string(), want);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn any_coll() -> impl Strategy<Value = Coll> {
        prop::sample::select(COLLS.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Random operations through the executor's step function equal the serial reference,
        /// bit for bit.
        #[test]
        fn random_ops_match_the_serial_reference(
            coll in any_coll(),
            n in 1usize..=12,
            count in 0usize..300,
            root_seed in 0usize..1000,
            chunk in 1usize..50,
            dt in prop::sample::select(DataType::ALL.to_vec()),
            op_i in 0usize..6,
            inplace in any::<bool>(),
            depth in 2usize..5,
            algo in prop::sample::select(Algo::ALL.to_vec()),
        ) {
            let op = if coll.reduces() {
                if op_i == 5 { premul_two(dt) } else { ReduceOp::BASIC[op_i] }
            } else {
                ReduceOp::Sum
            };
            let inplace = inplace && inplace_ok(coll);
            let case = Case { coll, nranks: n, count, root: root_seed % n, chunk, inplace, avg: op == ReduceOp::Avg, depth, algo, hosts: 1 + root_seed % n };
            prop_assert!(check_symbolic(&case).is_ok(), "{:?}", check_symbolic(&case));
            let r = check_numeric(&case, dt, op);
            prop_assert!(r.is_ok(), "{case:?} {dt:?} {op:?}: {r:?}");
        }
    }
}

/// Recursive doubling and the ordered (deterministic) schedules, for every rank count 1..=16,
/// awkward counts, every root, tiny chunks, both layouts; numerically for every type and op.
#[test]
fn other_algorithms_in_the_simulator() {
    for algo in [Algo::RecursiveDoubling, Algo::Ordered, Algo::Tree, Algo::Rabenseifner, Algo::Star] {
        let colls: &[Coll] = match algo {
            Algo::Ordered => &[Coll::AllReduce, Coll::ReduceScatter, Coll::Reduce],
            Algo::Star => &[Coll::AllReduce, Coll::Broadcast],
            _ => &[Coll::AllReduce],
        };
        for n in 1..=16 {
            for &coll in colls {
                for count in counts(n) {
                    for root in roots(coll, n) {
                        for chunk in [1, 3, 64] {
                            for inplace in [false, true] {
                                let case = Case {
                                    coll,
                                    nranks: n,
                                    count,
                                    root,
                                    chunk,
                                    inplace,
                                    avg: count % 2 == 1,
                                    depth: 2,
                                    algo,
                                    hosts: 1,
                                };
                                if let Err(e) = check_symbolic(&case) {
                                    panic!("{case:?}: {e}");
                                }
                            }
                        }
                    }
                }
            }
        }
        for n in [1, 2, 3, 5, 8] {
            for &coll in colls {
                for dt in DataType::ALL {
                    let ops = if coll.reduces() { oxccl::exact::all_ops(dt) } else { vec![ReduceOp::Sum] };
                    for op in ops {
                        for inplace in [false, true] {
                            let case = Case {
                                coll,
                                nranks: n,
                                count: 4 * n + 3,
                                root: n - 1,
                                chunk: 5,
                                inplace,
                                avg: op == ReduceOp::Avg,
                                depth: 2,
                                algo,
                                hosts: 1,
                            };
                            if let Err(e) = check_numeric(&case, dt, op) {
                                panic!("{case:?} {dt:?} {op:?}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Hierarchical all-reduce over every host layout (hosts 1..=n) for 1..=12 ranks.
#[test]
fn hierarchical_in_the_simulator() {
    for n in 1..=12 {
        for hosts in 1..=n {
            for count in [0, 1, n, 3 * n + 1, 97] {
                for inplace in [false, true] {
                    let case = Case {
                        coll: Coll::AllReduce,
                        nranks: n,
                        count,
                        root: 0,
                        chunk: 4,
                        inplace,
                        avg: count % 2 == 1,
                        depth: 2,
                        algo: Algo::Hierarchical,
                        hosts,
                    };
                    if let Err(e) = check_symbolic(&case) {
                        panic!("{case:?}: {e}");
                    }
                }
            }
            for dt in [DataType::F32, DataType::BF16, DataType::I8, DataType::F8E5M2] {
                for op in oxccl::exact::all_ops(dt) {
                    let case = Case {
                        coll: Coll::AllReduce,
                        nranks: n,
                        count: 2 * n + 5,
                        root: 0,
                        chunk: 3,
                        inplace: n % 2 == 0,
                        avg: op == ReduceOp::Avg,
                        depth: 2,
                        algo: Algo::Hierarchical,
                        hosts,
                    };
                    if let Err(e) = check_numeric(&case, dt, op) {
                        panic!("{case:?} {dt:?} {op:?}: {e}");
                    }
                }
            }
        }
    }
}

#[test]
fn fingerprints_decode_to_the_call() {
    use oxccl::schedule::Fingerprint;
    let restricted = oxccl::select::AlgoSelection::only(&[Algo::Ring, Algo::Tree], true).wire();
    for algo in Algo::ALL {
        for root in [0, 1, 5, 100_000] {
            for sel in [0, restricted] {
                let (coll, dtype, op) = (Coll::Broadcast, DataType::BF16, ReduceOp::Max);
                let fp = Fingerprint { coll, dtype, op, root, count: 77, algo, sel };
                let wire = Fingerprint::describe_wire(fp.count_word(), fp.call_word());
                assert_eq!(wire, fp.to_string(), "{algo:?} root {root} sel {sel}");
            }
        }
    }
}

/// `Schedule::stable_send` (one sweep with merged intervals) against its definition, checked
/// pairwise: a sent value is stable when it is the step's destination (or its untouched source)
/// and no later step writes an overlapping output range.
#[test]
fn stable_sends_match_their_definition() {
    use oxccl::schedule::{Buf, Slice};
    let oracle = |s: &oxccl::schedule::Schedule, i: usize| -> Option<Slice> {
        let st = &s.steps[i];
        st.send?;
        let v = match (st.dst, st.recv, st.src) {
            (Some(d), _, _) => d,
            (None, None, Some(src)) if !st.post => src,
            _ => return None,
        };
        let overlaps = |d: Slice, n: usize| d.buf == v.buf && d.offset < v.offset + st.count && v.offset < d.offset + n;
        let written =
            v.buf == Buf::Output && s.steps[i + 1..].iter().any(|t| t.dst.is_some_and(|d| overlaps(d, t.count)));
        (!written).then_some(v)
    };
    let mut checked = 0;
    for algo in Algo::ALL {
        for coll in COLLS {
            for n in [1, 2, 3, 5, 8] {
                for (count, chunk) in [(1, 1), (37, 4), (200, 64)] {
                    for rank in 0..n {
                        let root = n - 1;
                        let s = build(&Params { coll, nranks: n, rank, count, root, chunk, avg: count % 2 == 1, algo });
                        for i in 0..s.steps.len() {
                            assert_eq!(
                                s.stable_send(i),
                                oracle(&s, i),
                                "{algo:?} {coll:?} n={n} count={count} rank={rank} step {i}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

/// `Schedule::peer_copies` against the peers' schedules matched message by message, and two
/// known shapes: the ring all-reduce's peers combine in its first half and copy in its second;
/// recursive doubling's peers always combine.
#[test]
fn peer_copies_match_the_receiving_steps() {
    let mut checked = 0;
    for algo in Algo::ALL {
        for coll in COLLS {
            for n in [2, 3, 5, 8] {
                let p = |rank| Params { coll, nranks: n, rank, count: 37, root: n - 1, chunk: 4, avg: false, algo };
                let all: Vec<_> = (0..n).map(|r| build(&p(r))).collect();
                for (me, s) in all.iter().enumerate() {
                    s.find_peer_facts(&p(me), &|q| build(q));
                    let mut sent = vec![0; n];
                    for (i, st) in s.steps.iter().enumerate() {
                        let Some(q) = st.send else { continue };
                        let theirs = all[q].steps.iter().filter(|t| t.recv == Some(me)).nth(sent[q]).unwrap();
                        sent[q] += 1;
                        let copies = theirs.src.is_none() && theirs.dst.is_some() && !theirs.post;
                        assert_eq!(s.peer_copies(i), copies, "{algo:?} {coll:?} n={n} rank={me} step {i}");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1_000, "{checked}");
    let ring = |rank| Params {
        coll: Coll::AllReduce,
        nranks: 4,
        rank,
        count: 4,
        root: 0,
        chunk: 1,
        avg: false,
        algo: Algo::Ring,
    };
    let s = build(&ring(0));
    s.find_peer_facts(&ring(0), &|q| build(q));
    let sends: Vec<bool> =
        (0..s.steps.len()).filter(|&i| s.steps[i].send.is_some()).map(|i| s.peer_copies(i)).collect();
    assert_eq!(sends, [false, false, false, true, true, true], "{:?}", s.steps);
    let rd = |rank| Params { algo: Algo::RecursiveDoubling, ..ring(rank) };
    let s = build(&rd(0));
    s.find_peer_facts(&rd(0), &|q| build(q));
    assert!((0..s.steps.len()).all(|i| !s.peer_copies(i)));
}

/// `Schedule::sends_only_input` (which ranks may send their input by reference in smaller
/// operations): every send of a broadcast's root and of each rank of a 2-rank all-gather is its
/// input; a larger ring's all-gather also relays what it received; a rank that sends nothing,
/// or the reductions, never.
#[test]
fn which_ranks_only_send_their_input() {
    let p =
        |coll, nranks, rank| Params { coll, nranks, rank, count: 37, root: 1, chunk: 4, avg: false, algo: Algo::Ring };
    let only = |coll, n, rank| build(&p(coll, n, rank)).sends_only_input();
    assert!(only(Coll::AllGather, 2, 0) && only(Coll::AllGather, 2, 1));
    assert!(!only(Coll::AllGather, 3, 0) && !only(Coll::AllGather, 4, 2));
    assert!(only(Coll::Broadcast, 4, 1), "the root");
    assert!(!only(Coll::Broadcast, 4, 2), "a relay in the chain");
    assert!(!only(Coll::Broadcast, 4, 0), "the chain's last rank sends nothing");
    assert!(only(Coll::AllToAll, 3, 0) && only(Coll::Scatter, 3, 1));
    assert!(!only(Coll::AllReduce, 2, 0) && !only(Coll::ReduceScatter, 3, 0));
}
