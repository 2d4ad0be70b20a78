//! `oxccl-perf`: oxccl's benchmark, speaking nccl-tests' flags and table.
//!
//! ```text
//! oxccl-perf                                   # 2 local ranks, allreduce, 8 B .. 64 MiB
//! oxccl-perf --np 4 --coll all -d all -o all -b 1 -e 1M -f 16 -c 1
//! oxccl-perf --np 5 --hosts 2 ...              # ranks spread over 2 host ids (TCP between)
//! torchrun --nproc-per-node 2 oxccl-perf ...   # or mpirun -np 2 oxccl-perf ...
//! ```
//! Flags: `-b` min bytes, `-e` max bytes, `-f` step factor, `-i` step bytes, `-n` iterations,
//! `-w` warmup iterations, `-c` check (0/1), `-o` op (`sum|prod|min|max|avg|premulsum|all`),
//! `-d` type (`float|half|bfloat16|...|all`), `-r` root (or `all`), `--coll`
//! (`allreduce|allgather|reducescatter|broadcast|reduce|alltoall|gather|scatter|sendrecv|all`),
//! `--np N`, `--hosts H`. Sizes take K/M/G suffixes. The exit status is non-zero if any result
//! is wrong or any operation fails.

#![forbid(unsafe_code)]

use oxccl::exact::{coll_input, count_wrong, expected_output, premul_two};
use oxccl::schedule::inplace_layout;
use oxccl::{Coll, Communicator, DataType, OpDesc, OpMem, ReduceOp, UniqueId};
use std::process::ExitCode;

mod analyze;
mod args;
mod device;
mod launch;
mod watch;
use analyze::analyze;
use args::{parse, Opts, Parsed};
use device::DevCtx;
use launch::launch;
use std::time::Instant;

fn coll_of(name: &str) -> Coll {
    Coll::from_name(name).unwrap_or(Coll::Send) // "sendrecv": a send and a receive each
}

/// nccl-tests' bus bandwidth factor.
fn bus_factor(name: &str, n: usize) -> f64 {
    let n = n as f64;
    match name {
        "allreduce" => 2.0 * (n - 1.0) / n,
        "allgather" | "reducescatter" | "alltoall" | "gather" | "scatter" => (n - 1.0) / n,
        _ => 1.0,
    }
}

fn op_of(name: &str, dt: DataType) -> ReduceOp {
    match name {
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        "premulsum" | "mulsum" => premul_two(dt),
        _ => ReduceOp::Sum,
    }
}

struct Result1 {
    us: f64,
    wrong: usize,
}

/// nccl-tests' timing: `warmup` runs, a barrier, then the mean over `iters` runs, in µs.
/// `settle` runs after the warm-up and after the timed runs (device mode: synchronise the stream,
/// so enqueued work is counted); host runs complete in the call and pass a no-op.
fn timed(
    c: &Communicator,
    o: &Opts,
    mut run: impl FnMut() -> oxccl::Result<()>,
    settle: impl Fn() -> oxccl::Result<()>,
) -> oxccl::Result<f64> {
    for _ in 0..o.warmup {
        run()?;
    }
    settle()?;
    c.barrier()?;
    let t = Instant::now();
    let delay = o.delay.filter(|d| d.0 == c.rank()).map(|d| d.1);
    for _ in 0..o.iters {
        if let Some(d) = delay {
            std::thread::sleep(d); // --delay: a straggler on purpose
        }
        run()?;
    }
    settle()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / o.iters as f64)
}

