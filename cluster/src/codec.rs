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
//!
//! Every encoded value carries its format version: `0xFF, version`, then
//! the bincode body. Version 0 is the unversioned bincode written before
//! versions existed; no value of ours can start with `0xFF` (it is not a
//! valid bincode varint, and the types whose encoding starts with a bool or
//! an option tag start with 0 or 1), so such bytes are read as version 0.
//! A node decodes [`FORMAT_VERSION`] and [`OLDEST_READ_VERSION`]..; a newer
//! version is refused ([`CodecError::NewerFormat`]) with a WARN and a
//! count ([`newer_format_refusals`]), never misread.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// An append batch: at most `max_payload_entries` bounded entries
    /// (64 replicated configs of 1 MiB with their fields fit).
    pub const APPEND: usize = 80 * MIB;
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
    #[error(
        "decode: format version {version} is newer than this build reads (up to {FORMAT_VERSION}); upgrade this node"
    )]
    NewerFormat { version: u8 },
}

/// First byte of a versioned encoding.
pub const FORMAT_MAGIC: u8 = 0xFF;
/// The format version this build writes. Version 1 is version 0's bincode
/// layout behind the version header. Version 2 added the quota weights to
/// `ClusterState` and `ClusterView` and the tenants' demand to `Report`
/// (and so to `Applied`, which holds a state); every other type keeps its
/// layout, and the four decode their version 0 and 1 layouts
/// (`bounded_since`). Version 3 gave `ClusterState` a rebalance history of
/// its own, the last zone decision's version and the dwell clock
/// (`ZoneControl` its dwell readings), and `ClusterState`/`ClusterView`
/// zone weights in their quota table; both decode every older layout by
/// [`decoding_version`], also inside the store's `Applied`. `Command` and
/// `Decision` gained variants appended last (`Stamped`; `Rebalance`,
/// `Tick`), so older entries keep their bytes. Version 4 added budgets:
/// `TenantDemand` carries the tenant's spend (so `Report` decodes its
/// version 2–3 layout), `ClusterState` and `ClusterView` a budget table
/// (their version 3 layouts convert), and `Decision` the variant
/// `RebalanceWithBudgets`, appended last.
pub const FORMAT_VERSION: u8 = 4;
/// The oldest format version this build reads (0: unversioned).
pub const OLDEST_READ_VERSION: u8 = 0;

static NEWER_FORMAT_REFUSALS: AtomicU64 = AtomicU64::new(0);

/// How many values this process refused because their format version is
/// newer than it reads (for `zonegate_raft_rpc_refused_total{reason=
/// "newer_format"}`).
pub fn newer_format_refusals() -> u64 {
    NEWER_FORMAT_REFUSALS.load(Ordering::Relaxed)
}

/// The format version of `bytes` and its body.
fn split_version(bytes: &[u8]) -> Result<(u8, &[u8]), CodecError> {
    match bytes {
        [FORMAT_MAGIC, version, body @ ..] if *version <= FORMAT_VERSION => Ok((*version, body)),
        [FORMAT_MAGIC, version, ..] => {
            let n = NEWER_FORMAT_REFUSALS.fetch_add(1, Ordering::Relaxed) + 1;
            // A newer peer retries every heartbeat: log the first refusal
            // and then every power of two, the count says the rest.
            if n.is_power_of_two() {
                tracing::warn!(
                    version,
                    reads_up_to = FORMAT_VERSION,
                    refusals = n,
                    "refusing a value in a newer format version: upgrade this node"
                );
            }
            Err(CodecError::NewerFormat { version: *version })
        }
        [FORMAT_MAGIC] => Err(CodecError::Decode(
            bincode::error::DecodeError::UnexpectedEnd { additional: 1 },
        )),
        body => Ok((0, body)),
    }
}

thread_local! {
    /// The format version of the value this thread is decoding.
    static DECODING: Cell<u8> = const { Cell::new(FORMAT_VERSION) };
}

/// The format version of the bytes being decoded on this thread
/// ([`FORMAT_VERSION`] outside a decode): a type whose layout changed reads
/// it in its `Deserialize` to pick the layout, wherever it sits inside the
/// value being decoded.
pub fn decoding_version() -> u8 {
    DECODING.with(Cell::get)
}

/// Sets [`decoding_version`] for one decode and restores the outer one.
struct Decoding(u8);

