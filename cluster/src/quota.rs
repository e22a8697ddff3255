//! Quota arithmetic, pure: a tenant's global limits split over zones by
//! recent demand with a floor per zone (`zone_share` until the leader's
//! first table), lifted into a failover target (overflow), split over the
//! nodes that serve a zone by recent demand with a floor; and the priority
//! shedding rule against a zone's capacity units. No clock, no I/O: every
//! node computes the same allocations from the same view.
//!
//! Amounts are integers and every split uses the largest-remainder method,
//! so the parts of a split sum to exactly the whole: an allocation never
//! sums above a tenant's global quota, at any level.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::view::{NodeId, ZoneId, ZoneStatus};

/// Tenant priority: P0 is never starved, P2 yields first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Priority {
    P0,
    P1,
    P2,
}

impl Priority {
    /// The stable name (`P0`, `P1`, `P2`).
    pub fn name(self) -> &'static str {
        match self {
            Priority::P0 => "P0",
            Priority::P1 => "P1",
            Priority::P2 => "P2",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// Requests per minute.
    Rpm,
    /// Tokens (prompt + completion) per minute.
    Tpm,
    /// Requests in flight at once.
    Concurrency,
}

impl Unit {
    pub const ALL: [Unit; 3] = [Unit::Rpm, Unit::Tpm, Unit::Concurrency];

    /// The stable name, as in config and the `unit` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Rpm => "rpm",
            Unit::Tpm => "tpm",
            Unit::Concurrency => "concurrency",
        }
    }
}

/// A set of limits; `None` is unlimited in that unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub concurrency: Option<u64>,
}

impl Limits {
    pub fn get(&self, unit: Unit) -> Option<u64> {
        match unit {
            Unit::Rpm => self.rpm,
            Unit::Tpm => self.tpm,
            Unit::Concurrency => self.concurrency,
        }
    }

    fn slot(&mut self, unit: Unit) -> &mut Option<u64> {
        match unit {
            Unit::Rpm => &mut self.rpm,
            Unit::Tpm => &mut self.tpm,
            Unit::Concurrency => &mut self.concurrency,
        }
    }

    /// Whether no unit is limited.
    pub fn is_unlimited(&self) -> bool {
        Unit::ALL.iter().all(|u| self.get(*u).is_none())
    }

    /// Each limited unit split by `weights` (see [`split`]); unlimited
    /// units stay unlimited in every part.
    pub fn split(&self, weights: &[f64]) -> Vec<Limits> {
        let mut out = vec![Limits::default(); weights.len()];
        for unit in Unit::ALL {
            if let Some(total) = self.get(unit) {
                for (part, amount) in out.iter_mut().zip(split(total, weights)) {
                    *part.slot(unit) = Some(amount);
                }
            }
        }
        out
    }

    /// The sum of two allocations of the same tenant (unlimited wins).
    fn plus(&self, other: &Limits) -> Limits {
        let mut out = Limits::default();
        for unit in Unit::ALL {
            *out.slot(unit) = match (self.get(unit), other.get(unit)) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
        }
        out
    }

    /// Zero in every limited unit.
    fn zeroed(&self) -> Limits {
        let mut out = *self;
        for unit in Unit::ALL {
            if let Some(v) = out.slot(unit) {
                *v = 0;
            }
        }
        out
    }
}

/// Splits `total` into integer parts proportional to `weights`, summing to
/// exactly `total` (largest remainder; ties go to the earlier part). Weights
/// that are negative or not finite count as 0; when every weight is 0, every
/// part is 0 (nothing is handed out that nobody may hold).
pub fn split(total: u64, weights: &[f64]) -> Vec<u64> {
    let clean: Vec<f64> = weights
        .iter()
        .map(|w| if w.is_finite() && *w > 0.0 { *w } else { 0.0 })
        .collect();
    let sum: f64 = clean.iter().sum();
    if sum <= 0.0 || clean.is_empty() {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = clean.iter().map(|w| total as f64 * w / sum).collect();
    let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    // Floating error may floor a part a unit too high in sum; give back from
    // the largest first, then hand out the remainder by largest fraction.
    let mut given: u64 = parts.iter().sum();
    while given > total {
        if let Some(i) = (0..parts.len()).max_by_key(|&i| parts[i]) {
            parts[i] -= 1;
            given -= 1;
        }
    }
    let mut order: Vec<usize> = (0..parts.len()).filter(|&i| clean[i] > 0.0).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut left = total - given;
    for i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        parts[*i] += 1;
        left -= 1;
    }
    parts
}

/// A tenant's quota as configured: global limits across all zones, and the
/// share of each zone (shares sum to 1; validated by config).
#[derive(Clone, Debug, PartialEq)]
pub struct TenantQuota {
    pub tenant: String,
    pub priority: Priority,
    pub global: Limits,
    pub shares: BTreeMap<ZoneId, f64>,
}

/// One tenant moved into a failover target's allocation: the target's
/// limit is lifted by what `from` held (`mode=soft_limit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overflow {
    pub tenant: String,
    pub from: ZoneId,
    pub to: ZoneId,
    pub priority: Priority,
    /// What the failed zone held, now added to `to`.
    pub moved: Limits,
}

impl Overflow {
    /// The one log line (and decision-history note) per moved tenant.
    pub fn line(&self, version: u64) -> String {
        format!(
            "cross_zone overflow tenant={} from={} to={} mode=soft_limit priority={} version={version}",
            self.tenant, self.from, self.to, self.priority
        )
    }
}

/// A tenant's allocation per zone, before failovers are applied: the global
/// limits split by share.
pub fn zone_split(q: &TenantQuota) -> BTreeMap<ZoneId, Limits> {
    let zones: Vec<&ZoneId> = q.shares.keys().collect();
    let weights: Vec<f64> = q.shares.values().copied().collect();
    zones
        .into_iter()
        .cloned()
        .zip(q.global.split(&weights))
        .collect()
}

/// Whether the leader's zone weights were made for this tenant's zones:
/// the same zones as its shares, summing to [`PPM`].
fn zone_weights_fit(q: &TenantQuota, w: &BTreeMap<ZoneId, u32>) -> bool {
    w.keys().eq(q.shares.keys()) && w.values().map(|v| u64::from(*v)).sum::<u64>() == u64::from(PPM)
}