/// Time `iters` runs of one operation and optionally check one more run.
#[allow(clippy::too_many_arguments)]
fn bench_one(
    c: &Communicator,
    o: &Opts,
    name: &str,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    root: usize,
    inplace: bool,
) -> oxccl::Result<Option<Result1>> {
    let (n, r) = (c.size(), c.rank());
    let es = dt.size();
    if name == "sendrecv" {
        if inplace {
            return Ok(None);
        }
        let input = coll_input(Coll::Send, dt, op, n, r, count, r, 1);
        let mut out = vec![0u8; count * es];
        let run = |out: &mut [u8]| -> oxccl::Result<()> {
            let mut g = oxccl::Group::new();
            g.add(
                c,
                OpDesc { coll: Coll::Send, dtype: dt, op: ReduceOp::Sum, count, root: (r + 1) % n },
                OpMem::Split { input: &input, output: &mut [] },
            )?;
            g.add(
                c,
                OpDesc { coll: Coll::Recv, dtype: dt, op: ReduceOp::Sum, count, root: (r + n - 1) % n },
                OpMem::Split { input: &[], output: out },
            )?;
            g.run()
        };
        let us = timed(c, o, || run(&mut out), || Ok(()))?;
        let mut wrong = 0;
        if o.check {
            out.fill(0);
            run(&mut out)?;
            wrong = count_wrong(dt, &out, &coll_input(Coll::Send, dt, op, n, (r + n - 1) % n, count, 0, 1));
        }
        return Ok(Some(Result1 { us, wrong }));
    }
    let coll = coll_of(name);
    let desc = OpDesc { coll, dtype: dt, op, count, root };
    let input = coll_input(coll, dt, op, n, r, count, root, 1);
    let (ni, no) = coll.buffer_counts(n, r, count, root);
    let layout = inplace_layout(coll, n, r, count, root);
    if inplace && layout.is_none() {
        return Ok(None);
    }
    let mut a = vec![0u8; if inplace { layout.unwrap().2 * es } else { ni * es }];
    let mut b = vec![0u8; if inplace { 0 } else { no * es }];
    let fill = |a: &mut Vec<u8>| {
        if inplace {
            let io = layout.unwrap().0 * es;
            a.fill(0);
            a[io..io + input.len()].copy_from_slice(&input);
        } else {
            a.copy_from_slice(&input);
        }
    };
    fill(&mut a);
    let run = |a: &mut Vec<u8>, b: &mut Vec<u8>| -> oxccl::Result<()> {
        let mem = if inplace {
            let (io, oo, _) = layout.unwrap();
            OpMem::InPlace { buf: a, in_off: io * es, out_off: oo * es }
        } else {
            OpMem::Split { input: a, output: b }
        };
        c.run(desc, mem)
    };
    let us = timed(c, o, || run(&mut a, &mut b), || Ok(()))?;
    let mut wrong = 0;
    if o.check {
        fill(&mut a);
        b.fill(0);
        run(&mut a, &mut b)?;
        let want = expected_output(coll, dt, op, n, r, count, root, 1);
        let got = if inplace {
            let oo = layout.unwrap().1 * es;
            &a[oo..oo + want.len()]
        } else {
            &b[..want.len()]
        };
        wrong = count_wrong(dt, got, &want);
    }
    Ok(Some(Result1 { us, wrong }))
}

/// [`bench_one`] on host buffers, or its device twin.
#[allow(clippy::too_many_arguments)]
fn bench_any(
    c: &Communicator,
    o: &Opts,
    dev: Option<&DevCtx>,
    name: &str,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    root: usize,
    inplace: bool,
) -> oxccl::Result<Option<Result1>> {
    match dev {
        None => bench_one(c, o, name, dt, op, count, root, inplace),
        Some(d) => device::bench_device(d, c, o, name, dt, op, count, root, inplace),
    }
}

/// Average of `x` over ranks (nccl-tests averages times across ranks) and the sum of wrongs.
/// The row's time from every rank's (nccl-tests' `-a`: 0 rank 0's, 1 the mean, 2 the
/// minimum, 3 the maximum) and the total of wrong elements.
fn combine_ranks(c: &Communicator, us: f64, wrong: usize, average: u8) -> oxccl::Result<(f64, usize)> {
    let mut t = [us];
    let us = match average {
        0 => {
            c.broadcast(&mut t, 0)?;
            t[0]
        }
        2 => {
            c.all_reduce_inplace(&mut t, ReduceOp::Min)?;
            t[0]
        }
        3 => {
            c.all_reduce_inplace(&mut t, ReduceOp::Max)?;
            t[0]
        }
        _ => {
            c.all_reduce_inplace(&mut t, ReduceOp::Sum)?;
            t[0] / c.size() as f64
        }
    };
    let mut w = [wrong as u64];
    c.all_reduce_inplace(&mut w, ReduceOp::Sum)?;
    Ok((us, w[0] as usize))
}

