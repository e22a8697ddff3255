//! The respond stage: the committed attempt becomes the client's response
//! (routing headers, the session pin, the body relayed through), and its
//! end becomes metrics and the access line.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderName};
use opentelemetry::KeyValue;
use zonegate_net::http1::{is_header_text, put_header, put_number, written, Answer, HeadLines};

use super::attempts::Winner;
use super::chain::Link;
use super::continuation::Continuer;
use super::{pin, RequestFacts};
use crate::clock::now_ms;
use crate::dataplane::backend::{Backend, InFlight};
use crate::dataplane::forward::{self, names, Committed};
use crate::dataplane::quota::Admission;
use crate::dataplane::relay::{self, RelayHooks, RelayOptions, Resumed, StreamEnd};
use crate::dataplane::request::RequestClass;
use crate::dataplane::routing::PoolGuard;
use crate::dataplane::sse::{self, Transcript, Usage};
use crate::node::gateway::Gateway;
use crate::telemetry::traces::{self, keys};

/// At most this many continuations per request.
const MAX_CONTINUATIONS: u32 = 2;

/// The first byte is in: record the attempt's success, count fallbacks,
/// pin the session, and describe the route for the response headers.
/// `now`: [`now_ms`] when the first chunk arrived (`Committed::arrived`).
/// The winner's backend, answer and guards move into what is returned (a
/// reference count taken and dropped per request otherwise).
fn served(
    gw: &Gateway,
    req: RequestFacts,
    w: Winner<'_>,
    attempts: u32,
    now: u64,
) -> (Served, Committed, (InFlight, PoolGuard)) {
    let (model, backend, committed) = (w.model, w.backend, w.committed);
    backend.record_success(committed.first_byte, now);
    if let Some(wait) = committed.cool_for {
        // The provider's allowance is used up: the next requests go to
        // the model's other backends until its reset.
        backend.cool_down(now, wait);
    }
    let m = &gw.metrics;
    let handles = w.pool.handles(w.index, &model.cfg.name, m);
    handles
        .first_byte
        .observe(committed.first_byte.as_secs_f64());
    handles.ok.inc();
    let class = req.class.as_str();
    // The usual route is the pick alone: a static string, no allocation.
    let mut route = Cow::Borrowed(w.reason.as_str());
    if w.cross_zone {
        route.to_mut().push_str(", fallback:cross-zone");
        m.fallbacks.with_label_values(&["cross_zone", class]).inc();
    }
    if w.link != Link::Primary {
        route.to_mut().push_str(", ");
        route.to_mut().push_str(w.link.as_str());
        m.fallbacks
            .with_label_values(&[w.link.metric_kind(), class])
            .inc();
    }
    if let Some(asked) = &req.requested {
        // The usual answer, by the model asked for, has its handle.
        if w.link == Link::Primary && **asked == *model.cfg.name {
            model
                .handles(m, &req.cfg.tenants)
                .answered_as_asked(asked, m)
                .inc();
        } else {
            m.model_answers
                .with_label_values(&[asked, answer_link(w.link)])
                .inc();
        }
    }
    if let Some(rule) = &req.rule {
        route = Cow::Owned(format!("rule:{rule}, {route}"));
    }
    if attempts > 1 {
        route
            .to_mut()
            .push_str(&format!(", retry:{}", attempts - 1));
    }
    if let Some(span) = &req.trace {
        let mut attributes = vec![
            KeyValue::new(keys::ROUTE, route.to_string()),
            KeyValue::new(keys::DECISION_VERSION, traces::int(req.decision_version)),
            KeyValue::new(keys::CONFIG_VERSION, traces::int(req.cfg.config_version)),
        ];
        if let Some(rule) = &req.rule {
            attributes.push(KeyValue::new(keys::RULE, Arc::clone(rule)));
        }
        span.set(attributes);
    }
    // A session is pinned to its home zone: the zone that served it first,
    // never the zone a short request crossed to (that would lose the home
    // zone's prefix caches for the pin's lifetime).
    let pin_token = req
        .session
        .filter(|_| req.cfg.affinity.zone_pin)
        .map(|s| pin(gw, &req.tenant, s, &req.home));
    let served = Served {
        pin_token,
        tenant: req.tenant,
        model: Arc::clone(&model.name),
        model_value: model.name_value.clone(),
        backend,
        route,
        decision_version: req.decision_version,
        request_id: req.request_id,
        class: req.class,
        attempts,
        idle: model.cfg.timeouts.idle,
        deadline: req.deadline,
        trace: req.trace,
    };
    (served, committed, w.guards)
}

