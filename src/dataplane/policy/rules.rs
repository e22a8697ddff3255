//! Gray-release rules: one pure evaluation over (tenant, model's rules,
//! headers, user hash), first match wins. A rule takes a request when its
//! `match` holds and the user's bucket (a stable hash of tenant and user,
//! salted by the rule's name, cut into [`BUCKETS`]) is below the rule's
//! threshold: a user in the 5 % is in the 10 % of the same rule, on every
//! node. No allocation; O(rules for the model).

use http::HeaderName;

use crate::config::policy::{PolicyConfig, Rule, RuleHandles, BUCKETS};
use crate::config::Config;
use crate::telemetry::Metrics;

/// The hash a request's share is decided by: tenant and user key (the
/// session, else the body's `user`, else the request id), FNV-1a with a
/// splitmix64 finalizer (FNV alone leaves similar keys in similar
/// buckets: the "5 % configured, under 1 % observed" skew).
pub fn user_hash(tenant: &str, key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.as_bytes().iter().chain(&[0u8]).chain(key) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64's finalizer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The user's bucket for a rule or shadow salted `salt`: 0..[`BUCKETS`].
pub fn bucket(user: u64, salt: u64) -> u64 {
    mix(user ^ salt) % BUCKETS
}

/// The first rule of `candidates` (indices into `rules`, in config order)
/// whose `match` holds for `tenant` and `header`, whose target `allowed`
/// lets the tenant use, and whose share takes `user`. `seen` is told of
/// every rule whose `match` held (the share's denominator) and whether it
/// took the request.
pub fn evaluate<'r, 'h>(
    rules: &'r [Rule],
    candidates: &[usize],
    tenant: &str,
    header: impl Fn(&HeaderName) -> Option<&'h [u8]>,
    user: u64,
    allowed: impl Fn(&str) -> bool,
    mut seen: impl FnMut(&'r Rule, bool),
) -> Option<&'r Rule> {
    for &i in candidates {
        let Some(rule) = rules.get(i) else { continue };
        if !holds(rule, tenant, &header, &allowed) {
            continue;
        }
        let takes = bucket(user, rule.salt) < rule.threshold;
        seen(rule, takes);
        if takes {
            return Some(rule);
        }
    }
    None
}

/// Whether `rule`'s `match` holds for `tenant` and `header`, and
/// `allowed` lets the tenant use its target.
fn holds<'h>(
    rule: &Rule,
    tenant: &str,
    header: impl Fn(&HeaderName) -> Option<&'h [u8]>,
    allowed: impl Fn(&str) -> bool,
) -> bool {
    (rule.tenants.is_empty() || rule.tenants.iter().any(|t| &**t == tenant))
        && rule
            .headers
            .iter()
            .all(|(name, want)| header(name) == Some(want.as_bytes()))
        && allowed(&rule.route_to)
}

/// The rule for one request, counted in `zonegate_rule_*`; `None` at once
/// when no rule names the model, and before the user's hash is taken
/// when no rule's `match` holds.
pub fn select<'c, 'h>(
    cfg: &'c Config,
    metrics: &Metrics,
    (tenant, tenant_index): (&str, usize),
    model: &str,
    header: impl Fn(&HeaderName) -> Option<&'h [u8]>,
    user: impl FnOnce() -> u64,
) -> Option<&'c Rule> {
    let p: &PolicyConfig = &cfg.policy;
    if p.rules.is_empty() {
        return None;
    }
    let candidates = p.rules_by_model.get(model)?;
    let allowed = |m: &str| super::allows_model(cfg, tenant_index, m);
    // The user's hash (header lookups and a hash) only for a request some
    // rule's share decides: one no `match` takes pays for none of it.
    let any = candidates
        .iter()
        .filter_map(|&i| p.rules.get(i))
        .any(|r| holds(r, tenant, &header, allowed));
    if !any {
        return None;
    }
    evaluate(
        &p.rules,
        candidates,
        tenant,
        header,
        user(),
        allowed,
        |rule, took| {
            use std::sync::atomic::Ordering::Relaxed;
            let h = handles(rule, metrics);
            h.evaluated.inc();
            rule.counts.evaluated.fetch_add(1, Relaxed);
            if took {
                h.matched.inc();
                rule.counts.matched.fetch_add(1, Relaxed);
            }
        },
    )
}

