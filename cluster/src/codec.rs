//! The one binary encoding of the control plane: Raft RPC bodies, log
//! entries, the persisted state machine and snapshots.
//!
//! bincode 2 (serde mode, standard config) sits behind these functions so
//! it can be swapped without touching callers. bincode 3.0.0 on crates.io
//! is a tombstone that does not compile; stay on 2.
//!
//! Every decode is bounded. bincode trusts length prefixes: a string or
//! vector claiming 2^50 bytes is allocated before its bytes are read, and
//! the allocator aborts the whole process. So each type that is ever
//! decoded implements [`Bounded`] with a limit fitted to it, and bincode's
//! `with_limit` refuses any claim past that limit before allocating. The
//! limit counts bincode's claims, not wire bytes: every integer claims its
//! in-memory size (8 for a u64 sent as one varint byte), a string or byte
//! vector its length; so limits are generous multiples of the largest
//! valid message and far below what could hurt the process.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::command::Command;
use crate::detect::Report;
use crate::failover::ReportAck;
use crate::state::ClusterState;
use crate::types::alias::{
    AppendEntriesRequest, AppendEntriesResponse, Entry, InstallSnapshotRequest,
    InstallSnapshotResponse, LogId, RaftError, StoredMembership, Vote, VoteRequest, VoteResponse,
};
use crate::view::ClusterView;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// The decode limits, one per kind of message (bincode claim bytes).
pub mod limits {
    use super::{KIB, MIB};

    /// A vote, a log id, a vote request: a handful of integers.
    pub const SMALL: usize = 4 * KIB;
    /// One log entry or command. Writes are bounded far below this (a
    /// `reason` of at most 1 KiB, `evidence` of at most 16 KiB); the
    /// headroom lets entries written before those bounds still be read.
    pub const ENTRY: usize = 8 * MIB;
    /// An append batch: at most `max_payload_entries` bounded entries.
    pub const APPEND: usize = 64 * MIB;
    /// A snapshot chunk (1 MiB of data) with its metadata.
    pub const SNAPSHOT_CHUNK: usize = 8 * MIB;
    /// An RPC answer: a small value, or an error with its message.
    pub const ANSWER: usize = MIB;
    /// A zone report with its history, and the leader's answer.
    pub const REPORT: usize = MIB;
    /// The replicated state (a bounded history of bounded decisions) and
    /// what the store keeps with it; read from the local store or from a
    /// snapshot.
    pub const STATE: usize = 256 * MIB;
}

/// Encoding or decoding failed; the message says which and why.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("decode: {0} trailing bytes after the value")]
    TrailingBytes(usize),
    #[error("decode: {len} bytes exceed the {limit}-byte limit of the type")]
    TooLarge { len: usize, limit: usize },
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encode a value to bytes.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(value, config())?)
}

/// A type that may be decoded, with the limit that fits it.
pub trait Bounded: DeserializeOwned {
    /// The most bincode may claim while decoding one value.
    const LIMIT: usize;

    /// Decode with [`Self::LIMIT`]; use [`decode`].
    #[doc(hidden)]
    fn decode_bounded(bytes: &[u8]) -> Result<Self, CodecError>;
}

/// Decode a value from exactly `bytes`, within its type's limit: trailing
/// garbage is an error, so a truncated or concatenated body is never
/// half-read, and a length prefix past the limit is an error, never an
/// allocation.
pub fn decode<T: Bounded>(bytes: &[u8]) -> Result<T, CodecError> {
    T::decode_bounded(bytes)
}

/// [`decode`] with an explicit limit `N`, for a type without a
/// [`Bounded`] impl.
pub fn decode_with_limit<T: DeserializeOwned, const N: usize>(
    bytes: &[u8],
) -> Result<T, CodecError> {
    // Every byte on the wire is at least one claimed byte.
    if bytes.len() > N {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            limit: N,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice(bytes, config().with_limit::<N>())?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - used));
    }
    Ok(value)
}

/// `bounded!(Type => LIMIT, ...)`: implement [`Bounded`].
macro_rules! bounded {
    ($($t:ty => $limit:expr),* $(,)?) => {$(
        impl $crate::codec::Bounded for $t {
            const LIMIT: usize = $limit;
            fn decode_bounded(bytes: &[u8]) -> Result<Self, $crate::codec::CodecError> {
                $crate::codec::decode_with_limit::<Self, { $limit }>(bytes)
            }
        }
    )*};
}
pub(crate) use bounded;

type Answer<T, E = openraft::error::Infallible> = Result<T, RaftError<E>>;

