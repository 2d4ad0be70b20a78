//! The schedule simulator: runs the schedules of all ranks together, with no transport and no
//! threads, over FIFO queues of bounded depth (so a schedule that relies on unbounded buffering
//! deadlocks here too).
//!
//! - **Symbolic mode** tracks, for every element, which ranks' contributions it holds and which
//!   input element it came from. It reports deadlocks, unmatched or mis-sized messages, reads of
//!   unwritten data, double counting, misrouted elements and a wrong final value.
//! - **Numeric mode** moves real bytes through [`crate::exec::apply_step`], the executor's own
//!   data path, and compares the outputs bit for bit with [`crate::exact`].

use crate::exact;
use crate::exec::{apply_step, streams_output, OpMem};
use crate::schedule::{inplace_layout, Buf, Coll, Params, Schedule, Step};
use crate::types::{DataType, ReduceOp};
use std::collections::{HashMap, VecDeque};

/// One element in symbolic mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Val {
    /// Bit r set: rank r's contribution is included.
    pub mask: u128,
    /// Index of the element in the logical vector it belongs to.
    pub index: usize,
    /// Whether the avg division was applied.
    pub posted: bool,
}

/// A simulated operation.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// Operation.
    pub coll: Coll,
    /// Ranks (at most 128).
    pub nranks: usize,
    /// Count (NCCL convention).
    pub count: usize,
    /// Root.
    pub root: usize,
    /// Message size in elements.
    pub chunk: usize,
    /// Use NCCL's in-place layout.
    pub inplace: bool,
    /// Avg (the division step is checked).
    pub avg: bool,
    /// Queue depth per connection.
    pub depth: usize,
    /// Algorithm of the reducing collectives.
    pub algo: crate::schedule::Algo,
    /// Hosts the ranks are spread over (contiguously: rank r on host r * hosts / n), for the
    /// hierarchical algorithm; 1 otherwise.
    pub hosts: usize,
}

/// Schedules of every rank for `case`.
pub fn schedules(case: &Case) -> Vec<Schedule> {
    let host_of: Vec<usize> = (0..case.nranks).map(|r| r * case.hosts.max(1) / case.nranks).collect();
    (0..case.nranks)
        .map(|rank| {
            let p = Params {
                coll: case.coll,
                nranks: case.nranks,
                rank,
                count: case.count,
                root: case.root,
                chunk: case.chunk,
                avg: case.avg,
                algo: case.algo,
            };
            crate::schedule::build_on(&p, &host_of)
        })
        .collect()
}

/// Memory of one rank: input and output windows over one or two arrays.
struct Mem<T> {
    a: Vec<T>,
    b: Vec<T>,
    in_off: usize,
    out_off: usize,
    inplace: bool,
}

impl<T: Clone> Mem<T> {
    /// `scale`: array units per element (1 in symbolic mode, the element size in numeric mode).
    fn new(case: &Case, rank: usize, input: Vec<T>, unset: T, scale: usize) -> Self {
        let (ni, no) = case.coll.buffer_counts(case.nranks, rank, case.count, case.root);
        let (ni, no) = (ni * scale, no * scale);
        match case.inplace.then(|| inplace_layout(case.coll, case.nranks, rank, case.count, case.root)).flatten() {
            Some((io, oo, len)) => {
                let (io, oo, len) = (io * scale, oo * scale, len * scale);
                let mut a = vec![unset; len];
                a[io..io + ni].clone_from_slice(&input);
                Mem { a, b: vec![], in_off: io, out_off: oo, inplace: true }
            }
            None => Mem { a: input, b: vec![unset; no], in_off: 0, out_off: 0, inplace: false },
        }
    }
    fn slot(&self, buf: Buf, off: usize) -> (bool, usize) {
        match (self.inplace, buf) {
            (true, Buf::Input) => (true, self.in_off + off),
            (true, Buf::Output) => (true, self.out_off + off),
            (false, Buf::Input) => (true, off),
            (false, Buf::Output) => (false, off),
        }
    }
    fn get(&self, buf: Buf, off: usize) -> Option<&T> {
        let (in_a, i) = self.slot(buf, off);
        if in_a {
            self.a.get(i)
        } else {
            self.b.get(i)
        }
    }
    fn set(&mut self, buf: Buf, off: usize, v: T) -> bool {
        let (in_a, i) = self.slot(buf, off);
        let arr = if in_a { &mut self.a } else { &mut self.b };
        match arr.get_mut(i) {
            Some(x) => {
                *x = v;
                true
            }
            None => false,
        }
    }
    fn output(&self, len: usize) -> Vec<T> {
        let (in_a, i) = self.slot(Buf::Output, 0);
        let arr = if in_a { &self.a } else { &self.b };
        arr[i..i + len].to_vec()
    }
}

