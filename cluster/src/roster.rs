//! Who the members are right now: the applied Raft membership (the truth
//! after formation: it carries members added, removed and re-addressed by
//! `ctl members`), falling back to the bootstrap list (`[[cluster.members]]`)
//! for a member the applied membership does not hold yet (before
//! formation, or a configured learner not yet added).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::types::alias::RaftMetrics;
use crate::types::Member;
use crate::view::NodeId;

#[derive(Clone)]
pub(crate) struct Roster {
    bootstrap: Arc<BTreeMap<NodeId, Member>>,
    metrics: watch::Receiver<RaftMetrics>,
}

impl Roster {
    pub fn new(
        bootstrap: Arc<BTreeMap<NodeId, Member>>,
        metrics: watch::Receiver<RaftMetrics>,
    ) -> Self {
        Self { bootstrap, metrics }
    }

    /// The member's record: the applied membership's, else the bootstrap
    /// list's.
    pub fn get(&self, id: NodeId) -> Option<Member> {
        let applied = self
            .metrics
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .cloned();
        applied.or_else(|| self.bootstrap.get(&id).cloned())
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.get(id).is_some()
    }

    /// The bootstrap list, as configured.
    pub fn bootstrap(&self) -> &BTreeMap<NodeId, Member> {
        &self.bootstrap
    }
}
