//! Live status through the bootstrap store: each rank's record, and the job's verdict.
//!
//! Keys: `oxccl/status/comms` counts the communicators that published, `oxccl/status/comms/<k>`
//! names each (store prefix, id, and every rank's host and pid), and `<prefix>/status/<rank>` is
//! a rank's latest record (lines of `key value`, see [`RankStatus`]).

use crate::store::Store;
use crate::{Error, Result};
use std::fmt::Write;
use std::time::Duration;

/// The key counting the communicators registered for status.
pub(crate) const COMMS: &str = "oxccl/status/comms";

/// The operation a rank is in, as its record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// Its sequence number.
    pub seq: u64,
    /// What it is: `allreduce (float, 4 MiB)`.
    pub op: String,
    /// How long it had run when published.
    pub for_ms: u64,
    /// The peers it waited for.
    pub waiting_for: Vec<usize>,
}

/// One rank's status record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankStatus {
    /// The rank.
    pub rank: usize,
    /// Its host and process (from the communicator's registration).
    pub host: String,
    /// Its process id.
    pub pid: u64,
    /// When it published (Unix ms); `None`: it never did.
    pub time_ms: Option<u64>,
    /// The last operation it completed: sequence number and call.
    pub last: Option<(u64, String)>,
    /// The operation it was in.
    pub running: Option<Running>,
    /// Its first error.
    pub error: Option<String>,
    /// Its lateness view: (peer, last, observed, median lag µs).
    pub late: Vec<(usize, u64, u64, u64)>,
}

impl RankStatus {
    /// The record as stored.
    pub fn encode(&self) -> String {
        let mut s = format!("oxccl-status 1\nrank {}\ntime_ms {}\n", self.rank, self.time_ms.unwrap_or(0));
        if let Some((seq, op)) = &self.last {
            let _ = writeln!(s, "last {seq} {}", one_line(op));
        }
        if let Some(r) = &self.running {
            let peers: Vec<String> = r.waiting_for.iter().map(|p| p.to_string()).collect();
            let peers = if peers.is_empty() { "-".to_string() } else { peers.join(",") };
            let _ = writeln!(s, "running {} {} {peers} {}", r.seq, r.for_ms, one_line(&r.op));
        }
        if let Some(e) = &self.error {
            let _ = writeln!(s, "error {}", one_line(e));
        }
        for (p, last, seen, us) in &self.late {
            let _ = writeln!(s, "late {p} {last} {seen} {us}");
        }
        s
    }

