//! `deploy/` checked: the alert rules with promtool (syntax and unit
//! tests), the compose file and Kubernetes manifests for the invariants a
//! three-zone cluster needs, the systemd unit with systemd-analyze, and
//! the Grafana board against a running node's `/metrics`.
//!
//! Tools are installed by `.ci/run`, which sets `ZONEGATE_REQUIRE_TOOLS=1`:
//! there a missing tool fails the test (CI must not pass without running
//! it). A plain `cargo test` on a machine with only the Rust toolchain
//! skips a check whose tool is missing and says so on stderr.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::tool;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("deploy/prometheus");
    let out = run(Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(dir.join("alerts.yml")));
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run(Command::new(&promtool)
        .current_dir(&dir)
        .arg("test")
        .arg("rules")
        .arg("alerts.test.yml"));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert has a summary, a description, and a runbook section that
/// exists in deploy/RUNBOOK.md; the required alerts are all there.
#[test]
fn every_alert_has_annotations_and_a_runbook_section() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read(&root().join("deploy/prometheus/alerts.yml"))).unwrap();
    let runbook = read(&root().join("deploy/RUNBOOK.md"));
    let anchors: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase().replace(' ', "-"))
        .collect();
    let tests = read(&root().join("deploy/prometheus/alerts.test.yml"));
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            alerts.push(name.to_owned());
            let a = &rule["annotations"];
            for key in ["summary", "description", "runbook"] {
                assert!(
                    a[key].as_str().is_some_and(|s| !s.is_empty()),
                    "{name} lacks {key}"
                );
            }
            let anchor = a["runbook"]
                .as_str()
                .unwrap()
                .strip_prefix("deploy/RUNBOOK.md#")
                .unwrap_or_else(|| panic!("{name}: runbook must point into deploy/RUNBOOK.md"));
            assert!(
                anchors.iter().any(|h| h == anchor),
                "{name}: no section `## …` for #{anchor} in RUNBOOK.md"
            );
            assert!(
                ["page", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
        }
    }
    for required in [
        "ZonegateNoRaftLeader",
        "ZonegateLeaderFlapping",
        "ZonegateViewStale",
        "ZonegateDecisionVersionsDiverged",
        "ZonegateZoneFailedOver",
        "ZonegateZoneFailedOverTooLong",
        "ZonegateFailStatic",
        "ZonegateEjectionStorm",
        "ZonegateBreakerOpen",
        "ZonegateErrorBudgetBurnFast",
        "ZonegateErrorBudgetBurnSlow",
        "ZonegateNearFileDescriptorLimit",
    ] {
        assert!(alerts.iter().any(|a| a == required), "{required} missing");
    }
    for tested in ["ZonegateNoRaftLeader", "ZonegateViewStale"] {
        assert!(
            tests.contains(&format!("alertname: {tested}")),
            "{tested} has no promtool test"
        );
    }
}

/// Every metric an alert or recording rule reads is declared in the
/// metrics table (or a standard `process_*`/`up`), so a rename cannot
/// silently blind an alert.
#[test]
fn alert_expressions_read_declared_metrics() {
    let rules = read(&root().join("deploy/prometheus/alerts.yml"));
    let declared: Vec<&str> = zonegate::telemetry::metrics::DECLARED
        .iter()
        .map(|(n, _, _)| *n)
        .collect();
    let names = metric_names(&rules);
    assert!(names.len() >= 12, "the alerts read {names:?}");
    for name in names {
        assert!(
            declared.contains(&name.as_str())
                || ["up", "process_open_fds", "process_max_fds"].contains(&name.as_str()),
            "alerts.yml reads `{name}`, which no node exports"
        );
    }
}

/// Metric names in PromQL text: `zonegate_*`, `process_*` and `up`
/// identifiers (recording-rule names `zonegate:...` excluded).
pub fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &text[start..i];
            let metric = (word.starts_with("zonegate_") || word.starts_with("process_"))
                && !word.contains(':');
            if metric || word == "up" && text[i..].starts_with('{') {
                let name = word
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_count")
                    .trim_end_matches("_sum");
                let name = if word.ends_with("_seconds_bucket")
                    || word.ends_with("_seconds_count")
                    || word.ends_with("_seconds_sum")
                {
                    name
                } else {
                    word
                };
                if !out.iter().any(|n: &String| n == name) {
                    out.push(name.to_owned());
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// docs/src/metrics.md documents exactly the declared metrics, each with the
/// type the table gives it.
#[test]
fn metrics_doc_lists_every_declared_metric() {
    let doc = read(&root().join("docs/src/metrics.md"));
    let rows: Vec<(&str, &str)> = doc
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let name = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name, cells.next()?))
        })
        .filter(|(n, _)| n.starts_with("zonegate_"))
        .collect();
    for (name, kind, _) in zonegate::telemetry::metrics::DECLARED {
        assert!(
            rows.contains(&(*name, kind.prometheus_type())),
            "docs/src/metrics.md lacks `{name}` ({})",
            kind.prometheus_type()
        );
    }
    assert_eq!(
        rows.len(),
        zonegate::telemetry::metrics::DECLARED.len(),
        "{rows:?}"
    );
}