/// Memcpy bandwidth (bytes read + written per second) at `bytes`, measured by every rank at
/// the same time (so ranks share the memory system as they do in the collective).
fn memcpy_bw(c: &Communicator, bytes: usize) -> oxccl::Result<f64> {
    let bytes = bytes.max(64);
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let reps = ((256usize << 20) / bytes).clamp(3, 20000);
    c.barrier()?;
    let t = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
    }
    let bw = 2.0 * bytes as f64 * reps as f64 / t.elapsed().as_secs_f64();
    std::hint::black_box(&dst);
    let mut m = [bw];
    c.all_reduce_inplace(&mut m, ReduceOp::Min)?;
    Ok(m[0])
}

/// The memory-traffic ceiling of busbw (docs/algorithms.md): each rank must at least read its
/// input and write its output once; at the memcpy bandwidth of this size that takes
/// `(in + out) / bw`.
fn bound_busbw(name: &str, n: usize, total: usize, bw: f64) -> f64 {
    let (inb, outb) = match name {
        "allgather" => (total / n, total),
        "reducescatter" => (total, total / n),
        "gather" | "scatter" => (total / n, total / n),
        _ => (total, total),
    };
    let t = (inb + outb) as f64 / bw;
    total as f64 / t / 1e9 * bus_factor(name, n)
}

fn sizes(o: &Opts) -> Vec<usize> {
    if !o.list.is_empty() {
        return o.list.clone();
    }
    let mut v = vec![];
    let mut s = o.min;
    while s <= o.max {
        v.push(s);
        s = if o.step > 0 { s + o.step } else { s * o.factor };
    }
    v
}

/// The running totals of a table: wrong results, and the bus bandwidths of the non-empty rows.
#[derive(Default)]
struct Totals {
    wrong: usize,
    bw_sum: f64,
    bw_n: usize,
}

fn run_rank(c: &Communicator, o: &Opts, dev: Option<&DevCtx>) -> oxccl::Result<usize> {
    let (n, lead) = (c.size(), c.rank() == 0);
    let mut t = Totals::default();
    if lead {
        print_preamble(c, o);
    }
    for name in &o.colls {
        let coll = coll_of(name);
        if lead {
            print_table_header(name);
        }
        let ops: Vec<String> = if coll.reduces() { o.ops.clone() } else { vec!["none".into()] };
        for root in roots_of(coll, name, o, n) {
            if root >= n {
                return Err(oxccl::Error::invalid_argument(format!("root {root} out of range")));
            }
            for &dt in &o.types {
                for opname in &ops {
                    for size in sizes(o) {
                        run_row(c, o, dev, (name, coll, root, dt, opname), size, &mut t)?;
                    }
                }
            }
        }
    }
    let mut mem = [c.memory_bytes() as u64];
    c.all_reduce_inplace(&mut mem, ReduceOp::Max)?;
    if lead {
        println!(
            "# Connection memory    : {:.2} MiB per communicator (largest rank: shm rings owned + socket buffers)",
            mem[0] as f64 / (1 << 20) as f64
        );
        println!("# Out of bounds values : 0 OK");
        println!("# Avg bus bandwidth    : {:.4}", if t.bw_n > 0 { t.bw_sum / t.bw_n as f64 } else { 0.0 });
        if let Some(d) = dev {
            println!("# Device worker phases : {} (this rank, mean per operation, warm-ups included)", d.phases());
        }
        println!("#");
        if t.wrong > 0 {
            println!("# {} wrong results: FAILED", t.wrong);
        }
    }
    Ok(t.wrong)
}

