//! Tests of `quota.rs`.

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
        let d: BTreeMap<NodeId, u64> = [1, 2, 3].into_iter().zip(demand.iter().copied()).collect();
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
    let h = |p0, p1, p2| Held { p0, p1, p2 };
    let lower = |n| h(0, 0, n);
    // (priority, held, cost, total, reserve) → decision.
    type Case = (Priority, Held, u64, u64, f64, Option<Shed>);
    let cases: &[Case] = &[
        (P2, lower(50), 1, 100, 0.2, None),
        (P2, lower(59), 1, 100, 0.2, None),
        (P2, lower(60), 1, 100, 0.2, Some(Shed::Priority(P2))),
        (P1, lower(60), 1, 100, 0.2, None),
        (P1, lower(79), 1, 100, 0.2, None),
        (P1, lower(80), 1, 100, 0.2, Some(Shed::Priority(P1))),
        (P0, lower(80), 1, 100, 0.2, None),
        (P0, lower(99), 1, 100, 0.2, None),
        (P0, lower(100), 1, 100, 0.2, Some(Shed::Full)),
        (P2, lower(100), 1, 100, 0.2, Some(Shed::Full)),
        (P1, lower(77), 4, 100, 0.2, Some(Shed::Priority(P1))),
        (P2, lower(0), 1, 0, 0.2, None),
        (P2, lower(99), 1, 100, 0.0, None),
        // P0 holding its reserve: what is left is anybody's.
        (P2, h(40, 0, 59), 1, 100, 0.2, None),
        (P2, h(40, 0, 60), 1, 100, 0.2, Some(Shed::Full)),
        // P0 holding half of it: P2 leaves the other half free.
        (P2, h(20, 0, 59), 1, 100, 0.2, None),
        (P2, h(20, 0, 60), 1, 100, 0.2, Some(Shed::Priority(P2))),
        // P1's units count for P2's reserve, not for P1's own, and
        // never eat into P0's: P2 still leaves P0 its 20.
        (P2, h(0, 40, 39), 1, 100, 0.2, None),
        (P2, h(0, 40, 40), 1, 100, 0.2, Some(Shed::Priority(P2))),
        (P2, h(10, 40, 39), 1, 100, 0.2, None),
        (P1, h(0, 60, 19), 1, 100, 0.2, None),
        (P1, h(0, 60, 20), 1, 100, 0.2, Some(Shed::Priority(P1))),
        (P1, h(20, 60, 19), 1, 100, 0.2, None),
        (P1, h(10, 60, 19), 1, 100, 0.2, None),
        (P1, h(10, 60, 20), 1, 100, 0.2, Some(Shed::Priority(P1))),
    ];
    for (p, held, cost, total, reserve, want) in cases {
        assert_eq!(
            shed(*p, *held, *cost, *total, *reserve),
            *want,
            "{p} held {held:?} cost {cost} of {total} reserve {reserve}"
        );
    }
}

/// Whatever is in flight, a unit taken by the rule never leaves a higher
/// priority less free room than its reserve minus what it holds, and
/// never puts the zone past its total.
#[test]
fn a_lower_priority_never_takes_what_the_reserve_keeps() {
    use Priority::*;
    let total = 20;
    let reserve = 0.2;
    for p0 in 0..=total {
        for p1 in 0..=total - p0 {
            for p2 in 0..=total - p0 - p1 {
                let held = Held { p0, p1, p2 };
                for (p, kept, above) in [(P1, 4, p0), (P2, 4, p0), (P2, 8, p0 + p1)] {
                    if shed(p, held, 1, total, reserve).is_none() {
                        let free = total - held.total() - 1;
                        assert!(
                            free + above >= kept,
                            "{p} took a unit of {held:?}: {free} free"
                        );
                    }
                }
                assert_eq!(
                    shed(P0, held, 1, total, reserve).is_none(),
                    held.total() < total,
                    "{held:?}"
                );
            }
        }
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

#[test]
fn a_prioritys_place_in_all_is_its_number_highest_first() {
    for (i, p) in Priority::ALL.into_iter().enumerate() {
        assert_eq!(p as usize, i);
        assert_eq!(p.name(), format!("P{i}"));
    }
}
