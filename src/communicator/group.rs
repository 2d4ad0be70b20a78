//! Groups: operations that progress together, and their preparation (sequence numbers,
//! schedules, connections).

use super::*;
use crate::exec::{drive, OpMem, OpRun, Policy};
use crate::runtime::Setup;
use crate::schedule::{build_on, Coll, Fingerprint, Params};
use crate::select::CallOptions;
use crate::types::{Element, ReduceOp};
use crate::Result;
use smallvec::SmallVec;
use std::sync::Arc;
use std::time::Instant;

/// A short list kept inline: a blocking call (one op, one communicator) allocates nothing for
/// its group, its communicators or its runs.
pub(crate) type Few<T> = SmallVec<[T; 1]>;

/// The prepared operations of a group.
pub(crate) type Runs<'a> = Few<OpRun<'a>>;

/// Operations that progress together (`ncclGroupStart`/`ncclGroupEnd`): matching sends and
/// receives, and operations on many communicators from one thread, cannot deadlock.
///
/// ```no_run
/// # use oxccl::{Communicator, Group};
/// # fn f(comms: &[Communicator], a: &[f32], b: &mut [f32]) -> oxccl::Result<()> {
/// let (c, n) = (&comms[0], comms[0].size());
/// let mut g = Group::new();
/// g.send(c, a, (c.rank() + 1) % n)?;
/// g.recv(c, b, (c.rank() + n - 1) % n)?;
/// g.run()?;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct Group<'a> {
    ops: Few<(&'a Communicator, OpDesc, CallOptions, OpMem<'a>)>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Group { ops: Few::new() }
    }

    /// Add any operation in its untyped form.
    pub fn add(&mut self, comm: &'a Communicator, desc: OpDesc, mem: OpMem<'a>) -> Result<&mut Self> {
        self.add_with(comm, desc, CallOptions::default(), mem)
    }

    /// Add an operation with per-call options (algorithm selection, profiler tag).
    pub fn add_with(
        &mut self,
        comm: &'a Communicator,
        desc: OpDesc,
        opts: CallOptions,
        mut mem: OpMem<'a>,
    ) -> Result<&mut Self> {
        comm.validate(&desc, &mem.view())?;
        self.ops.push((comm, desc, opts, mem));
        Ok(self)
    }

    /// Add a send.
    pub fn send<T: Element>(&mut self, comm: &'a Communicator, buf: &'a [T], peer: usize) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::Send, ReduceOp::Sum, buf.len(), peer), split(buf, &mut []))
    }

    /// Add a receive.
    pub fn recv<T: Element>(&mut self, comm: &'a Communicator, buf: &'a mut [T], peer: usize) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::Recv, ReduceOp::Sum, buf.len(), peer), split(&[], buf))
    }

    /// Add an all-reduce.
    pub fn all_reduce<T: Element>(
        &mut self,
        comm: &'a Communicator,
        send: &'a [T],
        recv: &'a mut [T],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.add(comm, desc::<T>(Coll::AllReduce, op, send.len(), 0), split(send, recv))
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Run every operation to completion.
    pub fn run(self) -> Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let comms = self.comms();
        let _scope = crate::log::RankScope::new(comms[0].sh.rank);
        let mut _guards: Few<_> = Few::new();
        for c in &comms {
            _guards.push(c.enter()?);
        }
        for c in &comms {
            c.sh.wait_async_idle();
        }
        let now = oxccl_simd::clock::now(); // one (unfenced) clock read for the deadline and the flight record
        let mut runs = Runs::new();
        self.prepare(&comms, now, &mut runs)?;
        let shareds: Few<&Shared> = comms.iter().map(|c| &*c.sh).collect();
        let res = drive(&shareds, &mut runs, policy(&shareds, now));
        conclude(&shareds, &runs, res)
    }

    /// Distinct communicators, in first-use order.
    pub(crate) fn comms(&self) -> Few<&'a Communicator> {
        let mut comms: Few<&Communicator> = Few::new();
        for (c, _, _, _) in &self.ops {
            if !comms.iter().any(|x| Arc::ptr_eq(&x.sh, &c.sh)) {
                comms.push(c);
            }
        }
        comms
    }

    /// Sequence numbers, schedules and connections for every op, into `runs` (the caller's:
    /// an op is moved as little as can be on the fast path; the caller holds the busy guards
    /// of `comms`).
    pub(crate) fn prepare(self, comms: &[&'a Communicator], now: Instant, runs: &mut Runs<'a>) -> Result<()> {
        // a group over several communicators checks them all before any takes a sequence number;
        // a single one is checked under the lock that takes it
        if comms.len() > 1 {
            for c in comms {
                check_state(&c.sh, &c.sh.state.lock().unwrap())?;
            }
        }
        // pass 1: sequence numbers and schedules, in the order the ops were added (which is the
        // order they use each connection)
        // the algorithms first: a call whose selection cannot be honoured fails before any
        // sequence number is taken, and the communicator stays usable
        let mut algos: Few<_> = Few::new();
        for (c, d, o, _) in &self.ops {
            let algo = c.sh.choose_algo(&mut c.sh.state.lock().unwrap(), d.coll, d.count * d.dtype.size(), o.algos);
            algos.push(algo.map_err(|e| e.with_op(d.coll.name()))?);
        }
        runs.reserve(self.ops.len());
        // whether every connection the ops need exists (the steady state), noted under the same
        // lock as each op's sequence number
        let mut connected = true;
        for ((c, d, opts, mem), algo) in self.ops.into_iter().zip(algos) {
            let ci = comms.iter().position(|x| Arc::ptr_eq(&x.sh, &c.sh)).unwrap();
            let (run, conn) = prepare_op(c, ci, comms.len() == 1, d, opts, mem, algo, now)?;
            connected &= conn;
            runs.push(run);
        }
        // pass 2: connect what the ops need, all communicators phase by phase (nothing to do,
        // and nothing allocated, when every connection exists: the steady state)
        if connected {
            return Ok(());
        }
        connect(comms, runs)
    }
}