/// The `link` label of `zonegate_model_answers_total`.
fn answer_link(link: Link) -> &'static str {
    match link {
        Link::Primary => "primary",
        Link::Fallback => "fallback",
        Link::Floor => "floor",
        Link::ContextFallback => "context",
        Link::Budget => "budget",
    }
}

/// Who served a request and how; becomes headers, metrics and the access line.
struct Served {
    pin_token: Option<String>,
    tenant: Arc<str>,
    model: Arc<str>,
    model_value: Option<http::HeaderValue>,
    backend: Arc<Backend>,
    route: Cow<'static, str>,
    decision_version: u64,
    request_id: super::RequestId,
    class: RequestClass,
    attempts: u32,
    idle: Duration,
    deadline: tokio::time::Instant,
    /// The request's span, ended with the answer.
    trace: Option<traces::Span>,
}

/// The respond stage: the committed response with zonegate's headers, its
/// body relayed through; metrics and the access line when it ends.
pub(super) fn respond(
    gw: &Arc<Gateway>,
    req: RequestFacts,
    winner: Winner<'_>,
    started: Instant,
    attempts: u32,
    continuer: Option<Continuer>,
    admission: Admission,
) -> Answer {
    let model_handles = winner.model.handles(&gw.metrics, &req.cfg.tenants);
    let tenant = model_handles.tenant(
        req.tenant_index,
        &req.cfg.tenants,
        &winner.model.cfg.name,
        &gw.metrics,
    );
    let ok = tenant.map(|t| &t.ok);
    let tokens = tenant.map(|t| &t.tokens);
    let config_version = req.cfg.config_version;
    // The clock as the attempt read it when the first chunk was in: the
    // stage itself runs within microseconds of it.
    let arrived = winner.committed.arrived;
    let ttft = arrived.saturating_duration_since(started);
    let (ctx, mut committed, guards) =
        served(gw, req, winner, attempts, crate::clock::ms_at(arrived));
    let status = committed.status;
    let sse = committed.lines.event_stream;
    // The backend's headers (`upstream::wire` left out the hop-by-hop
    // ones), then zonegate's, as lines: no header map is built per answer.
    // Only a limited tenant's rate-limit headers go in a map (none
    // allocated otherwise); they replace the backend's.
    let mut headers = HeaderMap::new();
    admission.write_headers(&mut headers);
    let backend_lines = std::mem::take(&mut committed.lines);
    let dated = backend_lines.dated;
    let lines = written(|lines| {
        put_backend_lines(lines, &backend_lines, &headers);
        put_version(lines, &names::DECISION_VERSION, ctx.decision_version);
        put_version(lines, &names::CONFIG_VERSION, config_version);
        let mut put =
            |name: &HeaderName, value: &[u8]| put_header(lines, name.as_str().as_bytes(), value);
        if let Some(v) = &ctx.backend.name_value {
            put(&names::BACKEND, v.as_bytes());
        }
        if let Some(v) = &ctx.backend.zone_value {
            put(&names::ZONE, v.as_bytes());
        }
        if is_header_text(ctx.route.as_bytes()) {
            put(&names::ROUTE, ctx.route.as_bytes());
        }
        if let Some(v) = &ctx.model_value {
            put(&names::MODEL, v.as_bytes());
        }
        put(&names::REQUEST_ID, ctx.request_id.as_bytes());
        if let Some(token) = ctx
            .pin_token
            .as_deref()
            .filter(|t| is_header_text(t.as_bytes()))
        {
            put(&names::PIN, token.as_bytes());
        }
    });
    drop(backend_lines);
    if sse {
        model_handles.ttft.observe(ttft.as_secs_f64());
    }
    let head = HeadLines {
        lines,
        dated,
        event_stream: sse,
    };
    if let Some(body) = relay::whole(&mut committed, sse) {
        // Ended here: no relay, no hooks (and none of their handles cloned).
        let mut admission = admission;
        let ending = Ending {
            gw,
            ok,
            duration: &model_handles.duration,
            tokens,
            ctx: &ctx,
            current: &ctx.backend,
            answered_by: &ctx.model,
            // It ended as it arrived.
            took: ttft,
            ttft,
            status,
            earlier: &[],
        };
        let delivered = body.len() as u64;
        ending.report(
            &mut admission,
            StreamEnd::Complete,
            0,
            committed.usage.or_else(|| sse::body_usage(&body)),
            delivered,
        );
        drop((admission, guards));
        return Answer {
            status,
            headers,
            lines: head,
            body: axum::body::Body::from(body),
        };
    }
    let opts = RelayOptions {
        sse,
        continuable: sse && status.is_success() && continuer.is_some(),
        idle: ctx.idle,
        deadline: ctx.deadline,
        max_continuations: MAX_CONTINUATIONS,
    };
    let hooks = Hooks {
        gw: Arc::clone(gw),
        ok: ok.cloned(),
        duration: model_handles.duration.clone(),
        tokens: tokens.cloned(),
        admission,
        current: Arc::clone(&ctx.backend),
        answered_by: ctx.model.clone(),
        ttft,
        ctx,
        started,
        status,
        guards,
        continuer,
        parts: crate::dataplane::cost::Parts::new(),
    };
    Answer {
        status,
        headers,
        lines: head,
        body: relay::body(committed, opts, hooks),
    }
}

