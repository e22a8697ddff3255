//! The wire contract both sides of Raft RPC share: paths and headers.

/// Header carrying the sending node's id.
pub const NODE_HEADER: &str = "x-zonegate-node-id";

pub const PATH_APPEND: &str = "/raft/v1/append";
pub const PATH_VOTE: &str = "/raft/v1/vote";
pub const PATH_SNAPSHOT: &str = "/raft/v1/snapshot";
/// Zone observations for the leader's detector (not a Raft RPC, same
/// authentication): body [`crate::detect::Report`], answer
/// [`crate::failover::ReportAck`].
pub const PATH_REPORT: &str = "/raft/v1/report";
/// Authenticated; answers with this node's cluster id and joined set in
/// headers (the start-up amnesia check).
pub const PATH_HELLO: &str = "/raft/v1/hello";
/// A rejoining node asks the leader to take it as a learner, and once it
/// caught up, to promote it to its configured role.
pub const PATH_REJOIN: &str = "/raft/v1/rejoin";
/// The leader hands over: it asks a caught-up voter to campaign now
/// (see `crate::handover`). Obeyed only from the leader the voter follows.
pub const PATH_ELECT: &str = "/raft/v1/elect";
/// Pre-vote (see `crate::prevote`): may the sender campaign? 200 when
/// this voter heard from no live leader within the election timeout, 409
/// when it did. Changes nothing on either side.
pub const PATH_PREVOTE: &str = "/raft/v1/prevote";
