//! Algorithms as pure schedules: no I/O, no time, no payload.
//!
//! A [`Schedule`] is one rank's list of [`Step`]s for one operation. Every step is the same shape,
//! NCCL's primitives in one: take the message from `recv` (if any) and the local `src` slice (if
//! any), combine them with the reduction op, apply the avg division if `post`, then write the
//! value to the local `dst` slice and/or send it to `send`. So:
//!
//! | NCCL primitive        | recv | src | dst | send |
//! |-----------------------|------|-----|-----|------|
//! | send                  |      |  x  |     |  x   |
//! | recvReduceSend        |  x   |  x  |     |  x   |
//! | recvReduceCopySend    |  x   |  x  |  x  |  x   |
//! | recvCopySend          |  x   |     |  x  |  x   |
//! | recv                  |  x   |     |  x  |      |
//! | copy (local)          |      |  x  |  x  |      |
//!
//! Messages on a connection are FIFO; a step's message is at most `chunk` elements. The
//! simulator (`sim`) runs the schedules of all ranks together and checks them.
//! The cost of each algorithm is documented in `docs/algorithms.md` and checked by [`cost`].

use std::fmt;

pub mod cost;
mod fingerprint;
mod hierarchical;
mod ordered;
mod pairwise;
mod rabenseifner;
mod recdouble;
mod ring;
mod star;
mod table;
mod tree;

pub use fingerprint::{Fingerprint, COUNT_BITS};
pub use table::{Algo, Coll};
pub use tree::{binary_tree, TREE_LAG};

/// Which user buffer a slice refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The send buffer.
    Input,
    /// The receive buffer.
    Output,
}

/// A slice of a user buffer, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// Which buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
}

/// One step of a schedule (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Receive the step's message from this peer.
    pub recv: Option<usize>,
    /// Local input.
    pub src: Option<Slice>,
    /// Local output.
    pub dst: Option<Slice>,
    /// Send the value to this peer.
    pub send: Option<usize>,
    /// Elements.
    pub count: usize,
    /// Apply the avg division to the value.
    pub post: bool,
}

/// One rank's steps for one operation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schedule {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// The peers received from and sent to, derived from `steps` on first use (schedules are
    /// cached and reused, so this is computed once per schedule, not per call).
    peers: std::sync::OnceLock<(Vec<usize>, Vec<usize>)>,
    /// Per step, the slice its sent value stays in, unchanged to the end (see
    /// [`Schedule::stable_send`]), computed on first use.
    stable: std::sync::OnceLock<Vec<Option<Slice>>>,
    /// The peers whose first message to this rank depends on nothing they received (see
    /// [`Schedule::clean_peers`]), set once by whoever caches the schedule.
    clean: std::sync::OnceLock<Vec<usize>>,
    /// Per step that sends: whether the peer's step receiving it only copies it (see
    /// [`Schedule::peer_copies`]), set with `clean`.
    copied: std::sync::OnceLock<Vec<bool>>,
    /// Whether no step reads the output buffer (see [`Schedule::output_write_only`]).
    write_only: std::sync::OnceLock<bool>,
    /// Whether every message this rank sends is its input passed on (see
    /// [`Schedule::sends_only_input`]).
    input_sends: std::sync::OnceLock<bool>,
}

/// Inputs of a schedule generator.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Operation.
    pub coll: Coll,
    /// Ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Count, in NCCL's convention.
    pub count: usize,
    /// Root, or the peer of a point-to-point op.
    pub root: usize,
    /// Largest message, in elements (>= 1).
    pub chunk: usize,
    /// Whether the op divides by the rank count at the end (avg).
    pub avg: bool,
    /// Algorithm for the reducing collectives.
    pub algo: Algo,
}

fn block(count: usize, n: usize, b: usize) -> (usize, usize) {
    let s = (count as u128 * b as u128 / n as u128) as usize;
    let e = (count as u128 * (b as u128 + 1) / n as u128) as usize;
    (s, e)
}

struct Builder {
    steps: Vec<Step>,
}