/// The roots a rooted collective runs with (`-r`), or just 0.
fn roots_of(coll: Coll, name: &str, o: &Opts, n: usize) -> Vec<usize> {
    if !coll.rooted() || name == "sendrecv" {
        return vec![0];
    }
    match &o.roots {
        Some(v) if v.is_empty() => (0..n).collect(),
        Some(v) => v.clone(),
        None => vec![0],
    }
}

/// nccl-tests' preamble: the settings, then every rank.
fn print_preamble(c: &Communicator, o: &Opts) {
    println!("# oxccl-perf {} (nccl-tests compatible table)", env!("CARGO_PKG_VERSION"));
    println!(
        "# nranks {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} validation: {}",
        c.size(),
        o.min,
        o.max,
        if o.step > 0 { o.step } else { o.factor },
        if o.step > 0 { "bytes" } else { "factor" },
        o.warmup,
        o.iters,
        o.check as u8
    );
    println!("#");
    println!("# Using devices");
    for p in c.peers() {
        println!("#  Rank {:2} Pid {:6} on {:>10} host {:016x} cpu", p.rank, p.pid, p.hostname, p.host_id);
    }
    if launch::bound_core().is_some() {
        println!("#  Ranks bound to cores (--bind); rank 0 runs on cores {:?}", launch::allowed_cpus());
    }
    println!("#");
}

/// The column headers of one collective's table.
fn print_table_header(name: &str) {
    println!("# Collective: {name}");
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
}