/// The backend's header lines, but those named in `own` (the answer's
/// map: a limited tenant's rate-limit headers, which replace a backend's).
fn put_backend_lines(out: &mut Vec<u8>, backend: &HeadLines, own: &HeaderMap) {
    if own.is_empty() {
        out.extend_from_slice(&backend.lines);
        return;
    }
    for (name, value) in backend.iter() {
        if std::str::from_utf8(name).map_or(true, |n| !own.contains_key(n)) {
            put_header(out, name, value);
        }
    }
}

/// `name: version`, a number written without formatting machinery.
fn put_version(lines: &mut Vec<u8>, name: &HeaderName, version: u64) {
    lines.extend_from_slice(name.as_str().as_bytes());
    lines.extend_from_slice(b": ");
    put_number(lines, version, 10);
    lines.extend_from_slice(b"\r\n");
}

/// The request's side of the relay: passive signals of the backend that
/// is streaming, continuations, and the final metrics and access line.
struct Hooks {
    gw: Arc<Gateway>,
    /// This tenant's and model's `requests_total{outcome="ok"}` and the
    /// model's duration histogram, looked up once per route table.
    ok: Option<prometheus::IntCounter>,
    duration: prometheus::Histogram,
    /// The tenant's prompt and completion token counters for this model.
    tokens: Option<(prometheus::IntCounter, prometheus::IntCounter)>,
    /// The quota admission: settled from the usage at the end, released
    /// (concurrency, capacity units) when the relay drops the hooks.
    admission: Admission,
    ctx: Served,
    /// The backend streaming now (it changes with a continuation).
    current: Arc<Backend>,
    /// The model streaming now.
    answered_by: Arc<str>,
    started: Instant,
    /// From arrival to the first body chunk from the backend (handed to
    /// the client within microseconds).
    ttft: Duration,
    status: http::StatusCode,
    guards: (InFlight, PoolGuard),
    continuer: Option<Continuer>,
    /// The parts of a continued answer before the current one, each with
    /// its backend's price (`dataplane::cost`).
    parts: crate::dataplane::cost::Parts,
}

