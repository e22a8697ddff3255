//! Traffic policy config: `[[rules]]` (gray release by tenant, header and a
//! stable share of users), `[[shadows]]` (a copy of a share of a model's
//! requests to a candidate), a tenant's `models` (globs) and
//! `require_tags`, a backend's `tags`: the raw shapes and their validation
//! into [`PolicyConfig`], which the data plane reads per request
//! (`dataplane::policy`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;
use serde::Deserialize;

use super::bounds;
use super::raw::{RawBackend, RawTenant};
use super::{BackendConfig, ConfigError, ModelConfig, Tenant, Validator};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: String,
    pub(super) model: String,
    #[serde(rename = "match", default)]
    pub(super) matches: RawMatch,
    pub(super) percent: Option<f64>,
    pub(super) route_to: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    #[serde(default)]
    pub(super) tenants: Vec<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShadow {
    pub(super) name: String,
    pub(super) model: String,
    pub(super) to: String,
    pub(super) percent: Option<f64>,
    pub(super) max_in_flight: Option<u32>,
    #[serde(default)]
    pub(super) count_quota: bool,
    pub(super) timeout: Option<String>,
}

/// The policy keys of `[[tenants]]` and `[[backends]]`, taken out of the
/// raw sections before those are validated.
pub(super) struct RawPolicy {
    tenants: Vec<(Option<Vec<String>>, Vec<String>)>,
    tags: Vec<Vec<String>>,
    rules: Vec<RawRule>,
    shadows: Vec<RawShadow>,
}

impl RawPolicy {
    pub(super) fn take(
        tenants: &mut [RawTenant],
        backends: &mut [RawBackend],
        rules: Vec<RawRule>,
        shadows: Vec<RawShadow>,
    ) -> Self {
        RawPolicy {
            tenants: tenants
                .iter_mut()
                .map(|t| (t.models.take(), std::mem::take(&mut t.require_tags)))
                .collect(),
            tags: backends
                .iter_mut()
                .map(|b| std::mem::take(&mut b.tags))
                .collect(),
            rules,
            shadows,
        }
    }
}

/// Model name → indices of the rules or shadows naming it, in order.
pub type ModelIndex = HashMap<String, Vec<usize>, foldhash::fast::RandomState>;

/// The validated policy. Per tenant and per backend in config order.
#[derive(Clone, Debug, Default)]
pub struct PolicyConfig {
    /// Per tenant (the order of `Config::tenants`).
    pub tenants: Vec<TenantPolicy>,
    /// Per backend (the order of `Config::backends`): its `tags`.
    pub backend_tags: Vec<Vec<String>>,
    /// `[[rules]]` in order.
    pub rules: Vec<Rule>,
    /// Model → indices into `rules`, in order: a request looks at the rules
    /// for its model only (one foldhash lookup: SipHash's was most of what
    /// a request no rule takes paid for the rules of other models).
    pub rules_by_model: ModelIndex,
    /// `[[shadows]]` in order.
    pub shadows: Vec<Shadow>,
    /// Model → indices into `shadows`.
    pub shadows_by_model: ModelIndex,
}

/// Which models and backends one tenant may use.
#[derive(Clone, Debug, Default)]
pub struct TenantPolicy {
    /// `models`: globs of the logical models it may use; `None`: any.
    pub models: Option<Vec<String>>,
    /// `require_tags`: a backend must carry every one.
    pub require_tags: Vec<String>,
    /// The names of the backends carrying every required tag; `None` when
    /// nothing is required (every backend is eligible).
    pub eligible: Option<HashSet<String>>,
}

impl TenantPolicy {
    /// Whether the tenant may use logical model `name`.
    pub fn allows_model(&self, name: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|globs| globs.iter().any(|g| glob_match(g, name)))
    }

    /// Whether backend `name` carries every tag the tenant requires.
    pub fn allows_backend(&self, name: &str) -> bool {
        self.eligible.as_ref().is_none_or(|e| e.contains(name))
    }
}

