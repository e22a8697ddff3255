//! Tests of `state.rs`.

use super::*;

fn z(name: &str) -> ZoneId {
    ZoneId::new(name)
}

fn failover(from: &str, to: &str) -> Command {
    Command::decide(
        Decision::Failover {
            from: z(from),
            to: z(to),
        },
        "test",
        "drill",
    )
}

fn failback(zone: &str) -> Command {
    Command::decide(Decision::Failback { zone: z(zone) }, "test", "recovered")
}

fn freeze() -> Command {
    Command::decide(Decision::Freeze, "test", "maintenance")
}

fn unfreeze() -> Command {
    Command::decide(Decision::Unfreeze, "test", "done")
}

fn three_zones() -> ClusterState {
    ClusterState::with_zones(["az-a", "az-b", "az-c"])
}

/// Apply `setup` (each must be applied), then check that `cmd` yields
/// `expect`: `Ok(version)` or `Err(rule)`.
fn check_case(name: &str, setup: &[Command], cmd: Command, expect: Result<u64, RejectRule>) {
    let mut state = three_zones();
    for c in setup {
        assert!(
            matches!(state.apply(c), Outcome::Applied { .. }),
            "{name}: setup command {c:?} was refused"
        );
    }
    let before = state.clone();
    let preview = state.check(&cmd);
    let outcome = state.apply(&cmd);
    match expect {
        Ok(version) => {
            assert_eq!(outcome, Outcome::Applied { version }, "{name}");
            assert_eq!(preview.map(|p| p.version), Ok(version), "{name}");
        }
        Err(rule) => {
            match &outcome {
                Outcome::Rejected { rule: got, message } => {
                    assert_eq!(*got, rule, "{name}: {message}");
                    assert!(!message.is_empty(), "{name}: empty message");
                }
                other => panic!("{name}: expected {rule}, got {other:?}"),
            }
            assert_eq!(preview.map_err(|r| r.rule), Err(rule), "{name}");
            assert_eq!(state, before, "{name}: a refusal must change nothing");
        }
    }
}

