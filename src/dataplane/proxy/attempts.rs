//! The pick and forward stages: the chain's models in order, each in its
//! effective zone and then its allowed fallback zones, one backend at a
//! time, until one commits (its first body byte arrived) or the attempts,
//! the retry budget, the deadline or the candidates run out.
//!
//! Every backend of a model comes before the next model. A model whose
//! only backend failed with a 5xx, reset or connect timeout gets it once
//! more after a short jittered backoff (a refused connect or a first token
//! that never came sends the request on to the next candidate at once); a
//! 429 with a short `Retry-After` is waited out when no other backend of
//! the model is free. An ejected or unreachable (connect refused) backend
//! of a model that has nothing better gets one half-open trial at a time.
//! A `context_length_exceeded` answer moves the request to the model's
//! `context_fallback` models, never back to the same model.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use opentelemetry::KeyValue;
use smallvec::SmallVec;
use tokio::time::Instant;
use zonegate_cluster::ZoneId;

use super::chain::{Chain, Link};
use super::RequestFacts;
use crate::clock::{ms_at, now_ms};
use crate::config::Balance;
use crate::dataplane::backend::{Backend, InFlight};
use crate::dataplane::error::ApiError;
use crate::dataplane::forward::{self, AttemptError, AttemptLimits, Committed};
use crate::dataplane::observe::ZoneResult;
use crate::dataplane::provider;
use crate::dataplane::request::ClientHeaders;
use crate::dataplane::retry::Retrying;
use crate::dataplane::routing::{plan_zones, ModelRoute, PickReason, PoolGuard, Routes, ZonePool};
use crate::dataplane::upstream::Target;
use crate::node::gateway::Gateway;
use crate::telemetry::traces::keys;

/// The client's request as every attempt resends it.
pub(super) struct Outgoing<'a> {
    /// The client's path and query.
    pub target: &'a PathAndQuery,
    /// The client's headers (those for the backend:
    /// `forward::put_backend_headers`).
    pub headers: &'a ClientHeaders,
    pub body: &'a Bytes,
    /// The model the body names.
    pub model: &'a str,
}

/// The attempt that committed.
pub(super) struct Winner<'a> {
    pub committed: Committed,
    pub model: &'a ModelRoute,
    pub pool: &'a ZonePool,
    /// The backend's place in `pool`.
    pub index: usize,
    pub backend: Arc<Backend>,
    pub reason: PickReason,
    pub cross_zone: bool,
    pub link: Link,
    pub guards: (InFlight, PoolGuard),
}

/// No attempt committed.
pub(super) struct GaveUp {
    /// A zone this request's class may not cross to had a usable backend.
    pub withheld_zones: bool,
}

/// What one request's attempts have seen so far (continuations included).
#[derive(Default)]
pub(super) struct Attempts {
    /// Identities (addresses) of the backends already tried (inline up
    /// to a few: most requests try one).
    pub tried: SmallVec<[usize; 4]>,
    pub count: u32,
    pub failures: Vec<(String, AttemptError)>,
    pub budget_exhausted: bool,
    /// The effective zone's result went into the zone reports already.
    zone_recorded: bool,
}

/// A backend chosen for the next attempt.
struct Pick {
    backend: Arc<Backend>,
    /// Its place in its pool.
    index: usize,
    reason: PickReason,
    /// A half-open trial of an ejected backend.
    trial: bool,
    /// When it was picked: the attempt's start.
    at: std::time::Instant,
}

/// Where a model may be tried once more after every candidate failed.
struct Revisit {
    backend: Arc<Backend>,
    wait: Duration,
}

