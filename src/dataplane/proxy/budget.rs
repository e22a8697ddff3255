//! The budget stage, after the quota's: the tenant's budget on this node
//! reserves the most the request may cost (`dataplane::budget`). Over it,
//! the request gets 429 `budget_exceeded`, or with `on_budget =
//! "cheapest"` only the cheapest model of its chain (each meets the
//! request's tier) answers, routed `budget:cheapest`.

use crate::config::cost::OnBudget;
use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::dataplane::quota::Admission;
use crate::node::gateway::Gateway;

use super::chain::{Chain, Link};

/// Reserves the request's ceiling against its tenant's budget, at
/// `now_ms` (the hold goes into `admission`), or narrows `chain` to its
/// cheapest model, or refuses.
pub(super) fn admit(
    gw: &Gateway,
    facts: &super::RequestFacts,
    chain: &mut Chain<'_>,
    admission: &mut Admission,
    now_ms: u64,
) -> Result<(), ApiError> {
    let budgets = gw.budgets.load();
    budgets.refresh(&facts.view, now_ms);
    let Some((primary, _)) = chain.first() else {
        return Ok(());
    };
    let price = facts.cfg.costs.ceiling(&primary.cfg.name);
    let ceiling = admission.estimate().ceiling(price);
    match budgets.admit(facts.tenant_index, ceiling, now_ms) {
        Ok(hold) => {
            admission.budget = hold;
            Ok(())
        }
        Err(over) if over.on_budget == OnBudget::Cheapest => {
            let cheapest = cheapest(&facts.cfg, chain);
            if let Some(i) = cheapest {
                let (model, _) = chain[i];
                chain.clear();
                chain.push((model, Link::Budget));
            }
            Ok(())
        }
        Err(over) => Err(over.error(&facts.tenant)),
    }
}

/// The chain's cheapest model by its dearest price per token (input plus
/// output; an unpriced model costs nothing), the earliest of equals.
fn cheapest(cfg: &Config, chain: &Chain<'_>) -> Option<usize> {
    let cost = |name: &str| {
        cfg.costs
            .ceiling(name)
            .map_or(0.0, |p| p.input_nanos + p.output_nanos)
    };
    (0..chain.len()).min_by(|&a, &b| {
        cost(&chain[a].0.cfg.name)
            .total_cmp(&cost(&chain[b].0.cfg.name))
            .then(a.cmp(&b))
    })
}