bounded! {
    // Stored values (the store's private records declare theirs in store.rs).
    Vote => limits::SMALL,
    LogId => limits::SMALL,
    Option<LogId> => limits::SMALL,
    Entry => limits::ENTRY,
    Command => limits::ENTRY,
    ClusterState => limits::STATE,
    ClusterView => limits::STATE,
    StoredMembership => limits::REPORT,
    // Raft RPC requests and answers.
    AppendEntriesRequest => limits::APPEND,
    Answer<AppendEntriesResponse> => limits::ANSWER,
    VoteRequest => limits::SMALL,
    Answer<VoteResponse> => limits::ANSWER,
    InstallSnapshotRequest => limits::SNAPSHOT_CHUNK,
    Answer<InstallSnapshotResponse, openraft::error::InstallSnapshotError> => limits::ANSWER,
    // Zone reports.
    Report => limits::REPORT,
    ReportAck => limits::REPORT,
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use proptest::prelude::*;

    use super::*;
    use crate::command::{Decision, Outcome, RejectRule, Response};
    use crate::samples::{decoders, Decoder};

    static DECODERS: LazyLock<Vec<Decoder>> = LazyLock::new(decoders);

    #[test]
    fn every_sample_round_trips_within_its_limit() {
        for d in DECODERS.iter() {
            for bytes in &d.samples {
                assert_eq!(
                    (d.decode)(bytes).map_err(|e| e.to_string()),
                    Ok(()),
                    "{}",
                    d.name
                );
            }
        }
    }

    #[test]
    fn outcomes_and_rules_round_trip() {
        let part = |bytes: &[u8]| decode_with_limit::<Response, 1024>(bytes).unwrap();
        for rule in RejectRule::ALL {
            let resp = Response {
                outcome: Some(Outcome::Rejected {
                    rule,
                    message: format!("refused by {rule}"),
                }),
            };
            assert_eq!(part(&encode(&resp).unwrap()), resp);
        }
        let applied = Response {
            outcome: Some(Outcome::Applied { version: 42 }),
        };
        assert_eq!(part(&encode(&applied).unwrap()), applied);
        assert_eq!(
            part(&encode(&Response::default()).unwrap()),
            Response::default()
        );
    }

    #[test]
    fn operator_commands_keep_their_bincode_bytes() {
        // `Command::Decide` is variant 0 and its fields did not change, so
        // entries written before automatic decisions existed still decode.
        let cmd = Command::decide(Decision::Freeze, "ops", "r");
        let bytes = encode(&cmd).unwrap();
        assert_eq!(bytes[0], 0, "Decide stays the first variant");
        let expected: Vec<u8> = [0u8, 2, 3]
            .into_iter()
            .chain(*b"ops")
            .chain([1])
            .chain(*b"r")
            .chain([0, 0, 0])
            .collect();
        assert_eq!(bytes, expected);
        // Old rule indices are unchanged.
        assert_eq!(encode(&RejectRule::NotFrozen).unwrap(), vec![8]);
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&Some(LogId::default())).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<Option<LogId>>(&bytes),
            Err(CodecError::TrailingBytes(1))
        ));
    }

    #[test]
    fn every_truncation_of_every_sample_is_an_error() {
        for d in DECODERS.iter() {
            for bytes in &d.samples {
                for cut in 0..bytes.len() {
                    assert!(
                        (d.decode)(&bytes[..cut]).is_err(),
                        "{} cut at {cut}",
                        d.name
                    );
                }
            }
        }
    }

    #[test]
    fn a_length_bomb_at_every_offset_of_every_sample_is_survived() {
        for d in DECODERS.iter() {
            for bytes in &d.samples {
                for at in 0..=bytes.len() {
                    let mut bomb = bytes[..at].to_vec();
                    bomb.push(0xfd);
                    bomb.extend_from_slice(&(1u64 << 50).to_le_bytes());
                    bomb.extend_from_slice(&bytes[at..]);
                    // Ok is possible (a u64 field read the bomb); an abort
                    // or a panic is not.
                    let _ = (d.decode)(&bomb);
                }
            }
        }
    }

    #[test]
    fn the_report_body_that_aborted_nodes_is_an_error() {
        // Report { node: 3, period_end_ms: 0, zones: [one observation whose
        // zone name claims 2^50 bytes] }: issue 10's 12 bytes.
        let body = [0x03, 0x00, 0x01, 0xfd, 0, 0, 0, 0, 0, 0, 0x04, 0x00];
        assert!(matches!(
            decode::<Report>(&body),
            Err(CodecError::Decode(
                bincode::error::DecodeError::LimitExceeded
            ))
        ));
    }

    #[test]
    fn a_length_prefix_past_the_limit_is_refused_before_allocating() {
        let bomb = [0xfd, 0, 0, 0, 0, 0, 0, 4, 0];
        assert!(matches!(
            decode_with_limit::<String, 1024>(&bomb),
            Err(CodecError::Decode(
                bincode::error::DecodeError::LimitExceeded
            ))
        ));
    }

    #[test]
    fn input_longer_than_the_limit_is_refused_unread() {
        assert!(matches!(
            decode_with_limit::<Vec<u8>, 4>(&[0; 5]),
            Err(CodecError::TooLarge { len: 5, limit: 4 })
        ));
    }

    /// A decoder and one of its samples, by index.
    fn sample() -> impl Strategy<Value = (usize, Vec<u8>)> {
        let picks: Vec<(usize, Vec<u8>)> = DECODERS
            .iter()
            .enumerate()
            .flat_map(|(i, d)| d.samples.iter().map(move |s| (i, s.clone())))
            .collect();
        proptest::sample::select(picks)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_bytes_are_an_error_or_a_value_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600)
        ) {
            for d in DECODERS.iter() {
                let _ = (d.decode)(&bytes);
            }
        }

        #[test]
        fn length_bombs_of_any_size_and_width_are_survived(
            (i, bytes) in sample(),
            at in any::<prop::sample::Index>(),
            prefix in prop::sample::select(vec![0xfbu8, 0xfc, 0xfd]),
            claim in any::<u64>(),
        ) {
            let at = at.index(bytes.len() + 1);
            let width = match prefix { 0xfb => 2, 0xfc => 4, _ => 8 };
            let mut bomb = bytes[..at].to_vec();
            bomb.push(prefix);
            bomb.extend_from_slice(&claim.to_le_bytes()[..width]);
            bomb.extend_from_slice(&bytes[at..]);
            let _ = (DECODERS[i].decode)(&bomb);
        }

        #[test]
        fn mutated_samples_are_an_error_or_a_value_never_a_panic(
            (i, mut bytes) in sample(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            if !bytes.is_empty() {
                for (at, byte) in flips {
                    let at = at.index(bytes.len());
                    bytes[at] = byte;
                }
            }
            let _ = (DECODERS[i].decode)(&bytes);
        }
    }
}