/// Tries the chain until an attempt commits. Records the effective zone's
/// result for the zone reports either way (once per request).
/// `first_pick_at`: the clock as the stage before read it, for the first
/// pick (the stages follow within a microsecond; a read is ~20 ns); the
/// picks after it read the clock.
pub(super) async fn forward_chain<'a>(
    gw: &Gateway,
    routes: &'a Routes,
    req: &RequestFacts,
    chain: Chain<'a>,
    out: &Outgoing<'_>,
    attempts: &mut Attempts,
    mut first_pick_at: Option<std::time::Instant>,
) -> Result<Winner<'a>, GaveUp> {
    let mut zone_watch = ZoneWatch::default();
    let mut withheld_zones = false;
    let mut queue = chain;
    let mut next = 0;
    while let Some(&(model, link)) = queue.get(next) {
        next += 1;
        let cross_zone_ok = req.cfg.affinity.cross_zone_fallback;
        let plan = plan_zones(&req.home, &req.view, &model.zones, req.class, cross_zone_ok);
        zone_watch.zone.get_or_insert(plan.effective);
        let mut on_model = ModelAttempts::new(req, model);
        let mut revisited = false;
        let mut out_of_context = false;
        loop {
            let order = plan.order(&req.cfg, model);
            for zone in order {
                let Some(pool) = model.pool(zone) else {
                    continue;
                };
                if !pool.chat_only.is_empty()
                    && provider::Endpoint::of(out.target.path()) != provider::Endpoint::Chat
                {
                    // The route table knows: no embeddings or legacy
                    // completions from a chat-only provider.
                    for b in &pool.chat_only {
                        if !attempts.tried.contains(b) {
                            attempts.tried.push(*b);
                        }
                    }
                }
                while let Some(Pick {
                    backend,
                    index,
                    reason,
                    trial,
                    at,
                }) = on_model.pick(
                    pool,
                    attempts,
                    first_pick_at.take().unwrap_or_else(std::time::Instant::now),
                ) {
                    // A retry holds its place in the budget while it runs.
                    let _retrying = if attempts.count > 0 {
                        match take_retry(gw, routes, model) {
                            Some(r) => Some(r),
                            None => {
                                attempts.budget_exhausted = true;
                                zone_watch.finish(gw, None, attempts);
                                return Err(GaveUp {
                                    withheld_zones: false,
                                });
                            }
                        }
                    } else {
                        None
                    };
                    attempts.tried.push(Arc::as_ptr(&backend) as usize);
                    attempts.count += 1;
                    let guards = (backend.start_request(), pool.enter());
                    let result = attempt(req, out, model, &backend, at).await;
                    if trial {
                        crate::health::trial_ended(gw, &backend, result.is_ok(), now_ms());
                    }
                    if result
                        .as_ref()
                        .map_or_else(AttemptError::backend_answered, |_| true)
                    {
                        crate::health::reached(&backend);
                    }
                    match result {
                        Ok(committed) => {
                            zone_watch.finish(gw, Some(&backend.zone), attempts);
                            return Ok(Winner {
                                committed,
                                model,
                                pool,
                                index,
                                backend,
                                reason,
                                cross_zone: zone != plan.effective,
                                link,
                                guards,
                            });
                        }
                        Err(e) => {
                            note_failure(gw, model, &backend, &e, now_ms());
                            if matches!(e, AttemptError::ContextLength(_)) {
                                // Never the same model again: its larger-
                                // context fallbacks (configured, or this 400
                                // would have been committed) replace the
                                // rest of the chain.
                                queue.truncate(next);
                                queue.extend(
                                    model
                                        .cfg
                                        .context_fallback
                                        .iter()
                                        .filter_map(|name| routes.model(name))
                                        .filter(|m| {
                                            crate::dataplane::policy::allows_model(
                                                &req.cfg,
                                                req.tenant_index,
                                                &m.cfg.name,
                                            )
                                        })
                                        .map(|m| (m, Link::ContextFallback)),
                                );
                                out_of_context = true;
                            } else {
                                zone_watch.saw(&backend.zone, &e);
                                on_model.failed(&backend, &e);
                            }
                            attempts.failures.push((backend.name.clone(), e));
                            if out_of_context {
                                break;
                            }
                        }
                    }
                }
                if out_of_context {
                    break;
                }
            }
            if revisited || out_of_context {
                break;
            }
            let Some(revisit) = on_model.revisit(req.deadline) else {
                break;
            };
            tokio::time::sleep(revisit.wait).await;
            let ptr = Arc::as_ptr(&revisit.backend) as usize;
            attempts.tried.retain(|t| *t != ptr);
            on_model.allow_one_more();
            revisited = true;
        }
        withheld_zones |= plan
            .withheld
            .iter()
            .any(|z| model.pool(z).is_some_and(|p| p.has_usable(now_ms())));
    }
    zone_watch.finish(gw, None, attempts);
    Err(GaveUp { withheld_zones })
}