fn yaml_docs(path: &Path) -> Vec<serde_yaml::Value> {
    use serde::Deserialize;
    let text = read(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn load_config(path: &Path) -> zonegate::config::Config {
    zonegate::config::Config::load(path).unwrap_or_else(|e| panic!("{e}"))
}

fn members_of(c: &zonegate::config::Config) -> Vec<(u64, String, String, String)> {
    c.members
        .iter()
        .map(|m| {
            (
                m.id,
                m.zone.to_string(),
                m.raft_addr.clone(),
                m.admin_addr.clone(),
            )
        })
        .collect()
}

/// The compose file: three nodes in three zones with their own data
/// volume, configs that load, the same member list everywhere, two mock
/// backends per zone, Prometheus with the alert rules, Grafana with the
/// board provisioned.
#[test]
fn compose_runs_three_zones_with_prometheus_and_grafana() {
    let dir = root().join("deploy/compose");
    let mut compose = yaml_docs(&dir.join("compose.yaml")).remove(0);
    // `<<: *node` merge keys, as compose resolves them.
    compose.apply_merge().unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let mut zones = Vec::new();
    let mut member_lists = Vec::new();
    for n in 1..=3 {
        let name = format!("zonegate-{n}");
        let svc = &services[name.as_str()];
        assert!(svc.is_mapping(), "{name} missing");
        let volumes: Vec<&str> = svc["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let config_mount = volumes
            .iter()
            .find(|v| v.ends_with(":/etc/zonegate/zonegate.toml:ro"))
            .unwrap_or_else(|| panic!("{name}: config not mounted"));
        assert!(
            volumes.contains(&format!("{name}-data:/var/lib/zonegate").as_str()),
            "{name}: data_dir on its own volume"
        );
        let cfg = load_config(&dir.join(config_mount.split(':').next().unwrap()));
        assert_eq!(cfg.node.id, n, "{name}: node id");
        assert_eq!(cfg.node.data_dir, PathBuf::from("/var/lib/zonegate"));
        zones.push(cfg.node.zone.to_string());
        member_lists.push(members_of(&cfg));
        for m in &cfg.members {
            let host = m.raft_addr.split(':').next().unwrap();
            assert!(
                services.contains_key(host),
                "member address {host} is no service"
            );
        }
        for b in &cfg.backends {
            let host = b.authority.host();
            assert!(services.contains_key(host), "backend {host} is no service");
        }
        assert!(
            svc["stop_grace_period"].as_str().is_some(),
            "{name}: stop_grace_period covers the drain"
        );
    }
    zones.sort();
    assert_eq!(zones, ["az-a", "az-b", "az-c"]);
    assert!(
        member_lists.windows(2).all(|w| w[0] == w[1]),
        "same members on every node"
    );
    let mocks = services
        .keys()
        .filter(|k| k.as_str().unwrap().starts_with("mock-"))
        .count();
    assert_eq!(mocks, 6, "two mock backends per zone");
    let prom = services["prometheus"]["volumes"].as_sequence().unwrap();
    assert!(prom
        .iter()
        .any(|v| v.as_str().unwrap().starts_with("../prometheus/alerts.yml:")));
    let grafana = services["grafana"]["volumes"].as_sequence().unwrap();
    assert!(grafana
        .iter()
        .any(|v| v.as_str().unwrap().starts_with("../grafana/zonegate.json:")));
    // The Dockerfile the nodes build exists and runs as non-root.
    let dockerfile = read(&root().join("deploy/container/Dockerfile"));
    assert!(dockerfile.contains("USER 65532"), "non-root");
    assert!(dockerfile.contains("HEALTHCHECK") && dockerfile.contains("/healthz"));
    assert!(dockerfile.contains("\"serve\", \"--config\", \"/etc/zonegate/zonegate.toml\""));
    // The image ships the profile-guided build unless told otherwise; the
    // script it runs exists and is executable; the laptop cluster builds
    // the plain one.
    assert!(dockerfile.starts_with("# syntax=docker/dockerfile:1\n"));
    assert!(dockerfile.contains("ARG PGO=1") && dockerfile.contains("benches/pgo.sh"));
    let pgo = root().join("benches/pgo.sh");
    assert!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&pgo).unwrap().permissions())
            & 0o111
            != 0,
        "benches/pgo.sh is executable"
    );
    for service in ["zonegate-1", "zonegate-2", "zonegate-3"] {
        assert_eq!(
            services[service]["build"]["args"]["PGO"].as_str(),
            Some("0"),
            "{service}"
        );
    }
    // The build context leaves out build output and history.
    let ignore = read(&root().join(".dockerignore"));
    for entry in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|l| l == entry),
            "{entry} in .dockerignore"
        );
    }
}

