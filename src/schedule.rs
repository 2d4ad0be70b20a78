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

use crate::types::{DataType, ReduceOp};
use std::fmt;

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
}

/// The operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coll {
    /// AllReduce
    AllReduce,
    /// AllGather
    AllGather,
    /// ReduceScatter
    ReduceScatter,
    /// Broadcast
    Broadcast,
    /// Reduce
    Reduce,
    /// AllToAll
    AllToAll,
    /// Gather
    Gather,
    /// Scatter
    Scatter,
    /// Send (point to point)
    Send,
    /// Recv (point to point)
    Recv,
}

impl Coll {
    /// The collectives (every operation but send and recv).
    pub const COLLECTIVES: [Coll; 8] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
    ];

    /// Name used in messages and tables.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reducescatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Send => "send",
            Coll::Recv => "recv",
        }
    }
    fn code(self) -> u32 {
        match self {
            Coll::AllReduce => 1,
            Coll::AllGather => 2,
            Coll::ReduceScatter => 3,
            Coll::Broadcast => 4,
            Coll::Reduce => 5,
            Coll::AllToAll => 6,
            Coll::Gather => 7,
            Coll::Scatter => 8,
            // both sides of a point-to-point transfer carry the same code
            Coll::Send | Coll::Recv => 9,
        }
    }
    /// Whether it combines values with a reduction op.
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    /// Whether `root` is meaningful (`peer` for point to point).
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter | Coll::Send | Coll::Recv)
    }
    /// Elements of (input, output) buffers on `rank`, in NCCL's count convention.
    pub fn buffer_counts(self, nranks: usize, rank: usize, count: usize, root: usize) -> (usize, usize) {
        let is_root = rank == root;
        match self {
            Coll::AllReduce | Coll::Broadcast => (count, count),
            Coll::Reduce => (count, if is_root { count } else { 0 }),
            Coll::AllGather => (count, nranks * count),
            Coll::ReduceScatter => (nranks * count, count),
            Coll::AllToAll => (nranks * count, nranks * count),
            Coll::Gather => (count, if is_root { nranks * count } else { 0 }),
            Coll::Scatter => (if is_root { nranks * count } else { 0 }, count),
            Coll::Send => (count, 0),
            Coll::Recv => (0, count),
        }
    }
}

/// What identifies an operation across ranks: it travels in every frame header (`count` and the
/// packed `call` word) so a mismatch is caught where the data arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Operation.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (Sum for operations that do not reduce).
    pub op: ReduceOp,
    /// Root (peer for point to point; 0 when unused).
    pub root: usize,
    /// Count, in NCCL's convention.
    pub count: usize,
    /// Algorithm (ranks that chose differently would exchange differently shaped messages).
    pub algo: Algo,
    /// The call's algorithm selection ([`crate::select::AlgoSelection::wire`]; 0: automatic).
    pub sel: u8,
}

/// Element counts fit below this bit of the header's `count` word; the byte above carries the
/// call's algorithm selection.
pub const COUNT_BITS: u32 = 56;

impl Fingerprint {
    /// The header's `count` word: the element count, and the selection in the top byte.
    pub fn count_word(&self) -> u64 {
        self.count as u64 | (self.sel as u64) << COUNT_BITS
    }

    /// The `call` word: operation, type, reduce op and root packed in 32 bits.
    pub fn call_word(&self) -> u32 {
        let root = if matches!(self.coll, Coll::Send | Coll::Recv) { 0 } else { (self.root as u32) & 0x3FFFF };
        let root = root & 0x1FFFF;
        self.coll.code() | (self.dtype as u32) << 4 | self.op.code() << 8 | self.algo.code() << 12 | root << 15
    }