/// One model's share of a request's attempts.
struct ModelAttempts {
    max: u32,
    made: u32,
    balance: Balance,
    session: Option<u64>,
    /// Backends of the model in all its zones.
    backends: usize,
    rng: fastrand::Rng,
    /// The last failure, if it is worth the same backend again.
    same_again: Option<Arc<Backend>>,
    /// The shortest `Retry-After` a backend of the model asked for.
    busy: Option<(Arc<Backend>, Duration)>,
    max_retry_after_wait: Duration,
}

impl ModelAttempts {
    fn new(req: &RequestFacts, model: &ModelRoute) -> Self {
        // A session keeps its backend within its zone by consistent hashing.
        let balance = if req.session.is_some() && req.cfg.affinity.zone_pin {
            Balance::Ring
        } else {
            model.cfg.balance
        };
        Self {
            max: req.cfg.retry.max_attempts,
            made: 0,
            balance,
            session: req.session,
            backends: model.pools.iter().map(|p| p.backends.len()).sum(),
            rng: fastrand::Rng::new(),
            same_again: None,
            busy: None,
            max_retry_after_wait: req.cfg.retry.max_retry_after_wait,
        }
    }

    /// The next backend to try in `pool` at `at`, and whether it is a
    /// half-open trial of an ejected one (only when the pool has nothing
    /// usable left).
    fn pick(
        &mut self,
        pool: &ZonePool,
        attempts: &Attempts,
        at: std::time::Instant,
    ) -> Option<Pick> {
        if self.made >= self.max {
            return None;
        }
        let now = ms_at(at);
        let tried = &attempts.tried;
        let picked = pool
            .pick(self.balance, self.session, now, tried, &mut self.rng)
            .map(|(index, reason)| (index, reason, false))
            .or_else(|| {
                let index = pool.backends.iter().position(|b| {
                    !tried.contains(&(Arc::as_ptr(b) as usize)) && b.claim_trial(now)
                })?;
                Some((index, PickReason::Trial, true))
            });
        let (index, reason, trial) = picked?;
        self.made += 1;
        Some(Pick {
            backend: Arc::clone(&pool.backends[index]),
            index,
            reason,
            trial,
            at,
        })
    }

    fn failed(&mut self, backend: &Arc<Backend>, e: &AttemptError) {
        self.same_again = e.worth_same_backend_retry().then(|| Arc::clone(backend));
        if let AttemptError::Busy(Some(wait)) = e {
            if *wait <= self.max_retry_after_wait
                && self.busy.as_ref().is_none_or(|(_, w)| wait < w)
            {
                self.busy = Some((Arc::clone(backend), *wait));
            }
        }
    }

    /// After every candidate failed: the model's only backend once more
    /// after a short jittered backoff (5xx, reset, a connect that timed
    /// out; not one that was refused, which is certain), or a busy backend
    /// once its short `Retry-After` has passed; either only if it fits the
    /// deadline. Never a backend whose first token did not come in time:
    /// the request goes on to the next candidate instead.
    fn revisit(&mut self, deadline: Instant) -> Option<Revisit> {
        let candidate = match (self.busy.take(), self.same_again.take()) {
            (Some((backend, wait)), _) => Revisit {
                backend,
                // A little past the cooldown, so the pick sees it free.
                wait: wait.saturating_add(Duration::from_millis(20)),
            },
            (None, Some(backend)) if self.backends == 1 && !backend.is_unreachable() => Revisit {
                backend,
                wait: Duration::from_millis(fastrand::u64(100..=500)),
            },
            _ => return None,
        };
        Instant::now()
            .checked_add(candidate.wait)
            .is_some_and(|at| at < deadline)
            .then_some(candidate)
    }

    fn allow_one_more(&mut self) {
        self.made = self.made.min(self.max.saturating_sub(1));
    }
}

/// A retry takes a place in the retry budget for as long as it runs;
/// `None` when the retries running already fill it. The requests in flight
/// it is a share of: those at backends now, and the asking one.
fn take_retry(gw: &Gateway, routes: &Routes, model: &ModelRoute) -> Option<Retrying> {
    let name = [model.cfg.name.as_str()];
    let active = routes.requests_in_flight().saturating_add(1);
    let Some(retrying) = gw.try_retry(active) else {
        gw.metrics
            .retry_budget_exhausted
            .with_label_values(&name)
            .inc();
        return None;
    };
    gw.metrics.retries.with_label_values(&name).inc();
    Some(retrying)
}