/// One `[[rules]]` entry.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: Arc<str>,
    pub model: String,
    /// `match.tenants`: empty matches any tenant.
    pub tenants: Vec<Arc<str>>,
    /// `match.headers`: every one must be present with exactly this value.
    pub headers: Vec<(HeaderName, String)>,
    /// Share of matching requests, 0–100, by a stable hash of tenant and
    /// user.
    pub percent: f64,
    /// `percent` as a threshold on a bucket in 0..[`BUCKETS`].
    pub threshold: u64,
    pub route_to: String,
    /// Mixed into each user's hash, so two rules pick independent users.
    pub salt: u64,
    /// `zonegate_rule_{evaluated,matched}_total{rule}`, made on first use.
    pub handles: OnceLock<RuleHandles>,
    /// The same counts under this config version only (the realised share
    /// of the percent now configured, not a blend with earlier ones).
    pub counts: Arc<RuleCounts>,
}

/// A rule's requests under one config version.
#[derive(Debug, Default)]
pub struct RuleCounts {
    pub evaluated: std::sync::atomic::AtomicU64,
    pub matched: std::sync::atomic::AtomicU64,
}

/// A rule's counters.
#[derive(Clone, Debug)]
pub struct RuleHandles {
    /// Requests that reached the rule and met its `match`.
    pub evaluated: IntCounter,
    /// ...of which the rule took (the percent).
    pub matched: IntCounter,
}

/// Buckets a user hash is cut into: a percent is honoured to 1/100 of a
/// percent.
pub const BUCKETS: u64 = 10_000;

/// One `[[shadows]]` entry.
#[derive(Clone, Debug)]
pub struct Shadow {
    pub name: Arc<str>,
    pub model: String,
    pub to: String,
    pub percent: f64,
    pub threshold: u64,
    pub max_in_flight: u32,
    pub count_quota: bool,
    /// The copy's own deadline (first byte and body together).
    pub timeout: Duration,
    pub salt: u64,
}

/// `*` matches any run of characters, `?` any one; everything else is
/// itself. Hand-written: a model name is short and a pattern has one or
/// two stars; `globset` would compile regexes for this.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == b'?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

