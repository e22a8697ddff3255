//! The pick and forward stages: the chain's models in order, each in its
//! effective zone and then its allowed fallback zones, one backend at a
//! time, until one commits (its first body byte arrived) or the attempts,
//! the retry budget or the candidates run out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Uri};
use zonegate_cluster::ZoneId;

use super::chain::{Chain, Link};
use super::RequestFacts;
use crate::clock::now_ms;
use crate::config::Balance;
use crate::dataplane::backend::{Backend, InFlight};
use crate::dataplane::error::ApiError;
use crate::dataplane::forward::{self, AttemptError, Committed};
use crate::dataplane::observe::ZoneResult;
use crate::dataplane::routing::{plan_zones, ModelRoute, PickReason, PoolGuard};
use crate::node::gateway::Gateway;

/// The client's request as every attempt resends it.
pub(super) struct Outgoing<'a> {
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    /// The model the client named.
    pub model: &'a str,
}

/// The attempt that committed.
pub(super) struct Winner<'a> {
    pub committed: Committed,
    pub model: &'a ModelRoute,
    pub backend: Arc<Backend>,
    pub reason: PickReason,
    pub cross_zone: bool,
    pub link: Link,
    /// Attempts this request made, the winning one included.
    pub attempts: u32,
    pub guards: (InFlight, PoolGuard),
}

/// Why no attempt committed.
pub(super) struct GaveUp {
    pub attempts: Attempts,
    /// A zone this request's class may not cross to had a usable backend.
    pub withheld_zones: bool,
}

/// What one request's attempts have seen so far.
#[derive(Default)]
pub(super) struct Attempts {
    /// Identities (addresses) of the backends already tried.
    pub tried: Vec<usize>,
    pub count: u32,
    pub failures: Vec<(String, AttemptError)>,
    pub budget_exhausted: bool,
}

/// Tries the chain until an attempt commits. Records the effective zone's
/// result for the zone reports either way.
pub(super) async fn forward_chain<'a>(
    gw: &Gateway,
    req: &RequestFacts<'_>,
    chain: Chain<'a>,
    out: &Outgoing<'_>,
) -> Result<Winner<'a>, GaveUp> {
    let mut attempts = Attempts::default();
    let mut home_zone = ZoneWatch::default();
    let mut withheld_zones = false;
    let mut rng = fastrand::Rng::new();
    for (model, link) in chain {
        let zones: Vec<ZoneId> = model.pools.iter().map(|p| p.zone.clone()).collect();
        let cross_zone_ok = gw.cfg.affinity.cross_zone_fallback;
        let plan = plan_zones(&req.home, &req.view, &zones, req.class, cross_zone_ok);
        home_zone.zone.get_or_insert_with(|| plan.effective.clone());
        // A session keeps its backend within its zone by consistent hashing.
        let balance = if req.session.is_some() && gw.cfg.affinity.zone_pin {
            Balance::Ring
        } else {
            model.cfg.balance
        };
        let mut model_attempts = 0;
        // The fallback order is only worked out if the effective zone
        // cannot answer: most requests never need it.
        let fallbacks = std::iter::once_with(|| {
            order_fallbacks(gw, model, &plan.effective, plan.fallbacks.clone())
        });
        let zone_order = std::iter::once(plan.effective.clone()).chain(fallbacks.flatten());
        for (zone_pos, zone) in zone_order.enumerate() {
            let Some(pool) = model.pool(&zone) else {
                continue;
            };
            while model_attempts < gw.cfg.retry.max_attempts {
                let now = now_ms();
                let Some((backend, reason)) =
                    pool.pick(balance, req.session, now, &attempts.tried, &mut rng)
                else {
                    break;
                };
                if attempts.count > 0 && !take_retry(gw, model, now) {
                    attempts.budget_exhausted = true;
                    home_zone.finish(gw, None);
                    return Err(GaveUp {
                        attempts,
                        withheld_zones: false,
                    });
                }
                attempts.tried.push(Arc::as_ptr(&backend) as usize);
                attempts.count += 1;
                model_attempts += 1;
                let guards = (backend.start_request(), pool.enter());
                match attempt(gw, req, out, model, &backend).await {
                    Ok(committed) => {
                        home_zone.finish(gw, Some(&backend.zone));
                        return Ok(Winner {
                            committed,
                            model,
                            backend,
                            reason,
                            cross_zone: zone_pos > 0,
                            link,
                            attempts: attempts.count,
                            guards,
                        });
                    }
                    Err(e) => {
                        note_failure(gw, model, &backend, &e, now);
                        home_zone.saw(&backend.zone, &e);
                        attempts.failures.push((backend.name.clone(), e));
                    }
                }
            }
        }
        withheld_zones |= plan
            .withheld
            .iter()
            .any(|z| model.pool(z).is_some_and(|p| p.has_usable(now_ms())));
    }
    home_zone.finish(gw, None);
    Err(GaveUp {
        attempts,
        withheld_zones,
    })
}

/// A retry takes from the retry budget; false when it is spent.
fn take_retry(gw: &Gateway, model: &ModelRoute, now: u64) -> bool {
    let name = [model.cfg.name.as_str()];
    if !gw.budget.lock().try_retry(now / 1000) {
        gw.metrics
            .retry_budget_exhausted
            .with_label_values(&name)
            .inc();
        return false;
    }
    gw.metrics.retries.with_label_values(&name).inc();
    true
}

