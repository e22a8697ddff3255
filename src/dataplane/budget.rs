//! Budget admission on the request path, from local memory: each budgeted
//! tenant's grant on this node per UTC period (from the leader's
//! rebalances in the view, `zonegate_cluster::budget`), what this node
//! charged against it, and the spend it reports. A request reserves the
//! most it may cost (its prompt and the output it asks for at the
//! admission price) and settles to its answer's cost; a request that got
//! no answer gives its reservation back. A node cut off from the leader
//! spends only what it was granted; a standalone node holds the whole
//! budget (and forgets its spend when it restarts).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::Gauge;
use zonegate_cluster::budget::{floor_share, Period, PeriodSpend};
use zonegate_cluster::{ClusterView, NodeId};

use crate::config::cost::{Budget, OnBudget};
use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::telemetry::metrics::Metrics;

/// One tenant's budget in one period on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meter {
    limit: u64,
    /// [`Period::index`] of the period counted.
    period: u32,
    /// Spent and reserved in `period` on this node.
    charged: u64,
    /// What this node may charge in `period`.
    granted: u64,
    /// The cluster's grants of `period` already cover the whole budget:
    /// nothing more will come until the period ends.
    all_granted: bool,
}

impl Meter {
    /// A new period's meter: before the leader's first grant of it a node
    /// holds its floor share (standalone: the whole budget).
    fn fresh(limit: u64, period: u32, nodes: usize, standalone: bool) -> Self {
        Self {
            limit,
            period,
            charged: 0,
            granted: if standalone {
                limit
            } else {
                floor_share(limit, nodes)
            },
            all_granted: standalone,
        }
    }
}

/// One budgeted tenant: a meter per limited period, in [`Period::ALL`]
/// order.
pub struct TenantBudget {
    pub tenant: Arc<str>,
    pub on_budget: OnBudget,
    meters: Vec<(Period, Mutex<Meter>, Gauge)>,
}

/// A request's reservation against its tenant's budget; given back when
/// dropped unsettled.
pub struct Hold {
    tenant: Arc<TenantBudget>,
    /// (period index, amount) per meter, in the tenant's meter order.
    reserved: smallvec::SmallVec<[u32; 2]>,
    amount: u64,
    settled: bool,
}

impl Hold {
    /// Settles the reservation to what the answer cost (nano-units).
    pub fn settle(&mut self, cost: u64) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        for ((_, meter, _), period) in self.tenant.meters.iter().zip(&self.reserved) {
            let mut m = meter.lock();
            if m.period == *period {
                m.charged = m.charged.saturating_sub(self.amount).saturating_add(cost);
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.settle(0);
    }
}

/// Why a request was over budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Over {
    pub period: Period,
    pub on_budget: OnBudget,
    /// Seconds until more can be spent: the period's end when the whole
    /// budget is granted, else the next rebalance.
    pub retry_after_s: u64,
}

impl Over {
    /// The 429 a rejected request gets.
    pub fn error(&self, tenant: &str) -> ApiError {
        ApiError::BudgetExceeded {
            message: format!(
                "tenant `{tenant}` is over its {} budget; retry after {} s",
                match self.period {
                    Period::Day => "daily",
                    Period::Month => "monthly",
                },
                self.retry_after_s
            ),
            retry_after_s: self.retry_after_s,
        }
    }
}

/// Every tenant's budget on this node, by tenant index (`None`: not
/// budgeted). Rebuilt with the config, keeping the meters of tenants that
/// stay.
pub struct Budgets {
    node: NodeId,
    nodes: usize,
    standalone: bool,
    rebalance_s: u64,
    tenants: Vec<Option<Arc<TenantBudget>>>,
    applied: AtomicU64,
    metrics: Metrics,
}