/// The progress policy of a call on `shareds` that began at `now`: the longest timeout, spin
/// and yield of its communicators, the shortest report and status periods.
pub(crate) fn policy(shareds: &[&Shared], now: Instant) -> Policy {
    let deadline = shareds.iter().map(|sh| now + sh.cfg.timeout).max().unwrap();
    let spin = shareds.iter().map(|sh| sh.spin).max().unwrap();
    let yield_for = shareds.iter().map(|sh| sh.yield_for).max().unwrap();
    let report = shareds.iter().filter_map(|sh| sh.cfg.wait_report).min();
    let status = shareds.iter().filter_map(|sh| sh.cfg.watch.status_after).min();
    Policy { spin, yield_for, deadline, report, started: now, status }
}

/// The end of a call: every op's completion noted, and a failure named after the operation it
/// stopped (a dead peer is found by the transport, which knows the peer but not the call), with
/// the timeout census, and made the communicators' sticky error.
pub(crate) fn conclude(shareds: &[&Shared], runs: &[OpRun<'_>], res: Result<()>) -> Result<()> {
    let end = oxccl_simd::clock::now();
    for r in runs {
        shareds[r.comm].completed(r, end);
    }
    let Err(mut e) = res else { return Ok(()) };
    if e.op.is_none() {
        let stopped = runs.iter().filter(|r| !r.done());
        let involved = |r: &&OpRun<'_>| {
            let (rx, tx) = r.sched.peers();
            e.peer.is_some_and(|p| rx.contains(&p) || tx.contains(&p))
        };
        if let Some(r) = stopped.clone().find(involved).or_else(|| stopped.clone().next()) {
            e = e.with_op(r.fp.to_string()).with_seq(r.seq);
        }
    }
    if e.kind == crate::ErrorKind::Timeout {
        if let Some(r) = runs.iter().find(|r| !r.done() && !matches!(r.fp.coll, Coll::Send | Coll::Recv)) {
            e.message = format!("{}; {}", e.message, shareds[r.comm].census(r.seq, &r.heard_from()));
        }
    }
    for sh in shareds {
        sh.set_error(e.clone());
    }
    Err(shareds[0].with_root_cause(e))
}

/// What an op takes under its communicator's state lock: its number, call and schedule.
pub(crate) struct Taken {
    pub(crate) seq: u64,
    pub(crate) fp: Fingerprint,
    pub(crate) sched: Arc<crate::schedule::Schedule>,
    /// Whether every connection it needs exists.
    pub(crate) connected: bool,
}

