use super::*;
use zonegate_cluster::ZoneStatus;

#[test]
fn every_pick_reason_is_a_static_header_value() {
    // `respond` sends the pick as `x-zonegate-route` with
    // `HeaderValue::from_static`, which panics on anything else.
    use PickReason::*;
    for r in [P2c, RoundRobin, Random, Ring, Trial] {
        assert!(
            http::HeaderValue::from_str(r.as_str()).is_ok(),
            "{}",
            r.as_str()
        );
    }
}

fn config(balance: &str, backends: &[(&str, u32)]) -> Config {
    let mut text = format!(
        "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\n\
         admin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n{balance}\n"
    );
    for (i, (zone, weight)) in backends.iter().enumerate() {
        text.push_str(&format!(
            "[[backends]]\nname = \"b{i}\"\nzone = \"{zone}\"\nurl = \"http://127.0.0.1:{}\"\nmodels = [\"m\"]\nweight = {weight}\n",
            9000 + i
        ));
    }
    Config::parse("t.toml", &text).unwrap()
}

#[test]
fn a_route_table_past_the_ring_cap_is_refused_before_it_is_built() {
    // Each key within its own bound, the product past one pool's cap:
    // 10 000 vnodes × 2 × 10 000 weight = 2 × 10⁸ points (3 GiB).
    let costly = config(
        "[balance]\nvnodes = 10000",
        &[("az-a", 10_000), ("az-a", 10_000)],
    );
    let e = Routes::try_build(&costly, None).unwrap_err();
    assert_eq!(e.key, "balance.vnodes");
    assert!(e.reason.contains("model m in zone az-a"), "{e}");
    assert!(e.reason.contains("200000000 ring points"), "{e}");
    // Without rings (no pins, no ring balance) weights cost nothing.
    let no_rings = config(
        "[balance]\nvnodes = 10000\n[affinity]\nzone_pin = false",
        &[("az-a", 10_000), ("az-a", 10_000)],
    );
    assert_eq!(ring_points(&no_rings), Ok(0));
    assert!(Routes::try_build(&no_rings, None).is_ok());
    // The defaults: 160 points per unit of weight, one ring per pool.
    let fine = config("", &[("az-a", 3), ("az-b", 1)]);
    assert_eq!(ring_points(&fine), Ok(160 * 4));
    let routes = Routes::try_build(&fine, None).unwrap();
    assert_eq!(routes.model("m").unwrap().pools.len(), 2);
}

fn zones() -> Vec<ZoneId> {
    ["az-a", "az-b", "az-c"].map(ZoneId::new).to_vec()
}

#[test]
fn zone_plan_table() {
    let z = zones();
    let mut failed = ClusterView::initial(&z);
    failed.zones.insert(
        z[0].clone(),
        ZoneStatus::FailedOver {
            target: z[1].clone(),
        },
    );
    let initial = ClusterView::initial(&z);
    use RequestClass::{Long, Short};
    let (none, short, all) = (CrossZone::None, CrossZone::Short, CrossZone::All);
    // (view, class, policy, effective zone, fallbacks, withheld)
    type Case<'a> = (
        &'a ClusterView,
        RequestClass,
        CrossZone,
        &'a str,
        &'a [&'a str],
        &'a [&'a str],
    );
    let cases: &[Case] = &[
        (&initial, Short, short, "az-a", &["az-b", "az-c"], &[]),
        (&initial, Long, short, "az-a", &[], &["az-b", "az-c"]),
        (&initial, Long, all, "az-a", &["az-b", "az-c"], &[]),
        (&initial, Short, none, "az-a", &[], &["az-b", "az-c"]),
        // A failover moves every request, long ones included, and the
        // failed-over zone is never a fallback target.
        (&failed, Long, short, "az-b", &[], &["az-c"]),
        (&failed, Short, short, "az-b", &["az-c"], &[]),
    ];
    for (view, class, policy, eff, fb, wh) in cases {
        let plan = plan_zones(&z[0], view, &z, *class, *policy);
        let names = |v: &[&ZoneId]| v.iter().map(|z| z.to_string()).collect::<Vec<_>>();
        assert_eq!(plan.effective.as_str(), *eff, "{class:?} {policy:?}");
        assert_eq!(names(&plan.fallbacks), *fb, "{class:?} {policy:?}");
        assert_eq!(names(&plan.withheld), *wh, "{class:?} {policy:?}");
    }
}

