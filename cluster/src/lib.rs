//! zonegate's control plane: the identities of zones and nodes, and the
//! immutable [`ClusterView`] the data plane reads on every request.
//!
//! The Raft group that issues versioned decisions lands here with the
//! control-plane issue; until then every node publishes the initial view
//! (decision version 0, every zone active) and nothing changes it.

pub mod view;

pub use view::{ClusterView, NodeId, ZoneId, ZoneStatus};
