//! Every shipped scenario parses; the dry-run plan names every step.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use zonegate_chaos::scenario::{Scenario, Target};

#[test]
fn every_shipped_scenario_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("chaos/scenarios exists") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let s = Scenario::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        if let Target::Local { topology, .. } = &s.target {
            assert!(
                topology.is_dir(),
                "{}: topology {} does not exist",
                path.display(),
                topology.display()
            );
            zonegate_chaos::local::Topology::read(topology).unwrap_or_else(|e| panic!("{e:#}"));
        }
        let plan = zonegate_chaos::run::plan(&s);
        assert_eq!(
            plan.lines()
                .filter(|l| l.starts_with("  ") && l.contains(". "))
                .count(),
            s.steps.len(),
            "{plan}"
        );
        names.push(s.name);
    }
    names.sort();
    for wanted in [
        "backend-flap",
        "failover-quota-overflow",
        "follower-pause",
        "leader-kill",
        "leader-pause",
        "manual-failover-drill",
        "minority-partition",
        "rolling-restart",
        "zone-blackout",
        "zone-brownout",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} is not shipped: {names:?}"
        );
    }
}

#[test]
fn a_bad_file_names_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[target]\nkind = \"local\"\ntopology = \".\"\n[load]\nrps = 10\nduration = \"10s\"\n[[steps]]\naction = \"backend_fault\"\nzone = \"az-a\"\nfaults = { error_rate = 1.0, latency = 5 }\n",
    )
    .unwrap();
    let e = Scenario::load(&path, &[]).unwrap_err();
    assert_eq!(e.file, path.display().to_string());
    assert_eq!(e.key, "steps[0].faults.latency");
    assert!(e.reason.contains("not a mock fault"), "{e}");
    let missing = Scenario::load(&dir.path().join("nope.toml"), &[]).unwrap_err();
    assert!(missing.reason.contains("cannot read"), "{missing}");
}