    /// Describe a peer's (count, call) pair for messages.
    pub fn describe_wire(count_word: u64, call: u32) -> String {
        let count = count_word & ((1u64 << COUNT_BITS) - 1);
        let sel = (count_word >> COUNT_BITS) as u8;
        let coll = match call & 0xF {
            1 => "allreduce",
            2 => "allgather",
            3 => "reducescatter",
            4 => "broadcast",
            5 => "reduce",
            6 => "alltoall",
            7 => "gather",
            8 => "scatter",
            9 => "send/recv",
            _ => "unknown",
        };
        let dt = DataType::from_raw(((call >> 4) & 0xF) as i32).map(|d| d.name()).unwrap_or("?");
        let op =
            ["sum", "prod", "max", "min", "avg", "premulsum"].get(((call >> 8) & 0xF) as usize).copied().unwrap_or("?");
        let algo = Algo::ALL.get(((call >> 12) & 7) as usize).map(|a| a.name()).unwrap_or("?");
        format!("{coll}(type={dt}, count={count}, op={op}, root={}, algo={algo}{})", call >> 15, sel_suffix(sel))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if matches!(self.coll, Coll::Send | Coll::Recv) { "send/recv" } else { self.coll.name() };
        let root = if matches!(self.coll, Coll::Send | Coll::Recv) { 0 } else { self.root };
        write!(
            f,
            "{name}(type={}, count={}, op={}, root={root}, algo={}{})",
            self.dtype.name(),
            self.count,
            self.op.name(),
            self.algo.name(),
            sel_suffix(self.sel)
        )
    }
}

/// `, algSelection=ring,tree` for a restricted call; nothing for an automatic one.
fn sel_suffix(sel: u8) -> String {
    if sel == 0 {
        String::new()
    } else {
        format!(", algSelection={}", crate::select::AlgoSelection::describe_wire(sel))
    }
}

/// Algorithms for the reducing collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Pipelined ring (chain for reduce): bandwidth-optimal, 2(n-1) steps.
    Ring,
    /// Recursive doubling (all-reduce only; other operations use the ring): log2(n) steps of
    /// whole messages, for small messages.
    RecursiveDoubling,
    /// Deterministic: every element is reduced in rank order 0, 1, ..., n-1 by its owner
    /// (all-reduce, reduce-scatter, reduce), whatever the chunk size.
    Ordered,
    /// Hierarchical all-reduce: reduce inside each host (shared memory), all-reduce among the
    /// hosts' leaders (network), broadcast inside each host. Needs the host layout
    /// ([`build_hierarchical`]).
    Hierarchical,
    /// Double binary tree all-reduce: each half of the buffer is reduced up one balanced binary
    /// tree and broadcast back down it, pipelined by chunk; the second tree is the first shifted
    /// by one rank, so most leaves of one tree are inner nodes of the other.
    Tree,
    /// Rabenseifner all-reduce: reduce-scatter by recursive halving, then all-gather by
    /// recursive doubling (log2 n steps each, bandwidth-optimal), for medium messages.
    Rabenseifner,
}

impl Algo {
    /// Name used by `OXCCL_ALGO` and logs.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "recdouble",
            Algo::Ordered => "ordered",
            Algo::Hierarchical => "hierarchical",
            Algo::Tree => "tree",
            Algo::Rabenseifner => "rabenseifner",
        }
    }

    /// Every algorithm, in wire-code order.
    pub const ALL: [Algo; 6] =
        [Algo::Ring, Algo::RecursiveDoubling, Algo::Ordered, Algo::Hierarchical, Algo::Tree, Algo::Rabenseifner];

    /// Code carried in the `call` word (3 bits).
    fn code(self) -> u32 {
        self.index() as u32
    }

    /// Position in [`Algo::ALL`].
    pub fn index(self) -> usize {
        Algo::ALL.iter().position(|a| *a == self).unwrap()
    }
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