#[test]
fn compose_prometheus_config_passes_promtool() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = read(&root().join("deploy/compose/prometheus/prometheus.yml")).replace(
        "/etc/prometheus/alerts.yml",
        &root()
            .join("deploy/prometheus/alerts.yml")
            .display()
            .to_string(),
    );
    let path = tmp.path().join("prometheus.yml");
    std::fs::write(&path, cfg).unwrap();
    run(Command::new(promtool).arg("check").arg("config").arg(&path));
}

/// The Kubernetes manifests: per zone a StatefulSet pinned to its zone,
/// stable DNS names through a headless Service that publishes unready
/// pods, a PVC for data_dir, the secret from a Secret, readiness on
/// /readyz, a termination grace that covers the drain; a PodDisruptionBudget
/// of one voter; Services per zone and for all; every resource listed in
/// the kustomization; configs that load with member addresses that are the
/// pods' DNS names.
#[test]
fn kubernetes_manifests_keep_the_cluster_invariants() {
    let dir = root().join("deploy/kubernetes");
    let kustomization = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let mut docs = Vec::new();
    for r in kustomization["resources"].as_sequence().unwrap() {
        docs.extend(yaml_docs(&dir.join(r.as_str().unwrap())));
    }
    let namespace = kustomization["namespace"].as_str().unwrap();
    let of_kind = |k: &str| {
        docs.iter()
            .filter(move |d| d["kind"] == k)
            .collect::<Vec<_>>()
    };
    let headless = of_kind("Service")
        .into_iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    let peers = headless["metadata"]["name"].as_str().unwrap();
    let generated: Vec<(String, String)> = kustomization["configMapGenerator"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|g| {
            let file = g["files"][0].as_str().unwrap();
            (
                g["name"].as_str().unwrap().to_owned(),
                file.split_once('=').unwrap().1.to_owned(),
            )
        })
        .collect();
    let mut member_lists = Vec::new();
    let sets = of_kind("StatefulSet");
    assert_eq!(sets.len(), 3, "one StatefulSet per zone");
    for set in sets {
        let name = set["metadata"]["name"].as_str().unwrap();
        let spec = &set["spec"];
        assert_eq!(spec["serviceName"], peers, "{name}");
        assert_eq!(spec["replicas"], 1, "{name}: one voter per StatefulSet");
        let pod = &spec["template"]["spec"];
        let term = &pod["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0];
        assert_eq!(term["key"], "topology.kubernetes.io/zone", "{name}");
        let zone = term["values"][0].as_str().unwrap();
        let c = &pod["containers"][0];
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        let secret = c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "ZONEGATE_CLUSTER_SECRET")
            .expect("secret env");
        assert!(
            secret["valueFrom"]["secretKeyRef"]["name"].is_string(),
            "{name}"
        );
        let claim = spec["volumeClaimTemplates"][0]["metadata"]["name"]
            .as_str()
            .unwrap();
        let data_mount = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == claim)
            .expect("PVC mounted")["mountPath"]
            .as_str()
            .unwrap()
            .to_owned();
        let cm = pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find_map(|v| v["configMap"]["name"].as_str())
            .unwrap();
        let file = &generated
            .iter()
            .find(|(n, _)| n == cm)
            .expect("generated ConfigMap")
            .1;
        let cfg = load_config(&dir.join(file));
        assert_eq!(
            cfg.node.zone.as_str(),
            zone,
            "{name}: config zone = node affinity zone"
        );
        assert_eq!(
            cfg.node.data_dir,
            PathBuf::from(&data_mount),
            "{name}: data_dir on the PVC"
        );
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(
            grace > (cfg.node.drain_grace + cfg.node.drain_timeout).as_secs(),
            "{name}: terminationGracePeriodSeconds {grace} must cover the drain"
        );
        let me = cfg.members.iter().find(|m| m.id == cfg.node.id).unwrap();
        assert_eq!(
            me.raft_addr,
            format!("{name}-0.{peers}.{namespace}.svc.cluster.local:7071"),
            "{name}: its member address is its pod's stable DNS name"
        );
        member_lists.push(members_of(&cfg));
    }
    assert!(
        member_lists.windows(2).all(|w| w[0] == w[1]),
        "same members everywhere"
    );
    let pdb = of_kind("PodDisruptionBudget");
    assert_eq!(pdb.len(), 1);
    assert_eq!(
        pdb[0]["spec"]["maxUnavailable"], 1,
        "never more than one voter down"
    );
    let services: Vec<&str> = of_kind("Service")
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    for z in ["az-a", "az-b", "az-c"] {
        assert!(
            services.contains(&format!("zonegate-{z}").as_str()),
            "Service per zone"
        );
    }
    assert!(services.contains(&"zonegate"), "a Service for all zones");
    assert_eq!(of_kind("CronJob").len(), 1, "the drill CronJob");
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let Some(validate) = tool("kubernetes-validate") else {
        return;
    };
    let dir = root().join("deploy/kubernetes");
    let kustomization = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let mut cmd = Command::new(validate);
    cmd.current_dir(&dir).arg("--strict");
    for r in kustomization["resources"].as_sequence().unwrap() {
        cmd.arg(r.as_str().unwrap());
    }
    let out = run(&mut cmd);
    assert!(!out.contains("ERROR"), "{out}");
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    // verify checks that ExecStart exists: point it at the built binary.
    let tmp = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for unit in [
        "zonegate.service",
        "zonegate-drill.service",
        "zonegate-drill.timer",
    ] {
        let text = read(&root().join("deploy/systemd").join(unit))
            .replace("/usr/local/bin/zonegate", env!("CARGO_BIN_EXE_zonegate"));
        let path = tmp.path().join(unit);
        std::fs::write(&path, text).unwrap();
        units.push(path);
    }
    let unit = read(&root().join("deploy/systemd/zonegate.service"));
    for hardening in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "StateDirectory=zonegate",
        "LimitNOFILE=",
        "Restart=on-failure",
    ] {
        assert!(
            unit.contains(hardening),
            "zonegate.service lacks {hardening}"
        );
    }
    let out = Command::new(analyze)
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify:\n{text}"
    );
}

