//! The one table of operations and algorithms: names, wire codes, buffer shapes.

/// The operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coll {
    /// AllReduce
    AllReduce,
    /// AllGather
    AllGather,
    /// ReduceScatter
    ReduceScatter,
    /// Broadcast
    Broadcast,
    /// Reduce
    Reduce,
    /// AllToAll
    AllToAll,
    /// Gather
    Gather,
    /// Scatter
    Scatter,
    /// Send (point to point)
    Send,
    /// Recv (point to point)
    Recv,
}

impl Coll {
    /// Every operation, in declaration order (`Coll::ALL[c as usize] == c`).
    pub const ALL: [Coll; 10] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::Send,
        Coll::Recv,
    ];
    /// The collectives (every operation but send and recv).
    pub const COLLECTIVES: [Coll; 8] = {
        let a = Coll::ALL;
        [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]
    };

    /// Name used in messages and tables.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reducescatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Send => "send",
            Coll::Recv => "recv",
        }
    }
    /// The operation named `name` ([`Coll::name`]), if any.
    pub fn from_name(name: &str) -> Option<Coll> {
        [Coll::Send, Coll::Recv].into_iter().chain(Coll::COLLECTIVES).find(|c| c.name() == name)
    }
    /// The name a frame's `call` word shows for this operation: both sides of a point-to-point
    /// transfer carry the same code, so they read "send/recv".
    pub fn wire_name(self) -> &'static str {
        if matches!(self, Coll::Send | Coll::Recv) {
            "send/recv"
        } else {
            self.name()
        }
    }
    /// The operation of wire code `code` ([`Coll::Send`] for point to point).
    pub fn from_code(code: u32) -> Option<Coll> {
        [Coll::Send].into_iter().chain(Coll::COLLECTIVES).find(|c| c.code() == code)
    }
    pub(crate) fn code(self) -> u32 {
        match self {
            Coll::AllReduce => 1,
            Coll::AllGather => 2,
            Coll::ReduceScatter => 3,
            Coll::Broadcast => 4,
            Coll::Reduce => 5,
            Coll::AllToAll => 6,
            Coll::Gather => 7,
            Coll::Scatter => 8,
            // both sides of a point-to-point transfer carry the same code
            Coll::Send | Coll::Recv => 9,
        }
    }
    /// Whether it combines values with a reduction op.
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    /// Whether `root` is meaningful (`peer` for point to point).
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter | Coll::Send | Coll::Recv)
    }
    /// Elements of (input, output) buffers on `rank`, in NCCL's count convention.
    pub fn buffer_counts(self, nranks: usize, rank: usize, count: usize, root: usize) -> (usize, usize) {
        let is_root = rank == root;
        match self {
            Coll::AllReduce | Coll::Broadcast => (count, count),
            Coll::Reduce => (count, if is_root { count } else { 0 }),
            Coll::AllGather => (count, nranks * count),
            Coll::ReduceScatter => (nranks * count, count),
            Coll::AllToAll => (nranks * count, nranks * count),
            Coll::Gather => (count, if is_root { nranks * count } else { 0 }),
            Coll::Scatter => (if is_root { nranks * count } else { 0 }, count),
            Coll::Send => (count, 0),
            Coll::Recv => (0, count),
        }
    }
}

/// Algorithms for the reducing collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Pipelined ring (chain for reduce): bandwidth-optimal, 2(n-1) steps.
    Ring,
    /// Recursive doubling (all-reduce only; other operations use the ring): log2(n) steps of
    /// whole messages, for small messages.
    RecursiveDoubling,
    /// Deterministic: every element is reduced in rank order 0, 1, ..., n-1 by its owner
    /// (all-reduce, reduce-scatter, reduce), whatever the chunk size.
    Ordered,
    /// Hierarchical all-reduce: reduce inside each host (shared memory), all-reduce among the
    /// hosts' leaders (network), broadcast inside each host. Needs the host layout
    /// (the schedules are built with the host layout).
    Hierarchical,
    /// Double binary tree all-reduce: each half of the buffer is reduced up one balanced binary
    /// tree and broadcast back down it, pipelined by chunk; the second tree is the first shifted
    /// by one rank, so most leaves of one tree are inner nodes of the other.
    Tree,
    /// Rabenseifner all-reduce: reduce-scatter by recursive halving, then all-gather by
    /// recursive doubling (log2 n steps each, bandwidth-optimal), for medium messages.
    Rabenseifner,
    /// Star all-reduce: every rank sends to rank 0, which combines in rank order and sends the
    /// result back; two dependent hand-offs at any rank count, for tiny messages on a host with
    /// more ranks than cores.
    Star,
}

impl Algo {
    /// Name used by `OXCCL_ALGO` and logs.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "recdouble",
            Algo::Ordered => "ordered",
            Algo::Hierarchical => "hierarchical",
            Algo::Tree => "tree",
            Algo::Rabenseifner => "rabenseifner",
            Algo::Star => "star",
        }
    }

    /// Every algorithm, in wire-code order.
    pub const ALL: [Algo; 7] = [
        Algo::Ring,
        Algo::RecursiveDoubling,
        Algo::Ordered,
        Algo::Hierarchical,
        Algo::Tree,
        Algo::Rabenseifner,
        Algo::Star,
    ];

    /// Code carried in the `call` word (3 bits).
    pub(crate) fn code(self) -> u32 {
        self.index() as u32
    }

    /// Position in [`Algo::ALL`].
    pub fn index(self) -> usize {
        Algo::ALL.iter().position(|a| *a == self).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_round_trips_through_its_name_and_wire_code() {
        let all = [Coll::Send, Coll::Recv].into_iter().chain(Coll::COLLECTIVES);
        for c in all {
            assert_eq!(Coll::from_name(c.name()), Some(c));
            let back = Coll::from_code(c.code()).unwrap();
            assert_eq!(back.wire_name(), c.wire_name());
        }
        assert_eq!(Coll::from_name("sendrecv"), None);
        assert_eq!(Coll::from_code(0), None);
        assert_eq!(Coll::from_code(15), None);
        for (i, a) in Algo::ALL.iter().enumerate() {
            assert_eq!(a.index(), i);
            assert_eq!(a.code(), i as u32);
        }
    }
}