    /// Read a record ([`RankStatus::encode`]); host and pid come from elsewhere.
    pub fn parse(text: &str) -> Result<RankStatus> {
        let bad = |what: &str| Error::remote(format!("malformed status record: {what}"));
        let mut lines = text.lines();
        if lines.next() != Some("oxccl-status 1") {
            return Err(bad("no version line"));
        }
        let mut r = RankStatus::default();
        for l in lines {
            let (k, v) = l.split_once(' ').unwrap_or((l, ""));
            let num = |x: Option<&str>| x.and_then(|x| x.parse::<u64>().ok()).ok_or_else(|| bad(l));
            match k {
                "rank" => r.rank = num(Some(v))? as usize,
                "time_ms" => r.time_ms = Some(num(Some(v))?),
                "last" => {
                    let (seq, op) = v.split_once(' ').ok_or_else(|| bad(l))?;
                    r.last = Some((num(Some(seq))?, op.to_string()));
                }
                "running" => {
                    let mut f = v.splitn(4, ' ');
                    let (seq, ms) = (num(f.next())?, num(f.next())?);
                    let peers = f.next().ok_or_else(|| bad(l))?;
                    let waiting_for = match peers {
                        "-" => vec![],
                        p => p.split(',').map(|x| num(Some(x)).map(|x| x as usize)).collect::<Result<_>>()?,
                    };
                    let op = f.next().unwrap_or("").to_string();
                    r.running = Some(Running { seq, op, for_ms: ms, waiting_for });
                }
                "error" => r.error = Some(v.to_string()),
                "late" => {
                    let f: Vec<u64> = v.split(' ').map(|x| num(Some(x))).collect::<Result<_>>()?;
                    if let [p, last, seen, us] = f[..] {
                        r.late.push((p as usize, last, seen, us));
                    }
                }
                _ => {} // newer fields
            }
        }
        Ok(r)
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// A communicator's registration: its store prefix, id and every rank's host and pid.
pub(crate) fn registration(prefix: &str, comm: u64, peers: &[(String, u64)]) -> String {
    let mut s = format!("{prefix}\n{comm:016x}\n");
    for (host, pid) in peers {
        let _ = writeln!(s, "{}\t{pid}", one_line(host));
    }
    s
}

/// One communicator's status.
#[derive(Debug, Clone)]
pub struct CommStatus {
    /// Its store prefix.
    pub prefix: String,
    /// Its id.
    pub comm: String,
    /// Every rank's record (`time_ms` `None` for a rank that published none).
    pub ranks: Vec<RankStatus>,
}

/// Every registered communicator's status in a store.
#[derive(Debug, Clone)]
pub struct JobStatus {
    /// The communicators, in the order they registered.
    pub comms: Vec<CommStatus>,
}

/// Read every communicator's status from `store` (each read bounded by `timeout`).
pub fn read_job(store: &dyn Store, timeout: Duration) -> Result<JobStatus> {
    let n = store.add(COMMS, 0)?;
    let mut comms = vec![];
    for k in 1..=n {
        let reg = String::from_utf8_lossy(&store.get(&format!("{COMMS}/{k}"), timeout)?).into_owned();
        let mut lines = reg.lines();
        let (Some(prefix), Some(comm)) = (lines.next(), lines.next()) else {
            return Err(Error::remote(format!("malformed status registration {k}")));
        };
        let mut ranks = vec![];
        for (r, l) in lines.enumerate() {
            let (host, pid) = l.split_once('\t').unwrap_or((l, "0"));
            let key = format!("{prefix}/status/{r}");
            let mut st = match store.check(std::slice::from_ref(&key))? {
                true => RankStatus::parse(&String::from_utf8_lossy(&store.get(&key, timeout)?))?,
                false => RankStatus::default(),
            };
            st.rank = r;
            st.host = host.to_string();
            st.pid = pid.parse().unwrap_or(0);
            ranks.push(st);
        }
        comms.push(CommStatus { prefix: prefix.to_string(), comm: comm.to_string(), ranks });
    }
    Ok(JobStatus { comms })
}

/// Connect to a running job's store and read every communicator's status. `spec`: a unique id
/// in hex (`OXCCL_UNIQUE_ID`; the store it names is authenticated, and encrypted when `cfg`'s
/// encryption is on, as the job's must be) or `HOST:PORT` of a plain store (torchrun's c10d
/// store, or the one `MASTER_ADDR`/`MASTER_PORT` name).
pub fn job_status(spec: &str, cfg: &crate::Config) -> Result<JobStatus> {
    use crate::store::TcpStore;
    let spec = spec.trim();
    let store = match crate::UniqueId::from_hex(spec) {
        Ok(id) => {
            let master = cfg.encryption.master(&id.secret())?;
            TcpStore::connect_sealed(id.addr()?, Some(id.secret()), master, Duration::from_secs(5))?
        }
        Err(_) => {
            use std::net::ToSocketAddrs;
            let addr = spec
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| Error::invalid_argument(format!("{spec:?} is neither a unique id nor HOST:PORT")))?;
            TcpStore::connect(addr, None, Duration::from_secs(5))?
        }
    };
    read_job(&store, Duration::from_secs(5))
}

/// `[0-4, 6, 7]`.
pub fn ranges(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = vec![];
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => ranks[i].to_string(),
            1 => format!("{}, {}", ranks[i], ranks[j]),
            _ => format!("{}-{}", ranks[i], ranks[j]),
        });
        i = j + 1;
    }
    format!("[{}]", parts.join(", "))
}

/// A record older than the newest of its communicator by more than this is stale: its rank
/// stopped publishing (stopped, hung, paused) while the others went on.
pub const STALE: Duration = Duration::from_secs(3);