/// Run `step_fn` over all ranks in lockstep until done; shared by both modes.
fn lockstep<M>(
    scheds: &[Schedule],
    depth: usize,
    mut step_fn: impl FnMut(usize, &Step, Option<M>) -> Result<Option<M>, String>,
    len_of: impl Fn(&M) -> usize,
) -> Result<(), String> {
    let n = scheds.len();
    let mut pc = vec![0usize; n];
    let mut q: HashMap<(usize, usize), VecDeque<M>> = HashMap::new();
    loop {
        let mut progressed = false;
        for r in 0..n {
            while let Some(step) = scheds[r].steps.get(pc[r]) {
                if let Some(p) = step.recv {
                    if p >= n {
                        return Err(format!("rank {r} receives from nonexistent rank {p}"));
                    }
                    if q.get(&(p, r)).is_none_or(|x| x.is_empty()) {
                        break;
                    }
                }
                if let Some(s) = step.send {
                    if s >= n {
                        return Err(format!("rank {r} sends to invalid rank {s}"));
                    }
                    if q.get(&(r, s)).is_some_and(|x| x.len() >= depth) {
                        break;
                    }
                }
                let msg = match step.recv {
                    Some(p) => {
                        let m = q.get_mut(&(p, r)).unwrap().pop_front().unwrap();
                        if len_of(&m) != step.count {
                            return Err(format!(
                                "rank {r} step {} expects {} elements from rank {p}, message has {}",
                                pc[r],
                                step.count,
                                len_of(&m)
                            ));
                        }
                        Some(m)
                    }
                    None => None,
                };
                let out = step_fn(r, step, msg).map_err(|e| format!("rank {r} step {}: {e}", pc[r]))?;
                if let (Some(s), Some(m)) = (step.send, out) {
                    q.entry((r, s)).or_default().push_back(m);
                }
                pc[r] += 1;
                progressed = true;
            }
        }
        if (0..n).all(|r| pc[r] == scheds[r].steps.len()) {
            let left: Vec<_> = q.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (*k, v.len())).collect();
            if !left.is_empty() {
                return Err(format!("unreceived messages (src, dst) -> count: {left:?}"));
            }
            return Ok(());
        }
        if !progressed {
            let stuck: Vec<String> = (0..n)
                .filter(|&r| pc[r] < scheds[r].steps.len())
                .map(|r| format!("rank {r} at step {}: {:?}", pc[r], scheds[r].steps[pc[r]]))
                .collect();
            return Err(format!("deadlock: {}", stuck.join("; ")));
        }
    }
}

/// What rank `rank`'s output must hold, symbolically.
fn expected_sym(case: &Case, rank: usize) -> Vec<Val> {
    let (n, c, root) = (case.nranks, case.count, case.root);
    let all: u128 = if n == 128 { u128::MAX } else { (1u128 << n) - 1 };
    let one = |r: usize, index: usize| Val { mask: 1 << r, index, posted: false };
    let red = |index: usize| Val { mask: all, index, posted: case.avg };
    let (_, no) = case.coll.buffer_counts(n, rank, c, root);
    (0..no)
        .map(|i| match case.coll {
            Coll::AllReduce | Coll::Reduce => red(i),
            Coll::ReduceScatter => red(rank * c + i),
            Coll::AllGather | Coll::Gather => one(i / c, i % c),
            Coll::Broadcast => one(root, i),
            Coll::AllToAll => one(i / c, rank * c + i % c),
            Coll::Scatter => one(root, rank * c + i),
            Coll::Send | Coll::Recv => unreachable!(),
        })
        .collect()
}

/// Run `case` symbolically; `Err` describes the first problem.
pub fn check_symbolic(case: &Case) -> Result<(), String> {
    let scheds = schedules(case);
    check_symbolic_with(case, &scheds)
}