/// Board metrics the running cluster of the next test cannot show yet,
/// each with the reason; each must still be declared.
const NOT_ON_A_TEST_NODE: &[(&str, &str)] = &[
    (
        "zonegate_raft_handovers_total",
        "only after a draining leader handed over (tests/drain.rs checks it)",
    ),
    (
        "zonegate_retry_budget_exhausted_total",
        "only once retries exceed the budget",
    ),
    (
        "zonegate_failover_auto_decisions_total",
        "only on a leader that proposed automatically",
    ),
    (
        "zonegate_rule_matched_total",
        "only with [[rules]] (tests/policy.rs)",
    ),
    (
        "zonegate_rule_evaluated_total",
        "only with [[rules]] (tests/policy.rs)",
    ),
    (
        "zonegate_shadow_requests_total",
        "only with [[shadows]] (tests/policy.rs)",
    ),
    (
        "zonegate_shadow_spend_total",
        "only with priced [[shadows]] (tests/budgets.rs)",
    ),
    (
        "zonegate_shadow_comparisons_total",
        "only with [[shadows]] (tests/policy.rs)",
    ),
    (
        "zonegate_shadow_similarity_ratio",
        "only with [[shadows]] (tests/policy.rs)",
    ),
    (
        "zonegate_shadow_first_byte_seconds",
        "only with [[shadows]] (tests/policy.rs)",
    ),
];

