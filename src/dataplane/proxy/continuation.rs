//! Continuing a stream that broke after bytes reached the client: the same
//! request goes to another backend of the same model, else down the
//! fallback chain, as an assistant prefill of the text delivered so far
//! (`continuation = "prefill"`) or as the original request whose
//! regenerated text must begin with exactly what was delivered
//! (`"restart"`). The relay splices the answer in (`sse::Splice`).
//!
//! Only plain-text chat and completion streams (one choice, no tools, no
//! log probabilities) are continued; the rest end with the error event.

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use serde_json::{json, Map, Value};

use super::attempts::{self, Attempts, Outgoing};
use super::chain::{Chain, Link};
use super::RequestFacts;
use crate::clock::ms_at;
use crate::config::Continuation;
use crate::dataplane::backend::{Backend, InFlight};
use crate::dataplane::relay::Resumed;
use crate::dataplane::request::ClientHeaders;
use crate::dataplane::request::RequestMeta;
use crate::dataplane::routing::{PoolGuard, Routes};
use crate::dataplane::sse::{Resumption, Transcript};
use crate::node::gateway::Gateway;
use crate::telemetry::traces::keys;

/// Everything needed to resend a request after its response began; built
/// only for streams that may be continued.
pub(super) struct Continuer {
    gw: Arc<Gateway>,
    routes: Arc<Routes>,
    facts: RequestFacts,
    target: PathAndQuery,
    headers: ClientHeaders,
    body: Bytes,
    /// The model the client named.
    requested: String,
    /// The request's chain, by model name.
    chain: Vec<(String, Link)>,
    chat: bool,
    /// Attempts so far: a continuation never goes back to a backend that
    /// was tried, and the retry budget bounds it.
    attempts: Attempts,
}

/// A continuation that started streaming.
pub(super) struct Next {
    pub resumed: Resumed,
    pub backend: Arc<Backend>,
    pub guards: (InFlight, PoolGuard),
}

impl Continuer {
    /// A continuer when the request is a continuable stream: chat or
    /// completions, streaming, plain text, and its model allows it.
    pub(super) fn for_stream(
        gw: &Arc<Gateway>,
        out: &Outgoing<'_>,
        meta: &RequestMeta,
        chain: &Chain<'_>,
        facts: &RequestFacts,
        attempts: Attempts,
    ) -> Option<Self> {
        let path = out.target.path();
        let chat = path == "/v1/chat/completions";
        let primary = chain.first()?.0;
        let eligible = meta.stream
            && meta.plain_text
            && (chat || path == "/v1/completions")
            && primary.cfg.continuation != Continuation::None;
        eligible.then(|| Continuer {
            gw: Arc::clone(gw),
            routes: gw.routes.load_full(),
            facts: facts.clone(),
            target: out.target.clone(),
            headers: out.headers.clone(),
            body: out.body.clone(),
            requested: out.model.to_owned(),
            chain: chain
                .iter()
                .map(|(m, link)| (m.cfg.name.clone(), *link))
                .collect(),
            chat,
            attempts,
        })
    }

    /// The next backend to carry the answer on, in chain order (the same
    /// model's other backends first), each model resumed its own way; a
    /// backend that refuses the resumed request (a prefill it does not
    /// support answers 400) is passed over: the client never sees that.
    pub(super) async fn resume(&mut self, delivered: &Transcript, why: &str) -> Option<Next> {
        // A traced request's continuation is a span of its own, the
        // parent of its attempts.
        let Some(request) = self.facts.trace.clone() else {
            return self.resume_on_chain(delivered, why).await;
        };
        let span = request.child(
            "continuation",
            SpanKind::Internal,
            vec![KeyValue::new(
                "zonegate.continuation.reason",
                why.to_owned(),
            )],
        );
        self.facts.trace = Some(span.clone());
        let next = self.resume_on_chain(delivered, why).await;
        self.facts.trace = Some(request);
        match &next {
            Some(n) => span.set([
                KeyValue::new(keys::BACKEND, n.backend.name.clone()),
                KeyValue::new(keys::RESPONSE_MODEL, n.resumed.model.clone()),
            ]),
            None => span.fail("unavailable"),
        }
        span.end();
        next
    }

