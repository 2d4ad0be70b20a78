//! Hierarchical all-reduce: inside each host, among the hosts' leaders, inside each host again.

use super::*;

/// Hierarchical all-reduce for a host layout (`host_of[r]` = host index of rank r): the ranks of
/// each host, in rank order, form a group whose first rank is the host's leader.
/// 1. reduce inside the group to the leader (chain), into the output buffer;
/// 2. the leaders all-reduce the output buffer among themselves (ring);
/// 3. broadcast inside the group from the leader (chain).
///
/// Each phase is an ordinary schedule built on the group's own rank numbering and remapped to
/// communicator ranks; phases 2 and 3 read the output buffer. Other operations, and layouts with
/// one host or one rank per host, get the ring.
pub(super) fn hierarchical(p: &Params, host_of: &[usize]) -> Schedule {
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