/// Build the schedule of `p.rank` (ring/chain algorithms; pairwise exchange for all-to-all,
/// gather and scatter).
pub fn build(p: &Params) -> Schedule {
    assert!(p.nranks >= 1 && p.rank < p.nranks && p.chunk >= 1);
    let mut b = Builder { steps: Vec::new() };
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let m = |x: isize| (x.rem_euclid(n as isize)) as usize;
    let ri = r as isize;
    let local = |b: &mut Builder, src: usize, dst: usize, len: usize, post: bool| {
        b.step(Step { recv: None, src: inp(src), dst: out(dst), send: None, count: len, post });
    };
    match (p.coll, p.algo) {
        (Coll::AllReduce, Algo::RecursiveDoubling) if n > 1 => {
            recursive_doubling(&mut b, p);
            return Schedule::new(b.steps);
        }
        (Coll::AllReduce, Algo::Rabenseifner) if n > 1 => {
            rabenseifner(&mut b, p);
            return Schedule::new(b.steps);
        }
        (Coll::AllReduce, Algo::Tree) if n > 1 => {
            double_tree(&mut b, p);
            return Schedule::new(b.steps);
        }
        (Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce, Algo::Ordered) if n > 1 => {
            ordered(&mut b, p);
            return Schedule::new(b.steps);
        }
        (_, Algo::Hierarchical) => {
            // without a host layout there is no hierarchy: one host
            return build(&Params { algo: Algo::Ring, ..*p });
        }
        _ => {}
    }
    match p.coll {
        Coll::AllReduce if n == 1 => local(&mut b, 0, 0, c, p.avg),
        Coll::AllReduce => {
            let max_block = (0..n).map(|x| block(c, n, x)).map(|(s, e)| e - s).max().unwrap();
            for k in 0..max_block.div_ceil(ch) {
                let ck = |blk: usize| {
                    let (s, e) = block(c, n, blk);
                    chunk_of(s, e, k, ch)
                };
                let (o, l) = ck(m(ri - 1));
                b.step(Step { recv: None, src: inp(o), dst: None, send: Some(next), count: l, post: false });
                for j in 1..n as isize - 1 {
                    let (o, l) = ck(m(ri - 1 - j));
                    b.step(Step { recv: Some(prev), src: inp(o), dst: None, send: Some(next), count: l, post: false });
                }
                let (o, l) = ck(r);
                b.step(Step { recv: Some(prev), src: inp(o), dst: out(o), send: Some(next), count: l, post: p.avg });
                for j in 1..n as isize - 1 {
                    let (o, l) = ck(m(ri - j));
                    b.step(Step { recv: Some(prev), src: None, dst: out(o), send: Some(next), count: l, post: false });
                }
                let (o, l) = ck(next);
                b.step(Step { recv: Some(prev), src: None, dst: out(o), send: None, count: l, post: false });
            }
        }
        Coll::ReduceScatter if n == 1 => local(&mut b, 0, 0, c, p.avg),
        Coll::ReduceScatter => {
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                let blk = |x: usize| x * c + o;
                b.step(Step {
                    recv: None,
                    src: inp(blk(m(ri - 1))),
                    dst: None,
                    send: Some(next),
                    count: l,
                    post: false,
                });
                for j in 1..n as isize - 1 {
                    b.step(Step {
                        recv: Some(prev),
                        src: inp(blk(m(ri - 1 - j))),
                        dst: None,
                        send: Some(next),
                        count: l,
                        post: false,
                    });
                }
                b.step(Step { recv: Some(prev), src: inp(blk(r)), dst: out(o), send: None, count: l, post: p.avg });
            }
        }
        Coll::AllGather => {
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                let blk = |x: usize| x * c + o;
                let send = (n > 1).then_some(next);
                b.step(Step { recv: None, src: inp(o), dst: out(blk(r)), send, count: l, post: false });
                for j in 1..n as isize - 1 {
                    b.step(Step {
                        recv: Some(prev),
                        src: None,
                        dst: out(blk(m(ri - j))),
                        send: Some(next),
                        count: l,
                        post: false,
                    });
                }
                if n > 1 {
                    b.step(Step {
                        recv: Some(prev),
                        src: None,
                        dst: out(blk(next)),
                        send: None,
                        count: l,
                        post: false,
                    });
                }
            }
        }
        Coll::Broadcast => {
            let pos = m(ri - p.root as isize);
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                let send = (pos + 1 < n).then_some(next);
                if pos == 0 {
                    b.step(Step { recv: None, src: inp(o), dst: out(o), send, count: l, post: false });
                } else {
                    b.step(Step { recv: Some(prev), src: None, dst: out(o), send, count: l, post: false });
                }
            }
        }
        Coll::Reduce if n == 1 => local(&mut b, 0, 0, c, p.avg),
        Coll::Reduce => {
            // chain root+1 -> root+2 -> ... -> root
            let pos = m(ri - p.root as isize - 1);
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                let s = if pos == 0 {
                    Step { recv: None, src: inp(o), dst: None, send: Some(next), count: l, post: false }
                } else if pos + 1 < n {
                    Step { recv: Some(prev), src: inp(o), dst: None, send: Some(next), count: l, post: false }
                } else {
                    Step { recv: Some(prev), src: inp(o), dst: out(o), send: None, count: l, post: p.avg }
                };
                b.step(s);
            }
        }
        Coll::AllToAll => {
            local(&mut b, r * c, r * c, c, false);
            for i in 1..n {
                let to = (r + i) % n;
                let from = (r + n - i) % n;
                for k in 0..c.div_ceil(ch) {
                    let (o, l) = chunk_of(0, c, k, ch);
                    b.step(Step { recv: None, src: inp(to * c + o), dst: None, send: Some(to), count: l, post: false });
                    b.step(Step {
                        recv: Some(from),
                        src: None,
                        dst: out(from * c + o),
                        send: None,
                        count: l,
                        post: false,
                    });
                }
            }
        }
        Coll::Gather => {
            if r == p.root {
                local(&mut b, 0, r * c, c, false);
                for i in 1..n {
                    let from = (r + i) % n;
                    for k in 0..c.div_ceil(ch) {
                        let (o, l) = chunk_of(0, c, k, ch);
                        b.step(Step {
                            recv: Some(from),
                            src: None,
                            dst: out(from * c + o),
                            send: None,
                            count: l,
                            post: false,
                        });
                    }
                }
            } else {
                for k in 0..c.div_ceil(ch) {
                    let (o, l) = chunk_of(0, c, k, ch);
                    b.step(Step { recv: None, src: inp(o), dst: None, send: Some(p.root), count: l, post: false });
                }
            }
        }
        Coll::Scatter => {
            if r == p.root {
                local(&mut b, r * c, 0, c, false);
                for i in 1..n {
                    let to = (r + i) % n;
                    for k in 0..c.div_ceil(ch) {
                        let (o, l) = chunk_of(0, c, k, ch);
                        b.step(Step {
                            recv: None,
                            src: inp(to * c + o),
                            dst: None,
                            send: Some(to),
                            count: l,
                            post: false,
                        });
                    }
                }
            } else {
                for k in 0..c.div_ceil(ch) {
                    let (o, l) = chunk_of(0, c, k, ch);
                    b.step(Step { recv: Some(p.root), src: None, dst: out(o), send: None, count: l, post: false });
                }
            }
        }
        Coll::Send => {
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                b.step(Step { recv: None, src: inp(o), dst: None, send: Some(p.root), count: l, post: false });
            }
        }
        Coll::Recv => {
            for k in 0..c.div_ceil(ch) {
                let (o, l) = chunk_of(0, c, k, ch);
                b.step(Step { recv: Some(p.root), src: None, dst: out(o), send: None, count: l, post: false });
            }
        }
    }
    Schedule::new(b.steps)
}

