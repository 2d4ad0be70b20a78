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
    pub list: Vec<usize>,
    pub bound: bool,
    pub algo: Option<String>,
    pub device: bool,
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

fn usage() -> String {
    "usage: oxccl-perf [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP] [-c 0|1]\n\
     \x20                 [-o sum|prod|min|max|avg|premulsum|all] [-d TYPE|all] [-r ROOT|all]\n\
     \x20                 [--coll allreduce|allgather|reducescatter|broadcast|reduce|alltoall|gather|scatter|sendrecv|all]\n\
     \x20                 [-s SIZE,SIZE,...] [--np N] [--hosts H] [--netns NS1,NS2,...]\n\
     \x20                 [--algo ring|recdouble|...] [--bound] [--device]"
        .into()
}

pub fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        min: 8,
        max: 64 << 20,
        factor: 2,
        step: 0,
        iters: 20,
        warmup: 5,
        check: false,
        ops: vec!["sum".into()],
        types: vec![DataType::F32],
        roots: None,
        colls: vec!["allreduce"],
        np: None,
        hosts: 1,
        netns: vec![],
        list: vec![],
        bound: false,
        algo: None,
        device: false,
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
            "-g" | "-t" | "-p" | "-a" | "-m" | "-z" | "-G" | "-C" | "-u" => {
                let _ = val()?; // nccl-tests flags with no meaning here
            }
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown flag {other:?}\n{}", usage())),
        }
        i += 1;
    }
    if o.min == 0 || o.max < o.min || (o.factor < 2 && o.step == 0) || o.iters == 0 || o.hosts == 0 {
        return Err(format!("bad size range or factors\n{}", usage()));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes;

    fn p(s: &str) -> Result<Opts, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
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