/// One row: `size` bytes of (collective, root, type, op), out of place then in place.
fn run_row(
    c: &Communicator,
    o: &Opts,
    dev: Option<&DevCtx>,
    (name, coll, root, dt, opname): (&str, Coll, usize, DataType, &str),
    size: usize,
    t: &mut Totals,
) -> oxccl::Result<()> {
    let (n, lead) = (c.size(), c.rank() == 0);
    let tty = lead && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let op = op_of(opname, dt);
    let es = dt.size();
    // per-rank counts for the collectives nccl-tests sizes by total bytes
    let per_rank = matches!(name, "allgather" | "reducescatter" | "alltoall" | "gather" | "scatter");
    let count = if per_rank { size / es / n } else { size / es };
    let total = if per_rank { count * n * es } else { count * es };
    let mut cols = String::new();
    // on a terminal, the row being measured (a row of --coll all -d all can take seconds);
    // erased when the row is printed
    if tty {
        print!("\r# measuring {name} {} {opname} {total} B ...\x1b[K", dt.name());
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    let mut busbws = [None, None]; // out of place, in place
    for inplace in [false, true] {
        match bench_any(c, o, dev, name, dt, op, count, root, inplace)? {
            Some(res) => {
                let (us, wrong) = combine_ranks(c, res.us, res.wrong, o.average)?;
                let algbw = total as f64 / us / 1e3;
                let busbw = algbw * bus_factor(name, n);
                busbws[inplace as usize] = Some(busbw);
                t.wrong += wrong;
                if total > 0 {
                    t.bw_sum += busbw;
                    t.bw_n += 1;
                }
                let w = if o.check { wrong.to_string() } else { "N/A".into() };
                cols += &format!("  {us:7.2}  {algbw:6.2}  {busbw:6.2}  {w:>6}");
            }
            None => cols += &format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A"),
        }
    }
    if o.bound {
        let bound = bound_busbw(name, n, total, memcpy_bw(c, total)?);
        // the fraction of the ceiling each half reaches
        let pct =
            |b: Option<f64>| b.filter(|_| bound > 0.0).map_or("N/A".into(), |b| format!("{:.0}%", 100.0 * b / bound));
        cols += &format!("  bound {bound:6.2}  {:>4}  {:>4}", pct(busbws[0]), pct(busbws[1]));
    }
    if tty {
        print!("\r\x1b[K");
    }
    if lead {
        let root_col = if coll.rooted() && name != "sendrecv" { root as i64 } else { -1 };
        println!("{total:12}  {:12}  {:>8}  {:>6}  {root_col:6}{cols}", total / es, dt.name(), opname);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--status") {
        return watch::status(args.get(1).map(String::as_str));
    }
    if args.first().map(String::as_str) == Some("--analyze") {
        return match args.get(1) {
            Some(d) => analyze(d),
            None => {
                eprintln!("usage: oxccl-perf --analyze DIR");
                ExitCode::from(2)
            }
        };
    }
    let o = match parse(&args) {
        Ok(Parsed::Run(o)) => *o,
        Ok(Parsed::Help) => {
            println!("{}", args::help());
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!("oxccl-perf {} (nccl-tests' flags and table)", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return ExitCode::from(2);
        }
    };
    let under_launcher = std::env::var("OXCCL_PERF_ID").is_ok();
    if let Err(e) = launch::bind_self() {
        eprintln!("oxccl-perf: {e}");
        return ExitCode::FAILURE;
    }
    let env_launch = oxccl::bootstrap::env_rank_size().is_ok();
    if let Some(t) = o.timeout {
        std::env::set_var("OXCCL_TIMEOUT", t.to_string());
    }
    let warn = || {
        for w in &o.warnings {
            eprintln!("{w}");
        }
    };
    if !under_launcher && (o.np.is_some() || !env_launch) {
        // local launch; everything stays on loopback unless told otherwise
        if std::env::var("NCCL_SOCKET_IFNAME").is_err() && std::env::var("OXCCL_SOCKET_IFNAME").is_err() {
            std::env::set_var("OXCCL_SOCKET_IFNAME", "lo");
        }
        warn();
        let np = o.np.unwrap_or(2);
        let code = launch(np, o.hosts, (&o.netns, o.pidns), o.id_file.as_deref(), o.bind, &args);
        if let Some(file) = &o.trace {
            if let Err(e) = watch::merge(file, np) {
                eprintln!("oxccl-perf: writing the trace {file}: {e}");
                return ExitCode::FAILURE;
            }
        }
        return code;
    }
    if let Some(a) = &o.algo {
        std::env::set_var("OXCCL_ALGO", a);
    }
    let t_init = Instant::now();
    let comm = if under_launcher {
        let id = UniqueId::from_hex(&std::env::var("OXCCL_PERF_ID").unwrap());
        let rank = std::env::var("OXCCL_PERF_RANK").ok().and_then(|v| v.parse().ok());
        let n = std::env::var("OXCCL_PERF_NRANKS").ok().and_then(|v| v.parse().ok());
        match (id, rank, n) {
            (Ok(id), Some(rank), Some(n)) => Communicator::init(&id, n, rank),
            _ => Err(oxccl::Error::invalid_argument("bad OXCCL_PERF_* environment")),
        }
    } else {
        Communicator::from_env()
    };
    let init_ms = t_init.elapsed().as_secs_f64() * 1e3;
    let comm = match comm {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxccl-perf: init failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !under_launcher && comm.rank() == 0 {
        warn();
    }
    let mut t = [init_ms];
    if comm.all_reduce_inplace(&mut t, ReduceOp::Max).is_ok() && comm.rank() == 0 {
        println!("# Init time            : {:.1} ms (slowest of {} ranks)", t[0], comm.size());
    }
    let comm = std::sync::Arc::new(comm);
    let dev = if o.device {
        match DevCtx::new(&comm, &o) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("oxccl-perf: --device: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if o.trace.is_some() {
        oxccl::watch::trace::enable();
    }
    let res = run_rank(&comm, &o, dev.as_ref());
    if let Some(file) = &o.trace {
        if let Err(e) = watch::write_part(file, &comm) {
            eprintln!("oxccl-perf: writing this rank's trace: {e}");
        }
    }
    match res {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_match_nccl_tests() {
        assert_eq!(bus_factor("allreduce", 4), 1.5);
        assert_eq!(bus_factor("allgather", 4), 0.75);
        assert_eq!(bus_factor("broadcast", 4), 1.0);
        assert_eq!(bus_factor("sendrecv", 4), 1.0);
    }
}
