//! zonegate's control plane: the Raft group whose leader issues versioned
//! zone decisions, the replicated [`ClusterState`] every node applies in
//! order, and the immutable [`ClusterView`] the data plane reads.
//!
//! Entry point: [`ClusterNode::start`]. Pure cores: [`state`] (decisions and
//! safety rules) and [`command`] (what a log entry carries). The map and
//! invariants are in the `cluster/` section of the repository's
//! ARCHITECTURE.md.

pub mod budget;
mod clock;
pub mod codec;
pub mod command;
pub mod detect;
pub mod failover;
#[doc(hidden)]
pub mod fuzzing;
pub mod handover;
mod identity;
mod lock;
pub mod members;
pub mod network;
pub mod node;
mod prevote;
pub mod propose;
pub mod quota;
mod roster;
#[cfg(test)]
mod samples;
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod sim;
pub mod state;
pub mod store;
pub mod types;
pub mod view;
mod zone;

pub use command::{
    AutoLimits, Command, Decision, Origin, Outcome, RejectRule, Rejection, Response,
};
pub use detect::{
    failover_target, Evidence, FailoverConfig, FailoverConfigError, PeriodScore, Report,
    ScoreWeights, TenantDemand, ZoneHealth, ZoneObservation,
};
pub use failover::{DemandSource, FailoverStatus, ObservationSource, ReportAck};
pub use handover::Handover;
pub use members::{MemberChange, MemberInfo, MemberRefusal, MemberRule};
pub use network::FaultTable;
pub use node::{
    Applied, ClusterConfig, ClusterError, ClusterNode, ClusterStatus, Fatal, MemberChangeError,
    MemberStatus, ProposeError, RaftListen, Timing, FATAL_REASONS,
};
pub use propose::Unconfirmed;
pub use quota::{Limits, Priority, TenantQuota, Unit};
pub use state::{
    config_digest, ClusterState, ConfigRecord, DecisionRecord, Preview, ZoneChange, ZoneControl,
    CONFIG_HISTORY_LIMIT, HISTORY_LIMIT,
};
pub use types::{Member, Role, TypeConfig};
pub use view::{Automation, ClusterView, NodeId, ZoneId, ZoneStatus};
