//! The immutable view of the cluster that the control plane publishes and the
//! data plane reads: zone status and the decision version it was built from.

use std::collections::BTreeMap;
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ZoneStatus {
    /// Serves its own traffic.
    Active,
    /// A committed decision moved this zone's traffic to `target`.
    FailedOver { target: ZoneId },
    /// Takes no new sessions; existing ones finish.
    Draining,
}

/// One immutable snapshot of the replicated decisions, as applied by this
/// node. The data plane clones the `Arc` per request and never waits for a
/// newer one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Version of the last decision applied; 0 before any decision.
    pub decision_version: u64,
    pub zones: BTreeMap<ZoneId, ZoneStatus>,
}

impl ClusterView {
    /// The view before any decision: every known zone active, version 0.
    pub fn initial<'a>(zones: impl IntoIterator<Item = &'a ZoneId>) -> Self {
        Self {
            decision_version: 0,
            zones: zones
                .into_iter()
                .map(|z| (z.clone(), ZoneStatus::Active))
                .collect(),
        }
    }

    /// The zone that serves traffic homed in `zone`: the zone itself, or the
    /// target of a committed failover. Unknown zones serve themselves.
    pub fn effective_zone<'a>(&'a self, zone: &'a ZoneId) -> &'a ZoneId {
        match self.zones.get(zone) {
            Some(ZoneStatus::FailedOver { target }) => target,
            _ => zone,
        }
    }

    /// Whether a zone takes traffic of its own (not failed over, not draining).
    pub fn is_active(&self, zone: &ZoneId) -> bool {
        matches!(self.zones.get(zone), Some(ZoneStatus::Active) | None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_view_has_every_zone_active_at_version_zero() {
        let zones = [ZoneId::new("az-a"), ZoneId::new("az-b")];
        let view = ClusterView::initial(&zones);
        assert_eq!(view.decision_version, 0);
        assert!(zones.iter().all(|z| view.is_active(z)));
        assert_eq!(view.effective_zone(&zones[0]), &zones[0]);
    }

    #[test]
    fn failed_over_zone_routes_to_its_target() {
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        let mut view = ClusterView::initial([&a, &b]);
        view.zones
            .insert(a.clone(), ZoneStatus::FailedOver { target: b.clone() });
        assert_eq!(view.effective_zone(&a), &b);
        assert!(!view.is_active(&a));
    }

    #[test]
    fn zone_status_serializes_with_a_status_tag() {
        let s = ZoneStatus::FailedOver {
            target: ZoneId::new("az-b"),
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"{"status":"failed_over","target":"az-b"}"#);
    }
}