/// A stable 64-bit digest of a name (FNV-1a), the same on every node.
pub fn name_salt(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn threshold(percent: f64) -> u64 {
    // 0..=100 by validation: at most BUCKETS.
    (percent * (BUCKETS as f64) / 100.0).round() as u64
}

impl Validator<'_> {
    pub(super) fn policy(
        &self,
        raw: RawPolicy,
        tenants: &[Tenant],
        backends: &[BackendConfig],
        models: &[ModelConfig],
    ) -> Result<PolicyConfig, ConfigError> {
        let known = |m: &str| models.iter().any(|c| c.name == m);
        for (key, n, b) in [
            ("rules", raw.rules.len(), bounds::RULES),
            ("shadows", raw.shadows.len(), bounds::SHADOWS),
        ] {
            if n as u64 > b.max {
                return Err(self.err(key, format!("{n} entries, at most {} ({})", b.max, b.why)));
            }
        }
        let mut backend_tags = Vec::with_capacity(raw.tags.len());
        for (i, tags) in raw.tags.into_iter().enumerate() {
            self.words(&format!("backends[{i}].tags"), &tags)?;
            backend_tags.push(tags);
        }
        let mut tenant_policies = Vec::with_capacity(raw.tenants.len());
        for (i, (globs, require_tags)) in raw.tenants.into_iter().enumerate() {
            if let Some(g) = &globs {
                self.words(&format!("tenants[{i}].models"), g)?;
            }
            self.words(&format!("tenants[{i}].require_tags"), &require_tags)?;
            let eligible = (!require_tags.is_empty()).then(|| {
                backends
                    .iter()
                    .zip(&backend_tags)
                    .filter(|(_, tags)| require_tags.iter().all(|t| tags.contains(t)))
                    .map(|(b, _)| b.name.clone())
                    .collect()
            });
            tenant_policies.push(TenantPolicy {
                models: globs,
                require_tags,
                eligible,
            });
        }
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(raw.rules.len());
        let mut rules_by_model = ModelIndex::default();
        for (i, r) in raw.rules.into_iter().enumerate() {
            let key = format!("rules[{i}]");
            self.policy_name(&key, &r.name, &mut names)?;
            self.policy_models(&key, (&r.model, "model"), (&r.route_to, "route_to"), &known)?;
            let percent =
                self.real(&format!("{key}.percent"), r.percent, 100.0, bounds::PERCENT)?;
            let mut rule_tenants = Vec::with_capacity(r.matches.tenants.len());
            for (j, t) in r.matches.tenants.iter().enumerate() {
                let Some(known) = tenants.iter().find(|k| &*k.name == t) else {
                    return Err(self.err(
                        format!("{key}.match.tenants[{j}]"),
                        format!("`{t}` is not a tenant of this config"),
                    ));
                };
                rule_tenants.push(Arc::clone(&known.name));
            }
            let mut headers = Vec::with_capacity(r.matches.headers.len());
            for (h, v) in r.matches.headers {
                let name = HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    self.err(
                        format!("{key}.match.headers"),
                        format!("`{h}` is not a header name"),
                    )
                })?;
                headers.push((name, v));
            }
            rules_by_model.entry(r.model.clone()).or_default().push(i);
            rules.push(Rule {
                salt: name_salt(&r.name),
                name: r.name.into(),
                model: r.model,
                tenants: rule_tenants,
                headers,
                percent,
                threshold: threshold(percent),
                route_to: r.route_to,
                handles: OnceLock::new(),
                counts: Arc::default(),
            });
        }
        let mut shadows = Vec::with_capacity(raw.shadows.len());
        let mut shadows_by_model = ModelIndex::default();
        let mut names = HashSet::new();
        for (i, s) in raw.shadows.into_iter().enumerate() {
            let key = format!("shadows[{i}]");
            self.policy_name(&key, &s.name, &mut names)?;
            self.policy_models(&key, (&s.model, "model"), (&s.to, "to"), &known)?;
            let percent =
                self.real(&format!("{key}.percent"), s.percent, 100.0, bounds::PERCENT)?;
            let max_in_flight = self.int(
                &format!("{key}.max_in_flight"),
                s.max_in_flight,
                8,
                bounds::SHADOW_IN_FLIGHT,
            )?;
            let timeout = self.duration(
                &format!("{key}.timeout"),
                s.timeout.as_deref(),
                Duration::from_secs(60),
                bounds::SHADOW_TIMEOUT,
            )?;
            shadows_by_model.entry(s.model.clone()).or_default().push(i);
            shadows.push(Shadow {
                salt: name_salt(&s.name),
                name: s.name.into(),
                model: s.model,
                to: s.to,
                percent,
                threshold: threshold(percent),
                max_in_flight,
                count_quota: s.count_quota,
                timeout,
            });
        }
        Ok(PolicyConfig {
            tenants: tenant_policies,
            backend_tags,
            rules,
            rules_by_model,
            shadows,
            shadows_by_model,
        })
    }

    /// A list of names (tags, globs): none empty, at most 64.
    fn words(&self, key: &str, words: &[String]) -> Result<(), ConfigError> {
        if words.len() > 64 {
            return Err(self.err(key, format!("{} entries, at most 64", words.len())));
        }
        match words.iter().position(|w| w.trim().is_empty()) {
            Some(j) => Err(self.err(format!("{key}[{j}]"), "must not be empty")),
            None => Ok(()),
        }
    }

    fn policy_name(
        &self,
        key: &str,
        name: &str,
        seen: &mut HashSet<String>,
    ) -> Result<(), ConfigError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(self.err(
                format!("{key}.name"),
                "must be 1-64 letters, digits, `-`, `_` or `.` (it is a metric label and a header value)",
            ));
        }
        if !seen.insert(name.to_owned()) {
            return Err(self.err(format!("{key}.name"), format!("duplicate name `{name}`")));
        }
        Ok(())
    }

    fn policy_models(
        &self,
        key: &str,
        (from, from_key): (&str, &str),
        (to, to_key): (&str, &str),
        known: &dyn Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        for (m, k) in [(from, from_key), (to, to_key)] {
            if !known(m) {
                return Err(self.err(
                    format!("{key}.{k}"),
                    format!("`{m}` is not a model any backend serves"),
                ));
            }
        }
        if from == to {
            return Err(self.err(
                format!("{key}.{to_key}"),
                format!("must name another model than `{from}`"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{error_of, MINIMAL};
    use crate::config::Config;

    #[test]
    fn globs_match_star_and_question_mark_only() {
        let cases = [
            ("qwen3-*", "qwen3-8b-instruct", true),
            ("qwen3-*", "qwen25-7b-instruct", false),
            ("*", "anything", true),
            ("*-instruct", "qwen3-8b-instruct", true),
            ("q?en3-*", "qwen3-8b", true),
            ("qwen25-7b-instruct", "qwen25-7b-instruct", true),
            ("qwen25-7b-instruct", "qwen25-7b-instruct-v2", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("", "", true),
            ("", "x", false),
        ];
        for (p, n, want) in cases {
            assert_eq!(glob_match(p, n), want, "{p} vs {n}");
        }
    }

    fn two_models() -> String {
        MINIMAL.replace(
            "models = [\"qwen25-7b-instruct\"]",
            "models = [\"qwen25-7b-instruct\", \"qwen3-8b-instruct\"]\n        tags = [\"private\"]",
        )
    }

    #[test]
    fn rules_shadows_and_tenant_policy_are_read() {
        let text = format!(
            "{}\n[[rules]]\nname = \"gray\"\nmodel = \"qwen25-7b-instruct\"\nmatch = {{ tenants = [\"deptA\"], headers = {{ \"x-canary\" = \"1\" }} }}\npercent = 5.0\nroute_to = \"qwen3-8b-instruct\"\n\n[[shadows]]\nname = \"sh\"\nmodel = \"qwen25-7b-instruct\"\nto = \"qwen3-8b-instruct\"\npercent = 10.0\n",
            two_models().replace(
                "priority = \"P0\"",
                "priority = \"P0\"\n        models = [\"qwen3-*\"]\n        require_tags = [\"private\"]"
            )
        );
        let c = Config::parse("t", &text).unwrap();
        let p = &c.policy;
        assert_eq!(p.rules.len(), 1);
        assert_eq!(p.rules[0].threshold, 500);
        assert_eq!(p.rules[0].headers[0].0.as_str(), "x-canary");
        assert_eq!(p.rules_by_model["qwen25-7b-instruct"], vec![0]);
        assert_eq!(p.shadows[0].max_in_flight, 8);
        assert_eq!(p.shadows[0].threshold, 1000);
        let t = &p.tenants[0];
        assert!(t.allows_model("qwen3-8b-instruct"));
        assert!(!t.allows_model("qwen25-7b-instruct"));
        assert!(t.allows_backend("qwen-a1"));
        assert!(!t.allows_backend("other"));
        assert_eq!(p.backend_tags[0], vec!["private".to_owned()]);
    }

    #[test]
    fn bad_policy_names_its_key() {
        let base = two_models();
        let cases = [
            (
                "[[rules]]\nname = \"r\"\nmodel = \"nope\"\nroute_to = \"qwen3-8b-instruct\"",
                "rules[0].model",
                "not a model",
            ),
            (
                "[[rules]]\nname = \"r\"\nmodel = \"qwen3-8b-instruct\"\nroute_to = \"qwen3-8b-instruct\"",
                "rules[0].route_to",
                "another model",
            ),
            (
                "[[rules]]\nname = \"r\"\nmodel = \"qwen25-7b-instruct\"\nroute_to = \"qwen3-8b-instruct\"\npercent = 101.0",
                "rules[0].percent",
                "between",
            ),
            (
                "[[rules]]\nname = \"r\"\nmodel = \"qwen25-7b-instruct\"\nroute_to = \"qwen3-8b-instruct\"\nmatch = { tenants = [\"ghost\"] }",
                "rules[0].match.tenants[0]",
                "not a tenant",
            ),
            (
                "[[rules]]\nname = \"a b\"\nmodel = \"qwen25-7b-instruct\"\nroute_to = \"qwen3-8b-instruct\"",
                "rules[0].name",
                "letters",
            ),
            (
                "[[shadows]]\nname = \"s\"\nmodel = \"qwen25-7b-instruct\"\nto = \"qwen3-8b-instruct\"\nmax_in_flight = 0",
                "shadows[0].max_in_flight",
                "at least 1",
            ),
        ];
        for (section, key, reason) in cases {
            let e = error_of(&format!("{base}\n{section}\n"));
            assert_eq!(e.key, key, "{e}");
            assert!(e.reason.contains(reason), "{e}");
        }
    }
}
