//! `oxccl-perf`'s command line: nccl-tests' flags, and oxccl's own.

use oxccl::DataType;

#[derive(Debug, Clone)]
pub struct Opts {
    pub min: usize,
    pub max: usize,
    pub factor: usize,
    pub step: usize,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub ops: Vec<String>,
    pub types: Vec<DataType>,
    pub roots: Option<Vec<usize>>,
    pub colls: Vec<&'static str>,
    pub np: Option<usize>,
    pub hosts: usize,
    pub netns: Vec<String>,
    pub pidns: bool,
    /// `--bind`: whether the local launcher binds each rank to a core of its own.
    pub bind: Bind,
    pub list: Vec<usize>,
    pub bound: bool,
    pub algo: Option<String>,
    pub device: bool,
    /// nccl-tests' `-a`: how ranks' times combine (0 rank 0, 1 mean, 2 min, 3 max).
    pub average: u8,
    /// Warnings about accepted flags that change nothing here (printed by rank 0).
    pub warnings: Vec<String>,
    /// nccl-tests' `-T`: bound every wait by this many seconds (`OXCCL_TIMEOUT`).
    pub timeout: Option<u64>,
    /// `--trace FILE`: write a Chrome trace of every rank's operations and steps.
    pub trace: Option<String>,
    /// `--id-file FILE`: the launcher writes the job's unique id there (for `--status`).
    pub id_file: Option<String>,
    /// `--delay RANK:MS`: that rank sleeps this long before each timed operation.
    pub delay: Option<(usize, std::time::Duration)>,
}

/// How the local launcher places ranks on cores (`--bind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Each rank to a core of its own when there are as many cores as ranks, else free (Open
    /// MPI's `mpirun` binds 2 ranks to cores by default, more ranks to sockets).
    Auto,
    /// Each rank to one core, round robin over the cores this process may use.
    Core,
    /// Leave placement to the kernel (the default: on these 2-core machines binding made TCP
    /// 64 KiB faster but 1–64 MiB and shared-memory 8 B slower, bench/ANALYSIS.md).
    None,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// Run the benchmark.
    Run(Box<Opts>),
    /// Print the help (exit 0).
    Help,
    /// Print the version (exit 0).
    Version,
}

pub const ALL_COLLS: [&str; 9] =
    ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "gather", "scatter", "sendrecv"];

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|_| format!("bad size {s:?}"))
}

/// The short usage line of error messages.
pub fn usage() -> String {
    "usage: oxccl-perf [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP] [-c 0|1] [--coll ...] \
     [--np N] ... (oxccl-perf --help for every flag)"
        .into()
}

