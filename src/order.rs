//! Connection order: which queued operations may move now.
//!
//! Operations that share a connection (one communicator, one direction, one peer) use it in the
//! order they were queued: an operation may move once it is first in line on every connection it
//! uses. [`Order`] keeps one line per connection, so queueing, the question "who may move" and
//! retiring cost time in the number of connections an operation uses, never in the number of
//! operations queued before it (a group of 100,000 operations is linear, not quadratic).

use std::collections::{BTreeSet, HashMap, VecDeque};

/// One connection: communicator index, direction (`true`: sending), peer.
type Lane = (usize, bool, usize);

/// The lines of queued operations, by connection. Ids are the caller's, increasing in queue
/// order ([`Order::push`] checks it).
#[derive(Default)]
pub(crate) struct Order {
    lines: HashMap<Lane, VecDeque<u64>>,
    /// Per queued operation: its connections, and on how many of them it is not yet first.
    ops: HashMap<u64, (Vec<Lane>, usize)>,
    /// Operations first in every line they are in, in queue order.
    ready: BTreeSet<u64>,
    last: Option<u64>,
}

impl Order {
    /// Queue operation `id` of communicator `comm`, which receives from `rx` and sends to `tx`.
    pub fn push(&mut self, id: u64, comm: usize, rx: &[usize], tx: &[usize]) {
        debug_assert!(self.last.is_none_or(|l| id > l), "ids must increase");
        self.last = Some(id);
        let lanes: Vec<Lane> =
            rx.iter().map(|&p| (comm, false, p)).chain(tx.iter().map(|&q| (comm, true, q))).collect();
        let mut behind = 0;
        for l in &lanes {
            let line = self.lines.entry(*l).or_default();
            behind += usize::from(!line.is_empty());
            line.push_back(id);
        }
        if behind == 0 {
            self.ready.insert(id);
        }
        self.ops.insert(id, (lanes, behind));
    }

    /// The operations that may move now, in queue order.
    pub fn ready(&self) -> impl Iterator<Item = u64> + '_ {
        self.ready.iter().copied()
    }

    /// Operation `id` no longer uses its connections (it finished, or failed): the next in each
    /// of its lines may move once first everywhere. Unknown ids are ignored.
    pub fn retire(&mut self, id: u64) {
        let Some((lanes, _)) = self.ops.remove(&id) else { return };
        self.ready.remove(&id);
        for l in lanes {
            let Some(line) = self.lines.get_mut(&l) else { continue };
            if line.front() == Some(&id) {
                line.pop_front();
                if let Some(&next) = line.front() {
                    let e = self.ops.get_mut(&next).expect("a queued op is known");
                    e.1 -= 1;
                    if e.1 == 0 {
                        self.ready.insert(next);
                    }
                }
            } else if let Some(at) = line.iter().position(|&x| x == id) {
                // retired out of turn (a failure): the line's head is unchanged
                line.remove(at);
            }
            if line.is_empty() {
                self.lines.remove(&l);
            }
        }
    }

    /// Number of queued operations.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_waits_for_every_earlier_op_on_its_connections_and_only_those() {
        let mut o = Order::default();
        o.push(0, 0, &[1], &[1]); // ring with peer 1
        o.push(1, 0, &[1], &[]); // receives from 1: behind 0
        o.push(2, 0, &[2], &[2]); // other peer: free
        o.push(3, 1, &[1], &[1]); // other communicator: free
        o.push(4, 0, &[], &[1]); // sends to 1: behind 0 only (1 only receives)
        o.push(5, 0, &[], &[]); // no connection: free
        assert_eq!(o.ready().collect::<Vec<_>>(), [0, 2, 3, 5]);
        o.retire(0);
        assert_eq!(o.ready().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        o.retire(9); // unknown: ignored
        for id in [1, 2, 3, 4, 5] {
            o.retire(id);
        }
        assert_eq!(o.len(), 0);
        assert!(o.lines.is_empty());
    }

    #[test]
    fn a_failed_op_retired_out_of_turn_leaves_the_line_to_its_head() {
        let mut o = Order::default();
        for id in 0..3 {
            o.push(id, 0, &[1], &[1]);
        }
        o.retire(1);
        assert_eq!(o.ready().collect::<Vec<_>>(), [0]);
        o.retire(0);
        assert_eq!(o.ready().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn matches_the_pairwise_rule_on_random_queues() {
        // the rule it replaces: an op may move iff no earlier queued op shares a line with it
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m) as usize
        };
        for _ in 0..200 {
            let mut o = Order::default();
            let mut queued: Vec<(u64, usize, Vec<usize>, Vec<usize>)> = vec![];
            for id in 0..12u64 {
                let (c, rx, tx) =
                    (rnd(2), (0..rnd(3)).map(|_| rnd(4)).collect(), (0..rnd(3)).map(|_| rnd(4)).collect());
                let (mut rx, mut tx): (Vec<usize>, Vec<usize>) = (rx, tx);
                rx.sort_unstable();
                rx.dedup();
                tx.sort_unstable();
                tx.dedup();
                o.push(id, c, &rx, &tx);
                queued.push((id, c, rx, tx));
            }
            while !queued.is_empty() {
                let want: Vec<u64> = (0..queued.len())
                    .filter(|&i| {
                        let (_, c, rx, tx) = &queued[i];
                        !queued[..i].iter().any(|(_, c2, rx2, tx2)| {
                            c2 == c && (rx2.iter().any(|p| rx.contains(p)) || tx2.iter().any(|p| tx.contains(p)))
                        })
                    })
                    .map(|i| queued[i].0)
                    .collect();
                assert_eq!(o.ready().collect::<Vec<_>>(), want);
                let pick = want[rnd(want.len() as u64)];
                o.retire(pick);
                queued.retain(|q| q.0 != pick);
            }
        }
    }
}