impl Builder {
    fn step(&mut self, s: Step) {
        if s.count > 0 {
            self.steps.push(s);
        }
    }
}

fn inp(offset: usize) -> Option<Slice> {
    Some(Slice { buf: Buf::Input, offset })
}
fn out(offset: usize) -> Option<Slice> {
    Some(Slice { buf: Buf::Output, offset })
}

/// Split `[0, len)` into messages of at most `chunk` and call `f(offset, count)` for the k-th.
fn chunk_of(start: usize, end: usize, k: usize, chunk: usize) -> (usize, usize) {
    let s = (start + k * chunk).min(end);
    let e = (s + chunk).min(end);
    (s, e - s)
}

/// Build the schedule of `p.rank` on one host (no host layout: hierarchical is the ring).
pub fn build(p: &Params) -> Schedule {
    build_on(p, &[])
}

/// Build the schedule of `p.rank` for host layout `host_of` (`host_of[r]` = host index of rank r;
/// empty: one host): the one dispatch from (operation, algorithm) to a schedule file.
pub fn build_on(p: &Params, host_of: &[usize]) -> Schedule {
    assert!(p.nranks >= 1 && p.rank < p.nranks && p.chunk >= 1);
    let mut b = Builder { steps: Vec::new() };
    let (n, c) = (p.nranks, p.count);
    let one = n == 1;
    match (p.coll, p.algo) {
        (Coll::AllReduce, Algo::Hierarchical) if !host_of.is_empty() => return hierarchical::hierarchical(p, host_of),
        (_, Algo::Hierarchical) => return build_on(&Params { algo: Algo::Ring, ..*p }, &[]),
        (Coll::AllReduce, Algo::RecursiveDoubling) if !one => recdouble::recursive_doubling(&mut b, p),
        (Coll::AllReduce, Algo::Rabenseifner) if !one => rabenseifner::rabenseifner(&mut b, p),
        (Coll::AllReduce, Algo::Tree) if !one => tree::double_tree(&mut b, p),
        (Coll::AllReduce, Algo::Star) if !one => star::star(&mut b, p),
        (Coll::Broadcast, Algo::Star) if !one => star::broadcast(&mut b, p),
        (Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce, Algo::Ordered) if !one => ordered::ordered(&mut b, p),
        (Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce, _) if one => local(&mut b, 0, 0, c, p.avg),
        (Coll::AllReduce, _) => ring::all_reduce(&mut b, p),
        (Coll::ReduceScatter, _) => ring::reduce_scatter(&mut b, p),
        (Coll::AllGather, _) => ring::all_gather(&mut b, p),
        (Coll::Broadcast, _) => ring::broadcast(&mut b, p),
        (Coll::Reduce, _) => ring::reduce(&mut b, p),
        (Coll::AllToAll, _) => pairwise::all_to_all(&mut b, p),
        (Coll::Gather, _) => pairwise::gather(&mut b, p),
        (Coll::Scatter, _) => pairwise::scatter(&mut b, p),
        (Coll::Send, _) => pairwise::send(&mut b, p),
        (Coll::Recv, _) => pairwise::recv(&mut b, p),
    }
    Schedule::new(b.steps)
}

/// A local copy of `len` elements from input offset `src` to output offset `dst`.
fn local(b: &mut Builder, src: usize, dst: usize, len: usize, post: bool) {
    b.step(Step { recv: None, src: inp(src), dst: out(dst), send: None, count: len, post });
}

impl Schedule {
    /// The peers whose first message to this rank they send before receiving anything in the
    /// operation: its arrival tells when that peer entered it (straggler detection,
    /// `src/watch/lateness.rs`). Empty until [`Schedule::find_peer_facts`] ran.
    pub fn clean_peers(&self) -> &[usize] {
        self.clean.get().map_or(&[], Vec::as_slice)
    }