impl Decoding {
    fn enter(version: u8) -> Self {
        Self(DECODING.with(|d| d.replace(version)))
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        DECODING.with(|d| d.set(self.0));
    }
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// The format version of `bytes`, read without judging it (0 for bytes
/// without a version header); [`decode_with_limit`] refuses newer ones.
pub fn version_of(bytes: &[u8]) -> u8 {
    match bytes {
        [FORMAT_MAGIC, version, ..] => *version,
        _ => 0,
    }
}

/// Encode a value to bytes, in format version [`FORMAT_VERSION`].
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_MAGIC, FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())?;
    Ok(out)
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
    // Most types share one body layout across versions; the types whose
    // layout changed dispatch on the version first (`bounded_since`).
    let (version, body) = split_version(bytes)?;
    let _decoding = Decoding::enter(version);
    let (value, used) = bincode::serde::decode_from_slice(body, config().with_limit::<N>())?;
    if used != body.len() {
        return Err(CodecError::TrailingBytes(body.len() - used));
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

/// `bounded_since!(Type => LIMIT, before VERSION as OldType, ...)`:
/// implement [`Bounded`] for a type whose layout changed in `VERSION`:
/// bytes of an older version decode as `OldType` (the old layout) and
/// convert with `From`.
macro_rules! bounded_since {
    ($($t:ty => $limit:expr, before $v:literal as $old:ty),* $(,)?) => {$(
        impl $crate::codec::Bounded for $t {
            const LIMIT: usize = $limit;
            fn decode_bounded(bytes: &[u8]) -> Result<Self, $crate::codec::CodecError> {
                if $crate::codec::version_of(bytes) < $v {
                    $crate::codec::decode_with_limit::<$old, { $limit }>(bytes).map(<$t>::from)
                } else {
                    $crate::codec::decode_with_limit::<Self, { $limit }>(bytes)
                }
            }
        }
    )*};
}
pub(crate) use bounded_since;

type Answer<T, E = openraft::error::Infallible> = Result<T, RaftError<E>>;

bounded! {
    // Stored values (the store's private records declare theirs in store.rs).
    Vote => limits::SMALL,
    LogId => limits::SMALL,
    Option<LogId> => limits::SMALL,
    Entry => limits::ENTRY,
    Command => limits::ENTRY,
    StoredMembership => limits::REPORT,
    // Raft RPC requests and answers.
    AppendEntriesRequest => limits::APPEND,
    Answer<AppendEntriesResponse> => limits::ANSWER,
    VoteRequest => limits::SMALL,
    Answer<VoteResponse> => limits::ANSWER,
    InstallSnapshotRequest => limits::SNAPSHOT_CHUNK,
    Answer<InstallSnapshotResponse, openraft::error::InstallSnapshotError> => limits::ANSWER,
    // Zone reports.
    ReportAck => limits::REPORT,
    // Their `Deserialize` picks the layout by `decoding_version`.
    ClusterState => limits::STATE,
    ClusterView => limits::STATE,
}

impl Bounded for Report {
    const LIMIT: usize = limits::REPORT;
    /// Versions 0–1 had no demand, 2–3 demand without spend.
    fn decode_bounded(bytes: &[u8]) -> Result<Self, CodecError> {
        match version_of(bytes) {
            0 | 1 => decode_with_limit::<crate::detect::ReportV1, { limits::REPORT }>(bytes)
                .map(Report::from),
            2 | 3 => decode_with_limit::<crate::detect::ReportV3, { limits::REPORT }>(bytes)
                .map(Report::from),
            _ => decode_with_limit::<Report, { limits::REPORT }>(bytes),
        }
    }
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
        assert_eq!(bytes[..2], [FORMAT_MAGIC, FORMAT_VERSION]);
        assert_eq!(bytes[2], 0, "Decide stays the first variant");
        let expected: Vec<u8> = [FORMAT_MAGIC, FORMAT_VERSION, 0u8, 2, 3]
            .into_iter()
            .chain(*b"ops")
            .chain([1])
            .chain(*b"r")
            .chain([0, 0, 0])
            .collect();
        assert_eq!(bytes, expected);
        // Old rule indices are unchanged.
        assert_eq!(encode(&RejectRule::NotFrozen).unwrap()[2..], [8]);
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

    fn fixture(version: u8, name: &str, i: usize) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/v{version}/{name}-{i}.bin"))
    }

    /// Golden bytes of the current version: a change to any encoding
    /// fails here. After a deliberate format change (with a new
    /// `FORMAT_VERSION`), write the new fixtures with
    /// `ZONEGATE_BLESS_FIXTURES=1 cargo test -p zonegate-cluster golden`.
    #[test]
    fn golden_bytes_of_the_current_format_are_unchanged() {
        let bless = std::env::var_os("ZONEGATE_BLESS_FIXTURES").is_some();
        for d in DECODERS.iter() {
            for (i, bytes) in d.samples.iter().enumerate() {
                let path = fixture(FORMAT_VERSION, d.name, i);
                if bless && !path.exists() {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, bytes).unwrap();
                }
                let golden =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(golden == *bytes, "{} changed its encoding", path.display());
                assert!((d.decode)(&golden).is_ok(), "{}", path.display());
            }
        }
    }

    /// Every older version this build claims to read still decodes from
    /// the bytes that version wrote (v0: before format versions existed).
    #[test]
    fn golden_bytes_of_every_older_readable_format_decode() {
        // The samples grow with the format (version 2 added a quota
        // rebalance), so every fixture file an older version wrote is read,
        // and every decoder must have some.
        for version in OLDEST_READ_VERSION..FORMAT_VERSION {
            for d in DECODERS.iter() {
                let mut read = 0;
                for i in 0.. {
                    let path = fixture(version, d.name, i);
                    let Ok(golden) = std::fs::read(&path) else {
                        break;
                    };
                    let decoded = (d.decode)(&golden);
                    assert!(decoded.is_ok(), "{}: {decoded:?}", path.display());
                    read += 1;
                }
                assert!(read > 0, "no v{version} fixture of {}", d.name);
            }
        }
        // v0 and v1 share the layout: v0's bytes are v1's body.
        let v0 = std::fs::read(fixture(0, "command", 0)).unwrap();
        let v1 = std::fs::read(fixture(1, "command", 0)).unwrap();
        assert_eq!(v1[2..], v0[..]);
    }

    #[test]
    fn a_newer_format_is_refused_and_counted() {
        let mut bytes = encode(&Some(LogId::default())).unwrap();
        bytes[1] = FORMAT_VERSION + 1;
        let before = newer_format_refusals();
        assert!(matches!(
            decode::<Option<LogId>>(&bytes),
            Err(CodecError::NewerFormat { version }) if version == FORMAT_VERSION + 1
        ));
        assert!(newer_format_refusals() > before);
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
