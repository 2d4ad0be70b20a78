//! Where the bootstrap store of a launched job is, when `MASTER_ADDR` is not set.
//!
//! Under Open MPI, MPICH (Hydra) or Slurm with every rank on one node the store is on loopback.
//! Across nodes it is on the node of rank 0, where the launcher says which that is (Slurm: the
//! first node of the step's node list, or the node `srun` ran on); otherwise the error says what
//! to export. The port is `MASTER_PORT`, or one derived from the launcher's job id, so two jobs
//! on one node do not collide on a fixed port.

use crate::config::env_any;
use crate::{Error, Result};

/// A store address: host, port, and where they came from (for logs and errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// What chose them, e.g. "MASTER_ADDR" or "Open MPI, one node".
    pub source: String,
}

/// What a launcher's environment says about the job.
struct Launch {
    who: &'static str,
    /// Nodes the job's ranks span (`None`: unknown).
    nodes: Option<usize>,
    /// A job id, the same on every rank (for the port).
    job: Option<String>,
    /// The host of rank 0, where the launcher exports it.
    rank0_host: Option<String>,
}

fn num(name: &str) -> Option<usize> {
    env_any(&[name]).and_then(|v| v.trim().parse().ok())
}

fn detect() -> Option<Launch> {
    if let Some(size) = num("OMPI_COMM_WORLD_SIZE") {
        let local = num("OMPI_COMM_WORLD_LOCAL_SIZE");
        let job = env_any(&["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"]);
        return Some(Launch { who: "Open MPI", nodes: local.map(|l| size.div_ceil(l.max(1))), job, rank0_host: None });
    }
    if let Some(ntasks) = num("SLURM_NTASKS").or_else(|| num("SLURM_NPROCS")) {
        let nodes = num("SLURM_STEP_NUM_NODES").or_else(|| num("SLURM_NNODES")).or_else(|| num("SLURM_JOB_NUM_NODES"));
        let job =
            env_any(&["SLURM_JOB_ID"]).map(|j| format!("{j}.{}", env_any(&["SLURM_STEP_ID"]).unwrap_or_default()));
        let first =
            env_any(&["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]).and_then(|l| first_host(&l));
        let rank0_host = first.or_else(|| env_any(&["SLURM_LAUNCH_NODE_IPADDR"]));
        let _ = ntasks;
        return Some(Launch { who: "Slurm", nodes, job, rank0_host });
    }
    if let Some(size) = num("PMI_SIZE") {
        let local = num("MPI_LOCALNRANKS");
        // Hydra exports no job id; on one node every rank is a child of the same proxy
        let job = env_any(&["PMI_KVSNAME", "PMI_JOBID"])
            .or_else(|| Some(format!("hydra-proxy-{}", std::os::unix::process::parent_id())));
        return Some(Launch { who: "MPICH", nodes: local.map(|l| size.div_ceil(l.max(1))), job, rank0_host: None });
    }
    None
}

/// The first host of a Slurm host list (`node[01-04,07],gpu3` gives `node01`).
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find(',').unwrap_or(list.len());
    let open = list.find('[');
    let host = match open {
        Some(o) if o < end => {
            let close = list[o..].find(']')? + o;
            let inner = &list[o + 1..close];
            let first = inner.split([',', '-']).next()?;
            format!("{}{first}", &list[..o])
        }
        _ => list[..end].to_string(),
    };
    (!host.is_empty()).then_some(host)
}

/// A port in 20000..32000 from the job id (FNV-1a), the same on every rank of the job. Below
/// Linux's ephemeral range (32768..61000): there, the local end of any outgoing connection can
/// hold the port, which makes the bind fail while nothing listens.
fn port_of(job: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in job.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    20000 + (h % 12000) as u16
}

/// The store address for a job launched without `MASTER_ADDR`/`NCCL_COMM_ID`, or with them.
pub fn master() -> Result<Master> {
    let port_env = env_any(&["MASTER_PORT"]);
    let parse_port = |p: &str| {
        p.trim().parse::<u16>().map_err(|_| Error::invalid_argument(format!("MASTER_PORT={p:?} is not a port")))
    };
    if let Some(host) = env_any(&["MASTER_ADDR"]) {
        let port = match &port_env {
            Some(p) => parse_port(p)?,
            None => 29500,
        };
        return Ok(Master { host, port, source: "MASTER_ADDR".into() });
    }
    let Some(l) = detect() else {
        return Err(Error::invalid_usage(
            "MASTER_ADDR is not set and no launcher was recognised: export MASTER_ADDR=<host of rank 0> and \
             MASTER_PORT=<a free port> on every rank (or run under torchrun, mpirun or srun)",
        ));
    };
    let port = match (&port_env, &l.job) {
        (Some(p), _) => parse_port(p)?,
        (None, Some(j)) => port_of(j),
        (None, None) => 29500,
    };
    match (l.nodes, l.rank0_host) {
        (Some(1), _) => {
            Ok(Master { host: "127.0.0.1".into(), port, source: format!("{}, every rank on one node", l.who) })
        }
        (_, Some(h)) => Ok(Master { host: h, port, source: format!("{}, the node of rank 0", l.who) }),
        (nodes, None) => Err(Error::invalid_usage(format!(
            "MASTER_ADDR is not set and the ranks of this {} job span {} nodes, but the launcher does not say which \
             node rank 0 runs on: export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<a free port> to every rank \
             (with Open MPI: mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...)",
            l.who,
            nodes.map_or("several".to_string(), |n| n.to_string())
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_host("node[01-04,07],gpu3").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu3,node[1-2]").as_deref(), Some("gpu3"));
        assert_eq!(first_host("a-b-c").as_deref(), Some("a-b-c"));
        assert_eq!(first_host("rack[7]").as_deref(), Some("rack7"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("x[1-"), None);
    }

    #[test]
    fn ports_are_stable_and_in_range() {
        assert_eq!(port_of("1234.0"), port_of("1234.0"));
        assert_ne!(port_of("1234.0"), port_of("1235.0"));
        for j in ["", "a", "job-77", "999999.12"] {
            assert!((20000..32000).contains(&port_of(j)));
        }
    }
}
