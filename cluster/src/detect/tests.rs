//! Tests of `detect.rs`.

use super::*;

const P: u64 = 1000;
const ZONES: [&str; 3] = ["az-a", "az-b", "az-c"];

fn z(name: &str) -> ZoneId {
    ZoneId::new(name)
}

fn cfg() -> FailoverConfig {
    FailoverConfig {
        period: Duration::from_millis(P),
        ..FailoverConfig::default()
    }
}

/// An observation whose score is exactly `score` under default weights.
fn at(zone: &str, score: f64) -> ZoneObservation {
    ZoneObservation {
        zone: z(zone),
        gw_error_rate: 1.0 - score,
        timeout_rate: 1.0 - score,
        gpu_health: score,
        requests: 10,
    }
}

fn active() -> BTreeMap<ZoneId, ZoneStatus> {
    ZONES.iter().map(|n| (z(n), ZoneStatus::Active)).collect()
}

/// Node i+1 lives in ZONES[i] and reports its own zone's score for
/// every period (oldest first, ending at P, 2P, ...); one report per
/// node carrying the rest as history.
fn detector_from(periods: &[[f64; 3]], c: &FailoverConfig) -> (Detector, u64) {
    let mut d = Detector::new(0);
    let last = periods.len() as u64 * P;
    let now = last + c.grace_ms() + 50;
    for (i, zone) in ZONES.iter().enumerate() {
        let mut history: Vec<PeriodObservations> = periods
            .iter()
            .enumerate()
            .map(|(k, scores)| PeriodObservations {
                period_end_ms: (k as u64 + 1) * P,
                zones: vec![at(zone, scores[i])],
            })
            .collect();
        let Some(current) = history.pop() else {
            continue;
        };
        let report = Report {
            demand: Vec::new(),
            node: i as NodeId + 1,
            period_end_ms: current.period_end_ms,
            zones: current.zones,
            history,
        };
        d.ingest(c, &z(zone), &report, now);
    }
    (d, now)
}

fn decision_of(a: &Assessment) -> Option<(String, String)> {
    a.proposal.as_ref().map(|p| match &p.decision {
        Decision::Failover { from, to } => (from.to_string(), to.to_string()),
        Decision::Failback { zone } => ("failback".into(), zone.to_string()),
        other => (other.kind().into(), String::new()),
    })
}

#[test]
fn detector_table() {
    const OK: f64 = 0.9;
    const BAD: f64 = 0.1;
    // (name, per-period scores of az-a, az-b, az-c oldest first,
    //  expected failover, expected fail static)
    type Case = (
        &'static str,
        Vec<[f64; 3]>,
        Option<(&'static str, &'static str)>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "exactly three bad periods fail over",
            vec![
                [OK, OK, 0.8],
                [BAD, OK, 0.8],
                [BAD, OK, 0.8],
                [BAD, OK, 0.8],
            ],
            Some(("az-a", "az-b")),
            false,
        ),
        (
            "two bad periods do not",
            vec![[OK, OK, OK], [OK, OK, OK], [BAD, OK, OK], [BAD, OK, OK]],
            None,
            false,
        ),
        (
            "a single good period resets the count",
            vec![
                [BAD, OK, OK],
                [BAD, OK, OK],
                [OK, OK, OK],
                [BAD, OK, OK],
                [BAD, OK, OK],
            ],
            None,
            false,
        ),
        (
            "three bad periods after a good one fail over",
            vec![
                [BAD, OK, OK],
                [OK, OK, OK],
                [BAD, OK, OK],
                [BAD, OK, OK],
                [BAD, OK, OK],
            ],
            Some(("az-a", "az-b")),
            false,
        ),
        (
            "a score exactly at the cutoff is not bad",
            vec![[0.4, OK, OK], [0.4, OK, OK], [0.4, OK, OK]],
            None,
            false,
        ),
        (
            "every zone below the cutoff fails static",
            vec![[BAD, 0.2, 0.3], [BAD, 0.2, 0.3], [BAD, 0.2, 0.3]],
            None,
            true,
        ),
        (
            "every zone below the cutoff for one period only fails static then",
            vec![[BAD, OK, OK], [BAD, OK, OK], [BAD, 0.3, 0.3]],
            None,
            true,
        ),
        (
            "the worst of two bad zones fails over to the good one",
            vec![[0.3, BAD, OK], [0.3, BAD, OK], [0.3, BAD, OK]],
            Some(("az-b", "az-c")),
            false,
        ),
        (
            "the target is the healthiest active zone",
            vec![[BAD, 0.6, 0.95], [BAD, 0.6, 0.95], [BAD, 0.6, 0.95]],
            Some(("az-a", "az-c")),
            false,
        ),
        (
            "equal targets: the first by name",
            vec![[OK, BAD, OK], [OK, BAD, OK], [OK, BAD, OK]],
            Some(("az-b", "az-a")),
            false,
        ),
    ];
    let c = cfg();
    for (name, periods, expect, fail_static) in cases {
        let (d, now) = detector_from(&periods, &c);
        let a = d.assess(&c, &active(), now);
        let got = decision_of(&a);
        assert_eq!(
            got,
            expect.map(|(f, t)| (f.to_string(), t.to_string())),
            "{name}: {:#?}",
            a.zones
        );
        assert_eq!(a.fail_static, fail_static, "{name}");
        assert_eq!(a.period_end_ms, periods.len() as u64 * P, "{name}");
    }
}

