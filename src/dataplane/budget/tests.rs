use std::sync::Arc;

use zonegate_cluster::budget::{BudgetLine, Grant, Period};
use zonegate_cluster::ClusterView;

use super::*;
use crate::config::tests::MINIMAL;

/// 2026-12-06T12:00Z.
const NOON: u64 = 1_796_558_400_000;
const UNIT: u64 = 1_000_000_000;

fn cfg(budget: &str, cluster: bool) -> Config {
    let mut text = MINIMAL.replace("priority = \"P0\"", &format!("priority = \"P0\"\n{budget}"));
    if cluster {
        text.push_str(
            "\n[cluster]\nallow_plaintext = true\n\
             [[cluster.members]]\nid = 1\nzone = \"az-a\"\nraft = \"127.0.0.1:1\"\nadmin = \"127.0.0.1:2\"\n\
             [[cluster.members]]\nid = 2\nzone = \"az-a\"\nraft = \"127.0.0.1:3\"\nadmin = \"127.0.0.1:4\"\n",
        );
    }
    Config::parse("t.toml", &text).unwrap()
}

fn view(version: u64, granted: u64, spent: u64, all: u64) -> ClusterView {
    let mut v = ClusterView::initial([&zonegate_cluster::ZoneId::new("az-a")]);
    v.decision_version = version;
    let mut line = BudgetLine {
        period: Period::Day.index(NOON),
        ..BudgetLine::default()
    };
    line.nodes.insert(1, Grant { granted, spent });
    line.nodes.insert(
        2,
        Grant {
            granted: all - granted,
            spent: 0,
        },
    );
    let mut t = BudgetTable::new();
    t.insert("deptA".into(), [(Period::Day, line)].into_iter().collect());
    v.budgets = Arc::new(t);
    v
}

use zonegate_cluster::budget::BudgetTable;

#[test]
fn a_standalone_node_spends_its_whole_budget_then_refuses_until_the_day_ends() {
    let b = Budgets::new(
        &cfg("budget = { per_day = 1.0 }", false),
        &Metrics::new(),
        None,
        NOON,
    );
    let mut holds = Vec::new();
    for _ in 0..4 {
        holds.push(b.admit(0, UNIT / 4, NOON).unwrap().unwrap());
    }
    let over = b.admit(0, 1, NOON).err().unwrap();
    assert_eq!(over.period, Period::Day);
    assert_eq!(over.retry_after_s, 12 * 3600, "to midnight UTC");
    let e = over.error("deptA");
    assert_eq!(e.code(), "budget_exceeded");
    assert_eq!(e.status(), http::StatusCode::TOO_MANY_REQUESTS);
    // Two answers cost less than reserved, one got no answer: room again.
    holds[0].settle(UNIT / 8);
    holds[1].settle(UNIT / 8);
    drop(holds.pop());
    assert!(b.admit(0, UNIT / 2, NOON).unwrap().is_some());
    // The next day starts afresh.
    assert!(b.admit(0, UNIT, NOON + 12 * 3600 * 1000).unwrap().is_some());
}

#[test]
fn a_tenant_without_a_budget_is_never_held() {
    let b = Budgets::new(&cfg("", false), &Metrics::new(), None, NOON);
    assert!(b.admit(0, u64::MAX, NOON).unwrap().is_none());
}

#[test]
fn a_cluster_node_spends_its_grant_and_resumes_from_recorded_spend_after_a_restart() {
    let c = cfg("budget = { per_day = 1.0 }", true);
    let b = Budgets::new(&c, &Metrics::new(), None, NOON);
    // Before any grant: its floor share (1 % over two nodes), and a first
    // request goes even above it.
    let first = b.admit(0, UNIT / 10, NOON).unwrap().unwrap();
    let over = b.admit(0, 1, NOON).err().unwrap();
    assert_eq!(
        over.retry_after_s, 5,
        "the next rebalance, not the period's end"
    );
    drop(first);
    // Granted 0.4 of 1.0 (the other node 0.6: all granted).
    b.refresh(&view(1, 4 * UNIT / 10, 0, UNIT), NOON);
    let h = b.admit(0, 3 * UNIT / 10, NOON).unwrap().unwrap();
    let over = b.admit(0, 2 * UNIT / 10, NOON).err().unwrap();
    assert_eq!(
        over.retry_after_s,
        12 * 3600,
        "all granted: the period's end"
    );
    drop(h);
    // A restart with 0.35 recorded spent: only 0.05 is left to it.
    let restarted = Budgets::new(&c, &Metrics::new(), None, NOON);
    restarted.refresh(&view(2, 4 * UNIT / 10, 35 * UNIT / 100, UNIT), NOON);
    assert_eq!(
        restarted.period_spend("deptA").unwrap()[&Period::Day],
        (Period::Day.index(NOON), 35 * UNIT / 100)
    );
    let h = restarted.admit(0, 5 * UNIT / 100, NOON).unwrap().unwrap();
    assert!(restarted.admit(0, 1, NOON).is_err());
    drop(h);
    // A config change keeps the meters.
    let again = Budgets::new(&c, &Metrics::new(), Some(&restarted), NOON);
    assert_eq!(again.period_spend("deptA"), restarted.period_spend("deptA"));
}