/// Recursive doubling all-reduce. With n not a power of two, the `n - p2` extra ranks first fold
/// their data into ranks `0..n-p2` and get the result back at the end.
fn recursive_doubling(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p2;
    let rounds = p2.trailing_zeros();
    for k in 0..c.div_ceil(ch) {
        let (o, l) = chunk_of(0, c, k, ch);
        if r >= p2 {
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(r - p2), count: l, post: false });
            b.step(Step { recv: Some(r - p2), src: None, dst: out(o), send: None, count: l, post: false });
            continue;
        }
        let fold = if r < extra { Some(r + p2) } else { None };
        b.step(Step { recv: fold, src: inp(o), dst: out(o), send: None, count: l, post: false });
        for bit in 0..rounds {
            let partner = r ^ (1 << bit);
            let last = bit + 1 == rounds;
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(partner), count: l, post: false });
            b.step(Step { recv: Some(partner), src: out(o), dst: out(o), send: None, count: l, post: p.avg && last });
        }
        if let Some(e) = fold {
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(e), count: l, post: false });
        }
    }
}

/// Rabenseifner all-reduce. Ranks `0..p2` (p2 the largest power of two <= n) split the buffer
/// into p2 blocks. Reduce-scatter by recursive halving: at distance d = p2/2, ..., 1 each rank
/// keeps the half of its current block range on its side of bit d, sends the other half to
/// `r ^ d` and adds the partner's copy of the kept half; rank r ends owning block r. All-gather by
/// recursive doubling reverses the rounds. The `n - p2` extra ranks fold into ranks `0..n-p2`
/// first and get the result back at the end. Within a round, sends run one chunk ahead of
/// receives, so two slots per connection suffice.
fn rabenseifner(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p2;
    let chunks = |s: usize, e: usize| (e - s).div_ceil(ch);
    if r >= p2 {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: inp(o), dst: None, send: Some(r - p2), count: l, post: false });
        }
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: Some(r - p2), src: None, dst: out(o), send: None, count: l, post: false });
        }
        return;
    }
    let fold = (r < extra).then_some(r + p2);
    if let Some(e) = fold {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: Some(e), src: inp(o), dst: out(o), send: None, count: l, post: false });
        }
    }
    // element range of blocks [lo, hi)
    let range = |lo: usize, hi: usize| (block(c, p2, lo).0, block(c, p2, hi - 1).1);
    let mut base: fn(usize) -> Option<Slice> = if fold.is_some() { out } else { inp };
    let (mut lo, mut hi) = (0, p2);
    let mut d = p2 / 2;
    while d >= 1 {
        let partner = r ^ d;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if r & d == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let (gs, ge) = range(give.0, give.1);
        let (ks, ke) = range(keep.0, keep.1);
        exchange(b, partner, ch, (gs, ge, base), (ks, ke, base), p.avg && d == 1);
        (lo, hi) = keep;
        base = out;
        d /= 2;
    }
    let mut d = 1;
    while d < p2 {
        let partner = r ^ d;
        let (ps, pe) = (partner & !(d - 1), (partner & !(d - 1)) + d);
        let (ms, me) = range(lo, hi);
        let (ts, te) = range(ps, pe);
        exchange(b, partner, ch, (ms, me, out), (ts, te, |_| None), false);
        (lo, hi) = (lo.min(ps), hi.max(pe));
        d *= 2;
    }
    if let Some(e) = fold {
        for k in 0..chunks(0, c) {
            let (o, l) = chunk_of(0, c, k, ch);
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(e), count: l, post: false });
        }
    }
}

