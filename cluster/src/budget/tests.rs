use super::*;

const DAY: u64 = DAY_MS;

fn plan(limit: u64, nodes: &[NodeId]) -> BudgetPlan {
    BudgetPlan {
        tenants: vec![TenantBudget {
            tenant: "t".into(),
            limits: [(Period::Day, limit)].into_iter().collect(),
        }],
        nodes: nodes.to_vec(),
    }
}

fn reports(spent: &[(NodeId, u32, u64)]) -> BTreeMap<NodeId, BTreeMap<String, PeriodSpend>> {
    spent
        .iter()
        .map(|(n, p, s)| {
            let mut by_period = PeriodSpend::new();
            by_period.insert(Period::Day, (*p, *s));
            (*n, [("t".to_owned(), by_period)].into_iter().collect())
        })
        .collect()
}

fn line(t: &BudgetTable) -> &BudgetLine {
    &t["t"][&Period::Day]
}

#[test]
fn periods_are_utc_days_and_months_with_their_ends() {
    // 2026-12-06T07:00Z.
    let now = 1_796_540_400_000;
    assert_eq!(Period::Day.index(now), 20_793);
    assert_eq!(Period::Day.end_ms(20_793), 20_794 * DAY);
    // December 2026 is month (2026 − 1970) × 12 + 11.
    assert_eq!(Period::Month.index(now), 56 * 12 + 11);
    // It ends on 2027-01-01T00:00Z.
    assert_eq!(Period::Month.end_ms(56 * 12 + 11), 1_798_761_600_000);
    assert_eq!(Period::Month.index(0), 0);
    assert_eq!(Period::Month.end_ms(0), 31 * DAY);
    // February of a leap year (2028) has 29 days.
    let feb_2028 = (2028 - 1970) * 12 + 1;
    assert_eq!(
        Period::Month.end_ms(feb_2028) - Period::Month.end_ms(feb_2028 - 1),
        29 * DAY
    );
    for m in [0u32, 1, 11, 12, 700] {
        assert_eq!(Period::Month.index(Period::Month.end_ms(m)), m + 1);
        assert_eq!(Period::Month.index(Period::Month.end_ms(m) - 1), m);
    }
}

#[test]
fn a_first_split_gives_every_node_its_floor_share() {
    let t = plan_budgets(
        &plan(3_000_000, &[1, 2, 3]),
        &BudgetTable::new(),
        &reports(&[]),
        0,
    );
    let l = line(&t);
    assert_eq!(l.period, 0);
    for n in [1, 2, 3] {
        assert_eq!(
            l.nodes[&n],
            Grant {
                granted: 10_000,
                spent: 0
            }
        );
    }
}

#[test]
fn grants_follow_spend_and_never_sum_above_the_budget() {
    let limit = 1_000_000;
    let p = plan(limit, &[1, 2, 3]);
    let mut table = plan_budgets(&p, &BudgetTable::new(), &reports(&[]), 0);
    let mut spent = [0u64; 3];
    // Nodes spend 70/20/10 of what they may, every rebalance, until the
    // budget is gone.
    for _ in 0..200 {
        let l = line(&table).clone();
        for (i, share) in [7u64, 2, 1].iter().enumerate() {
            let n = i as NodeId + 1;
            let room = l.nodes[&n].granted.saturating_sub(spent[i]);
            spent[i] += room.min(share * 5_000);
        }
        let r = reports(&[(1, 0, spent[0]), (2, 0, spent[1]), (3, 0, spent[2])]);
        let next = plan_budgets(&p, &table, &r, 0);
        let nl = line(&next);
        assert!(nl.granted() <= limit, "{nl:?}");
        for (n, g) in &nl.nodes {
            assert!(g.granted >= l.nodes[n].granted, "a grant never drops");
            assert!(g.spent >= l.nodes[n].spent, "recorded spend never drops");
        }
        table = next;
    }
    let total: u64 = spent.iter().sum();
    assert_eq!(total, limit, "the whole budget is spent, no more");
    // The busy node got most of it.
    assert!(spent[0] > spent[1] && spent[1] > spent[2], "{spent:?}");
}

