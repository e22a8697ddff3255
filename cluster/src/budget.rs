//! Budget arithmetic, pure: the UTC periods (day, month) a budget counts
//! in, and the leader's split of each tenant's budget over the serving
//! nodes. Amounts are nano-units of the config's currency, as integers.
//!
//! A node's grant is what it may spend in a period, cumulative: the
//! leader raises it (never lowers it) from the budget's unallotted rest,
//! by the node's recent spend with a floor, and records the spend the node
//! reported. So the grants of a period never sum above the budget, a node
//! cut off from the leader spends at most its grant, and a node that
//! restarts resumes from its recorded spend: after a full-cluster restart
//! at most the grants' unspent rest at the last rebalance is spent again
//! (see [`target`]: a floor share plus twice one interval's spend per
//! node).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::view::NodeId;

/// The share of a budget every node may hold ahead of its spend whatever
/// its demand (split equally over the nodes), so a quiet node admits its
/// first requests before the next rebalance; also what a node may spend in
/// a new period before the leader's first grant of it.
pub const BUDGET_FLOOR: f64 = 0.01;

/// A node is granted this many rebalance intervals of its recent spend
/// ahead of it.
pub const HEADROOM_INTERVALS: u64 = 2;

/// The most budget lines (tenant × period × node) a decision carries.
pub const MAX_BUDGET_GRANTS: usize = 16 * 1024;

/// A budget's period: the UTC day or the UTC month.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub const ALL: [Period; 2] = [Period::Day, Period::Month];

    /// The stable name (`day`, `month`), as in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The period holding `now_ms` (ms since the Unix epoch): days since
    /// the epoch, or months since January 1970.
    pub fn index(self, now_ms: u64) -> u32 {
        let days = now_ms / DAY_MS;
        match self {
            Period::Day => u32::try_from(days).unwrap_or(u32::MAX),
            Period::Month => {
                let (y, m, _) = civil_from_days(days);
                u32::try_from((y - 1970) * 12 + i64::from(m) - 1).unwrap_or(0)
            }
        }
    }

    /// When period `index` ends (ms since the epoch): the next one's start.
    pub fn end_ms(self, index: u32) -> u64 {
        match self {
            Period::Day => (u64::from(index) + 1).saturating_mul(DAY_MS),
            Period::Month => {
                let next = i64::from(index) + 1;
                let (y, m) = (1970 + next.div_euclid(12), next.rem_euclid(12) + 1);
                days_from_civil(y, m as u32).saturating_mul(DAY_MS)
            }
        }
    }
}

const DAY_MS: u64 = 86_400_000;

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of the first of month `m` (1-12) of year `y`.
fn days_from_civil(y: i64, m: u32) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).unwrap_or(0)
}

/// One node's part of one budget line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// What the node may spend in the period (cumulative).
    pub granted: u64,
    /// What the node reported spent in the period, as of the decision.
    pub spent: u64,
}

/// One tenant's budget in one period: every node's grant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLine {
    /// [`Period::index`] of the period the grants are for.
    pub period: u32,
    pub nodes: BTreeMap<NodeId, Grant>,
}

impl BudgetLine {
    /// The grants' sum.
    pub fn granted(&self) -> u64 {
        self.nodes
            .values()
            .fold(0u64, |a, g| a.saturating_add(g.granted))
    }

    /// The recorded spend's sum.
    pub fn spent(&self) -> u64 {
        self.nodes
            .values()
            .fold(0u64, |a, g| a.saturating_add(g.spent))
    }
}

/// Tenant → period → its line: the replicated budget table.
pub type BudgetTable = BTreeMap<String, BTreeMap<Period, BudgetLine>>;

/// A tenant's budget as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantBudget {
    pub tenant: String,
    /// Period → the budget in nano-units.
    pub limits: BTreeMap<Period, u64>,
}

/// What one node reports of one tenant's spend in its current periods:
/// period → (its index, spent so far in it). Part of [`TenantDemand`].
///
/// [`TenantDemand`]: crate::detect::TenantDemand
pub type PeriodSpend = BTreeMap<Period, (u32, u64)>;

/// What the leader's budget split works from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BudgetPlan {
    pub tenants: Vec<TenantBudget>,
    /// The nodes that serve traffic.
    pub nodes: Vec<NodeId>,
}

/// How much a node should hold unspent: [`HEADROOM_INTERVALS`] times
/// what it spent since the last rebalance, at least its equal share of
/// [`BUDGET_FLOOR`].
pub fn target(limit: u64, nodes: usize, recent: u64) -> u64 {
    floor_share(limit, nodes).max(recent.saturating_mul(HEADROOM_INTERVALS))
}

/// One node's equal share of [`BUDGET_FLOOR`] of `limit`.
pub fn floor_share(limit: u64, nodes: usize) -> u64 {
    (limit as f64 * BUDGET_FLOOR / nodes.max(1) as f64) as u64
}