#[test]
fn failover_carries_per_period_evidence_and_onset() {
    let c = cfg();
    let (d, now) = detector_from(
        &[[0.9; 3], [0.2, 0.9, 0.9], [0.1, 0.9, 0.9], [0.3, 0.9, 0.9]],
        &c,
    );
    let a = d.assess(&c, &active(), now);
    let p = a.proposal.unwrap();
    let ends: Vec<u64> = p.evidence.periods.iter().map(|s| s.period_end_ms).collect();
    assert_eq!(ends, [4 * P, 3 * P, 2 * P], "newest first");
    let scores: Vec<f64> = p
        .evidence
        .periods
        .iter()
        .map(|s| s.score.unwrap())
        .collect();
    for (got, want) in scores.iter().zip([0.3, 0.1, 0.2]) {
        assert!((got - want).abs() < 1e-9, "{scores:?}");
    }
    assert_eq!(p.first_bad_ms, P, "the run started when period 2 began");
    assert_eq!(p.evidence.target, Some(z("az-b")));
    assert_eq!(p.evidence.trigger, "below_cutoff");
    let a_health = &a.zones[0];
    assert_eq!(a_health.bad_periods, 3);
    assert_eq!(a_health.reporters, 1);
    assert!(serde_json::to_string(&p.evidence)
        .unwrap()
        .contains("\"periods\""));
}

#[test]
fn fallback_order_is_preferred_when_its_zone_is_healthy() {
    let mut c = cfg();
    c.fallback_order
        .insert(z("az-a"), vec![z("az-c"), z("az-b")]);
    let periods = vec![[0.1, 0.95, 0.5]; 3];
    let (d, now) = detector_from(&periods, &c);
    let a = d.assess(&c, &active(), now);
    assert_eq!(decision_of(&a), Some(("az-a".into(), "az-c".into())));
    // A preferred zone below the cutoff is skipped.
    let periods = vec![[0.1, 0.95, 0.39]; 3];
    let (d, now) = detector_from(&periods, &c);
    assert_eq!(
        decision_of(&d.assess(&c, &active(), now)),
        Some(("az-a".into(), "az-b".into()))
    );
}

#[test]
fn no_active_healthy_target_means_no_decision() {
    let c = cfg();
    let (d, now) = detector_from(&[[0.1, 0.1, 0.9]; 3], &c);
    let mut zones = active();
    // az-c is failed over (to az-b): not a target even though healthy.
    zones.insert(z("az-c"), ZoneStatus::FailedOver { target: z("az-b") });
    let a = d.assess(&c, &zones, now);
    assert_eq!(a.proposal, None);
    assert_eq!(a.no_target, Some(z("az-a")));
    assert!(!a.fail_static);
}