impl CommStatus {
    /// Who waits for whom: `ranks [5] have not reached allreduce #1203; ranks [0-4, 6, 7] wait
    /// for them`. The ranks in a long operation (with a fresh record) wait; the ranks they wait
    /// for that are not themselves waiting are named, by what their own record says.
    pub fn verdict(&self) -> String {
        let newest = self.ranks.iter().filter_map(|r| r.time_ms).max().unwrap_or(0);
        let fresh = |r: &RankStatus| r.time_ms.is_some_and(|t| t + STALE.as_millis() as u64 >= newest);
        let waiting: Vec<&RankStatus> = self.ranks.iter().filter(|r| fresh(r) && r.running.is_some()).collect();
        if waiting.is_empty() {
            return "no rank is in a long operation".into();
        }
        let waiters: Vec<usize> = waiting.iter().map(|r| r.rank).collect();
        // per awaited rank: the earliest operation a waiter waits for it in
        let mut awaited: std::collections::BTreeMap<usize, &Running> = Default::default();
        for x in waiting.iter().filter_map(|r| r.running.as_ref()) {
            for &p in x.waiting_for.iter().filter(|p| !waiters.contains(p)) {
                let e = awaited.entry(p).or_insert(x);
                if x.seq < e.seq {
                    *e = x;
                }
            }
        }
        let name = |x: &Running| format!("{} #{}", x.op.split(' ').next().unwrap_or("operation"), x.seq);
        if awaited.is_empty() {
            let x = waiting[0].running.as_ref().unwrap();
            return format!("ranks {} are in {} and wait for each other (a wait inside it)", ranges(&waiters), name(x));
        }
        // (phrase, ranks, the earliest operation they are awaited in)
        let mut groups: Vec<(&str, Vec<usize>, &Running)> = vec![];
        for (p, x) in awaited {
            let r = self.ranks.get(p);
            let phrase = match r {
                Some(r) if fresh(r) => "have not reached",
                Some(RankStatus { running: Some(_), .. }) => "stopped reporting in",
                _ => "report nothing and have not completed their part of",
            };
            match groups.iter_mut().find(|g| g.0 == phrase) {
                Some(g) => {
                    g.1.push(p);
                    if x.seq < g.2.seq {
                        g.2 = x;
                    }
                }
                None => groups.push((phrase, vec![p], x)),
            }
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|(phrase, ranks, x)| {
                let why = match *phrase {
                    "have not reached" => "",
                    "stopped reporting in" => " (stopped, hung or paused)",
                    _ => " (stopped, hung, or busy outside oxccl)",
                };
                format!("ranks {} {phrase} {}{why}", ranges(ranks), name(x))
            })
            .collect();
        format!("{}; ranks {} wait for them", parts.join("; "), ranges(&waiters))
    }

    /// Every rank's lateness view added up: the straggler of the communicator, if any.
    pub fn straggler(&self) -> Option<super::Straggler> {
        super::lateness::added_up(self.ranks.len(), self.ranks.iter().map(|r| r.late.as_slice())).straggler()
    }
}

