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

use crate::zone::{NodeId, ZoneId, ZoneStatus};

/// Tenant priority: P0 is never starved, P2 yields first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Priority {
    P0,
    P1,
    P2,
}

impl Priority {
    /// Highest first; a priority's place here is `priority as usize`.
    pub const ALL: [Priority; 3] = [Priority::P0, Priority::P1, Priority::P2];

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

/// Capacity units in flight, by the priority of the requests holding them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub p0: u64,
    pub p1: u64,
    pub p2: u64,
}

impl Held {
    pub fn total(&self) -> u64 {
        self.p0.saturating_add(self.p1).saturating_add(self.p2)
    }

    pub fn of(&mut self, priority: Priority) -> &mut u64 {
        match priority {
            Priority::P0 => &mut self.p0,
            Priority::P1 => &mut self.p1,
            Priority::P2 => &mut self.p2,
        }
    }
}

/// The priority shedding rule. A zone's capacity `total` (units); `held`
/// units in flight; a request costing `cost`. P0 may use all of it. P1
/// leaves free `reserve × total` for P0, less what P0 already holds; P2
/// leaves that too, and `2 × reserve × total` for P0 and P1 together,
/// less what they hold.
/// With nothing of P0's or P1's in flight that is P1 stopping at
/// `1 − reserve` and P2 at `1 − 2 × reserve` of the units; once the higher
/// priorities hold their reserve, the rest is anybody's (no unit idles
/// while a lower priority waits for it). `reserve` is in [0, 0.5)
/// (validated by config). A zone with no declared capacity (`total == 0`)
/// sheds nothing.
pub fn shed(priority: Priority, held: Held, cost: u64, total: u64, reserve: f64) -> Option<Shed> {
    if total == 0 {
        return None;
    }
    let after = held.total().saturating_add(cost);
    if after > total {
        return Some(Shed::Full);
    }
    let room = reserve * total as f64;
    // P0's reserve, less what P0 holds: kept by P1 and P2 alike.
    let for_p0 = room - held.p0 as f64;
    let kept = match priority {
        Priority::P0 => return None,
        Priority::P1 => for_p0,
        // And P0's and P1's together, less what they hold.
        Priority::P2 => for_p0.max(2.0 * room - held.p0.saturating_add(held.p1) as f64),
    };
    if after as f64 + kept.max(0.0) <= total as f64 {
        None
    } else {
        Some(Shed::Priority(priority))
    }
}

#[cfg(test)]
mod tests;