#[test]
fn failback_table() {
    // (name, auto_failback, az-a's scores while failed over, expected)
    let cases: Vec<(&str, bool, Vec<f64>, bool)> = vec![
        ("healthy for failback_periods", true, vec![0.9; 5], true),
        (
            "one period short",
            true,
            vec![0.1, 0.9, 0.9, 0.9, 0.9],
            false,
        ),
        (
            "exactly at the threshold is not healthy",
            true,
            vec![0.7; 5],
            false,
        ),
        ("just above the threshold", true, vec![0.71; 5], true),
        ("disabled by default", false, vec![0.9; 5], false),
    ];
    for (name, enabled, scores, expect) in cases {
        let c = FailoverConfig {
            auto_failback: enabled,
            ..cfg()
        };
        let periods: Vec<[f64; 3]> = scores.iter().map(|s| [*s, 0.9, 0.9]).collect();
        let (d, now) = detector_from(&periods, &c);
        let mut zones = active();
        zones.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-b") });
        let a = d.assess(&c, &zones, now);
        let want = expect.then(|| ("failback".to_string(), "az-a".to_string()));
        assert_eq!(decision_of(&a), want, "{name}");
    }
}

#[test]
fn a_failed_over_zone_is_not_failed_over_again() {
    let c = cfg();
    let (d, now) = detector_from(&[[0.1, 0.9, 0.9]; 4], &c);
    let mut zones = active();
    zones.insert(z("az-a"), ZoneStatus::FailedOver { target: z("az-b") });
    assert_eq!(d.assess(&c, &zones, now).proposal, None);
}

/// Nodes 1 (az-a) and 2 (az-b) report both zones each period; node 3
/// (az-c) reported only up to `c_until`.
fn silent_c(c: &FailoverConfig, periods: u64, c_until: u64, listening_since: u64) -> Detector {
    let mut d = Detector::new(listening_since);
    for k in 1..=periods {
        let end = k * P;
        let now = end + 10;
        for (node, zone) in [(1, "az-a"), (2, "az-b")] {
            let report = Report {
                demand: Vec::new(),
                node,
                period_end_ms: end,
                zones: vec![at("az-a", 0.9), at("az-b", 0.9)],
                history: Vec::new(),
            };
            d.ingest(c, &z(zone), &report, now);
        }
        if k <= c_until {
            let report = Report {
                demand: Vec::new(),
                node: 3,
                period_end_ms: end,
                zones: vec![at("az-c", 0.9)],
                history: Vec::new(),
            };
            d.ingest(c, &z("az-c"), &report, now);
        }
    }
    d
}

#[test]
fn a_silent_unreachable_zone_scores_zero_once_settled() {
    let c = cfg();
    let d = silent_c(&c, 6, 2, 0);
    // Periods 3..=6 are silent; 6 is the newest and may still be in
    // flight, so 3, 4, 5 count: exactly three.
    let a = d.assess(&c, &active(), 6 * P + c.grace_ms() + 10);
    let h = &a.zones[2];
    assert_eq!((h.score, h.silent, h.bad_periods), (Some(0.0), true, 3));
    assert_eq!(decision_of(&a), Some(("az-c".into(), "az-a".into())));
    // One period earlier: only 3 and 4 are settled.
    let d = silent_c(&c, 5, 2, 0);
    let a = d.assess(&c, &active(), 5 * P + c.grace_ms() + 10);
    assert_eq!(a.zones[2].bad_periods, 2);
    assert_eq!(a.proposal, None);
}

#[test]
fn silence_before_the_leader_listened_is_no_evidence() {
    let c = cfg();
    let d = silent_c(&c, 6, 2, 3 * P);
    let a = d.assess(&c, &active(), 6 * P + c.grace_ms() + 10);
    // Period 3 began at 2P, before the leader listened; 4 and 5 count;
    // 6 is the newest and may still be in flight.
    assert_eq!(a.zones[2].bad_periods, 2);
    assert_eq!(a.proposal, None);
}

#[test]
fn silence_without_any_observations_is_no_evidence() {
    // Sources not wired: every node sends empty reports; node 3 stops.
    let c = cfg();
    let mut d = Detector::new(0);
    for k in 1..=8 {
        for node in [1, 2] {
            let report = Report {
                demand: Vec::new(),
                node,
                period_end_ms: k * P,
                zones: Vec::new(),
                history: Vec::new(),
            };
            d.ingest(&c, &z(ZONES[node as usize - 1]), &report, k * P);
        }
    }
    let a = d.assess(&c, &active(), 8 * P + 300);
    assert!(a.zones.iter().all(|h| h.score.is_none()), "{:?}", a.zones);
    assert_eq!(a.proposal, None);
    assert!(!a.fail_static);
}