/// One pairwise exchange round of [`rabenseifner`]: send elements `[ss, se)` read from `sbuf` to
/// `partner` while receiving `[rs, re)` from it, combined with what `rsrc` gives (if any), into the
/// output (`post`: the avg division). Sends run one chunk ahead of receives, so two slots per
/// connection suffice.
type Window = (usize, usize, fn(usize) -> Option<Slice>);
fn exchange(b: &mut Builder, partner: usize, ch: usize, (ss, se, sbuf): Window, (rs, re, rsrc): Window, post: bool) {
    let rounds = (se - ss).div_ceil(ch).max((re - rs).div_ceil(ch));
    for k in 0..=rounds {
        if k < rounds {
            let (o, l) = chunk_of(ss, se, k, ch);
            b.step(Step { recv: None, src: sbuf(o), dst: None, send: Some(partner), count: l, post: false });
        }
        if k > 0 {
            let (o, l) = chunk_of(rs, re, k - 1, ch);
            b.step(Step { recv: Some(partner), src: rsrc(o), dst: out(o), send: None, count: l, post });
        }
    }
}

/// A balanced in-order binary tree over positions `0..n`: (parent, children) of each position.
pub fn binary_tree(n: usize) -> Vec<(Option<usize>, Vec<usize>)> {
    fn rec(t: &mut [(Option<usize>, Vec<usize>)], lo: usize, hi: usize, parent: Option<usize>) -> Option<usize> {
        if lo >= hi {
            return None;
        }
        let mid = lo + (hi - lo) / 2;
        t[mid].0 = parent;
        let kids: Vec<usize> =
            [rec(t, lo, mid, Some(mid)), rec(t, mid + 1, hi, Some(mid))].into_iter().flatten().collect();
        t[mid].1 = kids;
        Some(mid)
    }
    let mut t = vec![(None, Vec::new()); n];
    rec(&mut t, 0, n, None);
    t
}