/// A tenant's allocation per zone, before failovers are applied: the global
/// limits split by the leader's zone weights when they fit the tenant's
/// zones, else by share ([`zone_split`]).
pub fn zone_base(
    q: &TenantQuota,
    zones: Option<&BTreeMap<ZoneId, u32>>,
) -> BTreeMap<ZoneId, Limits> {
    match zones.filter(|w| zone_weights_fit(q, w)) {
        Some(w) => {
            let weights: Vec<f64> = w.values().map(|v| f64::from(*v)).collect();
            w.keys().cloned().zip(q.global.split(&weights)).collect()
        }
        None => zone_split(q),
    }
}

/// A tenant's allocation per zone under the zone statuses of a view, split
/// by share: see [`zone_table_weighted`].
pub fn zone_table(
    q: &TenantQuota,
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
) -> (BTreeMap<ZoneId, Limits>, Vec<Overflow>) {
    zone_table_weighted(q, statuses, None)
}

/// A tenant's allocation per zone under the zone statuses of a view, from
/// [`zone_base`]: a zone failed over to a target holds nothing, and the
/// target's limit is lifted by exactly what the failed zone held
/// (overflow). The sum over zones is the same as without failovers, so it
/// never exceeds the global quota; with every zone active again (failback)
/// the table is [`zone_base`]'s again.
pub fn zone_table_weighted(
    q: &TenantQuota,
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
    zones: Option<&BTreeMap<ZoneId, u32>>,
) -> (BTreeMap<ZoneId, Limits>, Vec<Overflow>) {
    let base = zone_base(q, zones);
    let mut table = base.clone();
    let mut overflows = Vec::new();
    for (zone, held) in &base {
        let Some(ZoneStatus::FailedOver { target }) = statuses.get(zone) else {
            continue;
        };
        if target == zone {
            continue;
        }
        table.insert(zone.clone(), held.zeroed());
        let lifted = table.get(target).map_or(*held, |t| t.plus(held));
        table.insert(target.clone(), lifted);
        overflows.push(Overflow {
            tenant: q.tenant.clone(),
            from: zone.clone(),
            to: target.clone(),
            priority: q.priority,
            moved: *held,
        });
    }
    (table, overflows)
}

/// Parts per million: the unit of [`TenantWeights`].
pub const PPM: u32 = 1_000_000;

/// The share of a tenant's global quota every zone of its `zone_share`
/// keeps whatever its demand (each zone `ZONE_FLOOR × share`), so a quiet
/// zone still admits its first requests before the next rebalance. Small,
/// because a zone without demand holds its floor unused: with every other
/// zone loaded, at least `1 − ZONE_FLOOR` of the quota is admitted.
pub const ZONE_FLOOR: f64 = 0.05;

/// The leader's split of one tenant's quota. Carried by a `Rebalance`
/// decision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantWeights {
    /// Zone → parts per million of the tenant's global quota, over the
    /// zones of its `zone_share`, by demand with a floor per zone
    /// ([`rebalance_zones`]). Empty (or made for other zones): the
    /// configured shares.
    pub zones: BTreeMap<ZoneId, u32>,
    /// Node → parts per million of its group's allocation (the nodes whose
    /// effective zone is the same), by demand with a floor
    /// ([`rebalance_group`]). Made for another group: an equal split.
    pub nodes: BTreeMap<NodeId, u32>,
}

/// The leader's whole quota table: tenant → its weights.
pub type QuotaWeights = BTreeMap<String, TenantWeights>;

/// The node weights alone (tenant → node → parts per million of its
/// group), as format version 2's `QuotaRebalance` carried them: zones
/// then split by share.
pub type NodeWeights = BTreeMap<String, BTreeMap<NodeId, u32>>;

/// A format-2 node table as a [`QuotaWeights`] (zones by share).
pub fn from_node_weights(w: &NodeWeights) -> QuotaWeights {
    w.iter()
        .map(|(t, nodes)| {
            (
                t.clone(),
                TenantWeights {
                    zones: BTreeMap::new(),
                    nodes: nodes.clone(),
                },
            )
        })
        .collect()
}

/// The nodes that serve traffic of each effective zone: a node whose home
/// zone failed over serves its requests in the target, so it shares the
/// target's allocation with the target's own nodes.
pub fn groups(
    nodes: &[(NodeId, ZoneId)],
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
) -> BTreeMap<ZoneId, BTreeSet<NodeId>> {
    let mut out: BTreeMap<ZoneId, BTreeSet<NodeId>> = BTreeMap::new();
    for (id, zone) in nodes {
        let effective = match statuses.get(zone) {
            Some(ZoneStatus::FailedOver { target }) => target.clone(),
            _ => zone.clone(),
        };
        out.entry(effective).or_default().insert(*id);
    }
    out
}

