//! The CPUs a rank may run on, which its peer info carries so that the ranks of one machine can
//! count the cores they share: binding each rank to a core of its own (mpirun's
//! `--bind-to core`, `taskset`, SLURM's `--cpu-bind`) leaves every process one CPU, and that
//! alone must not read as an oversubscribed machine.
//!
//! Lists are in the kernel's notation (`0-3,8`), as `/proc/<pid>/status` writes them.

/// The most CPUs a list may name (a bound against a malformed range such as `0-4294967295`).
pub const MAX_CPUS: u32 = 1 << 16;

/// Parse a CPU list (`0-3,8,10-11`; the empty string is the empty list) into sorted, distinct
/// CPU numbers. `None` when it is malformed or names more than [`MAX_CPUS`] CPUs.
pub fn parse_list(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let c = part.parse::<u32>().ok()?;
                (c, c)
            }
        };
        if lo > hi || hi >= MAX_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Write sorted, distinct CPU numbers as a CPU list, runs collapsed into ranges.
pub fn format_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j > i {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        } else {
            out.push_str(&cpus[i].to_string());
        }
        i = j + 1;
    }
    out
}

/// The CPUs the calling thread may run on (its affinity, from `/proc/thread-self/status`);
/// empty where the kernel does not say.
pub fn allowed() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(parse_list).unwrap_or_default()
}

/// The calling process's CPU quota in whole CPUs where it is tighter than its affinity (a
/// cgroup's `cpu.max`, which std's `available_parallelism` reads); 0: none known.
pub fn quota(allowed: &[u32]) -> u32 {
    let parallel = std::thread::available_parallelism().map_or(0, |p| p.get());
    if parallel > 0 && parallel < allowed.len() {
        parallel as u32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_format_in_the_kernels_notation() {
        assert_eq!(parse_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list("5,1,1-2"), Some(vec![1, 2, 5]));
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_list(&[7]), "7");
        assert_eq!(format_list(&[]), "");
        for s in ["0-3,8,10-11", "1", "0,2,4", "3-4,6-9"] {
            assert_eq!(format_list(&parse_list(s).unwrap()), s);
        }
    }

    #[test]
    fn malformed_lists_are_refused() {
        for s in ["x", "3-1", "1-", "-2", "0-4294967295", "1,,a", "65536"] {
            assert_eq!(parse_list(s), None, "{s}");
        }
    }

    #[test]
    fn this_thread_may_run_somewhere() {
        let cpus = allowed();
        assert!(!cpus.is_empty(), "Cpus_allowed_list is in every Linux status file");
        let parallel = std::thread::available_parallelism().unwrap().get();
        assert!(cpus.len() >= parallel, "{cpus:?} against {parallel}");
    }
}