impl Budgets {
    pub fn new(cfg: &Config, metrics: &Metrics, previous: Option<&Budgets>, now_ms: u64) -> Self {
        let serving = cfg
            .members
            .iter()
            .filter(|m| m.role != zonegate_cluster::Role::Witness)
            .count();
        let standalone = cfg.members.is_empty();
        let nodes = serving.max(1);
        let old = |name: &str, period: Period| {
            previous
                .into_iter()
                .flat_map(|p| p.tenants.iter().flatten())
                .find(|t| &*t.tenant == name)
                .and_then(|t| t.meters.iter().find(|(p, ..)| *p == period))
                .map(|(_, m, _)| *m.lock())
        };
        let tenants = cfg
            .tenants
            .iter()
            .zip(&cfg.costs.budgets)
            .map(|(t, b): (_, &Budget)| {
                if !b.is_limited() {
                    return None;
                }
                let meters = Period::ALL
                    .iter()
                    .filter_map(|p| {
                        let limit = match p {
                            Period::Day => b.per_day,
                            Period::Month => b.per_month,
                        }?;
                        let index = p.index(now_ms);
                        let meter = match old(&t.name, *p) {
                            Some(m) if m.period == index => Meter { limit, ..m },
                            _ => Meter::fresh(limit, index, nodes, standalone),
                        };
                        let gauge = metrics
                            .budget_remaining
                            .with_label_values(&[&t.name, p.name()]);
                        Some((*p, Mutex::new(meter), gauge))
                    })
                    .collect();
                Some(Arc::new(TenantBudget {
                    tenant: Arc::clone(&t.name),
                    on_budget: b.on_budget,
                    meters,
                }))
            })
            .collect();
        Self {
            node: cfg.node.id,
            nodes,
            standalone,
            rebalance_s: cfg.quotas.rebalance_interval.as_secs().max(1),
            tenants,
            applied: AtomicU64::new(u64::MAX),
            metrics: metrics.clone(),
        }
    }

    /// Takes this node's grants and recorded spend from `view` when it is
    /// newer than the one applied (one atomic load otherwise).
    pub fn refresh(&self, view: &ClusterView, now_ms: u64) {
        if self.applied.swap(view.decision_version, Ordering::AcqRel) == view.decision_version {
            return;
        }
        for t in self.tenants.iter().flatten() {
            let lines = view.budgets.get(&*t.tenant);
            for (period, meter, gauge) in &t.meters {
                let mut m = meter.lock();
                self.roll(&mut m, *period, now_ms);
                if let Some(line) = lines
                    .and_then(|l| l.get(period))
                    .filter(|l| l.period == m.period)
                {
                    if let Some(g) = line.nodes.get(&self.node) {
                        m.granted = g.granted;
                        // A restarted node resumes from its recorded spend.
                        m.charged = m.charged.max(g.spent);
                    }
                    m.all_granted = line.granted() >= m.limit;
                }
                gauge.set(crate::dataplane::cost::units(
                    m.granted.saturating_sub(m.charged),
                ));
            }
        }
    }

    /// A new period on this node's clock starts a fresh meter.
    fn roll(&self, m: &mut Meter, period: Period, now_ms: u64) {
        let index = period.index(now_ms);
        if index > m.period {
            *m = Meter::fresh(m.limit, index, self.nodes, self.standalone);
        }
    }

    /// Reserves `ceiling` nano-units of tenant `index`'s budget at
    /// `now_ms`: `Ok(None)` for a tenant without a budget, `Ok(Some)` with
    /// the hold to settle, or the period it is over.
    pub fn admit(&self, index: usize, ceiling: u64, now_ms: u64) -> Result<Option<Hold>, Over> {
        let Some(t) = self.tenants.get(index).and_then(Option::as_ref) else {
            return Ok(None);
        };
        let mut guards: smallvec::SmallVec<[_; 2]> =
            t.meters.iter().map(|(p, m, _)| (*p, m.lock())).collect();
        for (period, m) in guards.iter_mut() {
            self.roll(m, *period, now_ms);
            // At least something must be left: a request whose ceiling
            // alone passes the grant still goes when nothing else is
            // charged (its settlement then counts what it cost).
            let room = m.granted.saturating_sub(m.charged);
            if room == 0 || (ceiling > room && m.charged > 0) {
                let retry_after_s = if m.all_granted {
                    period
                        .end_ms(m.period)
                        .saturating_sub(now_ms)
                        .div_ceil(1000)
                } else {
                    self.rebalance_s
                };
                self.metrics
                    .budget_exceeded
                    .with_label_values(&[&t.tenant, period.name(), reject_label(t.on_budget)])
                    .inc();
                return Err(Over {
                    period: *period,
                    on_budget: t.on_budget,
                    retry_after_s,
                });
            }
        }
        let mut reserved = smallvec::SmallVec::new();
        for (_, m) in guards.iter_mut() {
            m.charged = m.charged.saturating_add(ceiling);
            reserved.push(m.period);
        }
        drop(guards);
        Ok(Some(Hold {
            tenant: Arc::clone(t),
            reserved,
            amount: ceiling,
            settled: false,
        }))
    }

