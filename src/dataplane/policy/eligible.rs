//! Who may use what: a tenant's `models` (globs; any other model is, for
//! that tenant, a model that does not exist) and `require_tags` (only
//! backends carrying every required tag). Tags are enforced where every
//! pick happens: the backends a tenant may not use are put among the
//! request's tried backends before its first pick, so no retry, fallback
//! model, continuation, cross-zone hop, rule target or half-open trial can
//! pick one. A tenant without `require_tags` pays one check.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::policy::TenantPolicy;
use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::dataplane::routing::Routes;

fn tenant(cfg: &Config, index: usize) -> Option<&TenantPolicy> {
    cfg.policy.tenants.get(index)
}

/// Whether tenant `index` may use logical model `model`.
pub fn allows_model(cfg: &Config, index: usize, model: &str) -> bool {
    tenant(cfg, index).is_none_or(|t| t.allows_model(model))
}

/// What the tenant's tags kept out of a request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Excluded {
    /// Backends (of any model) the tenant may not use.
    pub backends: usize,
}

/// Marks every backend of `routes` that tenant `index` may not use as
/// tried (`tried` holds backend identities, [`Arc::as_ptr`]). A backend
/// the tenant's config does not know (a config swapped in meanwhile) is
/// left out too: fail closed.
pub fn exclude(
    cfg: &Config,
    index: usize,
    routes: &Routes,
    tried: &mut SmallVec<[usize; 4]>,
) -> Excluded {
    let Some(t) = tenant(cfg, index).filter(|t| t.eligible.is_some()) else {
        return Excluded::default();
    };
    let mut n = 0;
    for b in &routes.backends {
        if !t.allows_backend(&b.name) {
            tried.push(Arc::as_ptr(b) as usize);
            n += 1;
        }
    }
    Excluded { backends: n }
}

/// The error for a request no eligible backend answered: a tenant held to
/// tags gets 503 `no_eligible_backend` saying why, never a quiet route
/// elsewhere. Other errors (busy, context length, quota) stay as they are.
pub fn explain(cfg: &Config, index: usize, excluded: Excluded, e: ApiError) -> ApiError {
    let Some(t) = tenant(cfg, index).filter(|_| excluded.backends > 0) else {
        return e;
    };
    match e {
        ApiError::NoBackend { message }
        | ApiError::UpstreamFailed { message }
        | ApiError::UpstreamTimeout { message } => ApiError::NoEligibleBackend(format!(
            "this tenant may use only backends tagged [{}] ({} other backend(s) skipped), and none \
             of those could answer: {message}",
            t.require_tags.join(", "),
            excluded.backends
        )),
        ApiError::ZoneUnavailable(message) => ApiError::NoEligibleBackend(format!(
            "this tenant may use only backends tagged [{}]: {message}",
            t.require_tags.join(", ")
        )),
        e => e,
    }
}