#[test]
fn a_rebuild_keeps_the_ring_of_a_pool_whose_backends_did_not_change() {
    // Zone pins are on by default: every pool has a ring.
    let before = config("", &[("az-a", 1), ("az-a", 1), ("az-b", 1)]);
    let old = Routes::build(&before, None);
    // One backend more in az-b; az-a's pool is unchanged.
    let after = config("", &[("az-a", 1), ("az-a", 1), ("az-b", 1), ("az-b", 1)]);
    let new = Routes::build(&after, Some(&old));
    let ring = |r: &Routes, zone: &str| {
        let pool = r.models["m"].pools.iter().find(|p| p.zone.as_str() == zone);
        Arc::clone(pool.and_then(|p| p.ring.as_ref()).expect("a ring"))
    };
    assert!(Arc::ptr_eq(&ring(&old, "az-a"), &ring(&new, "az-a")));
    assert!(!Arc::ptr_eq(&ring(&old, "az-b"), &ring(&new, "az-b")));
    // Kept or rebuilt, each ring is the one a fresh build makes.
    let fresh = Routes::build(&after, None);
    for zone in ["az-a", "az-b"] {
        assert_eq!(*ring(&new, zone), *ring(&fresh, zone), "{zone}");
    }
    // Other ring settings: no ring is kept.
    let denser = config(
        "[balance]\nvnodes = 200",
        &[("az-a", 1), ("az-a", 1), ("az-b", 1), ("az-b", 1)],
    );
    let rebuilt = Routes::build(&denser, Some(&new));
    assert!(!Arc::ptr_eq(&ring(&new, "az-a"), &ring(&rebuilt, "az-a")));
    assert_eq!(
        *ring(&rebuilt, "az-a"),
        *ring(&Routes::build(&denser, None), "az-a")
    );
}

#[test]
// The counter a key holds takes no part in its hash or equality.
#[allow(clippy::mutable_key_type)]
fn a_rebuild_finds_each_live_backend_in_one_lookup_not_a_search() {
    use std::cell::Cell;
    use std::hash::Hasher;
    // Keys that count how often they are compared.
    struct Counted<'a>(usize, &'a Cell<usize>);
    impl PartialEq for Counted<'_> {
        fn eq(&self, other: &Self) -> bool {
            self.1.set(self.1.get() + 1);
            self.0 == other.0
        }
    }
    impl Eq for Counted<'_> {}
    impl Hash for Counted<'_> {
        fn hash<H: Hasher>(&self, h: &mut H) {
            self.0.hash(h);
        }
    }
    let compared = Cell::new(0);
    let n = 10_000;
    let live: Vec<usize> = (0..n).collect();
    let index = by_key(&live, |&i| Counted(i, &compared));
    for i in 0..n {
        assert_eq!(index.get(&Counted(i, &compared)), Some(&&i));
    }
    // A search of the list per backend compared n² / 2 = 5 × 10⁷ times.
    assert!(compared.get() <= 2 * n, "{} comparisons", compared.get());
}

#[test]
fn a_models_metric_series_are_made_for_the_tenants_it_answers_only() {
    let mut text = String::from(
        "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\n\
         admin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\
         [[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9000\"\nmodels = [\"m\"]\n",
    );
    for i in 0..1_000 {
        text.push_str(&format!(
            "[[tenants]]\nname = \"t{i}\"\nkey_sha256 = \"{:064x}\"\n",
            i + 1
        ));
    }
    let cfg = Config::parse("t.toml", &text).unwrap();
    let routes = Routes::build(&cfg, None);
    let metrics = Metrics::new();
    let handles = routes.models["m"].handles(&metrics, &cfg.tenants);
    let t7 = handles.tenant(7, &cfg.tenants, "m", &metrics).unwrap();
    t7.ok.inc();
    assert!(handles.tenant(1_000, &cfg.tenants, "m", &metrics).is_none());
    let text = metrics.render();
    let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
    // One tenant answered: its series, not the other 999 tenants'.
    assert_eq!(series("zonegate_requests_total{"), 1);
    assert_eq!(series("zonegate_tokens_total{"), 2);
    let again = handles.tenant(7, &cfg.tenants, "m", &metrics).unwrap();
    assert!(std::ptr::eq(t7, again));
}