/// The leader's budget split, pure: for every tenant and period, each
/// node's spend recorded (the larger of what the table holds and what it
/// reported for that period, `reports`: node → tenant → [`PeriodSpend`];
/// nodes missing are silent), its grant raised to cover it, then the
/// budget's unallotted rest handed to the reporting nodes by what each
/// lacks of its [`target`], in proportion when the rest is short. A new
/// period (at `now_ms`) starts a new line. Grants never drop within a
/// period, so they never sum above the budget.
pub fn plan_budgets(
    plan: &BudgetPlan,
    previous: &BudgetTable,
    reports: &BTreeMap<NodeId, BTreeMap<String, PeriodSpend>>,
    now_ms: u64,
) -> BudgetTable {
    let nodes: BTreeSet<NodeId> = plan.nodes.iter().copied().collect();
    let mut table = BudgetTable::new();
    for t in &plan.tenants {
        let mut lines = BTreeMap::new();
        for (&period, &limit) in &t.limits {
            let index = period.index(now_ms);
            let prev = previous
                .get(&t.tenant)
                .and_then(|l| l.get(&period))
                .filter(|l| l.period == index);
            let mut line = BudgetLine {
                period: index,
                nodes: BTreeMap::new(),
            };
            let mut lacks: Vec<(NodeId, u64)> = Vec::new();
            for &n in &nodes {
                let before = prev
                    .and_then(|l| l.nodes.get(&n))
                    .copied()
                    .unwrap_or_default();
                let reported = reports
                    .get(&n)
                    .and_then(|r| r.get(&t.tenant))
                    .and_then(|s| s.get(&period))
                    .filter(|(i, _)| *i == index)
                    .map(|(_, spent)| *spent);
                let spent = before.spent.max(reported.unwrap_or(0));
                // A node spends up to the floor share of a period before
                // its first grant of it.
                let held = if prev.is_some_and(|l| l.nodes.contains_key(&n)) {
                    before.granted
                } else {
                    floor_share(limit, nodes.len())
                };
                let granted = held.max(spent);
                line.nodes.insert(n, Grant { granted, spent });
                if reports.contains_key(&n) {
                    let want = target(limit, nodes.len(), spent.saturating_sub(before.spent));
                    let lack = want.saturating_sub(granted - spent);
                    if lack > 0 {
                        lacks.push((n, lack));
                    }
                }
            }
            let rest = limit.saturating_sub(line.granted());
            let asked: u64 = lacks.iter().fold(0u64, |a, (_, l)| a.saturating_add(*l));
            let give = rest.min(asked);
            if give > 0 {
                let weights: Vec<f64> = lacks.iter().map(|(_, l)| *l as f64).collect();
                for ((n, _), part) in lacks.iter().zip(crate::quota::split(give, &weights)) {
                    if let Some(g) = line.nodes.get_mut(n) {
                        g.granted = g.granted.saturating_add(part);
                    }
                }
            }
            lines.insert(period, line);
        }
        table.insert(t.tenant.clone(), lines);
    }
    table
}

/// The number of (tenant, period, node) grants of a table.
pub fn grant_count(table: &BudgetTable) -> usize {
    table
        .values()
        .flat_map(|l| l.values())
        .map(|l| l.nodes.len())
        .sum()
}

#[cfg(test)]
mod tests;

/// The spend each node reported, per tenant and period, from the nodes'
/// latest demand reports (`demand`: node → its tenants' demand).
pub fn reported_spend<'a>(
    demand: impl IntoIterator<Item = (NodeId, &'a [crate::detect::TenantDemand])>,
) -> BTreeMap<NodeId, BTreeMap<String, PeriodSpend>> {
    demand
        .into_iter()
        .map(|(n, d)| {
            let by_tenant = d
                .iter()
                .filter(|t| !t.spend.periods.is_empty())
                .map(|t| (t.tenant.clone(), t.spend.periods.clone()))
                .collect();
            (n, by_tenant)
        })
        .collect()
}

/// The rebalance decision to propose, if any: with budgets configured
/// (`budgets` is the new table), a `RebalanceWithBudgets` when the quota
/// weights drifted (`weights`) or the budget table changed, carrying the
/// weights in force when only budgets moved; without, a `Rebalance` when
/// the weights drifted.
pub fn rebalance_decision(
    weights: Option<crate::quota::QuotaWeights>,
    budgets: Option<BudgetTable>,
    in_force: (&crate::quota::QuotaWeights, &BudgetTable),
) -> Option<crate::command::Decision> {
    use crate::command::Decision;
    match budgets {
        Some(b) if weights.is_some() || b != *in_force.1 => Some(Decision::RebalanceWithBudgets {
            weights: weights.unwrap_or_else(|| in_force.0.clone()),
            budgets: b,
        }),
        Some(_) => None,
        None => weights.map(|weights| Decision::Rebalance { weights }),
    }
}