/// How many chunk rounds the broadcast half of a tree trails its reduce half: lets a leaf keep
/// this many chunks in flight instead of waiting for each one's round trip.
pub const TREE_LAG: usize = 2;

/// Double binary tree all-reduce (see [`Algo::Tree`]). Tree 0 places rank r at position r, tree 1
/// at position (r + n - 1) mod n; tree t reduces and broadcasts half t of the buffer. Per chunk:
/// up — a leaf sends its input to its parent; an inner node adds its children's messages to its
/// input (the first into its output, the second on the way up); the root's last addition is the
/// result. Down, `TREE_LAG` rounds later: receive from the parent (the root reads its output),
/// write, forward to the children. Every message is sent and received at the same position of
/// the (round, phase, tree) sequence on both sides, which keeps the connection FIFOs in order.
fn double_tree(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let t = binary_tree(n);
    let half = c / 2;
    let halves = [(0, half), (half, c)];
    // tree index -> (parent, children) of this rank, in ranks
    let node = |tree: usize| {
        let to_rank = |pos: usize| if tree == 0 { pos } else { (pos + 1) % n };
        let pos = if tree == 0 { r } else { (r + n - 1) % n };
        let (par, kids) = &t[pos];
        (par.map(to_rank), kids.iter().map(|&k| to_rank(k)).collect::<Vec<_>>())
    };
    let nodes = [node(0), node(1)];
    let rounds = (c - half).div_ceil(ch);
    let up = |b: &mut Builder, tree: usize, k: usize| {
        let (par, kids) = &nodes[tree];
        let (o, l) = chunk_of(halves[tree].0, halves[tree].1, k, ch);
        let root = par.is_none();
        match kids.len() {
            0 => b.step(Step { recv: None, src: inp(o), dst: None, send: *par, count: l, post: false }),
            _ => {
                if kids.len() == 2 {
                    b.step(Step { recv: Some(kids[0]), src: inp(o), dst: out(o), send: None, count: l, post: false });
                }
                let last = kids[kids.len() - 1];
                let src = if kids.len() == 2 { out(o) } else { inp(o) };
                let dst = if root { out(o) } else { None };
                b.step(Step { recv: Some(last), src, dst, send: *par, count: l, post: root && p.avg });
            }
        }
    };
    let down = |b: &mut Builder, tree: usize, k: usize| {
        let (par, kids) = &nodes[tree];
        let (o, l) = chunk_of(halves[tree].0, halves[tree].1, k, ch);
        let mut kids = kids.iter().copied();
        if let Some(par) = *par {
            b.step(Step { recv: Some(par), src: None, dst: out(o), send: kids.next(), count: l, post: false });
        }
        for kid in kids {
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(kid), count: l, post: false });
        }
    };
    for k in 0..rounds + TREE_LAG {
        if k < rounds {
            up(b, 0, k);
            up(b, 1, k);
        }
        if k >= TREE_LAG {
            down(b, 0, k - TREE_LAG);
            down(b, 1, k - TREE_LAG);
        }
    }
}