/// One attempt on `backend`, with the body it must see.
async fn attempt(
    gw: &Gateway,
    req: &RequestFacts<'_>,
    out: &Outgoing<'_>,
    model: &ModelRoute,
    backend: &Backend,
) -> Result<Committed, AttemptError> {
    let uri = upstream_uri(backend, out.uri);
    let mut headers = forward::upstream_headers(out.headers);
    forward::set_header(&mut headers, "x-request-id", &req.request_id);
    let payload = rewrite_model(out.body, out.model, backend, &model.cfg.name);
    let timeout = model.cfg.first_byte_timeout;
    forward::attempt(&gw.upstream(), uri, headers, payload, timeout).await
}

/// How a request's effective zone did, for the zone observations the
/// control plane scores (see `observe`).
#[derive(Default)]
struct ZoneWatch {
    zone: Option<ZoneId>,
    error: bool,
    busy: bool,
}

impl ZoneWatch {
    fn saw(&mut self, zone: &ZoneId, e: &AttemptError) {
        if self.zone.as_ref() != Some(zone) {
            return;
        }
        match e {
            AttemptError::Busy(_) => self.busy = true,
            AttemptError::FirstByteTimeout(_) => {}
            _ => self.error = true,
        }
    }

    /// Records the result once; `served_in` is the zone that answered.
    fn finish(&mut self, gw: &Gateway, served_in: Option<&ZoneId>) {
        let Some(zone) = self.zone.take() else { return };
        let result = if served_in == Some(&zone) {
            ZoneResult::Served
        } else if self.error {
            ZoneResult::Failed
        } else if self.busy {
            // Busy is not broken: a zone that only said 429 is not scored.
            return;
        } else {
            ZoneResult::Unanswered
        };
        gw.zone_stats.record(&zone, result);
    }
}

/// A failed attempt: its metric, its log line and its passive signal (a
/// 429 cools the backend down; anything else counts toward ejecting it).
fn note_failure(gw: &Gateway, model: &ModelRoute, backend: &Backend, e: &AttemptError, now: u64) {
    gw.metrics
        .forward_attempts
        .with_label_values(&[
            &model.cfg.name,
            &backend.name,
            backend.zone.as_str(),
            e.outcome(),
        ])
        .inc();
    tracing::debug!(backend = %backend.name, error = %e, "attempt failed");
    match e {
        AttemptError::Busy(wait) => {
            backend.cool_down(now, wait.unwrap_or(gw.cfg.retry.default_cooldown))
        }
        e if e.counts_against_health() => {
            if let Some(change) = backend.record_failure(now, &gw.cfg.health) {
                crate::health::passive_ejection(gw, backend, change, &e.to_string());
            }
        }
        _ => {}
    }
}

/// The error for a request that no backend answered.
pub(super) fn final_error(model: &str, a: &Attempts, zone_blocked: bool) -> ApiError {
    let tried = a.count;
    if tried == 0 {
        if zone_blocked {
            return ApiError::ZoneUnavailable(format!(
                "no backend for `{model}` is available in this zone, and long requests do not cross zones; \
                 retry later or cap max_tokens to make the request short"
            ));
        }
        return ApiError::NoBackend {
            message: format!("no healthy backend for model `{model}` (0 tried)"),
        };
    }
    let budget = if a.budget_exhausted {
        "; retry budget exhausted"
    } else {
        ""
    };
    let last = a
        .failures
        .last()
        .map(|(b, e)| format!("; last: {b}: {e}"))
        .unwrap_or_default();
    let message = format!("all {tried} tried backend(s) failed for model `{model}`{budget}{last}");
    if a.failures
        .iter()
        .all(|(_, e)| matches!(e, AttemptError::Busy(_)))
    {
        let wait = a
            .failures
            .iter()
            .filter_map(|(_, e)| match e {
                AttemptError::Busy(w) => *w,
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(1));
        return ApiError::AllBusy {
            message,
            retry_after_s: wait.as_secs().max(1),
        };
    }
    if a.failures
        .iter()
        .all(|(_, e)| matches!(e, AttemptError::FirstByteTimeout(_)))
    {
        return ApiError::UpstreamTimeout { message };
    }
    ApiError::UpstreamFailed { message }
}

fn upstream_uri(backend: &Backend, client_uri: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(backend.scheme.clone());
    parts.authority = Some(backend.authority.clone());
    parts.path_and_query = client_uri.path_and_query().cloned();
    // Scheme, authority and path each came from a valid URI.
    Uri::from_parts(parts).unwrap_or_else(|_| client_uri.clone())
}

/// The body for this backend: untouched, unless the model it must name
/// differs from the one the client asked for (the backend's own name for
/// it, or a fallback model).
fn rewrite_model(body: &Bytes, requested: &str, backend: &Backend, logical: &str) -> Bytes {
    let target = backend.physical_model(logical).unwrap_or(logical);
    if target == requested {
        return body.clone();
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut obj) => {
            obj.insert("model".into(), target.into());
            serde_json::to_vec(&obj)
                .map(Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

/// Cross-zone fallback targets in preference order: the configured
/// `[zones.<z>] fallback_order` first, then the others by how much of their
/// pool for this model can take traffic now (the healthiest first).
fn order_fallbacks(
    gw: &Gateway,
    model: &ModelRoute,
    effective: &ZoneId,
    mut zones: Vec<ZoneId>,
) -> Vec<ZoneId> {
    let preferred = gw.cfg.fallback_order.get(effective);
    let now = now_ms();
    let rank = |z: &ZoneId| {
        let configured = preferred
            .and_then(|p| p.iter().position(|x| x == z))
            .unwrap_or(usize::MAX);
        let usable = model.pool(z).map_or(0.0, |p| p.usable_share(now));
        (configured, std::cmp::Reverse((usable * 1000.0) as u64))
    };
    zones.sort_by_key(|z| rank(z));
    zones
}