impl RelayHooks for Hooks {
    fn failed(&mut self, why: &'static str) {
        let b = &self.current;
        self.gw
            .metrics
            .stream_aborts
            .with_label_values(&[&*self.answered_by, b.name.as_str(), why])
            .inc();
        // A restart that regenerated different text is not a broken backend.
        if why != "continuation_mismatch" {
            crate::health::passive_failure(&self.gw, b, why, now_ms());
        }
    }

    fn resume<'a>(
        &'a mut self,
        delivered: &'a Transcript,
        why: &'static str,
    ) -> BoxFuture<'a, Option<Resumed>> {
        Box::pin(async move {
            let continuer = self.continuer.as_mut()?;
            let metric = &self.gw.metrics.stream_continuations;
            match continuer.resume(delivered, why).await {
                Some(next) => {
                    metric
                        .with_label_values(&[&*self.ctx.model, "continued"])
                        .inc();
                    // The part that broke off, priced by its backend.
                    let before: u64 = self.parts.iter().map(|p| p.output).sum();
                    self.parts.push(crate::dataplane::cost::Part {
                        output: delivered.deltas.saturating_sub(before),
                        price: self
                            .gw
                            .cfg()
                            .costs
                            .price(&self.current.name, &self.answered_by),
                    });
                    self.current = next.backend;
                    self.answered_by = next.resumed.model.as_str().into();
                    self.guards = next.guards;
                    Some(next.resumed)
                }
                None => {
                    metric
                        .with_label_values(&[&*self.ctx.model, "unavailable"])
                        .inc();
                    None
                }
            }
        })
    }

    fn end(&mut self, end: StreamEnd, continuations: u32, usage: Option<Usage>, delivered: u64) {
        let ending = Ending {
            gw: &self.gw,
            ok: self.ok.as_ref(),
            duration: &self.duration,
            tokens: self.tokens.as_ref(),
            ctx: &self.ctx,
            current: &self.current,
            answered_by: &self.answered_by,
            took: self.started.elapsed(),
            ttft: self.ttft,
            status: self.status,
            earlier: &self.parts,
        };
        ending.report(&mut self.admission, end, continuations, usage, delivered);
    }
}

/// What reporting an answer's end needs: the request's handles and who
/// answered it, borrowed (from the hooks, or from the respond stage for
/// an answer that came whole).
struct Ending<'a> {
    gw: &'a Gateway,
    ok: Option<&'a prometheus::IntCounter>,
    duration: &'a prometheus::Histogram,
    tokens: Option<&'a (prometheus::IntCounter, prometheus::IntCounter)>,
    ctx: &'a Served,
    current: &'a Backend,
    answered_by: &'a str,
    /// From arrival to the end.
    took: Duration,
    ttft: Duration,
    status: http::StatusCode,
    /// The parts of a continued answer before the last.
    earlier: &'a [crate::dataplane::cost::Part],
}