/// The backends of `model` (in `cfg`) tenant `index` could reach, by name:
/// none when the tenant may not use the model; else those carrying its
/// tags. For the config safety rules and the admin view.
pub fn reachable<'c>(cfg: &'c Config, index: usize, model: &str) -> Vec<&'c str> {
    if !allows_model(cfg, index, model) {
        return Vec::new();
    }
    let t = tenant(cfg, index);
    cfg.backends
        .iter()
        .filter(|b| b.models.iter().any(|m| m == model))
        .filter(|b| t.is_none_or(|t| t.allows_backend(&b.name)))
        .map(|b| b.name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;

    const TWO: &str = "\n[[backends]]\nname = \"pub-a1\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:8001\"\nmodels = [\"qwen25-7b-instruct\", \"fb\"]\n\n[[backends]]\nname = \"priv-fb\"\nzone = \"az-b\"\nurl = \"http://127.0.0.1:8002\"\nmodels = [\"fb\"]\ntags = [\"private\", \"gpu-h100\"]\n\n[[models]]\nname = \"qwen25-7b-instruct\"\nfallback = [\"fb\"]\n";

    fn config(tenant_keys: &str) -> Config {
        let text = format!(
            "{}{TWO}",
            MINIMAL
                .replace(
                    "priority = \"P0\"",
                    &format!("priority = \"P0\"\n{tenant_keys}")
                )
                .replace(
                    "models = [\"qwen25-7b-instruct\"]",
                    "models = [\"qwen25-7b-instruct\"]\ntags = [\"private\"]"
                )
        );
        Config::parse("t", &text).unwrap()
    }

    #[test]
    fn eligibility_by_tags_and_allowed_models_table() {
        // (tenant keys, model, reachable backends)
        let cases: &[(&str, &str, &[&str])] = &[
            ("", "qwen25-7b-instruct", &["qwen-a1", "pub-a1"]),
            ("", "fb", &["pub-a1", "priv-fb"]),
            (
                "require_tags = [\"private\"]",
                "qwen25-7b-instruct",
                &["qwen-a1"],
            ),
            ("require_tags = [\"private\"]", "fb", &["priv-fb"]),
            (
                "require_tags = [\"private\", \"gpu-h100\"]",
                "qwen25-7b-instruct",
                &[],
            ),
            (
                "require_tags = [\"private\", \"gpu-h100\"]",
                "fb",
                &["priv-fb"],
            ),
            (
                "models = [\"qwen*\"]",
                "qwen25-7b-instruct",
                &["qwen-a1", "pub-a1"],
            ),
            ("models = [\"qwen*\"]", "fb", &[]),
            (
                "models = [\"fb\"]\nrequire_tags = [\"gpu-h100\"]",
                "fb",
                &["priv-fb"],
            ),
        ];
        for (keys, model, want) in cases {
            let cfg = config(keys);
            assert_eq!(reachable(&cfg, 0, model), *want, "{keys} / {model}");
        }
    }

    #[test]
    fn a_tagged_tenant_finds_every_untagged_backend_already_tried() {
        let cfg = config("require_tags = [\"private\"]");
        let routes = Routes::build(&cfg, None);
        let mut tried = SmallVec::new();
        let x = exclude(&cfg, 0, &routes, &mut tried);
        assert_eq!(x.backends, 1);
        let pub_a1 = routes.backends.iter().find(|b| b.name == "pub-a1").unwrap();
        assert_eq!(tried.as_slice(), &[Arc::as_ptr(pub_a1) as usize]);
        // No pick, in any zone of any model, lands on it.
        let mut rng = fastrand::Rng::with_seed(7);
        for model in ["qwen25-7b-instruct", "fb"] {
            for pool in &routes.model(model).unwrap().pools {
                for _ in 0..50 {
                    if let Some((i, _)) =
                        pool.pick(crate::config::Balance::P2c, None, 0, &tried, &mut rng)
                    {
                        assert_ne!(pool.backends[i].name, "pub-a1");
                    }
                }
            }
        }
        // An unrestricted tenant excludes nothing.
        let cfg = config("");
        let mut tried = SmallVec::new();
        assert_eq!(exclude(&cfg, 0, &routes, &mut tried), Excluded::default());
        assert!(tried.is_empty());
    }

    #[test]
    fn a_tagged_tenant_with_nothing_left_gets_no_eligible_backend() {
        let cfg = config("require_tags = [\"private\"]");
        let e = explain(
            &cfg,
            0,
            Excluded { backends: 1 },
            ApiError::UpstreamFailed {
                message: "all 1 tried backend(s) failed".into(),
            },
        );
        assert_eq!(e.code(), "no_eligible_backend");
        assert_eq!(e.status().as_u16(), 503);
        assert!(e.to_string().contains("tagged [private]"), "{e}");
        // Busy stays busy.
        let busy = ApiError::AllBusy {
            message: "busy".into(),
            retry_after_s: 1,
        };
        assert_eq!(
            explain(&cfg, 0, Excluded { backends: 1 }, busy).code(),
            "backends_busy"
        );
    }
}