    /// Whether the peer receiving step `i`'s message only copies it (its step has no local
    /// source to combine it with and no avg division): over shared memory, sending it by
    /// reference saves a copy only then; a peer that combines it would first copy it into a
    /// slot anyway, with the kernel's slower copy. `true` when unknown
    /// ([`Schedule::find_peer_facts`] did not run).
    pub fn peer_copies(&self, i: usize) -> bool {
        self.copied.get().is_none_or(|c| c.get(i).copied().unwrap_or(true))
    }

    /// Work out [`Schedule::clean_peers`] and [`Schedule::peer_copies`] of rank `p.rank` from
    /// the peers' own schedules (built with `build_peer`, which gets `p` with another rank).
    pub fn find_peer_facts(&self, p: &Params, build_peer: &dyn Fn(&Params) -> Schedule) {
        let me = p.rank;
        if matches!(p.coll, Coll::Send | Coll::Recv) {
            self.clean.get_or_init(Vec::new);
            return;
        }
        let (rx, tx) = self.peers();
        let mut theirs: std::collections::HashMap<usize, Schedule> = Default::default();
        for &q in rx.iter().chain(tx) {
            theirs.entry(q).or_insert_with(|| build_peer(&Params { rank: q, ..*p }));
        }
        self.clean.get_or_init(|| {
            let clean = |q: &usize| {
                let steps = &theirs[q].steps;
                let first = steps.iter().position(|s| s.send == Some(me));
                first.is_some_and(|i| steps[..=i].iter().all(|s| s.recv.is_none()))
            };
            rx.iter().copied().filter(clean).collect()
        });
        self.copied.get_or_init(|| {
            // the k-th message to q is q's k-th receive from this rank (connections are FIFO)
            let mut receives: std::collections::HashMap<usize, std::vec::IntoIter<bool>> = theirs
                .iter()
                .map(|(&q, s)| {
                    let copies = s.steps.iter().filter(|s| s.recv == Some(me));
                    (q, copies.map(|s| s.src.is_none() && s.dst.is_some() && !s.post).collect::<Vec<_>>().into_iter())
                })
                .collect();
            let mut copy = |q: usize| receives.get_mut(&q).and_then(Iterator::next).unwrap_or(true);
            self.steps.iter().map(|s| s.send.is_some_and(&mut copy)).collect()
        });
    }

    /// Whether no step reads the output buffer, with separate input and output buffers: what
    /// this rank writes there is read again only after the operation, by the caller, so a large
    /// output can be written with streaming stores (computed once per cached schedule).
    pub fn output_write_only(&self) -> bool {
        *self.write_only.get_or_init(|| self.steps.iter().all(|s| s.src.is_none_or(|v| v.buf != Buf::Output)))
    }

    /// Whether every step that sends passes the rank's input on unchanged (nothing received,
    /// no post-processing): a broadcast's root, each rank of a 2-rank all-gather, a send; not a
    /// larger ring's all-gather, whose ranks also pass on what they received (computed once per
    /// cached schedule).
    pub fn sends_only_input(&self) -> bool {
        *self.input_sends.get_or_init(|| {
            let sends = || self.steps.iter().filter(|s| s.send.is_some());
            sends().next().is_some()
                && sends().all(|s| s.recv.is_none() && !s.post && s.src.is_some_and(|v| v.buf == Buf::Input))
        })
    }

    /// A schedule of these steps.
    pub fn new(steps: Vec<Step>) -> Schedule {
        Schedule {
            steps,
            peers: Default::default(),
            stable: Default::default(),
            clean: Default::default(),
            copied: Default::default(),
            write_only: Default::default(),
            input_sends: Default::default(),
        }
    }