/// The Grafana board parses, names its datasource as a variable, and every
/// metric its queries read is exported by a running three-zone cluster
/// (after traffic, a failing backend, a cut stream and a failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_board_queries_only_metrics_a_running_cluster_exports() {
    use serde_json::{json, Value};
    use support::*;
    let board: Value =
        serde_json::from_str(&read(&root().join("deploy/grafana/zonegate.json"))).unwrap();
    assert_eq!(board["templating"]["list"][0]["type"], "datasource");
    let mut exprs = Vec::new();
    for p in board["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    for a in board["annotations"]["list"].as_array().unwrap() {
        if let Some(e) = a["expr"].as_str() {
            exprs.push(e.to_owned());
        }
    }
    for v in board["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_owned());
        }
    }
    let mut wanted = Vec::new();
    for e in &exprs {
        for n in metric_names(e) {
            if !wanted.contains(&n) {
                wanted.push(n);
            }
        }
    }
    assert!(wanted.len() >= 30, "the board reads {wanted:?}");

    // A second tenant with a small quota, so the quota row has data.
    // Priced, so the spend panel has data.
    let quota_tenant = tenant_toml("limited", "limited-key", "P1", "quota = { rpm = 2 }")
        + &format!("[[models]]\nname = \"{MODEL}\"\nprice = {{ input_per_mtok = 0.5, output_per_mtok = 1.5 }}\n");
    let cluster = TestCluster::start(2, &quota_tenant).await;
    cluster.leader().await;
    // Over its quota: admitted, then refused.
    let limited = || {
        client()
            .post(format!(
                "{}/v1/chat/completions",
                cluster.in_zone("az-a").data
            ))
            .bearer_auth("limited-key")
            .json(&chat_body(8, false))
    };
    send_and_read(4, limited).await;
    // A failing backend in az-a: retries, then a passive ejection.
    cluster.mocks["az-a-1"]
        .faults(json!({"error_rate": 1.0}))
        .await;
    // Streams in az-b cut after two chunks.
    cluster.mocks["az-b-1"]
        .faults(json!({"stream_cut_after": 2}))
        .await;
    cluster.mocks["az-b-2"]
        .faults(json!({"stream_cut_after": 2}))
        .await;
    let a = cluster.in_zone("az-a");
    send_and_read(12, || a.chat().json(&chat_body(8, false))).await;
    let b = cluster.in_zone("az-b");
    send_and_read(2, || b.chat().json(&chat_body(8, true))).await;
    // Both az-c backends down: short requests cross zones.
    for m in ["az-c-1", "az-c-2"] {
        cluster.mocks[m].faults(json!({"error_rate": 1.0})).await;
    }
    let c = cluster.in_zone("az-c");
    for _ in 0..12 {
        let _ = c
            .chat()
            .json(&chat_body(8, false))
            .send()
            .await
            .unwrap()
            .text()
            .await;
    }
    let resp = client()
        .post(format!("{}/admin/v1/failover", a.admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"from": "az-c", "to": "az-b", "reason": "board test"}))
        .send()
        .await
        .unwrap();
    assert!(
        resp.status().is_success(),
        "{}",
        resp.text().await.unwrap_or_default()
    );

    let mut exported = std::collections::BTreeSet::new();
    let mut check_types = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        for node in cluster.running() {
            let text = node.metrics().await;
            for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
                let mut w = line.split_whitespace().skip(2);
                let (name, ty) = (w.next().unwrap().to_owned(), w.next().unwrap().to_owned());
                check_types.push((name.clone(), ty));
                exported.insert(name);
            }
        }
        let missing: Vec<_> = wanted
            .iter()
            .filter(|n| !exported.contains(*n) && !NOT_ON_A_TEST_NODE.iter().any(|(m, _)| m == n))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the board reads metrics no node exports: {missing:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let declared: Vec<&str> = zonegate::telemetry::metrics::DECLARED
        .iter()
        .map(|(n, _, _)| *n)
        .collect();
    for (name, why) in NOT_ON_A_TEST_NODE {
        assert!(declared.contains(name), "{name} ({why}) is not declared");
    }
    // The conventions hold on the live page too, process_* included.
    for (name, ty) in &check_types {
        assert_eq!(
            zonegate::telemetry::metrics::convention_violation(name, ty, &[]),
            None
        );
    }
    let missing: Vec<_> = wanted.iter().filter(|n| !exported.contains(*n)).collect();
    eprintln!(
        "board reads {} metrics; not on the test cluster (declared): {missing:?}",
        wanted.len()
    );
}

/// Sends `n` requests made by `request`, one after another, each read to
/// its end (traffic for the metrics, whatever the answers).
async fn send_and_read(n: usize, request: impl Fn() -> reqwest::RequestBuilder) {
    for _ in 0..n {
        let _ = request().send().await.expect("sent").text().await;
    }
}