    /// Tenant `name`'s spend so far in its current periods, for the
    /// demand report (`None` for a tenant without a budget).
    pub fn period_spend(&self, name: &str) -> Option<PeriodSpend> {
        let t = self.tenants.iter().flatten().find(|t| &*t.tenant == name)?;
        let mut out = BTreeMap::new();
        for (period, meter, gauge) in &t.meters {
            let m = *meter.lock();
            out.insert(*period, (m.period, m.charged));
            gauge.set(crate::dataplane::cost::units(
                m.granted.saturating_sub(m.charged),
            ));
        }
        Some(out)
    }

    /// The names of the budgeted tenants.
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<TenantBudget>> {
        self.tenants.iter().flatten()
    }

    /// What the leader's budget split needs from this node's config.
    pub fn plan(cfg: &Config) -> zonegate_cluster::budget::BudgetPlan {
        let nodes: Vec<NodeId> = cfg
            .members
            .iter()
            .filter(|m| m.role != zonegate_cluster::Role::Witness)
            .map(|m| m.id)
            .collect();
        let tenants = cfg
            .tenants
            .iter()
            .zip(&cfg.costs.budgets)
            .filter(|(_, b)| b.is_limited())
            .map(|(t, b)| zonegate_cluster::budget::TenantBudget {
                tenant: t.name.to_string(),
                limits: [(Period::Day, b.per_day), (Period::Month, b.per_month)]
                    .into_iter()
                    .filter_map(|(p, l)| l.map(|l| (p, l)))
                    .collect(),
            })
            .collect();
        zonegate_cluster::budget::BudgetPlan { tenants, nodes }
    }
}

/// After the quota's `feed_rebalance`: this node's demand reports carry
/// each tenant's spend (per model since the last report, and per budget
/// period so far), the leader's budget split gets the tenants' budgets,
/// and on the leader the nodes' reported spend goes into `cluster` (the
/// cluster-wide `GET /admin/v1/spend`).
pub fn feed(
    node: &zonegate_cluster::ClusterNode,
    cfg: &Config,
    quotas: &crate::dataplane::quota::Quotas,
    budgets: &Arc<Budgets>,
    (mine, cluster): (
        &Arc<crate::dataplane::spend::Ledger>,
        &Arc<crate::dataplane::spend::Ledger>,
    ),
) {
    let tenants = quotas.tenants.clone();
    let (budgets, mine) = (Arc::clone(budgets), Arc::clone(mine));
    node.set_demand_source(Arc::new(move || {
        let mut demand = crate::dataplane::quota::Quotas::take_demand(&tenants);
        let mut spent = mine.take_pending();
        for t in budgets.tenants() {
            if !demand.iter().any(|d| *d.tenant == *t.tenant) {
                demand.push(zonegate_cluster::TenantDemand {
                    tenant: t.tenant.to_string(),
                    offered: 0,
                    admitted: 0,
                    spend: Default::default(),
                });
            }
        }
        for t in spent.keys() {
            if !demand.iter().any(|d| *d.tenant == **t) {
                demand.push(zonegate_cluster::TenantDemand {
                    tenant: t.to_string(),
                    offered: 0,
                    admitted: 0,
                    spend: Default::default(),
                });
            }
        }
        for d in &mut demand {
            d.spend.models = spent.remove(d.tenant.as_str()).unwrap_or_default();
            d.spend.periods = budgets.period_spend(&d.tenant).unwrap_or_default();
        }
        demand
    }));
    let cluster = Arc::clone(cluster);
    node.set_budgets(
        Budgets::plan(cfg),
        Arc::new(move |_node, demand| {
            let now = crate::clock::unix_ms();
            for d in demand {
                for (model, nanos) in &d.spend.models {
                    cluster.record_reported(&d.tenant, model, *nanos, now);
                }
            }
        }),
    );
}

fn reject_label(on: OnBudget) -> &'static str {
    match on {
        OnBudget::Reject => "rejected",
        OnBudget::Cheapest => "cheapest",
    }
}

#[cfg(test)]
mod tests;
