//! A network you can cut: which directed node pairs drop their Raft RPCs.
//! In-process cluster tests share one table between all nodes' clients.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;
use crate::view::NodeId;

/// Directed links that drop traffic. A blocked `(from, to)` makes every RPC
/// `from` sends to `to` fail as unreachable; responses travel on the same
/// connection, so blocking both directions cuts the pair completely.
#[derive(Debug, Default)]
pub struct FaultTable {
    blocked: Mutex<HashSet<(NodeId, NodeId)>>,
}

impl FaultTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn blocked(&self) -> MutexGuard<'_, HashSet<(NodeId, NodeId)>> {
        lock(&self.blocked)
    }

    /// Drop traffic from `from` to `to` (one direction).
    pub fn block(&self, from: NodeId, to: NodeId) {
        self.blocked().insert((from, to));
    }

    /// Cut the cluster into groups: nodes in different groups cannot talk.
    pub fn partition(&self, groups: &[&[NodeId]]) {
        let mut blocked = self.blocked();
        for (i, a) in groups.iter().enumerate() {
            for (j, b) in groups.iter().enumerate() {
                if i != j {
                    for &x in a.iter() {
                        for &y in b.iter() {
                            blocked.insert((x, y));
                        }
                    }
                }
            }
        }
    }

    /// Cut `node` off from every node in `others`, both directions.
    pub fn isolate(&self, node: NodeId, others: &[NodeId]) {
        let mut blocked = self.blocked();
        for &o in others.iter().filter(|&&o| o != node) {
            blocked.insert((node, o));
            blocked.insert((o, node));
        }
    }

    /// Restore every link.
    pub fn heal(&self) {
        self.blocked().clear();
    }

    /// Whether RPCs from `from` to `to` are dropped.
    pub fn is_blocked(&self, from: NodeId, to: NodeId) -> bool {
        self.blocked().contains(&(from, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_cuts_across_groups_only() {
        let t = FaultTable::new();
        t.partition(&[&[1], &[2, 3]]);
        assert!(t.is_blocked(1, 2) && t.is_blocked(3, 1));
        assert!(!t.is_blocked(2, 3));
        t.heal();
        assert!(!t.is_blocked(1, 2));
    }

    #[test]
    fn isolate_cuts_both_directions() {
        let t = FaultTable::new();
        t.isolate(2, &[1, 2, 3]);
        assert!(t.is_blocked(2, 1) && t.is_blocked(1, 2) && t.is_blocked(3, 2));
        assert!(!t.is_blocked(1, 3) && !t.is_blocked(2, 2));
    }
}
