//! The plan stage: which models may answer a request, in order (the
//! primary, its fallbacks, the floor model while the breaker is open), and
//! the tier a substitute must reach.

use http::HeaderName;
use smallvec::SmallVec;

use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::dataplane::request::ClientHeaders;
use crate::dataplane::routing::{ModelRoute, Routes};

/// How a model got into a request's chain; becomes part of
/// `x-zonegate-route`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Link {
    Primary,
    /// From the primary's `fallback` list.
    Fallback,
    /// The global breaker is open and the primary has no healthy backend.
    Floor,
    /// From a model's `context_fallback` list, after its
    /// `context_length_exceeded`.
    ContextFallback,
    /// The cheapest model of the chain, for a tenant over its budget with
    /// `on_budget = "cheapest"` (`proxy::budget`).
    Budget,
}

impl Link {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Link::Primary => "primary",
            Link::Fallback => "fallback-model",
            Link::Floor => "floor-model",
            Link::ContextFallback => "context-fallback",
            Link::Budget => "budget:cheapest",
        }
    }

    pub(super) fn metric_kind(self) -> &'static str {
        match self {
            Link::Primary => "none",
            Link::Fallback => "model",
            Link::Floor => "floor_model",
            Link::ContextFallback => "context_model",
            Link::Budget => "budget",
        }
    }
}

/// Models to try for one request, with how each got there.
pub(super) type Chain<'a> = SmallVec<[(&'a ModelRoute, Link); 4]>;

/// The header a client names its minimum model tier with.
const MIN_TIER_HEADER: HeaderName = HeaderName::from_static("x-zonegate-min-tier");

/// The tier a request needs: what the client asks for in the header, and
/// at least what its size suggests (`[[prompt_tiers]]`: a long prompt is
/// taken as a complex task that a small model would answer worse).
pub(super) fn min_tier(
    headers: &ClientHeaders,
    body_len: usize,
    by_size: &[(u64, u32)],
) -> Result<u32, ApiError> {
    let estimated = by_size
        .iter()
        .filter(|(bytes, _)| body_len as u64 >= *bytes)
        .map(|(_, tier)| *tier)
        .max()
        .unwrap_or(0);
    let Some(v) = headers.get(&MIN_TIER_HEADER) else {
        return Ok(estimated);
    };
    let asked: u32 = std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::BadRequest(format!("{MIN_TIER_HEADER} must be a non-negative integer"))
        })?;
    Ok(asked.max(estimated))
}

/// The models to try, in order: the primary and its fallbacks, led by the
/// floor model while the global breaker is open and the primary has no
/// healthy backend; each substitute at or above `min_tier`. Also returns the models
/// skipped for their tier, for the error.
pub(super) fn model_chain<'a>(
    cfg: &Config,
    routes: &'a Routes,
    primary: &'a ModelRoute,
    min_tier: u32,
) -> (Chain<'a>, Vec<(&'a str, u32)>) {
    let floor = cfg
        .health
        .floor_model
        .as_deref()
        .filter(|_| routes.breaker_open() && primary.is_unhealthy())
        .and_then(|f| routes.model(f))
        .map(|m| (m, Link::Floor));
    let listed = std::iter::once((primary, Link::Primary)).chain(
        primary
            .cfg
            .fallback
            .iter()
            .filter_map(|name| routes.model(name))
            .map(|m| (m, Link::Fallback)),
    );
    let mut chain = Chain::new();
    let mut skipped = Vec::new();
    for (m, link) in floor.into_iter().chain(listed) {
        if chain.iter().any(|(c, _)| std::ptr::eq(*c, m)) {
            continue;
        }
        // The model the client named is always tried: the tier only keeps
        // substitutes (fallbacks, the floor model) from answering worse.
        if link != Link::Primary && m.tier() < min_tier {
            skipped.push((m.cfg.name.as_str(), m.tier()));
            continue;
        }
        chain.push((m, link));
    }
    (chain, skipped)
}

pub(super) fn no_capable_model(model: &str, min_tier: u32, skipped: &[(&str, u32)]) -> ApiError {
    let skipped: Vec<String> = skipped
        .iter()
        .map(|(name, tier)| format!("`{name}` (tier {tier})"))
        .collect();
    ApiError::NoCapableModel(format!(
        "no model at or above tier {min_tier} can serve `{model}` now; skipped as below the \
         required tier: {}",
        skipped.join(", ")
    ))
}

pub(super) fn no_capable_after(
    model: &str,
    min_tier: u32,
    skipped: &[(&str, u32)],
    a: &super::attempts::Attempts,
) -> ApiError {
    let mut e = no_capable_model(model, min_tier, skipped);
    if let (ApiError::NoCapableModel(msg), Some((b, last))) = (&mut e, a.failures.last()) {
        msg.push_str(&format!(
            "; {} capable attempt(s) failed, the last: {b}: {last}",
            a.count
        ));
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_tier_takes_the_larger_of_header_and_size_estimate() {
        let by_size = [(1_000, 1), (10_000, 3)];
        let mut h = http::HeaderMap::new();
        let min_tier = |h: &http::HeaderMap, len, by_size: &[(u64, u32)]| {
            min_tier(&ClientHeaders::Map(h.clone()), len, by_size)
        };
        assert_eq!(min_tier(&h, 10, &by_size).unwrap(), 0);
        assert_eq!(min_tier(&h, 1_000, &by_size).unwrap(), 1);
        assert_eq!(min_tier(&h, 50_000, &by_size).unwrap(), 3);
        h.insert(MIN_TIER_HEADER, "2".parse().unwrap());
        assert_eq!(min_tier(&h, 10, &by_size).unwrap(), 2);
        assert_eq!(min_tier(&h, 50_000, &by_size).unwrap(), 3);
        h.insert(MIN_TIER_HEADER, "high".parse().unwrap());
        assert!(matches!(
            min_tier(&h, 10, &by_size),
            Err(ApiError::BadRequest(_))
        ));
    }
}