    /// For step `i` that sends: the user-buffer slice that holds exactly the value it sends and
    /// that no later step writes, with separate input and output buffers (the input is never
    /// written). Such a value can be sent by reference (single copy): the receiver reads it
    /// from this rank's memory at any time until the operation ends. The value is the step's
    /// destination if it has one, else its source when nothing is combined into it (no receive,
    /// no avg division; a pre-multiplied sum's input reads also change the value, which the
    /// caller checks).
    pub fn stable_send(&self, i: usize) -> Option<Slice> {
        let stable = self.stable.get_or_init(|| {
            // one sweep from the end, keeping the output ranges written by later steps as
            // disjoint merged intervals (start -> end): O(steps log steps)
            let mut written: std::collections::BTreeMap<usize, usize> = Default::default();
            let mut out = vec![None; self.steps.len()];
            for (i, s) in self.steps.iter().enumerate().rev() {
                let value = match (s.dst, s.recv, s.src) {
                    (Some(d), _, _) => Some(d),
                    (None, None, Some(src)) if !s.post => Some(src),
                    _ => None,
                };
                if let (Some(v), Some(_)) = (value, s.send) {
                    let (a, b) = (v.offset, v.offset + s.count);
                    let hit = v.buf == Buf::Output && written.range(..b).next_back().is_some_and(|(_, &e)| e > a);
                    out[i] = (!hit).then_some(v);
                }
                if let Some(d) = s.dst.filter(|d| d.buf == Buf::Output && s.count > 0) {
                    let (mut a, mut b) = (d.offset, d.offset + s.count);
                    // merge with every interval that touches [a, b)
                    while let Some((&sa, &sb)) = written.range(..=b).next_back().filter(|(_, &e)| e >= a) {
                        written.remove(&sa);
                        (a, b) = (a.min(sa), b.max(sb));
                    }
                    written.insert(a, b);
                }
            }
            out
        });
        stable.get(i).copied().flatten()
    }

    /// Peers this schedule receives from and sends to (sorted, deduplicated). Computed once:
    /// change `steps` only before the first call.
    pub fn peers(&self) -> (&[usize], &[usize]) {
        let (rx, tx) = self.peers.get_or_init(|| {
            let mut rx: Vec<usize> = self.steps.iter().filter_map(|s| s.recv).collect();
            let mut tx: Vec<usize> = self.steps.iter().filter_map(|s| s.send).collect();
            rx.sort_unstable();
            rx.dedup();
            tx.sort_unstable();
            tx.dedup();
            (rx, tx)
        });
        (rx, tx)
    }

    /// Elements this rank sends in total.
    pub fn elements_sent(&self) -> usize {
        self.steps.iter().filter(|s| s.send.is_some()).map(|s| s.count).sum()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sl = |s: Option<Slice>| match s {
            Some(Slice { buf: Buf::Input, offset }) => format!("in[{offset}]"),
            Some(Slice { buf: Buf::Output, offset }) => format!("out[{offset}]"),
            None => "-".into(),
        };
        let pr = |p: Option<usize>| p.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        for s in &self.steps {
            writeln!(
                f,
                "recv {:>3}  src {:>10}  dst {:>10}  send {:>3}  n {}{}",
                pr(s.recv),
                sl(s.src),
                sl(s.dst),
                pr(s.send),
                s.count,
                if s.post { "  /n" } else { "" }
            )?;
        }
        Ok(())
    }
}

/// In-place layout of `coll` on `rank`, as NCCL defines it: both buffers are windows of one
/// allocation; returns (input offset, output offset, allocation length) in elements, or `None`
/// when the operation has no in-place form.
pub fn inplace_layout(
    coll: Coll,
    nranks: usize,
    rank: usize,
    count: usize,
    root: usize,
) -> Option<(usize, usize, usize)> {
    let (ni, no) = coll.buffer_counts(nranks, rank, count, root);
    match coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce => Some((0, 0, ni.max(no))),
        // sendbuff == recvbuff + rank * sendcount
        Coll::AllGather => Some((rank * count, 0, no)),
        // recvbuff == sendbuff + rank * recvcount
        Coll::ReduceScatter => Some((0, rank * count, ni)),
        // at the root: sendbuff == recvbuff + root * count (others have one buffer only)
        Coll::Gather => Some(if rank == root { (rank * count, 0, no) } else { (0, 0, ni) }),
        // at the root: recvbuff == sendbuff + root * count
        Coll::Scatter => Some(if rank == root { (0, rank * count, ni) } else { (0, 0, no) }),
        Coll::AllToAll | Coll::Send | Coll::Recv => None,
    }
}
