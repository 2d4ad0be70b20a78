//! How many cores the ranks of one machine share, from the CPU affinities and quotas in their
//! peer info: more ranks than that makes the machine oversubscribed, where a waiting rank must
//! not spin (it would steal the core of the peer it waits for).

use oxccl_transport::PeerInfo;

/// The cores that the ranks of `peers` on rank `me`'s machine can run on together: the union of
/// their affinities, capped by the tightest CPU quota among them. A process's affinity alone is
/// not it: each rank bound to a core of its own sees one CPU. Where a rank's affinity is
/// unknown, this process's parallelism (`fallback`) stands in.
pub fn machine_cores(peers: &[PeerInfo], me: usize, fallback: usize) -> usize {
    let machine = peers[me].machine;
    let local: Vec<&PeerInfo> = peers.iter().filter(|p| p.machine == machine).collect();
    if local.iter().any(|p| p.cpus.is_empty()) {
        return fallback.max(1);
    }
    let mut all: Vec<u32> = local.iter().flat_map(|p| p.cpus.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    let quota = local.iter().map(|p| p.cpu_quota as usize).filter(|&q| q > 0).min();
    quota.map_or(all.len(), |q| q.min(all.len())).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: usize, machine: u64, cpus: &[u32], cpu_quota: u32) -> PeerInfo {
        PeerInfo {
            rank,
            host_id: machine,
            pid: 1,
            machine,
            hostname: "h".into(),
            ip: std::net::Ipv4Addr::LOCALHOST.into(),
            beacon: 0,
            cpus: cpus.to_vec(),
            cpu_quota,
        }
    }

    #[test]
    fn ranks_bound_to_cores_of_their_own_share_all_of_them() {
        let peers: Vec<PeerInfo> = (0..4).map(|r| peer(r, 1, &[r as u32], 0)).collect();
        assert_eq!(machine_cores(&peers, 2, 1), 4);
    }

    #[test]
    fn ranks_bound_to_one_core_share_one() {
        let peers: Vec<PeerInfo> = (0..4).map(|r| peer(r, 1, &[3], 0)).collect();
        assert_eq!(machine_cores(&peers, 0, 8), 1);
    }

    #[test]
    fn only_this_machines_ranks_count() {
        let peers = vec![peer(0, 1, &[0], 0), peer(1, 2, &[1], 0), peer(2, 1, &[0, 1], 0)];
        assert_eq!(machine_cores(&peers, 0, 9), 2);
        assert_eq!(machine_cores(&peers, 1, 9), 1);
    }

    #[test]
    fn the_tightest_quota_caps_the_union() {
        let peers = vec![peer(0, 1, &[0, 1, 2, 3], 3), peer(1, 1, &[0, 1, 2, 3], 2)];
        assert_eq!(machine_cores(&peers, 1, 9), 2);
        let loose = vec![peer(0, 1, &[0, 1], 6)];
        assert_eq!(machine_cores(&loose, 0, 9), 2);
    }

    #[test]
    fn an_unknown_affinity_falls_back_to_this_process() {
        let peers = vec![peer(0, 1, &[0], 0), peer(1, 1, &[], 0)];
        assert_eq!(machine_cores(&peers, 0, 6), 6);
        assert_eq!(machine_cores(&peers, 0, 0), 1);
    }
}