/// One attempt on `backend`, with the body and limits it must see; a
/// traced request's attempt is its span's child, and the backend's parent.
async fn attempt(
    req: &RequestFacts,
    out: &Outgoing<'_>,
    model: &ModelRoute,
    backend: &Backend,
    started: std::time::Instant,
) -> Result<Committed, AttemptError> {
    let Some(parent) = &req.trace else {
        return send(req, out, model, backend, started, None).await;
    };
    let span = forward::client_span(parent, out.target.path(), &model.cfg.name, backend);
    let result = send(
        req,
        out,
        model,
        backend,
        started,
        Some(&span.traceparent()[..]),
    )
    .await;
    match &result {
        Ok(c) => {
            span.set([KeyValue::new(
                keys::STATUS_CODE,
                i64::from(c.status.as_u16()),
            )]);
            if !c.status.is_success() {
                span.fail(c.status.as_str().to_owned());
            }
        }
        Err(e) => {
            if let AttemptError::Status(s) | AttemptError::Credentials(s) = e {
                span.set([KeyValue::new(keys::STATUS_CODE, i64::from(s.as_u16()))]);
            }
            span.fail(e.outcome());
        }
    }
    span.end();
    result
}

/// The attempt itself; `traceparent`: the backend's, replacing the
/// client's.
async fn send(
    req: &RequestFacts,
    out: &Outgoing<'_>,
    model: &ModelRoute,
    backend: &Backend,
    started: std::time::Instant,
    traceparent: Option<&[u8]>,
) -> Result<Committed, AttemptError> {
    let payload = rewrite_model(out.body, out.model, backend, &model.cfg.name);
    let call = match &backend.provider {
        None => None,
        Some(p) => {
            let upstream = backend
                .physical_model(&model.cfg.name)
                .unwrap_or(&model.cfg.name);
            match provider::prepare(p, out.target.as_str(), payload.clone(), upstream, out.model) {
                Ok(call) => Some(call),
                Err(refused) => return Ok(forward::refused(refused.body(), started)),
            }
        }
    };
    let t = &model.cfg.timeouts;
    let limits = AttemptLimits {
        first_byte: if req.stream { t.ttft } else { t.generation },
        stream: req.stream,
        deadline: req.deadline,
        detect_context_length: !model.cfg.context_fallback.is_empty(),
        started,
    };
    let target = Target {
        scheme: &backend.scheme,
        authority: &backend.authority,
        connect_timeout: t.connect,
        tls: &backend.tls,
    };
    forward::attempt(
        target,
        out.target.as_str(),
        out.headers,
        backend.host_value.as_ref(),
        req.request_id.as_bytes(),
        payload,
        limits,
        call.as_ref(),
        traceparent,
    )
    .await
}

/// How a request's effective zone did, for the zone observations the
/// control plane scores (see `observe`).
#[derive(Default)]
struct ZoneWatch<'v> {
    zone: Option<&'v ZoneId>,
    error: bool,
    busy: bool,
    /// Only answers that say nothing about the zone: long generations, the
    /// request's own deadline or context length.
    neutral: bool,
}

impl ZoneWatch<'_> {
    fn saw(&mut self, zone: &ZoneId, e: &AttemptError) {
        if self.zone != Some(zone) {
            return;
        }
        match e {
            AttemptError::Busy(_) => self.busy = true,
            // A stream's first token that never came: unanswered.
            AttemptError::TtftTimeout(_) => {}
            // A backend's own key says nothing about its zone.
            AttemptError::GenerationTimeout(_)
            | AttemptError::Deadline
            | AttemptError::ContextLength(_)
            | AttemptError::Credentials(_) => self.neutral = true,
            _ => self.error = true,
        }
    }

    /// Records the result once per request; `served_in` is the zone that
    /// answered.
    fn finish(&mut self, gw: &Gateway, served_in: Option<&ZoneId>, attempts: &mut Attempts) {
        let Some(zone) = self.zone.take() else { return };
        if std::mem::replace(&mut attempts.zone_recorded, true) {
            return;
        }
        let result = if served_in == Some(zone) {
            ZoneResult::Served
        } else if self.error {
            ZoneResult::Failed
        } else if self.busy || self.neutral {
            // Busy is not broken, and long work is not failure: such a
            // zone is not scored for this request.
            return;
        } else {
            ZoneResult::Unanswered
        };
        gw.zone_stats.record(zone, result);
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
            backend.cool_down(now, wait.unwrap_or(gw.cfg().retry.default_cooldown))
        }
        AttemptError::Credentials(status) => crate::health::credentials_refused(
            gw,
            backend,
            &format!("the provider answered {status} to its credential"),
            now,
        ),
        AttemptError::Refused(_) => {
            crate::health::refused(backend, now);
            crate::health::passive_failure(gw, backend, &e.to_string(), now);
        }
        e if e.counts_against_health() => {
            crate::health::passive_failure(gw, backend, &e.to_string(), now);
        }
        _ => {}
    }
}