/// (name, commands applied first, command under test, expected).
type Case = (&'static str, Vec<Command>, Command, Result<u64, RejectRule>);

#[test]
fn safety_rules_table() {
    use RejectRule::*;
    let cases: Vec<Case> = vec![
        (
            "failover to an active zone",
            vec![],
            failover("az-a", "az-b"),
            Ok(1),
        ),
        (
            "failover to itself",
            vec![],
            failover("az-a", "az-a"),
            Err(SameZone),
        ),
        (
            "failover from unknown zone",
            vec![],
            failover("az-x", "az-b"),
            Err(UnknownZone),
        ),
        (
            "failover to unknown zone",
            vec![],
            failover("az-a", "az-x"),
            Err(UnknownZone),
        ),
        (
            "failover twice",
            vec![failover("az-a", "az-b")],
            failover("az-a", "az-c"),
            Err(AlreadyFailedOver),
        ),
        (
            "failover to a failed-over zone",
            vec![failover("az-b", "az-c")],
            failover("az-a", "az-b"),
            Err(TargetNotActive),
        ),
        (
            "failover of the last serving zone",
            vec![failover("az-a", "az-c"), failover("az-b", "az-c")],
            failover("az-c", "az-a"),
            Err(LastServingZone),
        ),
        (
            "failover of a zone others point to",
            vec![failover("az-a", "az-b")],
            failover("az-b", "az-c"),
            Ok(2),
        ),
        (
            "failback of an active zone",
            vec![],
            failback("az-a"),
            Err(NotFailedOver),
        ),
        (
            "failback of an unknown zone",
            vec![],
            failback("az-x"),
            Err(UnknownZone),
        ),
        (
            "failback of a failed-over zone",
            vec![failover("az-a", "az-b")],
            failback("az-a"),
            Ok(2),
        ),
        ("freeze", vec![], freeze(), Ok(1)),
        ("freeze twice", vec![freeze()], freeze(), Err(AlreadyFrozen)),
        ("unfreeze when auto", vec![], unfreeze(), Err(NotFrozen)),
        ("unfreeze when frozen", vec![freeze()], unfreeze(), Ok(2)),
        (
            "operators decide while frozen",
            vec![freeze()],
            failover("az-a", "az-b"),
            Ok(2),
        ),
    ];
    for (name, setup, cmd, expect) in cases {
        check_case(name, &setup, cmd, expect);
    }
}

fn auto(decision: Decision, at_ms: u64, limits: AutoLimits) -> Command {
    Command::automatic(decision, "detector:1", "score below cutoff", limits).stamped(at_ms)
}

fn fo(from: &str, to: &str) -> Decision {
    Decision::Failover {
        from: z(from),
        to: z(to),
    }
}

#[test]
fn a_quota_rebalance_takes_a_version_and_reaches_the_view() {
    let mut s = ClusterState::with_zones(["az-a", "az-b"]);
    let weights: NodeWeights = [(
        "deptA".to_owned(),
        [(1, 600_000), (2, 400_000)].into_iter().collect(),
    )]
    .into_iter()
    .collect();
    let cmd = auto(
        Decision::QuotaRebalance {
            weights: weights.clone(),
        },
        1_000,
        AutoLimits::default(),
    );
    assert_eq!(s.apply(&cmd), Outcome::Applied { version: 1 });
    let weights = from_node_weights(&weights);
    assert_eq!(s.quota_weights(), &weights);
    assert_eq!(*s.view().quota, weights);
    assert!(
        s.decisions(1).is_empty(),
        "rebalances keep their own history"
    );
    let last = s.all_decisions(1).remove(0);
    assert_eq!(last.kind, "quota_rebalance");
    assert!(last.zones.is_empty());
    // Zones are untouched, and a frozen automation holds the weights.
    assert!(s.zones().values().all(|z| *z == ZoneStatus::Active));
    s.apply(&freeze());
    let r = s.apply(&auto(
        Decision::QuotaRebalance {
            weights: NodeWeights::new(),
        },
        2_000,
        AutoLimits::default(),
    ));
    assert!(
        matches!(
            r,
            Outcome::Rejected {
                rule: RejectRule::AutomationFrozen,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(s.quota_weights(), &weights);
    // The state round-trips through the codec with its weights.
    let back: ClusterState = crate::codec::decode(&crate::codec::encode(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_rebalance_in_between_does_not_make_a_zone_decision_stale() {
    let mut s = ClusterState::with_zones(["az-a", "az-b"]);
    let rebalance = |at| {
        auto(
            Decision::QuotaRebalance {
                weights: NodeWeights::new(),
            },
            at,
            AutoLimits::default(),
        )
    };
    assert_eq!(s.apply(&rebalance(1)), Outcome::Applied { version: 1 });
    assert_eq!(s.apply(&rebalance(2)), Outcome::Applied { version: 2 });
    // An operator who looked at version 0 may still fail over.
    assert_eq!(
        s.apply(&failover("az-a", "az-b").if_version(0)),
        Outcome::Applied { version: 3 }
    );
    // A zone decision in between still makes it stale.
    let r = s.apply(&failback("az-a").if_version(2));
    assert!(
        matches!(
            r,
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ),
        "{r:?}"
    );
    // A rebalance planned from an older version is always stale.
    let r = s.apply(&rebalance(3).if_version(2));
    assert!(
        matches!(
            r,
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(
        s.apply(&failback("az-a").if_version(3)),
        Outcome::Applied { version: 4 }
    );
}

#[test]
fn a_rebalance_over_its_bounds_is_refused_before_proposing() {
    let big: NodeWeights = [(
        "t".repeat(crate::command::MAX_TENANT_BYTES + 1),
        BTreeMap::new(),
    )]
    .into_iter()
    .collect();
    let cmd = auto(
        Decision::QuotaRebalance { weights: big },
        1,
        AutoLimits::default(),
    );
    assert_eq!(cmd.validate().unwrap_err().rule, RejectRule::TooLong);
}

fn auto_failover(from: &str, to: &str, at_ms: u64) -> Command {
    auto(fo(from, to), at_ms, AutoLimits::default())
}

fn auto_failback(zone: &str, at_ms: u64) -> Command {
    auto(
        Decision::Failback { zone: z(zone) },
        at_ms,
        AutoLimits::default(),
    )
}

const MIN: u64 = 60_000;

#[test]
fn automatic_decision_rules_table() {
    use RejectRule::*;
    let two_at_a_time = AutoLimits {
        max_auto_failed_over: 2,
        dwell_ms: MIN,
    };
    let cases: Vec<Case> = vec![
        (
            "automatic failover when nothing stands in the way",
            vec![],
            auto_failover("az-a", "az-b", 0),
            Ok(1),
        ),
        // freeze
        (
            "frozen automation blocks automatic failover",
            vec![freeze()],
            auto_failover("az-a", "az-b", 0),
            Err(AutomationFrozen),
        ),
        (
            "frozen automation blocks automatic failback",
            vec![auto_failover("az-a", "az-b", 0), freeze()],
            auto_failback("az-a", 10 * MIN),
            Err(AutomationFrozen),
        ),
        (
            "unfrozen automation decides again",
            vec![freeze(), unfreeze()],
            auto_failover("az-a", "az-b", 0),
            Ok(3),
        ),
        (
            "automation never freezes itself",
            vec![],
            auto(Decision::Freeze, 0, AutoLimits::default()),
            Err(NotAutomatable),
        ),
        (
            "automation never unfreezes itself",
            vec![freeze()],
            auto(Decision::Unfreeze, 0, AutoLimits::default()),
            Err(NotAutomatable),
        ),
        // one at a time
        (
            "a second automatic failover while one is in force",
            vec![auto_failover("az-a", "az-b", 0)],
            auto_failover("az-c", "az-b", 10 * MIN),
            Err(AutoFailoverLimit),
        ),
        (
            "a second automatic failover when the limit is two",
            vec![auto(fo("az-a", "az-b"), 0, two_at_a_time)],
            auto(fo("az-c", "az-b"), 10 * MIN, two_at_a_time),
            Ok(2),
        ),
        (
            "an operator's failover does not count toward the limit",
            vec![failover("az-a", "az-b")],
            auto_failover("az-c", "az-b", 10 * MIN),
            Ok(2),
        ),
        (
            "an automatic failback frees the slot",
            vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
            auto_failover("az-c", "az-b", MIN),
            Ok(3),
        ),
        // dwell
        (
            "automatic failback within the dwell time",
            vec![auto_failover("az-a", "az-b", 0)],
            auto_failback("az-a", MIN - 1),
            Err(DwellTime),
        ),
        (
            "automatic failback exactly at the dwell time",
            vec![auto_failover("az-a", "az-b", 0)],
            auto_failback("az-a", MIN),
            Ok(2),
        ),
        (
            "automatic failover again within the dwell time of its failback",
            vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
            auto_failover("az-a", "az-c", MIN + 1000),
            Err(DwellTime),
        ),
        (
            "a leader clock behind the last decision counts as no time",
            vec![auto_failover("az-a", "az-b", 10 * MIN)],
            auto_failback("az-a", MIN),
            Err(DwellTime),
        ),
        (
            "dwell is per zone: another zone may be decided at once",
            vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
            auto_failover("az-c", "az-b", MIN + 1),
            Ok(3),
        ),
        // manual beats automatic
        (
            "automation never fails back an operator's failover",
            vec![failover("az-a", "az-b").stamped(0)],
            auto_failback("az-a", 100 * MIN),
            Err(OperatorDecided),
        ),
        (
            "an operator's failback holds the zone for the dwell time",
            vec![
                auto_failover("az-a", "az-b", 0),
                failback("az-a").stamped(2 * MIN),
            ],
            auto_failover("az-a", "az-c", 3 * MIN - 1),
            Err(OperatorDecided),
        ),
        (
            "after the hold, automation may fail the zone over again",
            vec![
                auto_failover("az-a", "az-b", 0),
                failback("az-a").stamped(2 * MIN),
            ],
            auto_failover("az-a", "az-c", 3 * MIN),
            Ok(3),
        ),
        (
            "operators may always override automation",
            vec![auto_failover("az-a", "az-b", 0)],
            failback("az-a").stamped(1),
            Ok(2),
        ),
        (
            "re-targeting a zone an operator just failed over waits for the hold",
            vec![failover("az-a", "az-b").stamped(0)],
            auto_failover("az-b", "az-c", MIN - 1),
            Err(OperatorDecided),
        ),
        // the generic rules still apply first
        (
            "a stale automatic decision",
            vec![freeze(), unfreeze()],
            auto_failover("az-a", "az-b", 0).if_version(1),
            Err(StaleVersion),
        ),
        (
            "an automatic failover of an already failed-over zone",
            vec![failover("az-a", "az-b").stamped(0)],
            auto_failover("az-a", "az-c", 100 * MIN),
            Err(AlreadyFailedOver),
        ),
    ];
    for (name, setup, cmd, expect) in cases {
        check_case(name, &setup, cmd, expect);
    }
}

#[test]
fn applied_decisions_record_origin_and_who_failed_a_zone_over() {
    let mut state = three_zones();
    state.apply(&failover("az-a", "az-b").stamped(5));
    state.apply(&auto_failover("az-b", "az-c", 10 * MIN));
    // az-a was re-targeted to az-c by the automatic decision but stays
    // an operator's failover.
    assert_eq!(
        state.zone_control(&z("az-a")).failed_over_by,
        Some(Origin::Operator)
    );
    assert_eq!(state.zone_control(&z("az-a")).last_auto_ms, Some(10 * MIN));
    assert_eq!(
        state.zone_control(&z("az-b")).failed_over_by,
        Some(Origin::Automatic)
    );
    assert_eq!(state.auto_failed_over(), vec![z("az-b")]);
    let history = state.decisions(2);
    assert_eq!(history[0].origin, Origin::Automatic);
    assert_eq!(history[1].origin, Origin::Operator);
    state.apply(&failback("az-b").stamped(10 * MIN + 1));
    assert_eq!(state.zone_control(&z("az-b")).failed_over_by, None);
    assert!(state.auto_failed_over().is_empty());
}

#[test]
fn history_json_without_origin_reads_as_operator() {
    let mut state = three_zones();
    state.apply(&freeze());
    let mut json = serde_json::to_value(&state.decisions(1)[0]).unwrap();
    json.as_object_mut().unwrap().remove("origin");
    let back: DecisionRecord = serde_json::from_value(json).unwrap();
    assert_eq!(back.origin, Origin::Operator);
}

#[test]
fn compare_and_set_table() {
    // (name, decisions applied first, if_version, expected)
    let cases: Vec<(&str, usize, u64, Result<u64, RejectRule>)> = vec![
        ("matching version 0", 0, 0, Ok(1)),
        ("matching version 1", 1, 1, Ok(2)),
        ("stale version", 1, 0, Err(RejectRule::StaleVersion)),
        ("future version", 0, 5, Err(RejectRule::StaleVersion)),
    ];
    for (name, applied, version, expect) in cases {
        let setup: Vec<Command> = [freeze(), unfreeze()].into_iter().take(applied).collect();
        let cmd = failover("az-a", "az-b").if_version(version);
        check_case(name, &setup, cmd, expect);
    }
}

#[test]
fn stale_version_is_checked_before_the_other_rules() {
    let mut state = three_zones();
    state.apply(&failover("az-a", "az-b"));
    // Both stale and already failed over: the stale view is the reason.
    let out = state.apply(&failover("az-a", "az-c").if_version(0));
    assert!(matches!(
        out,
        Outcome::Rejected {
            rule: RejectRule::StaleVersion,
            ..
        }
    ));
}

#[test]
fn two_operators_racing_on_one_version_get_one_decision() {
    let mut state = three_zones();
    let first = state.apply(&failover("az-a", "az-b").if_version(0));
    let second = state.apply(&failover("az-b", "az-a").if_version(0));
    assert_eq!(first, Outcome::Applied { version: 1 });
    assert!(matches!(
        second,
        Outcome::Rejected {
            rule: RejectRule::StaleVersion,
            ..
        }
    ));
}

#[test]
fn failing_over_a_target_retargets_the_zones_pointing_at_it() {
    let mut state = three_zones();
    state.apply(&failover("az-a", "az-b"));
    let preview = state.check(&failover("az-b", "az-c")).unwrap();
    let moved: Vec<&str> = preview.changes.iter().map(|c| c.zone.as_str()).collect();
    assert_eq!(moved, ["az-a", "az-b"]);
    state.apply(&failover("az-b", "az-c"));
    let view = state.view();
    assert_eq!(view.effective_zone(&z("az-a")), &z("az-c"));
    assert_eq!(view.effective_zone(&z("az-b")), &z("az-c"));
    let last = &state.decisions(1)[0];
    assert_eq!(last.zones, vec![z("az-a"), z("az-b")]);
}

#[test]
fn two_zones_cannot_fail_over_at_each_other() {
    let mut state = ClusterState::with_zones(["az-a", "az-b"]);
    assert_eq!(
        state.apply(&failover("az-a", "az-b")),
        Outcome::Applied { version: 1 }
    );
    assert!(matches!(
        state.apply(&failover("az-b", "az-a")),
        Outcome::Rejected {
            rule: RejectRule::LastServingZone,
            ..
        }
    ));
}

#[test]
fn failover_targets_are_always_active_after_any_sequence() {
    // A small exhaustive walk: every sequence of three decisions over
    // three zones keeps the invariants (one zone serving, targets active).
    let zones = ["az-a", "az-b", "az-c"];
    let mut cmds = vec![freeze(), unfreeze()];
    for from in zones {
        cmds.push(failback(from));
        for to in zones {
            cmds.push(failover(from, to));
        }
    }
    for a in &cmds {
        for b in &cmds {
            for c in &cmds {
                let mut state = three_zones();
                let mut version = 0;
                for cmd in [a, b, c] {
                    if let Outcome::Applied { version: v } = state.apply(cmd) {
                        assert_eq!(v, version + 1, "versions are consecutive");
                        version = v;
                    }
                    assert_eq!(state.decision_version(), version);
                    let view = state.view();
                    assert!(zones
                        .iter()
                        .any(|zn| view.zones[&z(zn)] == ZoneStatus::Active));
                    for status in view.zones.values() {
                        if let ZoneStatus::FailedOver { target } = status {
                            assert_eq!(view.zones[target], ZoneStatus::Active);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn history_records_who_why_when_and_is_bounded() {
    let mut state = three_zones();
    let cmd = failover("az-a", "az-b")
        .with_evidence("score 0.21 for 3 periods")
        .stamped(1_700_000_000_000);
    state.apply(&cmd);
    let rec = &state.decisions(10)[0];
    assert_eq!(rec.version, 1);
    assert_eq!(rec.kind, "failover");
    assert_eq!(rec.actor, "test");
    assert_eq!(rec.reason, "drill");
    assert_eq!(rec.at_ms, 1_700_000_000_000);
    assert_eq!(rec.evidence.as_deref(), Some("score 0.21 for 3 periods"));

    for _ in 0..HISTORY_LIMIT {
        state.apply(&freeze());
        state.apply(&unfreeze());
    }
    let all = state.decisions(usize::MAX);
    assert_eq!(all.len(), HISTORY_LIMIT);
    assert_eq!(all[0].version, state.decision_version());
    assert_eq!(
        all[HISTORY_LIMIT - 1].version,
        state.decision_version() - 999
    );
}

#[test]
fn registering_zones_keeps_existing_status() {
    let mut state = ClusterState::with_zones(["az-a", "az-b"]);
    state.apply(&failover("az-a", "az-b"));
    assert!(state.register_zones([z("az-a"), z("az-c")]));
    assert!(!state.register_zones([z("az-a")]));
    assert_eq!(
        state.zones()[&z("az-a")],
        ZoneStatus::FailedOver { target: z("az-b") }
    );
    assert_eq!(state.zones()[&z("az-c")], ZoneStatus::Active);
    assert_eq!(
        state.decision_version(),
        1,
        "learning zones is not a decision"
    );
}

#[test]
fn view_carries_version_zones_and_automation() {
    let mut state = three_zones();
    state.apply(&freeze());
    let view = state.view();
    assert_eq!(view.decision_version, 1);
    assert_eq!(view.automation, Automation::Frozen);
    assert_eq!(view.zones.len(), 3);
}

fn rebalance_at(at_ms: u64, rpm_node_1: u32) -> Command {
    let weights: QuotaWeights = [(
        "deptA".to_owned(),
        crate::quota::TenantWeights {
            zones: [
                (z("az-a"), 500_000),
                (z("az-b"), 300_000),
                (z("az-c"), 200_000),
            ]
            .into_iter()
            .collect(),
            nodes: [(1, rpm_node_1), (2, 1_000_000 - rpm_node_1)]
                .into_iter()
                .collect(),
        },
    )]
    .into_iter()
    .collect();
    auto(
        Decision::Rebalance { weights },
        at_ms,
        AutoLimits::default(),
    )
}

#[test]
fn an_operators_failover_outlives_500_rebalances() {
    let mut s = three_zones();
    let operator = failover("az-a", "az-b").stamped(1_000);
    assert_eq!(s.apply(&operator), Outcome::Applied { version: 1 });
    for i in 0..500u32 {
        let out = s.apply(&rebalance_at(2_000 + u64::from(i) * 5_000, 400_000 + i));
        assert_eq!(
            out,
            Outcome::Applied {
                version: 2 + u64::from(i)
            }
        );
    }
    // Zone decisions by default: the failover is still there.
    let shown = s.decisions(10);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].kind, "failover");
    assert_eq!(shown[0].version, 1);
    // Everything: the newest rebalances first, bounded; the failover
    // is older than every kept rebalance.
    let all = s.all_decisions(usize::MAX);
    assert_eq!(all.len(), REBALANCE_HISTORY_LIMIT + 1);
    assert_eq!(all[0].version, 501);
    assert_eq!(all[0].kind, "quota_rebalance");
    assert_eq!(all.last().map(|r| r.version), Some(1));
    assert!(all.windows(2).all(|w| w[0].version > w[1].version));
    assert_eq!(s.all_decisions(3).len(), 3);
    // An operator who looked before the rebalances is not stale.
    assert_eq!(
        s.apply(&failback("az-a").if_version(1)),
        Outcome::Applied { version: 502 }
    );
    // And the history survives the codec.
    let back: ClusterState = crate::codec::decode(&crate::codec::encode(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

/// [`ClusterStateV2`]'s layout, to write format-2 bytes.
#[derive(Serialize)]
struct StateV2Bytes {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    history: VecDeque<DecisionRecord>,
    control: BTreeMap<ZoneId, ZoneControlV2Bytes>,
    quota: NodeWeights,
    config: VecDeque<ConfigRecord>,
}

/// [`ZoneControlV2`]'s layout: failed over by, last automatic and last
/// operator stamps.
type ZoneControlV2Bytes = (Option<Origin>, Option<u64>, Option<u64>);

fn record(version: u64, decision: Decision) -> DecisionRecord {
    DecisionRecord {
        version,
        kind: decision.kind().to_owned(),
        zones: decision.zones(),
        decision,
        reason: "r".into(),
        actor: "a".into(),
        at_ms: version,
        evidence: None,
        origin: Origin::Operator,
    }
}

fn v2_bytes(history: Vec<DecisionRecord>, decision_version: u64) -> Vec<u8> {
    let v2 = StateV2Bytes {
        zones: three_zones().zones,
        decision_version,
        automation: Automation::Auto,
        history: history.into(),
        control: BTreeMap::new(),
        quota: [("deptA".to_owned(), [(1, 1_000_000)].into_iter().collect())]
            .into_iter()
            .collect(),
        config: VecDeque::new(),
    };
    let mut bytes = crate::codec::encode(&v2).unwrap();
    bytes[1] = 2;
    bytes
}

#[test]
fn a_format_2_state_splits_its_history_and_keeps_compare_and_set() {
    let rebalance = || Decision::QuotaRebalance {
        weights: NodeWeights::new(),
    };
    // A failover at 3 among rebalances: it goes to the zone history.
    let mixed: Vec<DecisionRecord> = (1..=5)
        .map(|v| {
            record(
                v,
                if v == 3 {
                    fo("az-a", "az-b")
                } else {
                    rebalance()
                },
            )
        })
        .collect();
    let s: ClusterState = crate::codec::decode(&v2_bytes(mixed, 5)).unwrap();
    assert_eq!(
        s.decisions(10)
            .iter()
            .map(|r| r.version)
            .collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(s.all_decisions(10).len(), 5);
    assert_eq!(s.quota_weights()["deptA"].nodes[&1], 1_000_000);
    assert!(s.quota_weights()["deptA"].zones.is_empty());
    let mut ok = s.clone();
    assert_eq!(
        ok.apply(&failover("az-c", "az-b").if_version(3)),
        Outcome::Applied { version: 6 }
    );
    let mut stale = s.clone();
    assert!(matches!(
        stale.apply(&failover("az-c", "az-b").if_version(2)),
        Outcome::Rejected {
            rule: RejectRule::StaleVersion,
            ..
        }
    ));
    // Rebalances that pushed every zone decision out (oldest kept: 8):
    // one may have been at 7, so 6 is stale and 7 is not.
    let only: Vec<DecisionRecord> = (8..=10).map(|v| record(v, rebalance())).collect();
    let s: ClusterState = crate::codec::decode(&v2_bytes(only, 10)).unwrap();
    assert!(s.decisions(10).is_empty());
    assert!(matches!(
        s.clone().apply(&failover("az-a", "az-b").if_version(6)),
        Outcome::Rejected {
            rule: RejectRule::StaleVersion,
            ..
        }
    ));
    assert_eq!(
        s.clone().apply(&failover("az-a", "az-b").if_version(7)),
        Outcome::Applied { version: 11 }
    );
}

fn leader(node: u64, mono_ms: u64) -> LeaderClock {
    LeaderClock {
        node,
        boot: node * 1000,
        mono_ms,
    }
}

fn auto_at(decision: Decision, wall_ms: u64, clock: LeaderClock) -> Command {
    Command::automatic(decision, "detector", "score", AutoLimits::default()).clocked(wall_ms, clock)
}

fn tick_at(wall_ms: u64, clock: LeaderClock) -> Command {
    Command::tick("detector").clocked(wall_ms, clock)
}

fn refused_for_dwell(out: &Outcome) -> bool {
    matches!(
        out,
        Outcome::Rejected {
            rule: RejectRule::DwellTime,
            ..
        }
    )
}

/// 42.7: leader B's wall clock runs 50 s ahead of leader A's. Compared
/// wall to wall, B would fail a zone back 15 s after A failed it over;
/// the dwell clock counts only what each leader measured itself.
#[test]
fn a_leader_whose_clock_runs_ahead_cannot_shorten_the_dwell() {
    let skew = 50_000;
    let t0 = 1_700_000_000_000;
    let mut s = three_zones();
    assert_eq!(
        s.apply(&auto_at(fo("az-a", "az-b"), t0, leader(1, 7_000))),
        Outcome::Applied { version: 1 }
    );
    // A leads 10 s more and ticks, then B takes over.
    assert!(matches!(
        s.apply(&tick_at(t0 + 10_000, leader(1, 17_000))),
        Outcome::Applied { .. }
    ));
    // 15 s after the failover, by B's clock 65 s: the wall rule alone
    // would let it pass (the bug).
    let early = auto_at(
        Decision::Failback { zone: z("az-a") },
        t0 + 15_000 + skew,
        leader(2, 500),
    );
    let wall_only = Command::automatic(
        Decision::Failback { zone: z("az-a") },
        "detector",
        "score",
        AutoLimits::default(),
    )
    .stamped(t0 + 15_000 + skew);
    assert!(
        s.check(&wall_only).is_ok(),
        "the wall-clock rule alone is fooled"
    );
    assert!(
        refused_for_dwell(&s.apply(&early)),
        "B's clock ahead must not shorten the dwell"
    );
    // B's first stamp (a tick) counts nothing across the change of
    // leader; from it on B's own monotonic time counts.
    assert!(matches!(
        s.apply(&tick_at(t0 + 16_000 + skew, leader(2, 1_000))),
        Outcome::Applied { .. }
    ));
    assert_eq!(s.dwell_clock().elapsed_ms, 10_000);
    assert!(s.dwell_running(&leader(2, 1_000), 60_000));
    // A measured 10 s; B must measure 50 s more: 49.999 s is early.
    let b = |mono| {
        auto_at(
            Decision::Failback { zone: z("az-a") },
            t0 + 100_000 + skew,
            leader(2, mono),
        )
    };
    assert!(refused_for_dwell(&s.apply(&b(1_000 + 49_999))));
    assert!(!s.dwell_running(&leader(2, 51_000), 60_000));
    assert_eq!(s.apply(&b(1_000 + 50_000)), Outcome::Applied { version: 2 });
}

#[test]
fn a_wall_clock_stepping_forward_on_one_leader_cannot_shorten_the_dwell() {
    let mut s = three_zones();
    s.apply(&auto_at(fo("az-a", "az-b"), 0, leader(1, 0)));
    // The leader's wall clock jumps an hour ahead 10 s later.
    let out = s.apply(&auto_at(
        Decision::Failback { zone: z("az-a") },
        3_600_000,
        leader(1, 10_000),
    ));
    assert!(refused_for_dwell(&out), "{out:?}");
    assert_eq!(
        s.apply(&auto_at(
            Decision::Failback { zone: z("az-a") },
            3_660_000,
            leader(1, 60_000)
        )),
        Outcome::Applied { version: 2 }
    );
}

#[test]
fn a_leader_whose_clock_runs_behind_waits_its_own_dwell_and_a_tick_changes_nothing_else() {
    let mut s = three_zones();
    s.apply(&auto_at(fo("az-a", "az-b"), 100_000, leader(1, 0)));
    let before = s.clone();
    // A tick takes no version and no history record, even frozen.
    s.apply(&freeze());
    let frozen_version = s.decision_version();
    assert!(
        matches!(s.apply(&tick_at(0, leader(1, 5))), Outcome::Applied { version } if version == frozen_version)
    );
    assert_eq!(
        s.all_decisions(10).len(),
        before.all_decisions(10).len() + 1
    );
    s.apply(&unfreeze());
    // B's wall clock is 30 s behind A's: B's own 60 s on the dwell
    // clock are not enough, the wall rule still asks for A's 60 s.
    s.apply(&tick_at(70_000, leader(2, 0)));
    let out = s.apply(&auto_at(
        Decision::Failback { zone: z("az-a") },
        130_000,
        leader(2, 60_000),
    ));
    assert!(
        matches!(
            out,
            Outcome::Rejected {
                rule: RejectRule::DwellTime,
                ..
            }
        ),
        "{out:?}"
    );
    assert!(matches!(
        s.apply(&auto_at(
            Decision::Failback { zone: z("az-a") },
            160_000,
            leader(2, 90_000)
        )),
        Outcome::Applied { .. }
    ));
}