#[test]
fn other_zones_reaching_a_silent_zone_score_it() {
    let c = cfg();
    let mut d = silent_c(&c, 6, 2, 0);
    // Node 1 also probes az-c's backends and finds them healthy.
    for k in 1..=6 {
        let report = Report {
            demand: Vec::new(),
            node: 1,
            period_end_ms: k * P,
            zones: vec![at("az-a", 0.9), at("az-b", 0.9), at("az-c", 0.8)],
            history: Vec::new(),
        };
        d.ingest(&c, &z("az-a"), &report, 6 * P + 10);
    }
    let a = d.assess(&c, &active(), 6 * P + c.grace_ms() + 10);
    let h = &a.zones[2];
    assert!(!h.silent);
    assert!((h.score.unwrap() - 0.8).abs() < 1e-9);
    assert_eq!(a.proposal, None);
}

#[test]
fn the_newest_period_without_reports_yet_is_skipped() {
    let c = cfg();
    let (mut d, _) = detector_from(&[[0.1, 0.9, 0.9]; 3], &c);
    // Period 4 has only node 2's report so far: az-a unknown there.
    let report = Report {
        demand: Vec::new(),
        node: 2,
        period_end_ms: 4 * P,
        zones: vec![at("az-b", 0.9)],
        history: Vec::new(),
    };
    d.ingest(&c, &z("az-b"), &report, 4 * P + 10);
    let a = d.assess(&c, &active(), 4 * P + c.grace_ms() + 10);
    assert_eq!(a.zones[0].bad_periods, 3);
    assert_eq!(a.zones[0].period_end_ms, Some(3 * P));
    assert_eq!(decision_of(&a), Some(("az-a".into(), "az-b".into())));
}

#[test]
fn scores_weight_rates_by_requests_and_average_gpu_health() {
    let c = cfg();
    let mut d = Detector::new(0);
    let obs = |err: f64, gpu: f64, requests: u64| ZoneObservation {
        zone: z("az-a"),
        gw_error_rate: err,
        timeout_rate: 0.0,
        gpu_health: gpu,
        requests,
    };
    for (node, o) in [(1, obs(1.0, 0.0, 90)), (2, obs(0.0, 1.0, 10))] {
        let report = Report {
            demand: Vec::new(),
            node,
            period_end_ms: P,
            zones: vec![o],
            history: Vec::new(),
        };
        d.ingest(&c, &z("az-a"), &report, P + 10);
    }
    let a = d.assess(&c, &active(), P + c.grace_ms() + 10);
    let h = &a.zones[0];
    assert_eq!(h.gw_error_rate, Some(0.9));
    assert_eq!(h.gpu_health, Some(0.5));
    assert_eq!(h.reporters, 2);
    // 0.4 x 0.1 + 0.4 x 1 + 0.2 x 0.5
    assert!((h.score.unwrap() - 0.54).abs() < 1e-9, "{h:?}");
}

/// `ctl status` shows where traffic goes: each zone's requests over every
/// reporter, in the period its health describes.
#[test]
fn the_assessment_counts_each_zones_requests_over_reporters() {
    let (d, now) = detector_from(&[[0.9, 0.9, 0.9], [0.9, 0.9, 0.9]], &cfg());
    let a = d.assess(&cfg(), &active(), now);
    for zone in ZONES {
        assert_eq!(a.requests.get(&z(zone)), Some(&10), "{zone}: {a:?}");
    }
}

#[test]
fn an_idle_zone_is_scored_by_its_backends() {
    let c = cfg();
    let mut d = Detector::new(0);
    let report = Report {
        demand: Vec::new(),
        node: 1,
        period_end_ms: P,
        zones: vec![ZoneObservation {
            zone: z("az-a"),
            gw_error_rate: 0.0,
            timeout_rate: 0.0,
            gpu_health: 0.2,
            requests: 0,
        }],
        history: Vec::new(),
    };
    d.ingest(&c, &z("az-a"), &report, P + 10);
    let h = &d.assess(&c, &active(), P + 300).zones[0];
    assert_eq!(h.score, Some(0.2));
    assert_eq!(h.gw_error_rate, None);
}