#[test]
fn a_silent_node_keeps_its_grant_and_gets_no_more() {
    let p = plan(1_000_000, &[1, 2]);
    let first = plan_budgets(&p, &BudgetTable::new(), &reports(&[]), 0);
    let r = reports(&[(1, 0, 5_000)]);
    let next = plan_budgets(&p, &first, &r, 0);
    assert_eq!(line(&next).nodes[&2], line(&first).nodes[&2]);
    assert!(line(&next).nodes[&1].granted > line(&first).nodes[&1].granted);
    assert_eq!(line(&next).nodes[&1].spent, 5_000);
}

#[test]
fn a_new_period_starts_a_new_line_and_stale_reports_are_ignored() {
    let p = plan(1_000_000, &[1]);
    let day0 = plan_budgets(&p, &BudgetTable::new(), &reports(&[(1, 0, 9_000)]), 0);
    assert_eq!(line(&day0).nodes[&1].spent, 9_000);
    // Next day: yesterday's spend (a report still of period 0) counts nothing.
    let day1 = plan_budgets(&p, &day0, &reports(&[(1, 0, 9_500)]), DAY);
    assert_eq!(line(&day1).period, 1);
    assert_eq!(line(&day1).nodes[&1].spent, 0);
}

#[test]
fn the_rest_is_split_by_what_each_node_lacks_when_short() {
    let p = plan(100_000, &[1, 2]);
    let mut prev = BudgetTable::new();
    let mut l = BudgetLine::default();
    l.nodes.insert(
        1,
        Grant {
            granted: 60_000,
            spent: 0,
        },
    );
    l.nodes.insert(
        2,
        Grant {
            granted: 20_000,
            spent: 0,
        },
    );
    prev.insert("t".into(), [(Period::Day, l)].into_iter().collect());
    // Node 1 spent 60k (lacks 120k), node 2 spent 20k (lacks 40k): 20k left
    // goes 3:1.
    let next = plan_budgets(&p, &prev, &reports(&[(1, 0, 60_000), (2, 0, 20_000)]), 0);
    let nl = line(&next);
    assert_eq!(nl.granted(), 100_000);
    assert_eq!(nl.nodes[&1].granted, 75_000);
    assert_eq!(nl.nodes[&2].granted, 25_000);
}

#[test]
fn a_rebalance_carries_budgets_when_they_moved_and_the_weights_in_force() {
    use crate::command::Decision;
    use crate::quota::{QuotaWeights, TenantWeights};
    let weights: QuotaWeights = [("q".to_owned(), TenantWeights::default())]
        .into_iter()
        .collect();
    let old = plan_budgets(&plan(1_000, &[1]), &BudgetTable::new(), &reports(&[]), 0);
    let new = plan_budgets(&plan(1_000, &[1]), &old, &reports(&[(1, 0, 10)]), 0);
    let in_force = (&weights, &old);
    // Budgets unchanged, weights steady: nothing.
    assert_eq!(rebalance_decision(None, Some(old.clone()), in_force), None);
    // Budgets moved: the weights in force go along.
    assert_eq!(
        rebalance_decision(None, Some(new.clone()), in_force),
        Some(Decision::RebalanceWithBudgets {
            weights: weights.clone(),
            budgets: new.clone()
        })
    );
    // No budgets configured: the format-3 decision.
    assert_eq!(
        rebalance_decision(Some(weights.clone()), None, in_force),
        Some(Decision::Rebalance {
            weights: weights.clone()
        })
    );
    assert_eq!(rebalance_decision(None, None, in_force), None);
}

#[test]
fn a_state_applies_budget_grants_and_a_format_3_state_reads_without_any() {
    use crate::command::{Command, Decision};
    use crate::state::ClusterState;
    let budgets = plan_budgets(&plan(1_000, &[1]), &BudgetTable::new(), &reports(&[]), 0);
    let mut s = ClusterState::with_zones(["az-a"]);
    let cmd = Command::decide(
        Decision::RebalanceWithBudgets {
            weights: Default::default(),
            budgets: budgets.clone(),
        },
        "rebalancer:1",
        "budget spend recorded",
    );
    s.apply(&cmd);
    assert_eq!(s.budgets(), &budgets);
    assert_eq!(*s.view().budgets, budgets);
    let bytes = crate::codec::encode(&s).unwrap();
    let back: ClusterState = crate::codec::decode(&bytes).unwrap();
    assert_eq!(back.budgets(), &budgets);
}