    async fn resume_on_chain(&mut self, delivered: &Transcript, why: &str) -> Option<Next> {
        let routes = Arc::clone(&self.routes);
        for (name, link) in &self.chain {
            let Some(model) = routes.model(name) else {
                continue;
            };
            let (how, body) = match model.cfg.continuation {
                Continuation::None => continue,
                Continuation::Restart => (Resumption::Restart, self.body.clone()),
                Continuation::Prefill => match prefill(&self.body, delivered, self.chat) {
                    Some(body) => (Resumption::Prefill, body),
                    None => continue,
                },
            };
            let out = Outgoing {
                target: &self.target,
                headers: &self.headers,
                body: &body,
                model: &self.requested,
            };
            loop {
                let one = smallvec::smallvec![(model, *link)];
                let chain = attempts::forward_chain(
                    &self.gw,
                    &routes,
                    &self.facts,
                    one,
                    &out,
                    &mut self.attempts,
                    None,
                )
                .await;
                let Ok(w) = chain else { break };
                let ok = w.committed.status.is_success() && w.committed.lines.event_stream;
                let outcome = if ok { "ok" } else { "continuation_refused" };
                self.gw
                    .metrics
                    .forward_attempts
                    .with_label_values(&[name, &w.backend.name, w.backend.zone.as_str(), outcome])
                    .inc();
                if !ok {
                    tracing::debug!(
                        backend = %w.backend.name,
                        status = w.committed.status.as_u16(),
                        "a backend refused to continue the stream"
                    );
                    continue;
                }
                w.backend
                    .record_success(w.committed.first_byte, ms_at(w.committed.arrived));
                tracing::info!(
                    request_id = %self.facts.request_id,
                    backend = %w.backend.name,
                    model = %name,
                    after_chars = delivered.text.chars().count(),
                    why,
                    "stream continued"
                );
                return Some(Next {
                    resumed: Resumed {
                        committed: w.committed,
                        how,
                        backend: w.backend.name.clone(),
                        model: name.clone(),
                    },
                    backend: w.backend,
                    guards: w.guards,
                });
            }
        }
        None
    }
}

/// The request resent as a continuation of `delivered`: chat gets the text
/// as a final assistant message to continue (vLLM's
/// `continue_final_message`), completions get it appended to the prompt;
/// the output cap shrinks by what was delivered. `None` when the body has
/// no shape to extend.
fn prefill(original: &Bytes, delivered: &Transcript, chat: bool) -> Option<Bytes> {
    let mut v: Map<String, Value> = serde_json::from_slice(original).ok()?;
    if chat {
        let messages = v.get_mut("messages")?.as_array_mut()?;
        messages.push(json!({"role": "assistant", "content": delivered.text}));
        v.insert("continue_final_message".into(), true.into());
        v.insert("add_generation_prompt".into(), false.into());
    } else {
        let prompt = v.get_mut("prompt")?;
        let extended = format!("{}{}", prompt.as_str()?, delivered.text);
        *prompt = extended.into();
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = v.get(key).and_then(Value::as_u64) {
            v.insert(key.into(), n.saturating_sub(delivered.deltas).max(1).into());
        }
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered() -> Transcript {
        Transcript {
            text: "tok0 tok1 ".into(),
            deltas: 2,
            ..Transcript::new()
        }
    }

    #[test]
    fn a_chat_prefill_appends_the_delivered_text_as_the_assistant_turn() {
        let body = Bytes::from(
            r#"{"model":"m","stream":true,"max_tokens":60,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let v: Value =
            serde_json::from_slice(&prefill(&body, &delivered(), true).unwrap()).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "tok0 tok1 "})
        );
        assert_eq!(v["continue_final_message"], true);
        assert_eq!(v["max_tokens"], 58);
    }

    #[test]
    fn a_completion_prefill_extends_the_prompt() {
        let body = Bytes::from(r#"{"model":"m","prompt":"say: ","max_tokens":5}"#);
        let v: Value =
            serde_json::from_slice(&prefill(&body, &delivered(), false).unwrap()).unwrap();
        assert_eq!(v["prompt"], "say: tok0 tok1 ");
        assert_eq!(v["max_tokens"], 3);
        let odd = Bytes::from(r#"{"model":"m","prompt":["a","b"]}"#);
        assert!(prefill(&odd, &delivered(), false).is_none());
    }
}
