//! An Anthropic answer → OpenAI's `chat.completion`, and an Anthropic
//! error body → OpenAI's error shape.

use serde_json::{json, Map, Value};

use crate::provider::TranslateError;

fn malformed(field: impl Into<String>, reason: impl Into<String>) -> TranslateError {
    TranslateError::new(field, reason)
}

/// Anthropic's `stop_reason` → OpenAI's `finish_reason`.
pub(super) fn finish_reason(stop_reason: &str) -> Result<&'static str, TranslateError> {
    match stop_reason {
        "end_turn" | "stop_sequence" => Ok("stop"),
        "max_tokens" | "model_context_window_exceeded" => Ok("length"),
        "tool_use" => Ok("tool_calls"),
        "refusal" => Ok("content_filter"),
        // `pause_turn` comes only from server-side tools, which a
        // translated request never asks for.
        other => Err(malformed(
            "stop_reason",
            format!("`{other}` has no OpenAI finish_reason"),
        )),
    }
}

/// Token counts of an answer, as Anthropic splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: Option<u64>,
    pub cache_read_input_tokens: Option<u64>,
}

impl Usage {
    /// Reads the fields present in an Anthropic `usage` object; absent ones
    /// keep their value (a stream's `message_delta` repeats only some).
    pub(super) fn update(&mut self, usage: &Value) {
        let get = |k: &str| usage.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.input_tokens = n;
        }
        if let Some(n) = get("output_tokens") {
            self.output_tokens = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.cache_creation_input_tokens = Some(n);
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.cache_read_input_tokens = Some(n);
        }
    }

    /// OpenAI's `prompt_tokens` counts every token of the prompt, cached or
    /// not; Anthropic's `input_tokens` only those after the last cache
    /// breakpoint, so the cache counts are added back.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
            .saturating_add(self.cache_read_input_tokens.unwrap_or(0))
    }

    /// OpenAI's `usage` object; `prompt_tokens_details.cached_tokens` (the
    /// cache reads) when Anthropic reported cache counts.
    pub fn openai(&self) -> Value {
        let prompt = self.prompt_tokens();
        let mut usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.output_tokens,
            "total_tokens": prompt.saturating_add(self.output_tokens),
        });
        if self.cache_creation_input_tokens.is_some() || self.cache_read_input_tokens.is_some() {
            usage["prompt_tokens_details"] =
                json!({"cached_tokens": self.cache_read_input_tokens.unwrap_or(0)});
        }
        usage
    }
}

/// See [`super::response`]; `created` is the answer's Unix time in seconds.
pub fn response_at(
    body: &Value,
    client_model: &str,
    created: u64,
) -> Result<Value, TranslateError> {
    let obj = body
        .as_object()
        .ok_or_else(|| malformed("body", "the provider's answer is not a JSON object"))?;
    if let Some(t) = obj.get("type").and_then(Value::as_str) {
        if t != "message" {
            return Err(malformed("type", format!("expected `message`, got `{t}`")));
        }
    }
    let id = obj
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("id", "missing"))?;
    let blocks = obj
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("content", "missing or not a list"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = block
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed(format!("content[{i}].text"), "missing"))?;
                text.push_str(t);
            }
            Some("tool_use") => calls.push(tool_call(i, block)?),
            // Extended thinking is never asked for by a translated request;
            // if a provider sends it anyway it is not part of the answer.
            Some("thinking" | "redacted_thinking") => {}
            _ => {
                return Err(malformed(
                    format!("content[{i}].type"),
                    "a content block OpenAI's chat.completion cannot carry",
                ))
            }
        }
    }
    let stop = obj
        .get("stop_reason")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("stop_reason", "missing"))?;
    let finish = finish_reason(stop)?;
    let mut usage = Usage::default();
    usage.update(obj.get("usage").unwrap_or(&Value::Null));
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    // OpenAI's content is null when the answer is only tool calls.
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    message.insert("content".into(), content);
    message.insert("refusal".into(), Value::Null);
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": client_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage.openai(),
    }))
}

/// A `tool_use` block → an OpenAI tool call (arguments as a JSON string).
fn tool_call(i: usize, block: &Value) -> Result<Value, TranslateError> {
    let get = |k: &str| {
        block
            .get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(format!("content[{i}].{k}"), "missing"))
    };
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({
        "id": get("id")?,
        "type": "function",
        "function": {"name": get("name")?, "arguments": input.to_string()},
    }))
}

/// See [`super::error`].
pub fn error(status: u16, body: &[u8]) -> (u16, Value) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let kind = err
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = err
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let (status, openai_type, code, message): (u16, &str, &str, String) = match (status, kind) {
        // Anthropic words a too-long prompt this way; OpenAI's code for it
        // lets the gateway try a model with a larger context.
        (_, "invalid_request_error") if message.starts_with("prompt is too long") => (
            400,
            "invalid_request_error",
            "context_length_exceeded",
            message.to_owned(),
        ),
        (_, "invalid_request_error") => (
            400,
            "invalid_request_error",
            "invalid_request",
            message.to_owned(),
        ),
        // The backend's key is wrong or lacks a permission: the gateway's
        // fault, not the client's, so never a 401/403 to the client (whose
        // own key was fine) and never the provider's words about a key.
        (401 | 403, _) | (_, "authentication_error" | "permission_error") => (
            502,
            "server_error",
            "upstream_credentials",
            "the provider rejected the gateway's credentials for this backend".to_owned(),
        ),
        (_, "not_found_error") => (
            404,
            "invalid_request_error",
            "not_found",
            message.to_owned(),
        ),
        (_, "request_too_large") => (
            413,
            "invalid_request_error",
            "payload_too_large",
            message.to_owned(),
        ),
        (429, _) | (_, "rate_limit_error") => {
            // OpenAI's 429 names the limit's unit as its type.
            let unit = if message.contains("tokens") {
                "tokens"
            } else {
                "requests"
            };
            (429, unit, "rate_limit_exceeded", message.to_owned())
        }
        // 529 is not an HTTP status OpenAI clients know; 503 is retried by
        // them the same way.
        (529, _) | (_, "overloaded_error") => {
            (503, "server_error", "overloaded", message.to_owned())
        }
        (_, "api_error") => (500, "server_error", "upstream_error", message.to_owned()),
        _ => {
            let status = if (400..=599).contains(&status) {
                status
            } else {
                502
            };
            let kind = if status < 500 {
                "invalid_request_error"
            } else {
                "server_error"
            };
            (status, kind, "upstream_error", message.to_owned())
        }
    };
    let message = if message.is_empty() {
        format!("the provider answered {status} without an error message")
    } else {
        message
    };
    // OpenAI's error object (the shape of `dataplane::error::error_body`,
    // written here so the adapter depends on nothing of the data plane).
    let body =
        json!({"error": {"message": message, "type": openai_type, "param": null, "code": code}});
    (status, body)
}