/// Run given schedules symbolically against `case`'s expected outputs.
pub fn check_symbolic_with(case: &Case, scheds: &[Schedule]) -> Result<(), String> {
    let n = case.nranks;
    let mut mem: Vec<Mem<Option<Val>>> = (0..n)
        .map(|r| {
            let (ni, _) = case.coll.buffer_counts(n, r, case.count, case.root);
            let input = (0..ni).map(|i| Some(Val { mask: 1 << r, index: i, posted: false })).collect();
            Mem::new(case, r, input, None, 1)
        })
        .collect();
    lockstep(
        scheds,
        case.depth,
        |r, step, msg: Option<Vec<Val>>| {
            let m = &mut mem[r];
            let mut vals = Vec::with_capacity(step.count);
            for i in 0..step.count {
                let src = match step.src {
                    Some(s) => Some(
                        m.get(s.buf, s.offset + i)
                            .ok_or("source outside the buffer")?
                            .ok_or_else(|| format!("reads unwritten element {:?}[{}]", s.buf, s.offset + i))?,
                    ),
                    None => None,
                };
                let mut v = match (msg.as_ref().map(|x| x[i]), src) {
                    (Some(a), Some(b)) => {
                        if a.index != b.index {
                            return Err(format!("combines element {} with element {}", a.index, b.index));
                        }
                        if a.mask & b.mask != 0 || a.posted || b.posted {
                            return Err(format!("double counting at element {}", a.index));
                        }
                        Val { mask: a.mask | b.mask, index: a.index, posted: false }
                    }
                    (Some(a), None) => a,
                    (None, Some(b)) => b,
                    (None, None) => return Err("step has neither recv nor src".into()),
                };
                if step.post {
                    if v.posted {
                        return Err("avg division applied twice".into());
                    }
                    if v.mask.count_ones() as usize != n {
                        return Err("avg division before the reduction is complete".into());
                    }
                    v.posted = true;
                }
                if let Some(d) = step.dst {
                    if !m.set(d.buf, d.offset + i, Some(v)) {
                        return Err("destination outside the buffer".into());
                    }
                }
                vals.push(v);
            }
            Ok(Some(vals))
        },
        |m| m.len(),
    )?;
    for (r, m) in mem.iter().enumerate() {
        let want = expected_sym(case, r);
        let got = m.output(want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if *g != Some(*w) {
                return Err(format!("rank {r} output[{i}] is {g:?}, expected {w:?}"));
            }
        }
    }
    Ok(())
}

/// Run `case` numerically for `dt`/`op` through the executor's step function; `Err` describes
/// the first wrong element.
pub fn check_numeric(case: &Case, dt: DataType, op: ReduceOp) -> Result<(), String> {
    let scheds = schedules(case);
    let n = case.nranks;
    let es = dt.size();
    let seed = 11;
    let mut mem: Vec<Mem<u8>> = (0..n)
        .map(|r| Mem::new(case, r, exact::coll_input(case.coll, dt, op, n, r, case.count, case.root, seed), 0, es))
        .collect();
    lockstep(
        &scheds,
        case.depth,
        |r, step, msg: Option<Vec<u8>>| {
            let m = &mut mem[r];
            let mut slot = step.send.map(|_| vec![0u8; step.count * es]);
            let mut opmem = if m.inplace {
                OpMem::InPlace { buf: &mut m.a, in_off: m.in_off, out_off: m.out_off }
            } else {
                OpMem::Split { input: &m.a, output: &mut m.b }
            };
            let stream = streams_output(&scheds[r], &opmem);
            apply_step(step, dt, op, n, stream, &mut opmem, msg.as_deref(), slot.as_deref_mut())
                .map_err(|e| e.to_string())?;
            Ok(slot)
        },
        |m| m.len() / es,
    )?;
    for (r, m) in mem.iter().enumerate() {
        let want = exact::expected_output(case.coll, dt, op, n, r, case.count, case.root, seed);
        let got = m.output(want.len());
        let wrong = exact::count_wrong(dt, &got, &want);
        if wrong > 0 {
            return Err(format!("rank {r}: {wrong} wrong elements ({dt:?} {op:?})"));
        }
    }
    Ok(())
}