/// The part of an op's preparation done under its communicator's state lock (`st`): the
/// algorithm (the tuner's choice, made here if `algo` is `None`), the state check (`check`),
/// the sequence number and the schedule.
pub(crate) fn take(
    sh: &Shared,
    st: &mut crate::runtime::State,
    check: bool,
    d: &OpDesc,
    opts: &CallOptions,
    algo: Option<crate::schedule::Algo>,
) -> Result<Taken> {
    // the algorithm first: a call whose selection cannot be honoured fails before it takes a
    // sequence number, and the communicator stays usable
    let algo = match algo {
        Some(a) => a,
        None => {
            sh.choose_algo(st, d.coll, d.count * d.dtype.size(), opts.algos).map_err(|e| e.with_op(d.coll.name()))?
        }
    };
    if check {
        check_state(sh, st)?;
    }
    let ctr = match d.coll {
        Coll::Send => &mut st.p2p_tx[d.root],
        Coll::Recv => &mut st.p2p_rx[d.root],
        _ => &mut st.seq,
    };
    *ctr += 1;
    let seq = *ctr - 1;
    let chunk = (sh.cfg.chunk_bytes / d.dtype.size()).max(1);
    let avg = d.op == ReduceOp::Avg && d.coll.reduces();
    let key = (d.coll, d.count, d.root, chunk, avg, algo);
    let sched = cached_schedule(sh, st, key);
    let (rx, tx) = sched.peers();
    let connected = rx.iter().all(|&p| st.conns.recv[p].is_some()) && tx.iter().all(|&q| st.conns.send[q].is_some());
    let op = if d.coll.reduces() { d.op } else { ReduceOp::Sum };
    let sel = opts.algos.wire();
    let fp = Fingerprint { coll: d.coll, dtype: d.dtype, op, root: d.root, count: d.count, algo, sel };
    Ok(Taken { seq, fp, sched, connected })
}

/// One op of a group, as communicator `ci` of its call: [`take`] under the lock (`check`: see
/// there), then its flight record and its state. Returns the op and whether every connection
/// it needs exists.
#[allow(clippy::too_many_arguments)]
fn prepare_op<'a>(
    c: &Communicator,
    ci: usize,
    check: bool,
    d: OpDesc,
    opts: CallOptions,
    mem: OpMem<'a>,
    algo: crate::schedule::Algo,
    now: Instant,
) -> Result<(OpRun<'a>, bool)> {
    let sh = &*c.sh;
    let t = take(sh, &mut sh.state.lock().unwrap(), check, &d, &opts, Some(algo))?;
    let mut run = OpRun::new(ci, sh.rank, sh.nranks, sh.comm_id, t.seq, t.fp, t.sched, mem);
    run.obs = crate::exec::Observe::new(now, opts.profiler_tag);
    sh.record(&mut run);
    Ok((run, t.connected))
}

/// Connect what `runs` need, all communicators phase by phase: publish, connect, accept.
pub(crate) fn connect(comms: &[&Communicator], runs: &[OpRun<'_>]) -> Result<()> {
    let shareds: Vec<&Shared> = comms.iter().map(|c| &*c.sh).collect();
    let mut setups: Vec<Setup<'_>> = shareds
        .iter()
        .enumerate()
        .map(|(ci, sh)| {
            let (rx, tx) = crate::exec::peers_of(runs.iter().filter(|r| r.comm == ci));
            let mine: Vec<&OpRun<'_>> = runs.iter().filter(|r| r.comm == ci).collect();
            let doing = match mine.as_slice() {
                [one] if !matches!(one.fp.coll, Coll::Send | Coll::Recv) => Some((one.seq, one.fp)),
                _ => None,
            };
            Setup::new(sh, &rx, &tx, doing)
        })
        .collect();
    let phased = (|| -> Result<()> {
        setups.iter_mut().try_for_each(|s| s.publish())?;
        setups.iter_mut().try_for_each(|s| s.connect())?;
        setups.iter_mut().try_for_each(|s| s.accept())
    })();
    drop(setups);
    if let Err(e) = phased {
        let e = e.with_op("connection setup");
        for sh in &shareds {
            sh.set_error(e.clone());
        }
        return Err(e);
    }
    Ok(())
}

/// The schedule of `key` on this rank: the last call's (the common case: the same call again),
/// else the communicator's cache, else built and cached.
fn cached_schedule(
    sh: &Shared,
    st: &mut crate::runtime::State,
    key: crate::runtime::SchedKey,
) -> Arc<crate::schedule::Schedule> {
    if let Some((_, s)) = st.last_sched.as_ref().filter(|(k, _)| *k == key) {
        return s.clone();
    }
    let s = match st.sched_cache.get(&key) {
        Some(s) => s.clone(),
        None => {
            let (coll, count, root, chunk, avg, algo) = key;
            let params = Params { coll, nranks: sh.nranks, rank: sh.rank, count, root, chunk, avg, algo };
            let s = Arc::new(build_on(&params, &sh.host_of));
            // (clean peers for the straggler window, and where sending by reference pays)
            s.find_peer_facts(&params, &|q| build_on(q, &sh.host_of));
            if st.sched_cache.len() >= 256 {
                st.sched_cache.clear();
            }
            st.sched_cache.insert(key, s.clone());
            s
        }
    };
    st.last_sched = Some((key, s.clone()));
    s
}
