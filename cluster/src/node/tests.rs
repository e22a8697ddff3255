//! The node's own unit tests: what it shares across tasks, what its
//! config prints, the largest append batch against its decode limit, and
//! the default timing against the failover budget.

use super::*;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn node_and_errors_can_be_shared_across_tasks() {
    assert_send_sync::<ClusterNode>();
    assert_send_sync::<ProposeError>();
    assert_send_sync::<ClusterError>();
}

#[test]
fn config_debug_does_not_print_the_secret() {
    let config = ClusterConfig {
        node_id: 1,
        zone: ZoneId::new("az-a"),
        members: Vec::new(),
        data_dir: PathBuf::from("/tmp/x"),
        secret: "hunter2".into(),
        raft_listen: RaftListen::Addr(SocketAddr::from(([127, 0, 0, 1], 0))),
        timing: Timing::default(),
        faults: None,
        rejoin: false,
        tls: None,
        limits: zonegate_net::listen::Limits::with_max(16),
    };
    let printed = format!("{config:?}");
    assert!(!printed.contains("hunter2"));
    assert!(printed.contains("<redacted>"));
}

/// The bytes of an append batch of `MAX_PAYLOAD_ENTRIES` copies of
/// `largest`, with the largest ids.
fn full_batch(largest: Command) -> Vec<u8> {
    use crate::types::alias::{AppendEntriesRequest, Entry};
    let log_id = |i| openraft::LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 1), i);
    let request = AppendEntriesRequest {
        vote: openraft::Vote::new_committed(u64::MAX, 1),
        prev_log_id: Some(log_id(u64::MAX - 100)),
        entries: (0..MAX_PAYLOAD_ENTRIES)
            .map(|i| Entry {
                log_id: log_id(u64::MAX - 64 + i),
                payload: openraft::EntryPayload::Normal(largest.clone()),
            })
            .collect(),
        leader_commit: Some(log_id(u64::MAX - 1)),
    };
    crate::codec::encode(&request).unwrap()
}

#[test]
fn a_full_append_batch_of_the_largest_valid_entries_decodes_within_its_limit() {
    use crate::codec::{self, limits};
    use crate::command::{
        AutoLimits, Decision, MAX_ACTOR_BYTES, MAX_EVIDENCE_BYTES, MAX_REASON_BYTES, MAX_ZONE_BYTES,
    };
    use crate::types::alias::AppendEntriesRequest;
    let zone = |c: &str| ZoneId::new(&c.repeat(MAX_ZONE_BYTES));
    let largest = Command::automatic(
        Decision::Failover {
            from: zone("a"),
            to: zone("b"),
        },
        "x".repeat(MAX_ACTOR_BYTES),
        "y".repeat(MAX_REASON_BYTES),
        AutoLimits::default(),
    )
    .if_version(u64::MAX)
    .with_evidence("z".repeat(MAX_EVIDENCE_BYTES))
    .stamped(u64::MAX);
    assert_eq!(largest.validate(), Ok(()));
    let bytes = full_batch(largest);
    // Far below the limit, so the body limit and timeouts never bite.
    assert!(bytes.len() * 16 < limits::APPEND, "{} bytes", bytes.len());
    let back: AppendEntriesRequest = codec::decode(&bytes).unwrap();
    assert_eq!(back.entries.len(), MAX_PAYLOAD_ENTRIES as usize);
}

#[test]
fn a_full_append_batch_of_the_largest_configs_decodes_within_its_limit() {
    use crate::codec::{self, limits};
    use crate::command::{Decision, MAX_ACTOR_BYTES, MAX_CONFIG_BYTES, MAX_REASON_BYTES};
    use crate::types::alias::AppendEntriesRequest;
    let largest = Command::decide(
        Decision::Config {
            config_version: u64::MAX,
            toml: "t".repeat(MAX_CONFIG_BYTES).into(),
        },
        "x".repeat(MAX_ACTOR_BYTES),
        "y".repeat(MAX_REASON_BYTES),
    )
    .if_version(u64::MAX)
    .stamped(u64::MAX);
    assert_eq!(largest.validate(), Ok(()));
    let bytes = full_batch(largest);
    assert!(bytes.len() < limits::APPEND, "{} bytes", bytes.len());
    let back: AppendEntriesRequest = codec::decode(&bytes).unwrap();
    assert_eq!(back.entries.len(), MAX_PAYLOAD_ENTRIES as usize);
}

#[test]
fn default_timing_fits_the_two_second_failover_budget() {
    let t = Timing::default();
    // Lease (= max) + the slowest random timeout + one tick of 1.5 x
    // heartbeat: the latest a follower starts campaigning.
    let worst = t.election_timeout_max * 2 + t.heartbeat * 3 / 2;
    assert!(worst < Duration::from_secs(2), "{worst:?}");
    assert!(t.heartbeat * 5 <= t.election_timeout_min + t.election_timeout_max);
}
