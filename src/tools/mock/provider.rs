//! The mock's provider formats (`mock-backend --provider openai|azure|
//! anthropic --expect-key K`): the credential each provider expects, in
//! its header and with its error body when wrong; Azure OpenAI's
//! deployment paths and model list; OpenAI's `x-ratelimit-*` headers. The
//! headers of the last inference request are kept for `/mock/stats`, so a
//! test can see what a provider would have seen.

use http::{header, HeaderMap, Method, Response, StatusCode};
use serde_json::json;

use super::{json_resp, openai_error, MockBody};
use crate::config::Provider;

/// Where a provider request goes, in the mock's own (OpenAI) paths.
pub(super) enum Route {
    /// An OpenAI path (as the client sent it, or Azure's mapped to it).
    Openai(String),
    /// A provider's model list (the free probe).
    Models,
    /// Not a provider path: the mock's own handling.
    Pass,
}

/// The mock's path for a provider request; `Err` for a request the
/// provider itself would refuse (Azure without `api-version`).
pub(super) fn route(
    kind: Provider,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Route, Box<Response<MockBody>>> {
    match kind {
        Provider::Openai | Provider::Anthropic => Ok(Route::Pass),
        Provider::Azure => {
            let Some(rest) = path.strip_prefix("/openai/") else {
                return Ok(Route::Pass);
            };
            let versioned = query.unwrap_or("").split('&').any(|p| {
                p.strip_prefix("api-version=")
                    .is_some_and(|v| !v.is_empty())
            });
            if !versioned {
                return Err(Box::new(azure_error(
                    StatusCode::NOT_FOUND,
                    "404",
                    "Resource not found (api-version is required)",
                )));
            }
            if rest == "models" && method == Method::GET {
                return Ok(Route::Models);
            }
            let Some(tail) = rest.strip_prefix("deployments/") else {
                return Err(Box::new(azure_error(
                    StatusCode::NOT_FOUND,
                    "404",
                    "Resource not found",
                )));
            };
            let op = tail.split_once('/').map_or("", |(_, op)| op);
            match op {
                "chat/completions" => Ok(Route::Openai("/v1/chat/completions".into())),
                "completions" => Ok(Route::Openai("/v1/completions".into())),
                "embeddings" => Ok(Route::Openai("/v1/embeddings".into())),
                _ => Err(Box::new(azure_error(
                    StatusCode::NOT_FOUND,
                    "404",
                    "Resource not found",
                ))),
            }
        }
    }
}

/// Whether a path is the provider's (checked for the credential).
pub(super) fn guarded(path: &str) -> bool {
    path.starts_with("/v1/") || path.starts_with("/openai/")
}

/// The provider's answer to a missing or wrong credential, `None` when the
/// request carries `expect`ed key in the provider's header.
pub(super) fn check_key(
    kind: Provider,
    expect: &str,
    headers: &HeaderMap,
) -> Option<Response<MockBody>> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let given = match kind {
        Provider::Openai => text("authorization").and_then(|v| v.strip_prefix("Bearer ")),
        Provider::Azure => text("api-key"),
        Provider::Anthropic => text("x-api-key"),
    };
    if given == Some(expect) {
        return None;
    }
    Some(match kind {
        Provider::Openai => openai_error(
            StatusCode::UNAUTHORIZED,
            "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
            "invalid_api_key",
        ),
        Provider::Azure => azure_error(
            StatusCode::UNAUTHORIZED,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to \
             provide a valid key for an active subscription and use a correct regional API \
             endpoint for your resource.",
        ),
        Provider::Anthropic => json_resp(
            StatusCode::UNAUTHORIZED,
            &json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        ),
    })
}

/// Azure OpenAI's error shape (`code` a string, no `type`).
fn azure_error(status: StatusCode, code: &str, message: &str) -> Response<MockBody> {
    json_resp(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}

/// Azure's model list.
pub(super) fn azure_models(models: &[String]) -> Response<MockBody> {
    let data: Vec<_> = models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "status": "succeeded", "capabilities": {"chat_completion": true}}))
        .collect();
    json_resp(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// OpenAI's rate-limit headers on an answer: `remaining` requests left
/// this minute (the `ratelimit_remaining` fault), reset in a second (20 s
/// once none is left).
pub(super) fn put_rate_limits(resp: &mut Response<MockBody>, remaining: u64) {
    let h = resp.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit-requests", "10000".to_owned()),
        ("x-ratelimit-remaining-requests", remaining.to_string()),
        (
            "x-ratelimit-reset-requests",
            if remaining == 0 { "20s" } else { "1s" }.to_owned(),
        ),
        ("x-ratelimit-limit-tokens", "2000000".to_owned()),
        ("x-ratelimit-remaining-tokens", "1999000".to_owned()),
        ("x-ratelimit-reset-tokens", "30ms".to_owned()),
    ] {
        if let Ok(v) = header::HeaderValue::from_str(&value) {
            h.insert(header::HeaderName::from_static(name), v);
        }
    }
}

/// The tool call an OpenAI-format answer makes when the request names a
/// function in `tool_choice` (or says `required`: the first of `tools`):
/// its arguments fit the function's parameters (`mock_anthropic::tool_input`).
pub(super) fn tool_call(
    tools: Option<&serde_json::Value>,
    choice: Option<&serde_json::Value>,
    n: u64,
    text: &str,
) -> Option<serde_json::Value> {
    let tools = tools?.as_array()?;
    let name = match choice? {
        serde_json::Value::String(s) if s == "required" => {
            tools.first()?.pointer("/function/name")?.as_str()?
        }
        c => c.pointer("/function/name")?.as_str()?,
    };
    let function = tools
        .iter()
        .find(|t| t.pointer("/function/name").and_then(|v| v.as_str()) == Some(name))?;
    let schema = function
        .pointer("/function/parameters")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let args = crate::tools::mock_anthropic::tool_input(&schema, text);
    Some(json!({"id": format!("call_mock_{n}"), "type": "function",
        "function": {"name": name, "arguments": args.to_string()}}))
}