#[test]
fn non_finite_observations_are_dropped_not_read_as_outages() {
    let c = cfg();
    let mut d = Detector::new(0);
    let mut bad = at("az-a", 0.9);
    bad.gw_error_rate = f64::NAN;
    let report = Report {
        demand: Vec::new(),
        node: 1,
        period_end_ms: P,
        zones: vec![bad, at("az-b", 0.9)],
        history: Vec::new(),
    };
    d.ingest(&c, &z("az-a"), &report, P + 10);
    let a = d.assess(&c, &active(), P + 300);
    assert_eq!(a.zones[0].score, None);
    assert!(a.zones[1].score.is_some());
}

#[test]
fn the_window_forgets_old_periods_and_snaps_unaligned_ones() {
    let c = cfg();
    let mut d = Detector::new(0);
    let report = Report {
        demand: Vec::new(),
        node: 1,
        period_end_ms: 1500,
        zones: vec![at("az-a", 0.1)],
        history: vec![PeriodObservations {
            period_end_ms: 10,
            zones: vec![at("az-a", 0.1)],
        }],
    };
    d.ingest(&c, &z("az-a"), &report, 2000);
    let a = d.assess(&c, &active(), 2000 + 300);
    assert_eq!(a.zones[0].period_end_ms, Some(2000), "1500 snaps to 2000");
    assert_eq!(a.zones[0].bad_periods, 2, "10 snaps to 1000");
    d.prune(&c, 2000 + 20 * P);
    assert_eq!(d.reporters(), 0);
}

#[test]
fn evidence_of_the_most_periods_fits_a_command() {
    let worst = PeriodScore {
        period_end_ms: u64::MAX,
        score: Some(0.123_456_789_012_345_67),
        gw_error_rate: Some(0.987_654_321_098_765_4),
        timeout_rate: Some(f64::MIN_POSITIVE),
        gpu_health: Some(0.333_333_333_333_333_3),
        requests: u64::MAX,
        reporters: u32::MAX,
        silent: false,
    };
    let long = ZoneId::new(&"z".repeat(crate::command::MAX_ZONE_BYTES));
    let evidence = Evidence {
        zone: long.clone(),
        trigger: "above_failback_threshold".into(),
        threshold: 0.123_456_789_012_345_67,
        periods: vec![worst; MAX_EVIDENCE_PERIODS],
        target: Some(long),
        target_score: Some(0.123_456_789_012_345_67),
        assessed_at_ms: u64::MAX,
    };
    let json = serde_json::to_string(&evidence).unwrap();
    assert!(
        json.len() <= crate::command::MAX_EVIDENCE_BYTES,
        "{}",
        json.len()
    );
}

#[test]
fn period_end_is_aligned() {
    assert_eq!(period_end(0, 1000), 0);
    assert_eq!(period_end(1, 1000), 1000);
    assert_eq!(period_end(1000, 1000), 1000);
    assert_eq!(period_end(1001, 1000), 2000);
}

#[test]
fn config_validation_names_the_key() {
    let cases: Vec<(&str, FailoverConfig)> = vec![
        (
            "cutoff",
            FailoverConfig {
                cutoff: 1.5,
                ..cfg()
            },
        ),
        (
            "failback_threshold",
            FailoverConfig {
                failback_threshold: 0.3,
                ..cfg()
            },
        ),
        (
            "min_periods",
            FailoverConfig {
                min_periods: 0,
                ..cfg()
            },
        ),
        (
            "history_periods",
            FailoverConfig {
                history_periods: 5,
                ..cfg()
            },
        ),
        (
            "weights",
            FailoverConfig {
                weights: ScoreWeights {
                    gw_error: 0.0,
                    timeout: 0.0,
                    gpu: 0.0,
                },
                ..cfg()
            },
        ),
        (
            "period",
            FailoverConfig {
                period: Duration::ZERO,
                ..cfg()
            },
        ),
    ];
    for (key, c) in cases {
        assert_eq!(c.validate().map_err(|e| e.key), Err(key));
    }
    assert_eq!(FailoverConfig::default().validate(), Ok(()));
    let limits = FailoverConfig::default().limits();
    assert_eq!((limits.max_auto_failed_over, limits.dwell_ms), (1, 60_000));
}