/// Deterministic schedules: the owner of each block accumulates every rank's contribution, its
/// own included (through a connection to itself), in rank order 0..n-1; all-reduce then shares
/// the blocks with a ring all-gather.
fn ordered(b: &mut Builder, p: &Params) {
    let (n, r, c, ch) = (p.nranks, p.rank, p.count, p.chunk);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    // (input offset, output offset, length) of chunk k of block `blk`, and the block owner
    let part = |blk: usize, k: usize| -> (usize, usize, usize) {
        match p.coll {
            Coll::AllReduce => {
                let (s, e) = block(c, n, blk);
                let (o, l) = chunk_of(s, e, k, ch);
                (o, o, l)
            }
            Coll::ReduceScatter => {
                let (o, l) = chunk_of(0, c, k, ch);
                (blk * c + o, o, l)
            }
            _ => {
                let (o, l) = chunk_of(0, c, k, ch);
                (o, o, l)
            }
        }
    };
    let rounds = match p.coll {
        Coll::AllReduce => (0..n).map(|x| block(c, n, x)).map(|(s, e)| e - s).max().unwrap().div_ceil(ch),
        _ => c.div_ceil(ch),
    };
    for k in 0..rounds {
        // 1. contributions to their owners (the block's rank; the root for reduce)
        let owners: Vec<usize> = match p.coll {
            Coll::Reduce => vec![p.root],
            _ => (0..n).map(|i| (r + 1 + i) % n).collect(),
        };
        for &owner in &owners {
            let (io, _, l) = part(owner, k);
            let io = if p.coll == Coll::Reduce { part(0, k).0 } else { io };
            b.step(Step { recv: None, src: inp(io), dst: None, send: Some(owner), count: l, post: false });
        }
        // 2. the owner accumulates in rank order
        if p.coll != Coll::Reduce || r == p.root {
            let (_, oo, l) = part(r, k);
            for q in 0..n {
                let src = if q == 0 { None } else { out(oo) };
                b.step(Step { recv: Some(q), src, dst: out(oo), send: None, count: l, post: p.avg && q == n - 1 });
            }
        }
        // 3. all-reduce: ring all-gather of the owned blocks
        if p.coll == Coll::AllReduce {
            let (o, _, l) = part(r, k);
            b.step(Step { recv: None, src: out(o), dst: None, send: Some(next), count: l, post: false });
            for j in 1..n - 1 {
                let (o, _, l) = part((r + n - j) % n, k);
                b.step(Step { recv: Some(prev), src: None, dst: out(o), send: Some(next), count: l, post: false });
            }
            let (o, _, l) = part(next, k);
            b.step(Step { recv: Some(prev), src: None, dst: out(o), send: None, count: l, post: false });
        }
    }
}

/// Hierarchical all-reduce for a host layout (`host_of[r]` = host index of rank r): the ranks of
/// each host, in rank order, form a group whose first rank is the host's leader.
/// 1. reduce inside the group to the leader (chain), into the output buffer;
/// 2. the leaders all-reduce the output buffer among themselves (ring);
/// 3. broadcast inside the group from the leader (chain).
///
/// Each phase is an ordinary schedule built on the group's own rank numbering and remapped to
/// communicator ranks; phases 2 and 3 read the output buffer. Other operations, and layouts with
/// one host or one rank per host, get the ring.
pub fn build_hierarchical(p: &Params, host_of: &[usize]) -> Schedule {
    assert_eq!(host_of.len(), p.nranks);
    let hosts: std::collections::BTreeSet<usize> = host_of.iter().copied().collect();
    if p.coll != Coll::AllReduce || hosts.len() <= 1 || hosts.len() == p.nranks {
        return build(&Params { algo: Algo::Ring, ..*p });
    }
    let group: Vec<usize> = (0..p.nranks).filter(|&q| host_of[q] == host_of[p.rank]).collect();
    let leaders: Vec<usize> = hosts.iter().map(|h| (0..p.nranks).find(|&q| host_of[q] == *h).unwrap()).collect();
    let me_in_group = group.iter().position(|&q| q == p.rank).unwrap();
    let remap = |s: Schedule, members: &[usize], input_is_output: bool| -> Vec<Step> {
        s.steps
            .into_iter()
            .map(|mut st| {
                st.recv = st.recv.map(|i| members[i]);
                st.send = st.send.map(|i| members[i]);
                if input_is_output {
                    if let Some(x) = st.src.as_mut() {
                        x.buf = Buf::Output;
                    }
                }
                st
            })
            .collect()
    };
    let sub = |coll: Coll, n: usize, rank: usize, avg: bool| {
        build(&Params { coll, nranks: n, rank, count: p.count, root: 0, chunk: p.chunk, avg, algo: Algo::Ring })
    };
    let mut steps = remap(sub(Coll::Reduce, group.len(), me_in_group, false), &group, false);
    if let Some(li) = leaders.iter().position(|&q| q == p.rank) {
        steps.extend(remap(sub(Coll::AllReduce, leaders.len(), li, p.avg), &leaders, true));
    }
    steps.extend(
        remap(sub(Coll::Broadcast, group.len(), me_in_group, false), &group, true)
            .into_iter()
            // the leader's own copy (output to output) is a no-op: keep only its sends
            .filter(|st| !(st.recv.is_none() && st.send.is_none())),
    );
    Schedule::new(steps)
}