/// The error for a request that no backend answered.
pub(super) fn final_error(model: &str, a: &Attempts, zone_blocked: bool) -> ApiError {
    if let Some((_, AttemptError::ContextLength(body))) = a.failures.last() {
        // No larger-context model answered: the backend's own 400.
        return ApiError::ContextLength(body.clone());
    }
    let tried = a.count;
    if zone_blocked {
        let last = a
            .failures
            .last()
            .map(|(b, e)| format!(" (last attempt: {b}: {e})"))
            .unwrap_or_default();
        return ApiError::ZoneUnavailable(format!(
            "no backend for `{model}` is available in this zone{last}, and long requests do not \
             cross zones; retry later or cap max_tokens to make the request short"
        ));
    }
    if tried == 0 {
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
    if a.failures.iter().all(|(_, e)| {
        matches!(
            e,
            AttemptError::TtftTimeout(_)
                | AttemptError::GenerationTimeout(_)
                | AttemptError::Deadline
        )
    }) {
        return ApiError::UpstreamTimeout { message };
    }
    ApiError::UpstreamFailed { message }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, HealthConfig};
    use http::StatusCode;

    fn lone_backend() -> Arc<Backend> {
        let cfg = BackendConfig {
            name: "only".into(),
            zone: ZoneId::new("az-a"),
            scheme: http::uri::Scheme::HTTP,
            authority: "127.0.0.1:1".parse().expect("authority"),
            models: vec!["m".into()],
            weight: 1,
            health_path: "/health".into(),
            metrics_path: None,
            model_names: Default::default(),
            tls: Default::default(),
            capacity: None,
            provider: None,
            probe_interval: None,
        };
        Arc::new(Backend::new(&cfg, &HealthConfig::default(), 0))
    }

    /// A model with one backend, as `forward_chain` makes it.
    fn one_backend_model() -> ModelAttempts {
        ModelAttempts {
            max: 3,
            made: 1,
            balance: Balance::P2c,
            session: None,
            backends: 1,
            rng: fastrand::Rng::with_seed(1),
            same_again: None,
            busy: None,
            max_retry_after_wait: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_lone_backend_is_tried_again_only_when_another_try_may_help() {
        let second = Duration::from_secs(1);
        // (what failed, in order; whether the backend gets its second try)
        let cases: Vec<(Vec<AttemptError>, bool)> = vec![
            (vec![AttemptError::Reset("reset".into())], true),
            (vec![AttemptError::Status(StatusCode::BAD_GATEWAY)], true),
            (vec![AttemptError::Connect("timed out".into())], true),
            // A first token that never came: on to the next candidate.
            (vec![AttemptError::TtftTimeout(second)], false),
            (vec![AttemptError::GenerationTimeout(second)], false),
            // The last failure decides.
            (
                vec![
                    AttemptError::Reset("reset".into()),
                    AttemptError::TtftTimeout(second),
                ],
                false,
            ),
            // A refused connect is certain: no second try after a backoff.
            (vec![AttemptError::Refused("refused".into())], false),
        ];
        let deadline = Instant::now() + Duration::from_secs(600);
        for (failures, again) in cases {
            let backend = lone_backend();
            let mut m = one_backend_model();
            for e in &failures {
                if matches!(e, AttemptError::Refused(_)) {
                    backend.refused(0); // as `note_failure` marks it
                }
                m.failed(&backend, e);
            }
            assert_eq!(m.revisit(deadline).is_some(), again, "{failures:?}");
        }
    }

    #[test]
    fn a_retry_after_wait_never_overflows_the_clock() {
        let backend = lone_backend();
        let mut m = one_backend_model();
        m.max_retry_after_wait = Duration::MAX;
        m.failed(&backend, &AttemptError::Busy(Some(Duration::MAX)));
        let deadline = Instant::now() + Duration::from_secs(600);
        assert!(m.revisit(deadline).is_none(), "past any deadline");
    }
}