/// The headers a request carried, for `/mock/stats` (`last_headers`).
pub(super) fn seen(headers: &HeaderMap) -> serde_json::Map<String, serde_json::Value> {
    headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
            )
        })
        .collect()
}

/// Anthropic's Messages API on the mock: `tools::mock_anthropic` speaks
/// the format, the mock's fault switches still apply (status sequence,
/// error rate, generation time, stream pacing, cuts, stalls, an `error`
/// event mid-stream).
impl super::Mock {
    pub(super) async fn messages(
        &self,
        req: http::Request<hyper::body::Incoming>,
        faults: &super::Faults,
        running: super::Running,
    ) -> Response<MockBody> {
        use crate::tools::mock_anthropic as fmt;
        use http_body_util::BodyExt;
        use std::sync::atomic::Ordering;

        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let rid = format!("req_mock_{n}");
        if let Err(resp) = fmt::authenticate(req.headers(), None, &rid) {
            return boxed(*resp);
        }
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return boxed(fmt::error_response(
                    400,
                    Some(&e.to_string()),
                    None,
                    &rid,
                    now(),
                ))
            }
        };
        let head = match fmt::parse_request(&body, &rid) {
            Ok(h) => h,
            Err(resp) => return boxed(*resp),
        };
        if !self.opts.models.is_empty() && !self.opts.models.contains(&head.model) {
            let m = format!("model: {}", head.model);
            return boxed(fmt::error_response(404, Some(&m), None, &rid, now()));
        }
        let applies = faults.only_models.is_empty() || faults.only_models.contains(&head.model);
        let clean = super::Faults::default();
        let faults = if applies { faults } else { &clean };
        if let Some(status) = self.scripted_status(faults) {
            return boxed(fmt::error_response(
                status,
                None,
                faults.retry_after,
                &rid,
                now(),
            ));
        }
        if faults.generation_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(faults.generation_ms)).await;
        }
        let salt = &faults.answer_salt;
        let from = super::words_done(head.prefill.as_deref(), salt);
        let tokens = head.max_tokens.clamp(1, 64);
        let words: Vec<String> = (from..from + tokens)
            .map(|i| format!("{salt}tok{i} "))
            .collect();
        let input = head
            .tool
            .as_ref()
            .map(|t| fmt::tool_input(&t.input_schema, &words.concat()));
        let tool_id = format!("toolu_mock_{n}");
        let id = format!("msg_mock_{n}");
        let answer = fmt::Answer {
            id: &id,
            model: &head.model,
            words: &words,
            tool_use: head
                .tool
                .as_ref()
                .zip(input.as_ref())
                .map(|(t, i)| (tool_id.as_str(), t.name.as_str(), i)),
            stop_reason: if head.tool.is_some() {
                "tool_use"
            } else {
                "end_turn"
            },
            input_tokens: 8,
            output_tokens: tokens,
        };
        if !head.stream {
            return boxed(fmt::message_response(&answer, &rid));
        }
        let mut resp = super::paced(
            answer.events(),
            faults,
            running,
            fmt::error_event(529, None),
        );
        let head = fmt::stream_response(&rid);
        for (name, value) in head.headers() {
            resp.headers_mut().insert(name.clone(), value.clone());
        }
        resp
    }

    /// The status the faults ask for this request (`status_sequence`, else
    /// `error_rate`), `None` for an answer.
    fn scripted_status(&self, faults: &super::Faults) -> Option<u16> {
        let scripted = {
            let mut live = self.faults.lock();
            (!live.status_sequence.is_empty() && faults.status_sequence == live.status_sequence)
                .then(|| live.status_sequence.remove(0))
        };
        match scripted {
            Some(200) => None,
            Some(s) => Some(s),
            None if faults.error_rate > 0.0 && fastrand::f64() < faults.error_rate => {
                Some(faults.error_status)
            }
            None => None,
        }
    }
}

fn now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

fn boxed(resp: Response<bytes::Bytes>) -> Response<MockBody> {
    use http_body_util::BodyExt;
    resp.map(|b| {
        http_body_util::Full::new(b)
            .map_err(|e: std::convert::Infallible| match e {})
            .boxed()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_paths_map_to_the_openai_ones_and_need_an_api_version() {
        let r = route(
            Provider::Azure,
            &Method::POST,
            "/openai/deployments/gpt-4o/chat/completions",
            Some("api-version=2024-10-21"),
        );
        assert!(matches!(r, Ok(Route::Openai(p)) if p == "/v1/chat/completions"));
        let r = route(
            Provider::Azure,
            &Method::POST,
            "/openai/deployments/gpt-4o/chat/completions",
            None,
        );
        assert!(matches!(r, Err(resp) if resp.status() == StatusCode::NOT_FOUND));
        let r = route(
            Provider::Azure,
            &Method::GET,
            "/openai/models",
            Some("api-version=1"),
        );
        assert!(matches!(r, Ok(Route::Models)));
    }

    #[test]
    fn each_provider_wants_its_key_in_its_own_header() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer k1".parse().expect("value"));
        assert!(check_key(Provider::Openai, "k1", &h).is_none());
        assert!(check_key(Provider::Azure, "k1", &h).is_some());
        h.insert("api-key", "k1".parse().expect("value"));
        assert!(check_key(Provider::Azure, "k1", &h).is_none());
        let refused = check_key(Provider::Anthropic, "k1", &h).expect("401");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    }
}
