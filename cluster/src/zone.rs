//! Names the control plane shares: a node's id, a zone's name and what a
//! zone does with its traffic. Both `view` and `quota` read them, so they
//! live apart from either.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A Raft node id. Node ids are never reused.
pub type NodeId = u64;

/// The name of an availability zone, e.g. `az-a`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ZoneId(Arc<str>);

impl ZoneId {
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ZoneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ZoneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl From<&str> for ZoneId {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

/// What a zone does with the traffic that is homed in it.
///
/// Serialized with a `status` tag for people and JSON
/// (`{"status":"failed_over","target":"az-b"}`), and as a plain enum for
/// binary formats: bincode cannot read internally tagged enums, and the
/// replicated state travels through bincode (see `serde` impls below).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZoneStatus {
    /// Serves its own traffic.
    Active,
    /// A committed decision moved this zone's traffic to `target`.
    FailedOver { target: ZoneId },
    /// Reserved for draining a zone (no new sessions, existing ones
    /// finish), as the design describes. No decision produces it yet, and
    /// nothing drains: were it to appear, [`ClusterView::effective_zone`](crate::view::ClusterView::effective_zone)
    /// would still send the zone its own traffic and
    /// [`ClusterView::is_active`](crate::view::ClusterView::is_active) would keep it out of cross-zone
    /// fallback. Kept so the wire format need not change when a decision
    /// that drains arrives.
    Draining,
}

impl ZoneStatus {
    /// The stable snake_case name of the status, as in the JSON tag.
    pub fn name(&self) -> &'static str {
        match self {
            ZoneStatus::Active => "active",
            ZoneStatus::FailedOver { .. } => "failed_over",
            ZoneStatus::Draining => "draining",
        }
    }
}

/// The two wire shapes of [`ZoneStatus`]; private so the public type stays one.
mod zone_status_serde {
    use super::{ZoneId, ZoneStatus};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "status", rename_all = "snake_case")]
    enum Tagged {
        Active,
        FailedOver { target: ZoneId },
        Draining,
    }

    #[derive(Serialize, Deserialize)]
    enum Plain {
        Active,
        FailedOver { target: ZoneId },
        Draining,
    }

    impl Serialize for ZoneStatus {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let human = s.is_human_readable();
            match (self, human) {
                (ZoneStatus::Active, true) => Tagged::Active.serialize(s),
                (ZoneStatus::Draining, true) => Tagged::Draining.serialize(s),
                (ZoneStatus::FailedOver { target }, true) => Tagged::FailedOver {
                    target: target.clone(),
                }
                .serialize(s),
                (ZoneStatus::Active, false) => Plain::Active.serialize(s),
                (ZoneStatus::Draining, false) => Plain::Draining.serialize(s),
                (ZoneStatus::FailedOver { target }, false) => Plain::FailedOver {
                    target: target.clone(),
                }
                .serialize(s),
            }
        }
    }

    impl<'de> Deserialize<'de> for ZoneStatus {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            if d.is_human_readable() {
                Ok(match Tagged::deserialize(d)? {
                    Tagged::Active => ZoneStatus::Active,
                    Tagged::FailedOver { target } => ZoneStatus::FailedOver { target },
                    Tagged::Draining => ZoneStatus::Draining,
                })
            } else {
                Ok(match Plain::deserialize(d)? {
                    Plain::Active => ZoneStatus::Active,
                    Plain::FailedOver { target } => ZoneStatus::FailedOver { target },
                    Plain::Draining => ZoneStatus::Draining,
                })
            }
        }
    }
}