/// `--help`: every flag with its default.
pub fn help() -> String {
    const HELP: &str = r#"oxccl-perf {}: oxccl's benchmark, with nccl-tests' flags and table

usage: oxccl-perf [FLAGS]                       2 local ranks (processes) unless a launcher started it
       mpirun -np N oxccl-perf [FLAGS]          or srun, or torchrun --no-python, or RANK/WORLD_SIZE/MASTER_*
       oxccl-perf --analyze DIR                 explain the flight records (OXCCL_DUMP_DIR) of a failed job
       oxccl-perf --status [ID|@FILE|HOST:PORT] every rank of a running job: its operation, what it waits
                                                for, the verdict and the straggler (default: OXCCL_UNIQUE_ID)

sizes (K, M, G suffixes):
  -b, --minbytes N       smallest size                                  default 8
  -e, --maxbytes N       largest size                                   default 64M
  -f, --stepfactor N     multiply the size by N each row                default 2
  -i, --stepbytes N      add N bytes each row instead
  -s, --sizes A,B,...    exactly these sizes
what runs:
  --coll NAME[,NAME]     allreduce allgather reducescatter broadcast reduce alltoall gather scatter
                         sendrecv, or all                               default allreduce
  -d, --datatype T       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 e4m3 e5m2,
                         or all                                         default float
  -o, --op OP            sum prod min max avg premulsum, or all         default sum
  -r, --root R           root of rooted collectives, or all             default 0
  --algo A               allowed all-reduce algorithms (OXCCL_ALGO syntax: ring, recdouble, rabenseifner,
                         tree, hierarchical, star, ^excluded)           default: the tuner
  --device               device (GPU) buffers, with memcpy/kernel bandwidth
timing and checking:
  -n, --iters N          timed iterations per row                       default 20
  -w, --warmup_iters N   untimed iterations first                       default 5
  -c, --check 0|1        check every result bit for bit                 default 1
  -a, --average 0|1|2|3  time of rank 0, mean, min or max over ranks    default 1 (mean)
  --bound                add each size's memory-traffic ceiling (from a memcpy measured in the run)
ranks (local launch):
  --np N                 N local ranks                                  default 2
  --hosts H              spread them over H host ids (shared memory inside, TCP between)  default 1
  --netns NS1,NS2,...    run them in these network namespaces, as separate hosts (root)
  --pidns                with --netns, one rank per namespace, each in its own pid namespace too
                         (no rank can see another's process, as on separate machines)
  --id-file FILE         write the job's unique id there (for oxccl-perf --status @FILE)
  --bind none|core|auto  bind each rank to a core of its own: core always (round robin), auto
                         when there are as many cores as ranks (mpirun does for 2)  default none
watching:
  --trace FILE           write a Chrome trace (JSON) of every rank's operations and steps
  --delay RANK:MS        that rank sleeps MS before each timed operation (a straggler on purpose)
other:
  -h, --help             this help
  --version              the version

nccl-tests flags oxccl-perf does not need: -t and -g (threads and GPUs per process) must be 1 (use
--np for more ranks); -m (aggregated ops) must be 1; -G (CUDA graph launches) must be 0; -p, -z, -C,
-R and -u are accepted and warned about; -T N bounds every wait by N seconds (OXCCL_TIMEOUT). Table columns: out-of-place then in-place time (us),
algbw (bytes / time) and busbw (algbw x nccl-tests' factor) in GB/s, #wrong (N/A without -c 1).
The exit status is non-zero if any result is wrong or any operation fails."#;
    HELP.replace("{}", env!("CARGO_PKG_VERSION"))
}

/// An nccl-tests flag that has no effect here: refused when its value would change what is
/// measured, warned about otherwise.
fn nccl_tests_flag(flag: &str, v: &str, o: &mut Opts) -> Result<(), String> {
    let n: i64 = v.trim().parse().map_err(|_| format!("{flag} {v:?} is not a number"))?;
    let refuse = |why: &str| Err(format!("{flag} {v}: {why}\n{}", usage()));
    match flag {
        "-t" | "--nthreads" if n != 1 => {
            refuse("oxccl-perf runs one rank per process, not threads; use --np for more local ranks")
        }
        "-g" | "--ngpus" if n != 1 => {
            refuse("oxccl-perf drives one GPU per rank; use --np (several ranks may share a GPU)")
        }
        "-m" | "--agg_iters" if n != 1 => refuse("aggregated operations per iteration are not supported (use 1)"),
        "-G" | "--cudagraph" if n != 0 => refuse("CUDA graph launches are not supported (use 0)"),
        "-t" | "--nthreads" | "-g" | "--ngpus" | "-m" | "--agg_iters" | "-G" | "--cudagraph" => Ok(()),
        _ => {
            o.warnings.push(format!("oxccl-perf: warning: {flag} {v} has no effect here"));
            Ok(())
        }
    }
}

/// Parse the command line.
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut o = Opts {
        min: 8,
        max: 64 << 20,
        factor: 2,
        step: 0,
        iters: 20,
        warmup: 5,
        check: true,
        ops: vec!["sum".into()],
        types: vec![DataType::F32],
        roots: None,
        colls: vec!["allreduce"],
        np: None,
        hosts: 1,
        netns: vec![],
        pidns: false,
        bind: Bind::None,
        list: vec![],
        bound: false,
        algo: None,
        device: false,
        average: 1,
        warnings: vec![],
        timeout: None,
        trace: None,
        id_file: None,
        delay: None,
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a, None),
        };
        let mut val = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i).cloned().ok_or_else(|| format!("{flag} needs a value\n{}", usage()))
        };
        match flag {
            "-b" | "--minbytes" => o.min = parse_size(&val()?)?,
            "-e" | "--maxbytes" => o.max = parse_size(&val()?)?,
            "-f" | "--stepfactor" => o.factor = val()?.parse().map_err(|_| "bad -f")?,
            "-i" | "--stepbytes" => o.step = parse_size(&val()?)?,
            "-n" | "--iters" => o.iters = val()?.parse().map_err(|_| "bad -n")?,
            "-w" | "--warmup_iters" => o.warmup = val()?.parse().map_err(|_| "bad -w")?,
            "-c" | "--check" => o.check = val()? != "0",
            "-o" | "--op" => {
                let v = val()?;
                o.ops = if v == "all" {
                    ["sum", "prod", "max", "min", "avg", "premulsum"].map(String::from).to_vec()
                } else {
                    if !["sum", "prod", "max", "min", "avg", "premulsum", "mulsum"].contains(&v.as_str()) {
                        return Err(format!("unknown op {v:?}"));
                    }
                    vec![v]
                }
            }
            "-d" | "--datatype" => {
                let v = val()?;
                o.types = if v == "all" {
                    DataType::ALL.to_vec()
                } else {
                    vec![DataType::parse(&v).ok_or_else(|| format!("unknown type {v:?}"))?]
                }
            }
            "-r" | "--root" => {
                let v = val()?;
                o.roots = if v == "all" { Some(vec![]) } else { Some(vec![v.parse().map_err(|_| "bad -r")?]) };
            }
            "--coll" => {
                let v = val()?;
                o.colls = if v == "all" {
                    ALL_COLLS.to_vec()
                } else {
                    let mut cs = vec![];
                    for c in v.split(',') {
                        cs.push(
                            *ALL_COLLS.iter().find(|x| **x == c).ok_or_else(|| format!("unknown collective {c:?}"))?,
                        );
                    }
                    cs
                }
            }
            "-s" | "--sizes" => {
                o.list = val()?.split(',').map(parse_size).collect::<Result<Vec<_>, _>>()?;
                if o.list.is_empty() {
                    return Err("empty -s list".into());
                }
            }
            "--bound" => o.bound = true,
            "--device" => o.device = true,
            "--algo" => o.algo = Some(val()?),
            "--np" => o.np = Some(val()?.parse().map_err(|_| "bad --np")?),
            "--hosts" => o.hosts = val()?.parse().map_err(|_| "bad --hosts")?,
            "--netns" => o.netns = val()?.split(',').map(String::from).filter(|s| !s.is_empty()).collect(),
            "--pidns" => o.pidns = true,
            "--bind" => {
                o.bind = match val()?.as_str() {
                    "auto" => Bind::Auto,
                    "core" => Bind::Core,
                    "none" => Bind::None,
                    b => return Err(format!("bad --bind {b}: auto, core or none")),
                }
            }
            "--trace" => o.trace = Some(val()?),
            "--id-file" => o.id_file = Some(val()?),
            "--delay" => {
                let v = val()?;
                let bad = || format!("--delay {v:?}: RANK:MS expected (rank 2 sleeps 5 ms before each timed op: 2:5)");
                let (r, ms) = v.split_once(':').ok_or_else(bad)?;
                let ms: f64 = ms.parse().ok().filter(|m: &f64| *m >= 0.0 && m.is_finite()).ok_or_else(bad)?;
                o.delay = Some((r.parse().map_err(|_| bad())?, std::time::Duration::from_secs_f64(ms / 1e3)));
            }
            "-a" | "--average" => {
                o.average = val()?.parse().ok().filter(|a| *a <= 3).ok_or("-a takes 0, 1, 2 or 3")?;
            }
            "-g" | "--ngpus" | "-t" | "--nthreads" | "-p" | "--parallel_init" | "-m" | "--agg_iters" | "-z"
            | "--blocking" | "-G" | "--cudagraph" | "-C" | "--report_cputime" | "-u" | "-R" | "--local_register" => {
                let v = val()?;
                nccl_tests_flag(flag, &v, &mut o)?;
            }
            "-T" | "--timeout" => {
                o.timeout = Some(val()?.parse().ok().filter(|t| *t > 0).ok_or("-T takes a number of seconds > 0")?);
            }
            "-h" | "--help" => return Ok(Parsed::Help),
            "-V" | "--version" => return Ok(Parsed::Version),
            other => return Err(format!("unknown flag {other:?}\n{}", usage())),
        }
        i += 1;
    }
    if o.min == 0 || o.max < o.min || (o.factor < 2 && o.step == 0) || o.iters == 0 || o.hosts == 0 {
        return Err(format!("bad size range or factors\n{}", usage()));
    }
    Ok(Parsed::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes;

    fn p(s: &str) -> Result<Opts, String> {
        match parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())? {
            Parsed::Run(o) => Ok(*o),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn help_version_and_nccl_tests_flags() {
        let a = |s: &str| parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>());
        assert!(matches!(a("-b 8 --help"), Ok(Parsed::Help)));
        assert!(matches!(a("-h"), Ok(Parsed::Help)));
        assert!(matches!(a("--version"), Ok(Parsed::Version)));
        assert!(help().contains("default 64M") && help().contains("-c, --check"));
        assert!(p("").unwrap().check, "results are checked by default, as in nccl-tests");
        assert!(!p("-c 0").unwrap().check);
        let e = p("-t 4").unwrap_err();
        assert!(e.contains("--np"), "{e}");
        assert!(p("-g 2").is_err() && p("-m 4").is_err() && p("-G 1").is_err() && p("-t x").is_err());
        assert!(p("-t 1 -g 1 -m 1 -G 0").unwrap().warnings.is_empty());
        let w = p("-p 1 -z 1 -C 1").unwrap().warnings;
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("-p 1 has no effect"), "{w:?}");
        assert_eq!(p("-a 3").unwrap().average, 3);
        assert!(p("-a 4").is_err());
        assert_eq!(p("-T 30").unwrap().timeout, Some(30));
    }

    #[test]
    fn flags() {
        let o = p("-b 1 -e 1M -f 16 -c 1 -o all -d all --coll all --np 3 --hosts 2").unwrap();
        assert_eq!((o.min, o.max, o.factor, o.check), (1, 1 << 20, 16, true));
        assert_eq!(o.ops.len(), 6);
        assert_eq!(o.types.len(), 12);
        assert_eq!(o.colls.len(), 9);
        assert_eq!((o.np, o.hosts), (Some(3), 2));
        assert_eq!(sizes(&o), vec![1, 16, 256, 4096, 65536, 1 << 20]);
        let d = p("").unwrap();
        assert_eq!((d.min, d.max, d.colls.clone()), (8, 64 << 20, vec!["allreduce"]));
        assert!(p("-b").is_err());
        assert!(p("-d quux").is_err());
        assert!(p("--coll nope").is_err());
        assert!(p("-b 2K -e 1K").is_err());
        assert_eq!(p("--coll=broadcast,reduce -r all").unwrap().colls, vec!["broadcast", "reduce"]);
        assert_eq!(sizes(&p("-s 8,4K,1M").unwrap()), vec![8, 4096, 1 << 20]);
    }
}
