//! The immutable view of the cluster that the control plane publishes and the
//! data plane reads: zone status, the automation switch and the decision
//! version it was built from.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

use crate::budget::BudgetTable;
use crate::quota::{from_node_weights, NodeWeights, QuotaWeights};

pub use crate::zone::{NodeId, ZoneId, ZoneStatus};

/// Whether the leader may issue automatic decisions. Operators can always
/// decide; `Frozen` stops only the automation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Automation {
    #[default]
    Auto,
    Frozen,
}

impl Automation {
    /// The stable snake_case name, as serialized.
    pub fn name(self) -> &'static str {
        match self {
            Automation::Auto => "auto",
            Automation::Frozen => "frozen",
        }
    }
}

/// One immutable snapshot of the replicated decisions, as applied by this
/// node. The data plane clones the `Arc` per request and never waits for a
/// newer one. Decoding follows the format version of the bytes
/// (`codec::decoding_version`): versions 0–1 and 2 convert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    /// Version of the last decision applied; 0 before any decision.
    pub decision_version: u64,
    pub zones: BTreeMap<ZoneId, ZoneStatus>,
    /// The automation switch as of `decision_version`.
    pub automation: Automation,
    /// The last quota rebalance's weights (tenant → zone weights and node
    /// weights); empty before the first. Format version 2 held node
    /// weights only; format 3 the zone weights too.
    pub quota: Arc<QuotaWeights>,
    /// The replicated routing config: its version and TOML (the
    /// cluster-wide sections); `None` before the first. Format version 2.
    pub config: Option<(u64, Arc<str>)>,
    /// The last rebalance's budget grants per tenant, period and node
    /// (`crate::budget`); empty before the first. Format version 4.
    pub budgets: Arc<BudgetTable>,
}

impl ClusterView {
    /// The replicated config's version (0 before the first).
    pub fn config_version(&self) -> u64 {
        self.config.as_ref().map_or(0, |(v, _)| *v)
    }
}

/// [`ClusterView`]'s current layout, as derived (JSON written before a
/// field existed reads it as empty).
#[derive(Deserialize)]
struct ClusterViewV4 {
    decision_version: u64,
    zones: BTreeMap<ZoneId, ZoneStatus>,
    #[serde(default)]
    automation: Automation,
    #[serde(default)]
    quota: Arc<QuotaWeights>,
    #[serde(default)]
    config: Option<(u64, Arc<str>)>,
    #[serde(default)]
    budgets: Arc<BudgetTable>,
}

/// [`ClusterView`] as format version 3 laid it out (before budgets).
#[derive(Deserialize)]
struct ClusterViewV3 {
    decision_version: u64,
    zones: BTreeMap<ZoneId, ZoneStatus>,
    automation: Automation,
    quota: Arc<QuotaWeights>,
    config: Option<(u64, Arc<str>)>,
}

/// [`ClusterView`] as format version 2 laid it out (node weights only).
#[derive(Deserialize)]
struct ClusterViewV2 {
    decision_version: u64,
    zones: BTreeMap<ZoneId, ZoneStatus>,
    automation: Automation,
    quota: NodeWeights,
    config: Option<(u64, Arc<str>)>,
}

/// [`ClusterView`] as format versions 0 and 1 laid it out (before quota
/// weights).
#[derive(Deserialize)]
pub(crate) struct ClusterViewV1 {
    decision_version: u64,
    zones: BTreeMap<ZoneId, ZoneStatus>,
    automation: Automation,
}

impl<'de> Deserialize<'de> for ClusterView {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let version = if d.is_human_readable() {
            crate::codec::FORMAT_VERSION
        } else {
            crate::codec::decoding_version()
        };
        Ok(match version {
            0 | 1 => ClusterViewV1::deserialize(d)?.into(),
            2 => {
                let v = ClusterViewV2::deserialize(d)?;
                Self {
                    decision_version: v.decision_version,
                    zones: v.zones,
                    automation: v.automation,
                    quota: Arc::new(from_node_weights(&v.quota)),
                    config: v.config,
                    budgets: Arc::default(),
                }
            }
            3 => {
                let v = ClusterViewV3::deserialize(d)?;
                Self {
                    decision_version: v.decision_version,
                    zones: v.zones,
                    automation: v.automation,
                    quota: v.quota,
                    config: v.config,
                    budgets: Arc::default(),
                }
            }
            _ => {
                let v = ClusterViewV4::deserialize(d)?;
                Self {
                    decision_version: v.decision_version,
                    zones: v.zones,
                    automation: v.automation,
                    quota: v.quota,
                    config: v.config,
                    budgets: v.budgets,
                }
            }
        })
    }
}

impl From<ClusterViewV1> for ClusterView {
    fn from(v: ClusterViewV1) -> Self {
        Self {
            decision_version: v.decision_version,
            zones: v.zones,
            automation: v.automation,
            quota: Arc::default(),
            config: None,
            budgets: Arc::default(),
        }
    }
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
            automation: Automation::Auto,
            quota: Arc::default(),
            config: None,
            budgets: Arc::default(),
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

    #[test]
    fn zone_status_round_trips_through_json_and_the_binary_codec() {
        for s in [
            ZoneStatus::Active,
            ZoneStatus::Draining,
            ZoneStatus::FailedOver {
                target: ZoneId::new("az-c"),
            },
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<ZoneStatus>(&json).unwrap(), s);
            let bytes = crate::codec::encode(&s).unwrap();
            let back: ZoneStatus = crate::codec::decode_with_limit::<_, 1024>(&bytes).unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn view_without_automation_field_reads_as_auto() {
        let view: ClusterView =
            serde_json::from_str(r#"{"decision_version":3,"zones":{"az-a":{"status":"active"}}}"#)
                .unwrap();
        assert_eq!(view.automation, Automation::Auto);
    }
}