impl Schedule {
    /// A schedule of these steps.
    pub fn new(steps: Vec<Step>) -> Schedule {
        Schedule { steps, peers: Default::default(), stable: Default::default() }
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

/// The costs documented in `docs/algorithms.md`: elements each rank sends, as closed formulas.
/// Tests check every schedule against them.
pub mod cost {
    use super::{block, Coll};

    /// Elements rank `rank` sends for `coll` with `nranks` ranks, count `count` (NCCL convention)
    /// and root `root`.
    pub fn elements_sent(coll: Coll, nranks: usize, rank: usize, count: usize, root: usize) -> usize {
        let n = nranks;
        if n == 1 {
            return 0;
        }
        let blk = |b: usize| {
            let (s, e) = block(count, n, b % n);
            e - s
        };
        match coll {
            // ring: reduce-scatter sends every block but its own, all-gather every block but its
            // successor's: 2S - |B_r| - |B_r+1|  (= 2(n-1)/n S for equal blocks)
            Coll::AllReduce => 2 * count - blk(rank) - blk(rank + 1),
            // (n-1) blocks of `count`
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => (n - 1) * count,
            // chain from the root: everyone but the last forwards S
            Coll::Broadcast => {
                if (rank + 1) % n == root {
                    0
                } else {
                    count
                }
            }
            // chain to the root: everyone but the root sends S
            Coll::Reduce | Coll::Gather => {
                if rank == root {
                    0
                } else {
                    count
                }
            }
            Coll::Scatter => {
                if rank == root {
                    (n - 1) * count
                } else {
                    0
                }
            }
            Coll::Send => count,
            Coll::Recv => 0,
        }
    }

    /// Elements rank `rank` sends in a Rabenseifner all-reduce of `count` elements: with p2 the
    /// largest power of two <= n, `B'_r` rank r's block of p2 blocks and `G_d(r)` the d aligned
    /// blocks holding r, a rank below p2 sends `S - |B'_r|` in the halving rounds and the sum of
    /// `|G_d(r)|` over d = 1, 2, ..., p2/2 in the doubling rounds, plus S if it folds an extra rank
    /// in; an extra rank sends S.
    pub fn rabenseifner_elements_sent(nranks: usize, rank: usize, count: usize) -> usize {
        if nranks == 1 {
            return 0;
        }
        let p2 = 1usize << (usize::BITS - 1 - nranks.leading_zeros());
        if rank >= p2 {
            return count;
        }
        let blocks = |lo: usize, hi: usize| block(count, p2, hi - 1).1 - block(count, p2, lo).0;
        let halving = count - blocks(rank, rank + 1);
        let doubling: usize =
            (0..p2.trailing_zeros()).map(|i| 1 << i).map(|d| blocks(rank & !(d - 1), (rank & !(d - 1)) + d)).sum();
        halving + doubling + if rank < nranks - p2 { count } else { 0 }
    }

    /// Elements all ranks together send in a double-binary-tree all-reduce: in each tree every
    /// rank but the root sends its half up once and receives it down once, so `2(n-1)·S` in all,
    /// the ring's total, but spread unevenly (inner nodes send up to 1.5 S, leaves 0.5 S).
    pub fn tree_total_elements_sent(nranks: usize, count: usize) -> usize {
        2 * (nranks - 1) * count
    }

    /// Messages (steps that send) per rank for a ring all-reduce: 2(n-1) per chunk round.
    pub fn allreduce_sends_per_round(nranks: usize) -> usize {
        2 * (nranks - 1)
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