impl Ending<'_> {
    /// What the answer cost (`dataplane::cost`): settled against the
    /// tenant's budget, counted in `zonegate_spend_total` and this node's
    /// spend ledger. An error answer without `usage` costs nothing.
    fn spend(&self, admission: &mut Admission, usage: Option<Usage>, delivered: u64) {
        let cost = if usage.is_none() && !self.status.is_success() {
            0
        } else {
            let price = self
                .gw
                .cfg()
                .costs
                .price(&self.current.name, self.answered_by);
            crate::dataplane::cost::answer_cost(
                usage,
                admission.estimate(),
                delivered,
                self.earlier,
                price,
            )
        };
        if let Some(hold) = admission.budget.as_mut() {
            hold.settle(cost);
        }
        if cost > 0 {
            self.gw
                .metrics
                .spend
                .with_label_values(&[
                    &self.ctx.tenant,
                    self.answered_by,
                    self.current.zone.as_str(),
                ])
                .inc_by(crate::dataplane::cost::units(cost));
            self.gw.spend.record(
                &self.ctx.tenant,
                self.answered_by,
                cost,
                crate::clock::unix_ms(),
            );
        }
    }

    /// The end, once: the tenant's tokens and quota settled from the
    /// usage (else from the bytes delivered), the outcome counted, the
    /// duration observed, the access line.
    fn report(
        &self,
        admission: &mut Admission,
        end: StreamEnd,
        continuations: u32,
        usage: Option<Usage>,
        delivered: u64,
    ) {
        if let (Some(u), Some((prompt, completion))) = (usage, self.tokens) {
            prompt.inc_by(u.prompt_tokens);
            completion.inc_by(u.completion_tokens);
        }
        self.spend(admission, usage, delivered);
        admission.finish(
            usage.map(|u| u.prompt_tokens.saturating_add(u.completion_tokens)),
            delivered,
        );
        let (gw, ctx) = (self.gw, self.ctx);
        let outcome = match &end {
            StreamEnd::Complete if self.status.is_success() => "ok",
            StreamEnd::Complete => "client_error",
            StreamEnd::ClientGone => "client_gone",
            StreamEnd::Aborted(_) => "stream_aborted",
        };
        match (self.ok, outcome) {
            (Some(ok), "ok") => ok.inc(),
            _ => gw
                .metrics
                .requests
                .with_label_values(&[&*ctx.tenant, &*ctx.model, outcome])
                .inc(),
        }
        self.duration.observe(self.took.as_secs_f64());
        if let Some(span) = &ctx.trace {
            self.end_span(span, outcome, usage);
        }
        tracing::info!(
            target: "zonegate::access",
            request_id = %ctx.request_id,
            tenant = %ctx.tenant,
            model = %ctx.model,
            answered_by = %self.answered_by,
            backend = %self.current.name,
            zone = %self.current.zone,
            route = %ctx.route,
            class = ctx.class.as_str(),
            status = self.status.as_u16(),
            outcome,
            attempts = ctx.attempts,
            continuations,
            ttft_ms = self.ttft.as_millis() as u64,
            ms = self.took.as_millis() as u64,
            trace_id = ctx.trace.as_ref().map(|t| tracing::field::display(t.trace_id())),
            "request"
        );
    }

    /// The request's span ends with who answered, the usage and the
    /// outcome (an error status unless `ok`).
    fn end_span(&self, span: &traces::Span, outcome: &'static str, usage: Option<Usage>) {
        let mut attributes = vec![
            KeyValue::new(keys::RESPONSE_MODEL, self.answered_by.to_owned()),
            KeyValue::new(keys::PROVIDER, forward::provider_name(self.current)),
            KeyValue::new(keys::BACKEND, self.current.name.clone()),
            KeyValue::new(keys::ZONE, self.current.zone.as_str().to_owned()),
            KeyValue::new(keys::STATUS_CODE, i64::from(self.status.as_u16())),
            KeyValue::new(keys::OUTCOME, outcome),
        ];
        if let Some(u) = usage {
            attributes.push(KeyValue::new(
                keys::INPUT_TOKENS,
                traces::int(u.prompt_tokens),
            ));
            attributes.push(KeyValue::new(
                keys::OUTPUT_TOKENS,
                traces::int(u.completion_tokens),
            ));
        }
        span.set(attributes);
        if outcome != "ok" {
            span.fail(outcome);
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_limited_tenants_rate_limit_headers_replace_the_backends() {
        let backend = HeadLines {
            lines: Bytes::from_static(
                b"content-type: application/json\r\nX-RateLimit-Remaining-Requests: 99\r\nserver: vllm\r\n",
            ),
            ..HeadLines::default()
        };
        let mut out = Vec::new();
        put_backend_lines(&mut out, &backend, &HeaderMap::new());
        assert_eq!(
            out, backend.lines,
            "nothing of zonegate's: passed as they are"
        );

        let mut own = HeaderMap::new();
        own.insert(
            "x-ratelimit-remaining-requests",
            http::HeaderValue::from_static("7"),
        );
        let mut out = Vec::new();
        put_backend_lines(&mut out, &backend, &own);
        assert_eq!(out, b"content-type: application/json\r\nserver: vllm\r\n");
    }
}