/// A rule's counters, made on first use.
pub fn handles<'r>(rule: &'r Rule, metrics: &Metrics) -> &'r RuleHandles {
    rule.handles.get_or_init(|| RuleHandles {
        evaluated: metrics.rule_evaluated.with_label_values(&[&rule.name]),
        matched: metrics.rule_matched.with_label_values(&[&rule.name]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;

    fn config(rules: &str) -> Config {
        let text = format!(
            "{}\n[[tenants]]\nname = \"internal\"\nkey_sha256 = \"{}\"\n{rules}",
            MINIMAL.replace(
                "models = [\"qwen25-7b-instruct\"]",
                "models = [\"qwen25-7b-instruct\", \"qwen3-8b-instruct\", \"other\"]",
            ),
            crate::config::sha256_hex("internal-key"),
        );
        Config::parse("t", &text).unwrap()
    }

    const GRAY: &str = "[[rules]]\nname = \"internal-all\"\nmodel = \"qwen25-7b-instruct\"\nmatch = { tenants = [\"internal\"] }\nroute_to = \"qwen3-8b-instruct\"\n\n[[rules]]\nname = \"canary\"\nmodel = \"qwen25-7b-instruct\"\nmatch = { headers = { \"x-canary\" = \"1\" } }\nroute_to = \"other\"\n\n[[rules]]\nname = \"gray\"\nmodel = \"qwen25-7b-instruct\"\npercent = 5.0\nroute_to = \"qwen3-8b-instruct\"\n";

    fn run<'c>(
        cfg: &'c Config,
        tenant: &str,
        model: &str,
        canary: bool,
        user: u64,
    ) -> Option<&'c str> {
        let p = &cfg.policy;
        let none = Vec::new();
        let c = p.rules_by_model.get(model).unwrap_or(&none);
        let name = HeaderName::from_static("x-canary");
        evaluate(
            &p.rules,
            c,
            tenant,
            |h| (canary && *h == name).then_some(&b"1"[..]),
            user,
            |_| true,
            |_, _| {},
        )
        .map(|r| &*r.name)
    }

    #[test]
    fn a_request_no_rule_matches_never_takes_its_user_hash() {
        let cfg = config(
            GRAY.split("[[rules]]\nname = \"gray\"")
                .next()
                .unwrap_or(GRAY),
        );
        let metrics = Metrics::new();
        let taken = std::cell::Cell::new(0);
        let user = || {
            taken.set(taken.get() + 1);
            7
        };
        // deptA is not `internal` and sends no `x-canary`: no rule holds.
        let rule = select(
            &cfg,
            &metrics,
            ("deptA", 0),
            "qwen25-7b-instruct",
            |_: &HeaderName| None,
            user,
        );
        assert!(rule.is_none());
        assert_eq!(taken.get(), 0, "the user's hash was taken for nothing");
        let canary = HeaderName::from_static("x-canary");
        let rule = select(
            &cfg,
            &metrics,
            ("deptA", 0),
            "qwen25-7b-instruct",
            |h: &HeaderName| (*h == canary).then_some(&b"1"[..]),
            user,
        );
        assert_eq!(rule.map(|r| &*r.name), Some("canary"));
        assert_eq!(taken.get(), 1);
    }

    #[test]
    fn rules_match_in_order_first_match_wins() {
        let cfg = config(GRAY);
        // A user hash outside the 5 % of `gray`.
        let out = (0..u64::MAX)
            .map(|i| user_hash("deptA", &i.to_le_bytes()))
            .find(|u| bucket(*u, cfg.policy.rules[2].salt) >= 500)
            .unwrap();
        let inside = (0..u64::MAX)
            .map(|i| user_hash("deptA", &i.to_le_bytes()))
            .find(|u| bucket(*u, cfg.policy.rules[2].salt) < 500)
            .unwrap();
        // (tenant, model, canary header, user, rule)
        let cases = [
            (
                "internal",
                "qwen25-7b-instruct",
                false,
                out,
                Some("internal-all"),
            ),
            (
                "internal",
                "qwen25-7b-instruct",
                true,
                out,
                Some("internal-all"),
            ),
            ("deptA", "qwen25-7b-instruct", true, out, Some("canary")),
            ("deptA", "qwen25-7b-instruct", false, out, None),
            ("deptA", "qwen25-7b-instruct", false, inside, Some("gray")),
            ("deptA", "qwen3-8b-instruct", true, inside, None),
        ];
        for (tenant, model, canary, user, want) in cases {
            assert_eq!(
                run(&cfg, tenant, model, canary, user),
                want,
                "{tenant} {model} canary={canary}"
            );
        }
    }

    #[test]
    fn a_rule_whose_target_the_tenant_may_not_use_is_skipped() {
        let cfg = config(GRAY);
        let p = &cfg.policy;
        let c = &p.rules_by_model["qwen25-7b-instruct"];
        let got = evaluate(
            &p.rules,
            c,
            "internal",
            |_| None,
            1,
            |m| m != "qwen3-8b-instruct",
            |_, _| {},
        );
        assert!(got.is_none(), "{:?}", got.map(|r| &r.name));
    }

    #[test]
    fn users_in_a_smaller_share_stay_in_every_larger_one() {
        let salt = crate::config::policy::name_salt("gray");
        for i in 0..20_000u64 {
            let u = user_hash("deptA", format!("user-{i}").as_bytes());
            let b = bucket(u, salt);
            for (small, large) in [(100, 500), (500, 1_000), (1_000, 5_000), (5_000, 10_000)] {
                assert!(
                    b >= small || b < large,
                    "user {i} in {small} but not {large}"
                );
            }
        }
    }

    #[test]
    fn ten_thousand_distinct_users_split_within_a_point_of_five_percent() {
        let salt = crate::config::policy::name_salt("qwen3-gray");
        for tenant in ["deptA", "internal", "t"] {
            let took = (0..10_000)
                .filter(|i| bucket(user_hash(tenant, format!("user-{i}").as_bytes()), salt) < 500)
                .count();
            let share = took as f64 / 100.0;
            assert!((4.0..=6.0).contains(&share), "{tenant}: {share} %");
        }
    }
}