impl std::fmt::Display for CommStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "communicator {} ({} ranks, store prefix {})", self.comm, self.ranks.len(), self.prefix)?;
        let newest = self.ranks.iter().filter_map(|r| r.time_ms).max().unwrap_or(0);
        for r in &self.ranks {
            write!(f, "  rank {:<3} {} pid {}: ", r.rank, r.host, r.pid)?;
            let Some(t) = r.time_ms else {
                writeln!(f, "no status published (no long operation yet, or stopped before reporting)")?;
                continue;
            };
            match &r.running {
                Some(x) => write!(
                    f,
                    "in {} #{} for {:.1} s, waiting for ranks {}",
                    x.op,
                    x.seq,
                    x.for_ms as f64 / 1e3,
                    ranges(&x.waiting_for)
                )?,
                None => write!(f, "not in a long operation")?,
            }
            if let Some((seq, op)) = &r.last {
                write!(f, "; last completed #{seq} {op}")?;
            }
            if newest >= t + 1000 {
                write!(f, "; reported {:.1} s before the newest", (newest - t) as f64 / 1e3)?;
            }
            if let Some(e) = &r.error {
                write!(f, "; error: {e}")?;
            }
            writeln!(f)?;
        }
        writeln!(f, "  verdict: {}", self.verdict())?;
        if let Some(s) = self.straggler() {
            writeln!(f, "  straggler: {s} (all ranks' views)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(r: usize, t: u64, running: Option<(u64, &[usize])>) -> RankStatus {
        RankStatus {
            rank: r,
            host: "h".into(),
            pid: 10 + r as u64,
            time_ms: Some(t),
            last: Some((4, "allreduce(type=float, count=4)".into())),
            running: running.map(|(seq, w)| Running {
                seq,
                op: "allreduce (float, 4 MiB)".into(),
                for_ms: 2500,
                waiting_for: w.to_vec(),
            }),
            error: None,
            late: vec![],
        }
    }

    #[test]
    fn records_round_trip() {
        let mut r = rank(3, 1234, Some((7, &[1, 2])));
        r.error = Some("boom\nsecond line".into());
        r.late = vec![(2, 91, 100, 14000)];
        let back = RankStatus::parse(&r.encode()).unwrap();
        assert_eq!(back.running, r.running);
        assert_eq!(back.error.as_deref(), Some("boom second line"));
        assert_eq!((back.rank, back.time_ms, back.late.clone(), back.last.clone()), (3, Some(1234), r.late, r.last));
        assert!(RankStatus::parse("nonsense").is_err());
        assert!(RankStatus::parse("oxccl-status 1\nrunning x y").is_err());
    }

    #[test]
    fn the_verdict_names_the_rank_the_others_wait_for() {
        let t = 100_000;
        let mut ranks: Vec<RankStatus> = (0..8).map(|r| rank(r, t, Some((7, &[5])))).collect();
        ranks[5] = RankStatus { rank: 5, ..Default::default() };
        ranks[6].running.as_mut().unwrap().waiting_for = vec![5];
        ranks[7].running.as_mut().unwrap().waiting_for = vec![6];
        let c = CommStatus { prefix: "p".into(), comm: "c".into(), ranks };
        assert_eq!(
            c.verdict(),
            "ranks [5] report nothing and have not completed their part of allreduce #7 (stopped, hung, or busy \
             outside oxccl); ranks [0-4, 6, 7] wait for them"
        );
        // a rank whose fresh record says it is elsewhere has not reached it
        let mut ranks = c.ranks.clone();
        ranks[5] = rank(5, t, None);
        let c = CommStatus { ranks, ..c };
        assert_eq!(c.verdict(), "ranks [5] have not reached allreduce #7; ranks [0-4, 6, 7] wait for them");
        // a rank in the operation whose record went stale stopped in it
        let mut ranks = c.ranks.clone();
        ranks[5] = rank(5, t - 10_000, Some((7, &[4])));
        let c = CommStatus { ranks, ..c };
        assert_eq!(
            c.verdict(),
            "ranks [5] stopped reporting in allreduce #7 (stopped, hung or paused); ranks [0-4, 6, 7] wait for them"
        );
        let quiet = CommStatus { ranks: (0..2).map(|r| rank(r, t, None)).collect(), ..c };
        assert_eq!(quiet.verdict(), "no rank is in a long operation");
        assert_eq!(ranges(&[0, 1, 2, 3, 4, 6, 7, 9]), "[0-4, 6, 7, 9]");
    }

    #[test]
    fn every_view_adds_up_to_one_straggler() {
        let mut ranks: Vec<RankStatus> = (0..4).map(|r| rank(r, 1, None)).collect();
        ranks[0].late = vec![(3, 95, 100, 5000)];
        ranks[1].late = vec![(0, 2, 100, 300)];
        ranks[2].late = vec![(1, 0, 100, 0)];
        let c = CommStatus { prefix: "p".into(), comm: "c".into(), ranks };
        let s = c.straggler().unwrap();
        assert_eq!((s.rank, s.last, s.observed), (3, 95, 100));
    }
}