/// Weights (ppm, summing to [`PPM`]) for one group of nodes from their
/// recent demand: `floor` of the group's allocation is shared equally (so
/// an idle node can still admit), the rest follows demand. Nodes in
/// `silent` (no report since the last rebalance) keep the weight they had
/// in `previous`, so a node without contact never holds less than it may
/// still be admitting with, and the group never sums above its allocation.
pub fn rebalance_group(
    members: &BTreeSet<NodeId>,
    demand: &BTreeMap<NodeId, u64>,
    previous: Option<&BTreeMap<NodeId, u32>>,
    silent: &BTreeSet<NodeId>,
    floor: f64,
) -> BTreeMap<NodeId, u32> {
    let floor = if floor.is_finite() {
        floor.clamp(0.0, 1.0)
    } else {
        1.0
    };
    // Silent nodes keep their weight only when the previous table was made
    // for this very group (the weights are shares of a group).
    let prev_fits = previous.is_some_and(|p| {
        p.keys().copied().collect::<BTreeSet<_>>() == *members
            && p.values().map(|w| u64::from(*w)).sum::<u64>() == u64::from(PPM)
    });
    let kept: BTreeMap<NodeId, u32> = match previous {
        Some(p) if prev_fits => silent
            .iter()
            .filter_map(|n| p.get(n).map(|w| (*n, *w)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let rest: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|n| !kept.contains_key(n))
        .collect();
    let left = PPM - kept.values().sum::<u32>();
    let mut out = kept;
    if rest.is_empty() {
        return out;
    }
    let total: u64 = rest
        .iter()
        .map(|n| demand.get(n).copied().unwrap_or(0))
        .sum();
    let weights: Vec<f64> = rest
        .iter()
        .map(|n| {
            let share = if total == 0 {
                1.0 / rest.len() as f64
            } else {
                demand.get(n).copied().unwrap_or(0) as f64 / total as f64
            };
            floor / rest.len() as f64 + (1.0 - floor) * share
        })
        .collect();
    for (n, w) in rest.iter().zip(split(u64::from(left), &weights)) {
        out.insert(*n, w as u32);
    }
    out
}

/// Zone weights (ppm of the tenant's global quota, summing to [`PPM`])
/// over the zones of its `zone_share` from their recent demand: `floor`
/// of the quota is split by share (so a quiet zone keeps
/// `floor × share`), the rest by demand (by share while no zone has
/// any). Zones in `held` (a node drawing from them did not report since
/// the last rebalance) keep the weight they had in `previous`, so a node
/// without contact never holds more than the table in force leaves it;
/// the other zones share what is left, each still above its floor when
/// the previous table kept every floor.
pub fn rebalance_zones(
    q: &TenantQuota,
    demand: &BTreeMap<ZoneId, u64>,
    previous: Option<&BTreeMap<ZoneId, u32>>,
    held: &BTreeSet<ZoneId>,
    floor: f64,
) -> BTreeMap<ZoneId, u32> {
    let floor = if floor.is_finite() {
        floor.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let share = |z: &ZoneId| {
        q.shares
            .get(z)
            .copied()
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(0.0)
    };
    // A previous table is kept from only when it was made for these zones
    // and kept every zone's floor (so what it leaves covers the others').
    let prev_fits = previous.is_some_and(|p| {
        zone_weights_fit(q, p)
            && p.iter()
                .all(|(z, w)| f64::from(*w) + 1.0 >= floor * share(z) * f64::from(PPM))
    });
    let kept: BTreeMap<ZoneId, u32> = match previous {
        Some(p) if prev_fits => held
            .iter()
            .filter_map(|z| p.get(z).map(|w| (z.clone(), *w)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let rest: Vec<&ZoneId> = q.shares.keys().filter(|z| !kept.contains_key(*z)).collect();
    let left = PPM.saturating_sub(kept.values().sum::<u32>());
    let mut out = kept;
    if rest.is_empty() {
        return out;
    }
    // Each zone's floor first (in ppm of the whole quota, not of what is
    // left), then what remains by demand.
    let floors: Vec<f64> = rest
        .iter()
        .map(|z| floor * share(z) * f64::from(PPM))
        .collect();
    let spare = (f64::from(left) - floors.iter().sum::<f64>()).max(0.0);
    let share_sum: f64 = rest.iter().map(|z| share(z)).sum();
    let total: u64 = rest
        .iter()
        .map(|z| demand.get(*z).copied().unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    let weights: Vec<f64> = rest
        .iter()
        .zip(&floors)
        .map(|(z, floor)| {
            let by_demand = if total > 0 {
                demand.get(*z).copied().unwrap_or(0) as f64 / total as f64
            } else if share_sum > 0.0 {
                share(z) / share_sum
            } else {
                1.0 / rest.len() as f64
            };
            floor + spare * by_demand
        })
        .collect();
    for (z, w) in rest.into_iter().zip(split(u64::from(left), &weights)) {
        out.insert(z.clone(), u32::try_from(w).unwrap_or(PPM));
    }
    out
}

/// Whether the weights moved enough to be worth a new decision: some
/// part's weight differs by more than `threshold` (a fraction of the
/// whole), or the set of parts differs.
pub fn drifted<K: Ord>(
    old: Option<&BTreeMap<K, u32>>,
    new: &BTreeMap<K, u32>,
    threshold: f64,
) -> bool {
    let Some(old) = old else { return true };
    if old.keys().ne(new.keys()) {
        return true;
    }
    old.iter().any(|(n, w)| {
        let other = new.get(n).copied().unwrap_or(0);
        (f64::from(*w) - f64::from(other)).abs() / f64::from(PPM) > threshold
    })
}

/// What the leader's quota rebalance works from: the tenants' quotas, the
/// nodes that serve (with their home zones), and the `[quotas]` knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct RebalancePlan {
    pub tenants: Vec<TenantQuota>,
    pub nodes: Vec<(NodeId, ZoneId)>,
    /// See [`rebalance_group`].
    pub node_floor: f64,
    /// See [`drifted`].
    pub drift_threshold: f64,
    /// At most one rebalance per this many ms.
    pub interval_ms: u64,
}

/// The zone a node's demand counts for: its home zone when the tenant has
/// a share there, else the zone it serves (a zone without a share failed
/// over into one that has).
fn demand_zone<'a>(
    q: &TenantQuota,
    home: &'a ZoneId,
    statuses: &'a BTreeMap<ZoneId, ZoneStatus>,
) -> Option<&'a ZoneId> {
    if q.shares.contains_key(home) {
        return Some(home);
    }
    match statuses.get(home) {
        Some(ZoneStatus::FailedOver { target }) if q.shares.contains_key(target) => Some(target),
        _ => None,
    }
}

/// The leader's rebalance, pure: for every limited tenant, zone weights by
/// the recent `demand` of the nodes homed in each zone (with
/// [`ZONE_FLOOR`]), and for every group of nodes serving one effective
/// zone, node weights by their demand (node → tenant → requests offered;
/// nodes missing from it are silent: they keep their node weight, and the
/// zones their group draws from keep their zone weight), checked against
/// the weights in force. Returns the whole new table when some zone or
/// group drifted past the threshold (or has no fitting weights yet, as
/// after a failover), else `None`.
pub fn plan_rebalance(
    plan: &RebalancePlan,
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
    previous: &QuotaWeights,
    demand: &BTreeMap<NodeId, BTreeMap<String, u64>>,
) -> Option<QuotaWeights> {
    let groups = groups(&plan.nodes, statuses);
    let silent: BTreeSet<NodeId> = plan
        .nodes
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !demand.contains_key(n))
        .collect();
    // The zones each group draws from: its own, and every zone failed over
    // to it. A group with a silent node holds those zones' weights.
    let mut held = BTreeSet::new();
    for (zone, members) in &groups {
        if members.iter().any(|n| silent.contains(n)) {
            held.insert(zone.clone());
            held.extend(
                statuses
                    .iter()
                    .filter(
                        |(_, s)| matches!(s, ZoneStatus::FailedOver { target } if target == zone),
                    )
                    .map(|(z, _)| z.clone()),
            );
        }
    }
    let mut table = QuotaWeights::new();
    let mut changed = false;
    for q in plan.tenants.iter().filter(|q| !q.global.is_unlimited()) {
        let prev = previous.get(&q.tenant);
        let per_node: BTreeMap<NodeId, u64> = demand
            .iter()
            .map(|(n, d)| (*n, d.get(&q.tenant).copied().unwrap_or(0)))
            .collect();
        let mut zone_demand: BTreeMap<ZoneId, u64> = BTreeMap::new();
        for (node, home) in &plan.nodes {
            let Some(d) = per_node.get(node) else {
                continue;
            };
            if let Some(zone) = demand_zone(q, home, statuses) {
                let sum = zone_demand.entry(zone.clone()).or_default();
                *sum = sum.saturating_add(*d);
            }
        }
        let prev_zones = prev.map(|p| &p.zones).filter(|z| !z.is_empty());
        let zones = rebalance_zones(q, &zone_demand, prev_zones, &held, ZONE_FLOOR);
        changed |= drifted(prev_zones, &zones, plan.drift_threshold);
        let mut nodes = BTreeMap::new();
        for members in groups.values() {
            let fitting: Option<BTreeMap<NodeId, u32>> = prev.map(|p| {
                p.nodes
                    .iter()
                    .filter(|(n, _)| members.contains(n))
                    .map(|(n, w)| (*n, *w))
                    .collect()
            });
            let fitting = fitting.filter(|f| {
                f.len() == members.len()
                    && f.values().map(|w| u64::from(*w)).sum::<u64>() == u64::from(PPM)
            });
            let silent_here: BTreeSet<NodeId> = silent.intersection(members).copied().collect();
            let new = rebalance_group(
                members,
                &per_node,
                fitting.as_ref(),
                &silent_here,
                plan.node_floor,
            );
            changed |= drifted(fitting.as_ref(), &new, plan.drift_threshold);
            nodes.extend(new);
        }
        table.insert(q.tenant.clone(), TenantWeights { zones, nodes });
    }
    // A tenant removed from config (or no longer limited) drops out.
    changed |= previous.keys().any(|t| !table.contains_key(t));
    changed.then_some(table)
}

/// Every limited tenant's overflows under `statuses`, in tenant order.
pub fn overflows(
    tenants: &[TenantQuota],
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
) -> Vec<Overflow> {
    tenants
        .iter()
        .filter(|q| !q.global.is_unlimited())
        .flat_map(|q| zone_table(q, statuses).1)
        .collect()
}

/// The overflow lines of every tenant under `statuses` (for the log and
/// the decision history), stamped with `version`.
pub fn overflow_lines(
    tenants: &[TenantQuota],
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
    version: u64,
) -> Vec<String> {
    overflows(tenants, statuses)
        .iter()
        .map(|o| o.line(version))
        .collect()
}

/// One node's allocation of one tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAllocation {
    pub node: NodeId,
    /// The effective zone whose allocation the node draws from.
    pub zone: ZoneId,
    pub limits: Limits,
}

/// Every node's allocation of one tenant under a view: the zone table by
/// the leader's zone weights (with overflow; by share while they do not
/// fit), each group split by the leader's node weights when they were
/// made for this group, else equally. A standalone node is a group of one
/// and holds its zone's whole allocation.
pub fn allocate(
    q: &TenantQuota,
    statuses: &BTreeMap<ZoneId, ZoneStatus>,
    nodes: &[(NodeId, ZoneId)],
    weights: Option<&TenantWeights>,
) -> (Vec<NodeAllocation>, Vec<Overflow>) {
    let (table, overflows) = zone_table_weighted(q, statuses, weights.map(|w| &w.zones));
    let weights = weights.map(|w| &w.nodes);
    let mut out = Vec::new();
    for (zone, members) in groups(nodes, statuses) {
        let zone_limits = table
            .get(&zone)
            .copied()
            .unwrap_or_else(|| q.global.zeroed());
        let fitted = weights.filter(|w| {
            members.iter().all(|n| w.contains_key(n))
                && members
                    .iter()
                    .map(|n| u64::from(w.get(n).copied().unwrap_or(0)))
                    .sum::<u64>()
                    == u64::from(PPM)
        });
        let shares: Vec<f64> = members
            .iter()
            .map(|n| match fitted {
                Some(w) => f64::from(w.get(n).copied().unwrap_or(0)),
                None => 1.0,
            })
            .collect();
        for (node, limits) in members.iter().zip(zone_limits.split(&shares)) {
            out.push(NodeAllocation {
                node: *node,
                zone: zone.clone(),
                limits,
            });
        }
    }
    (out, overflows)
}

/// Why a request was refused for zone capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// Shed for its priority: the zone is past this priority's threshold
    /// but still has room for higher ones.
    Priority(Priority),
    /// The zone is full, even for P0.
    Full,
}

/// The priority shedding rule. A zone's capacity `total` (units); `used`
/// units in flight; a request costing `cost`. P0 may use all of it; P1 stops
/// at `1 − reserve` (so P0 keeps the reserve); P2 stops at `1 − 2 × reserve`
/// (shed first). `reserve` is in [0, 0.5) (validated by config). A zone with
/// no declared capacity (`total == 0`) sheds nothing.
pub fn shed(priority: Priority, used: u64, cost: u64, total: u64, reserve: f64) -> Option<Shed> {
    if total == 0 {
        return None;
    }
    let after = used.saturating_add(cost) as f64;
    let cap = total as f64;
    let threshold = match priority {
        Priority::P0 => 1.0,
        Priority::P1 => 1.0 - reserve,
        Priority::P2 => 1.0 - 2.0 * reserve,
    };
    if after <= cap * threshold {
        None
    } else if after <= cap {
        Some(Shed::Priority(priority))
    } else {
        Some(Shed::Full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn z(s: &str) -> ZoneId {
        ZoneId::new(s)
    }

    fn quota(rpm: u64, shares: &[(&str, f64)], priority: Priority) -> TenantQuota {
        TenantQuota {
            tenant: "deptA".into(),
            priority,
            global: Limits {
                rpm: Some(rpm),
                tpm: Some(rpm * 100),
                concurrency: Some(rpm / 30),
            },
            shares: shares.iter().map(|(n, s)| (z(n), *s)).collect(),
        }
    }

    fn active(zones: &[&str]) -> BTreeMap<ZoneId, ZoneStatus> {
        zones.iter().map(|n| (z(n), ZoneStatus::Active)).collect()
    }

    fn by_node(nodes: &BTreeMap<NodeId, u32>) -> TenantWeights {
        TenantWeights {
            zones: BTreeMap::new(),
            nodes: nodes.clone(),
        }
    }

    fn sum(table: &BTreeMap<ZoneId, Limits>, unit: Unit) -> u64 {
        table.values().filter_map(|l| l.get(unit)).sum()
    }

    #[test]
    fn split_is_exact_and_proportional() {
        let cases: &[(u64, &[f64], &[u64])] = &[
            (6000, &[0.5, 0.3, 0.2], &[3000, 1800, 1200]),
            (10, &[1.0, 1.0, 1.0], &[4, 3, 3]),
            (2, &[1.0, 1.0, 1.0], &[1, 1, 0]),
            (7, &[0.0, 1.0], &[0, 7]),
            (7, &[0.0, 0.0], &[0, 0]),
            (7, &[f64::NAN, -1.0, 2.0], &[0, 0, 7]),
            (0, &[1.0, 2.0], &[0, 0]),
            (100, &[1.0, 2.0, 7.0], &[10, 20, 70]),
            (1, &[0.4, 0.6], &[0, 1]),
        ];
        for (total, weights, want) in cases {
            assert_eq!(split(*total, weights), *want, "split({total}, {weights:?})");
        }
        assert!(split(5, &[]).is_empty());
    }

    #[test]
    fn zone_split_follows_shares() {
        let q = quota(
            6000,
            &[("az-a", 0.5), ("az-b", 0.3), ("az-c", 0.2)],
            Priority::P0,
        );
        let t = zone_split(&q);
        assert_eq!(t[&z("az-a")].rpm, Some(3000));
        assert_eq!(t[&z("az-b")].rpm, Some(1800));
        assert_eq!(t[&z("az-c")].rpm, Some(1200));
        assert_eq!(t[&z("az-c")].concurrency, Some(40));
        assert_eq!(sum(&t, Unit::Tpm), 600_000);
    }

    #[test]
    fn overflow_lifts_exactly_what_the_failed_zone_held_and_failback_restores() {
        let q = quota(
            6000,
            &[("az-a", 0.5), ("az-b", 0.3), ("az-c", 0.2)],
            Priority::P0,
        );
        let normal = active(&["az-a", "az-b", "az-c"]);
        let (before, none) = zone_table(&q, &normal);
        assert!(none.is_empty());
        let mut failed = normal.clone();
        failed.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-b") });
        let (during, overflows) = zone_table(&q, &failed);
        for unit in Unit::ALL {
            let a = before[&z("az-a")].get(unit).unwrap();
            let b = before[&z("az-b")].get(unit).unwrap();
            assert_eq!(during[&z("az-b")].get(unit), Some(a + b), "{unit:?}");
            assert_eq!(during[&z("az-a")].get(unit), Some(0), "{unit:?}");
            assert_eq!(during[&z("az-c")], before[&z("az-c")]);
            assert_eq!(sum(&during, unit), sum(&before, unit));
        }
        assert_eq!(overflows.len(), 1);
        assert_eq!(overflows[0].moved, before[&z("az-a")]);
        assert_eq!(
            overflows[0].line(7),
            "cross_zone overflow tenant=deptA from=az-a to=az-b mode=soft_limit priority=P0 version=7"
        );
        // Failback: every zone active again gives the previous table back.
        let (after, _) = zone_table(&q, &normal);
        assert_eq!(after, before);
    }

    #[test]
    fn two_zones_failed_over_into_one_keep_the_global_total() {
        let q = quota(
            999,
            &[("az-a", 0.4), ("az-b", 0.35), ("az-c", 0.25)],
            Priority::P1,
        );
        let mut s = active(&["az-a", "az-b", "az-c"]);
        s.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-c") });
        s.insert(z("az-b"), ZoneStatus::FailedOver { target: z("az-c") });
        let (t, o) = zone_table(&q, &s);
        assert_eq!(t[&z("az-c")].rpm, Some(999));
        assert_eq!(o.len(), 2);
        assert!(o.iter().all(|o| o.to == z("az-c")));
    }

    #[test]
    fn nodes_split_by_demand_with_a_floor() {
        let members: BTreeSet<NodeId> = [1, 2, 3].into();
        // (demand, floor) → weights in ppm.
        let cases: &[(&[u64], f64, &[u32])] = &[
            (&[70, 20, 10], 0.0, &[700_000, 200_000, 100_000]),
            (&[70, 20, 10], 0.3, &[590_000, 240_000, 170_000]),
            (&[0, 0, 0], 0.2, &[333_334, 333_333, 333_333]),
            (&[100, 0, 0], 0.3, &[800_000, 100_000, 100_000]),
            (&[100, 0, 0], 1.0, &[333_334, 333_333, 333_333]),
        ];
        for (demand, floor, want) in cases {
            let d: BTreeMap<NodeId, u64> =
                [1, 2, 3].into_iter().zip(demand.iter().copied()).collect();
            let w = rebalance_group(&members, &d, None, &BTreeSet::new(), *floor);
            let got: Vec<u32> = w.values().copied().collect();
            assert_eq!(got, *want, "demand {demand:?} floor {floor}");
            assert_eq!(w.values().sum::<u32>(), PPM);
        }
    }

    #[test]
    fn a_node_without_contact_never_exceeds_its_last_allocation() {
        let members: BTreeSet<NodeId> = [1, 2, 3].into();
        let q = quota(600, &[("az-a", 1.0)], Priority::P1);
        let statuses = active(&["az-a"]);
        let nodes = [(1, z("az-a")), (2, z("az-a")), (3, z("az-a"))];
        let first: BTreeMap<NodeId, u64> = [(1, 10), (2, 10), (3, 80)].into();
        let w1 = rebalance_group(&members, &first, None, &BTreeSet::new(), 0.1);
        let (a1, _) = allocate(&q, &statuses, &nodes, Some(&by_node(&w1)));
        // Node 3 goes silent; the others' demand changes completely.
        let second: BTreeMap<NodeId, u64> = [(1, 90), (2, 10)].into();
        let silent: BTreeSet<NodeId> = [3].into();
        let w2 = rebalance_group(&members, &second, Some(&w1), &silent, 0.1);
        assert_eq!(w2[&3], w1[&3], "a silent node keeps its weight");
        let (a2, _) = allocate(&q, &statuses, &nodes, Some(&by_node(&w2)));
        let of = |a: &[NodeAllocation], n: NodeId| a.iter().find(|x| x.node == n).unwrap().limits;
        // Node 3 still admits with its old allocation; the others' new
        // allocations plus it stay within the global quota.
        let stale = of(&a1, 3);
        assert_eq!(of(&a2, 3), stale);
        for unit in Unit::ALL {
            let total = stale.get(unit).unwrap()
                + of(&a2, 1).get(unit).unwrap()
                + of(&a2, 2).get(unit).unwrap();
            assert!(total <= q.global.get(unit).unwrap(), "{unit:?}: {total}");
        }
        assert!(of(&a2, 1).rpm > of(&a1, 1).rpm);
    }

    #[test]
    fn a_failed_over_zones_nodes_share_the_targets_allocation() {
        let q = quota(600, &[("az-a", 0.5), ("az-b", 0.5)], Priority::P0);
        let nodes = [(1, z("az-a")), (2, z("az-b"))];
        let mut s = active(&["az-a", "az-b"]);
        let (normal, _) = allocate(&q, &s, &nodes, None);
        assert_eq!(normal[0].limits.rpm, Some(300));
        s.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-b") });
        let (moved, o) = allocate(&q, &s, &nodes, None);
        assert_eq!(o.len(), 1);
        assert!(moved.iter().all(|a| a.zone == z("az-b")));
        assert_eq!(moved.iter().filter_map(|a| a.limits.rpm).sum::<u64>(), 600);
    }

    #[test]
    fn standalone_node_holds_its_zones_whole_share() {
        let q = quota(600, &[("az-a", 0.5), ("az-b", 0.5)], Priority::P0);
        let (a, _) = allocate(&q, &active(&["az-a", "az-b"]), &[(7, z("az-a"))], None);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].limits.rpm, Some(300));
    }

    #[test]
    fn weights_made_for_another_group_are_not_used() {
        let q = quota(600, &[("az-a", 1.0)], Priority::P0);
        let nodes = [(1, z("az-a")), (2, z("az-a")), (3, z("az-a"))];
        let old: BTreeMap<NodeId, u32> = [(1, 900_000), (2, 100_000)].into();
        let (a, _) = allocate(&q, &active(&["az-a"]), &nodes, Some(&by_node(&old)));
        let rpm: Vec<u64> = a.iter().filter_map(|x| x.limits.rpm).collect();
        assert_eq!(rpm, [200, 200, 200]);
    }

    #[test]
    fn drift_is_measured_against_the_group() {
        let a: BTreeMap<NodeId, u32> = [(1, 500_000), (2, 500_000)].into();
        let b: BTreeMap<NodeId, u32> = [(1, 560_000), (2, 440_000)].into();
        let c: BTreeMap<NodeId, u32> = [(1, 1_000_000)].into();
        assert!(drifted(None, &a, 0.1));
        assert!(!drifted(Some(&a), &b, 0.1));
        assert!(drifted(Some(&a), &b, 0.05));
        assert!(drifted(Some(&a), &c, 0.5));
    }

    #[test]
    fn shedding_takes_p2_first_then_p1_and_keeps_the_reserve_for_p0() {
        use Priority::*;
        // (priority, used, cost, total, reserve) → decision.
        type Case = (Priority, u64, u64, u64, f64, Option<Shed>);
        let cases: &[Case] = &[
            (P2, 50, 1, 100, 0.2, None),
            (P2, 60, 1, 100, 0.2, Some(Shed::Priority(P2))),
            (P1, 60, 1, 100, 0.2, None),
            (P1, 79, 1, 100, 0.2, None),
            (P1, 80, 1, 100, 0.2, Some(Shed::Priority(P1))),
            (P0, 80, 1, 100, 0.2, None),
            (P0, 99, 1, 100, 0.2, None),
            (P0, 100, 1, 100, 0.2, Some(Shed::Full)),
            (P2, 100, 1, 100, 0.2, Some(Shed::Full)),
            (P1, 77, 4, 100, 0.2, Some(Shed::Priority(P1))),
            (P2, 0, 1, 0, 0.2, None),
            (P2, 99, 1, 100, 0.0, None),
        ];
        for (p, used, cost, total, reserve, want) in cases {
            assert_eq!(
                shed(*p, *used, *cost, *total, *reserve),
                *want,
                "{p} used {used} cost {cost} of {total} reserve {reserve}"
            );
        }
    }

    fn plan(tenants: Vec<TenantQuota>, nodes: &[(NodeId, &str)]) -> RebalancePlan {
        RebalancePlan {
            tenants,
            nodes: nodes.iter().map(|(n, zn)| (*n, z(zn))).collect(),
            node_floor: 0.1,
            drift_threshold: 0.05,
            interval_ms: 5000,
        }
    }

    fn demand(rows: &[(NodeId, u64)]) -> BTreeMap<NodeId, BTreeMap<String, u64>> {
        rows.iter()
            .map(|(n, d)| (*n, [("deptA".to_owned(), *d)].into()))
            .collect()
    }

    #[test]
    fn the_leader_rebalances_by_demand_only_past_the_drift() {
        let p = plan(
            vec![quota(600, &[("az-a", 1.0)], Priority::P1)],
            &[(1, "az-a"), (2, "az-a"), (3, "az-a")],
        );
        let s = active(&["az-a"]);
        let first = plan_rebalance(
            &p,
            &s,
            &QuotaWeights::new(),
            &demand(&[(1, 70), (2, 20), (3, 10)]),
        )
        .expect("no weights yet: a first table");
        let w = &first["deptA"].nodes;
        assert_eq!(w.values().sum::<u32>(), PPM);
        assert!(w[&1] > w[&2] && w[&2] > w[&3] && w[&3] > 0, "{w:?}");
        // The same demand again: nothing drifted, no decision.
        assert_eq!(
            plan_rebalance(&p, &s, &first, &demand(&[(1, 70), (2, 20), (3, 10)])),
            None
        );
        // A small wobble stays under the threshold.
        assert_eq!(
            plan_rebalance(&p, &s, &first, &demand(&[(1, 71), (2, 19), (3, 10)])),
            None
        );
        // The load moves: a new table.
        let moved = plan_rebalance(&p, &s, &first, &demand(&[(1, 10), (2, 20), (3, 70)])).unwrap();
        assert!(moved["deptA"].nodes[&3] > moved["deptA"].nodes[&1]);
        // Node 3 silent: it keeps its weight.
        let quiet = plan_rebalance(&p, &s, &moved, &demand(&[(1, 90), (2, 10)])).unwrap();
        assert_eq!(quiet["deptA"].nodes[&3], moved["deptA"].nodes[&3]);
    }

    #[test]
    fn a_failover_regroups_the_nodes_and_asks_for_a_new_table() {
        let p = plan(
            vec![quota(600, &[("az-a", 0.5), ("az-b", 0.5)], Priority::P0)],
            &[(1, "az-a"), (2, "az-b")],
        );
        let mut s = active(&["az-a", "az-b"]);
        let d = demand(&[(1, 30), (2, 10)]);
        let before = plan_rebalance(&p, &s, &QuotaWeights::new(), &d).unwrap();
        assert_eq!(before["deptA"].nodes[&1], PPM, "alone in its group");
        assert_eq!(plan_rebalance(&p, &s, &before, &d), None);
        s.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-b") });
        let during = plan_rebalance(&p, &s, &before, &d).expect("the groups changed");
        assert_eq!(
            during["deptA"].nodes.values().sum::<u32>(),
            PPM,
            "one group now"
        );
        let lines = overflow_lines(&p.tenants, &s, 4);
        assert_eq!(
            lines,
            ["cross_zone overflow tenant=deptA from=az-a to=az-b mode=soft_limit priority=P0 version=4"]
        );
        // Failback: the old groups, and the old table back once demand
        // looks as before.
        s.insert(z("az-a"), ZoneStatus::Active);
        let after = plan_rebalance(&p, &s, &during, &d).unwrap();
        assert_eq!(after, before);
        assert!(overflow_lines(&p.tenants, &s, 5).is_empty());
    }

    proptest! {
        #[test]
        fn no_allocation_ever_sums_above_the_global_quota(
            rpm in 0u64..1_000_000,
            raw_shares in proptest::collection::vec(1u32..1000, 1..5),
            homes in proptest::collection::vec(0usize..5, 1..8),
            demand in proptest::collection::vec(0u64..10_000, 8),
            failed in proptest::collection::vec(proptest::option::of(0usize..5), 5),
            floor in 0.0f64..1.0,
        ) {
            let n = raw_shares.len();
            let total: u32 = raw_shares.iter().sum();
            let names: Vec<ZoneId> = (0..n).map(|i| z(&format!("z{i}"))).collect();
            let q = TenantQuota {
                tenant: "t".into(),
                priority: Priority::P2,
                global: Limits { rpm: Some(rpm), tpm: Some(rpm.saturating_mul(7)), concurrency: Some(rpm % 97) },
                shares: names.iter().cloned().zip(raw_shares.iter().map(|s| f64::from(*s) / f64::from(total))).collect(),
            };
            let mut statuses: BTreeMap<ZoneId, ZoneStatus> = names.iter().map(|z| (z.clone(), ZoneStatus::Active)).collect();
            // Failovers only ever target an active zone, as the state's rules keep it.
            for (i, f) in failed.iter().enumerate().take(n) {
                if let Some(t) = f.map(|t| t % n) {
                    if t != i && statuses[&names[t]] == ZoneStatus::Active
                        && !statuses.values().any(|s| *s == ZoneStatus::FailedOver { target: names[i].clone() })
                    {
                        statuses.insert(names[i].clone(), ZoneStatus::FailedOver { target: names[t].clone() });
                    }
                }
            }
            let nodes: Vec<(NodeId, ZoneId)> = homes.iter().enumerate().map(|(i, h)| (i as NodeId, names[h % n].clone())).collect();
            let d: BTreeMap<NodeId, u64> = nodes.iter().map(|(id, _)| (*id, demand[*id as usize])).collect();
            let mut weights = BTreeMap::new();
            for (_, members) in groups(&nodes, &statuses) {
                weights.extend(rebalance_group(&members, &d, None, &BTreeSet::new(), floor));
            }
            let weights = by_node(&weights);
            for w in [None, Some(&weights)] {
                let (allocs, _) = allocate(&q, &statuses, &nodes, w);
                for unit in Unit::ALL {
                    let s: u64 = allocs.iter().filter_map(|a| a.limits.get(unit)).sum();
                    prop_assert!(s <= q.global.get(unit).unwrap(), "{:?}: {} > {:?}", unit, s, q.global);
                }
            }
            let (table, _) = zone_table(&q, &statuses);
            for unit in Unit::ALL {
                prop_assert_eq!(table.values().filter_map(|l| l.get(unit)).sum::<u64>(), q.global.get(unit).unwrap());
            }
        }

        /// 41.2: for any demand over zones and nodes (silent nodes
        /// included) and any failovers, the leader's tables never sum above
        /// the global quota, every zone keeps its floor, a silent node's
        /// zone and node weights are kept, and a failed-over zone's
        /// allocation moves whole into its target.
        #[test]
        fn zone_rebalances_keep_the_quota_the_floors_and_the_overflow(
            rpm in 1u64..1_000_000,
            raw_shares in proptest::collection::vec(1u32..1000, 1..5),
            homes in proptest::collection::vec(0usize..5, 1..8),
            first in proptest::collection::vec(proptest::option::of(0u64..10_000), 8),
            second in proptest::collection::vec(proptest::option::of(0u64..10_000), 8),
            failed in proptest::collection::vec(proptest::option::of(0usize..5), 5),
            node_floor in 0.0f64..1.0,
            threshold in 0.001f64..0.5,
        ) {
            let n = raw_shares.len();
            let total: u32 = raw_shares.iter().sum();
            let names: Vec<ZoneId> = (0..n).map(|i| z(&format!("z{i}"))).collect();
            let q = TenantQuota {
                tenant: "t".into(),
                priority: Priority::P1,
                global: Limits { rpm: Some(rpm), tpm: Some(rpm.saturating_mul(13)), concurrency: Some(rpm % 89 + 1) },
                shares: names.iter().cloned().zip(raw_shares.iter().map(|s| f64::from(*s) / f64::from(total))).collect(),
            };
            let mut statuses: BTreeMap<ZoneId, ZoneStatus> = names.iter().map(|z| (z.clone(), ZoneStatus::Active)).collect();
            for (i, f) in failed.iter().enumerate().take(n) {
                if let Some(t) = f.map(|t| t % n) {
                    if t != i && statuses[&names[t]] == ZoneStatus::Active
                        && !statuses.values().any(|s| *s == ZoneStatus::FailedOver { target: names[i].clone() })
                    {
                        statuses.insert(names[i].clone(), ZoneStatus::FailedOver { target: names[t].clone() });
                    }
                }
            }
            let nodes: Vec<(NodeId, ZoneId)> = homes.iter().enumerate().map(|(i, h)| (i as NodeId, names[h % n].clone())).collect();
            let demand_of = |d: &[Option<u64>]| -> BTreeMap<NodeId, BTreeMap<String, u64>> {
                nodes.iter().filter_map(|(id, _)| d[*id as usize].map(|v| (*id, [("t".to_owned(), v)].into()))).collect()
            };
            let p = RebalancePlan { tenants: vec![q.clone()], nodes: nodes.clone(), node_floor, drift_threshold: threshold, interval_ms: 1000 };
            let t1 = plan_rebalance(&p, &statuses, &QuotaWeights::new(), &demand_of(&first)).expect("a first table");
            let t2 = plan_rebalance(&p, &statuses, &t1, &demand_of(&second)).unwrap_or_else(|| t1.clone());
            for t in [&t1, &t2] {
                let w = &t["t"];
                prop_assert_eq!(w.zones.values().map(|v| u64::from(*v)).sum::<u64>(), u64::from(PPM));
                for (zone, share) in &q.shares {
                    let floor = ZONE_FLOOR * share * f64::from(PPM);
                    prop_assert!(f64::from(w.zones[zone]) + 1.0 >= floor, "{}: {} < floor {}", zone, w.zones[zone], floor);
                }
                let (allocs, _) = allocate(&q, &statuses, &nodes, Some(w));
                for unit in Unit::ALL {
                    let s: u64 = allocs.iter().filter_map(|a| a.limits.get(unit)).sum();
                    prop_assert!(s <= q.global.get(unit).unwrap(), "{:?}: {} > {:?}", unit, s, q.global);
                }
                let base = zone_base(&q, Some(&w.zones));
                let (table, overflows) = zone_table_weighted(&q, &statuses, Some(&w.zones));
                for unit in Unit::ALL {
                    let g = q.global.get(unit).unwrap();
                    prop_assert_eq!(table.values().filter_map(|l| l.get(unit)).sum::<u64>(), g);
                    for (zone, share) in &q.shares {
                        let b = base[zone].get(unit).unwrap() as f64;
                        prop_assert!(b + 1.0 >= (g as f64 * (ZONE_FLOOR * share - 2e-6)).floor(), "{} {:?}: {} below its floor", zone, unit, b);
                        match &statuses[zone] {
                            ZoneStatus::FailedOver { .. } => prop_assert_eq!(table[zone].get(unit), Some(0)),
                            _ => {
                                let moved_in: u64 = overflows.iter().filter(|o| o.to == *zone).filter_map(|o| o.moved.get(unit)).sum();
                                prop_assert_eq!(table[zone].get(unit), Some(base[zone].get(unit).unwrap() + moved_in));
                            }
                        }
                    }
                }
            }
            // A silent node keeps its node weight, and the zones its group
            // draws from keep theirs, when the table in force fitted.
            let silent: Vec<NodeId> = nodes.iter().map(|(id, _)| *id).filter(|id| second[*id as usize].is_none()).collect();
            for id in silent {
                prop_assert_eq!(t2["t"].nodes[&id], t1["t"].nodes[&id], "node {}", id);
                let home = &nodes[id as usize].1;
                let serves = match &statuses[home] { ZoneStatus::FailedOver { target } => target.clone(), _ => home.clone() };
                prop_assert_eq!(t2["t"].zones[&serves], t1["t"].zones[&serves], "zone {}", serves);
            }
        }

        /// 41.2's target, pure: one node per zone, demand at twice the
        /// quota split any way over the zones; the leader's table admits
        /// at least 95 % of the quota (each zone admits the smaller of its
        /// demand and its allocation: only quiet zones' floors go unused).
        #[test]
        fn any_split_of_demand_over_zones_admits_at_least_95_percent(
            rpm in 1_000u64..1_000_000,
            raw_shares in proptest::collection::vec(1u32..1000, 1..6),
            raw_demand in proptest::collection::vec(0u32..1000, 6),
        ) {
            let n = raw_shares.len();
            let total: u32 = raw_shares.iter().sum();
            let names: Vec<ZoneId> = (0..n).map(|i| z(&format!("z{i}"))).collect();
            let q = TenantQuota {
                tenant: "t".into(),
                priority: Priority::P1,
                global: Limits { rpm: Some(rpm), tpm: None, concurrency: None },
                shares: names.iter().cloned().zip(raw_shares.iter().map(|s| f64::from(*s) / f64::from(total))).collect(),
            };
            let weights: Vec<u64> = raw_demand[..n].iter().map(|d| u64::from(*d)).collect();
            prop_assume!(weights.iter().sum::<u64>() > 0);
            let offered = split(2 * rpm, &weights.iter().map(|w| *w as f64).collect::<Vec<_>>());
            let nodes: Vec<(NodeId, ZoneId)> = names.iter().enumerate().map(|(i, zn)| (i as NodeId, zn.clone())).collect();
            let demand: BTreeMap<NodeId, BTreeMap<String, u64>> = offered.iter().enumerate().map(|(i, d)| (i as NodeId, [("t".to_owned(), *d)].into())).collect();
            let p = RebalancePlan { tenants: vec![q.clone()], nodes: nodes.clone(), node_floor: 0.2, drift_threshold: 0.1, interval_ms: 1000 };
            let statuses = active(&names.iter().map(ZoneId::as_str).collect::<Vec<_>>());
            let table = plan_rebalance(&p, &statuses, &QuotaWeights::new(), &demand).expect("a first table");
            let (allocs, _) = allocate(&q, &statuses, &nodes, table.get("t"));
            let admitted: u64 = allocs.iter().map(|a| a.limits.rpm.unwrap().min(offered[a.node as usize])).sum();
            prop_assert!(admitted as f64 >= 0.95 * rpm as f64 - n as f64, "admitted {} of {} (offered {:?}, allocations {:?})", admitted, rpm, offered, allocs);
        }
    }
}
