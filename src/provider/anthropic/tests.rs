//! Golden tables of the translation, both ways, and random input that
//! must never panic.

use serde_json::{json, Value};

use super::*;

/// `check(input, expect)`: one OpenAI request → the Anthropic request.
fn check_request(openai: Value, expect: Value) {
    let got =
        request(&openai, "claude-up", 1024).unwrap_or_else(|e| panic!("{openai} was refused: {e}"));
    assert_eq!(got, expect, "request {openai}");
}

/// One OpenAI request → refused, naming `field`.
fn check_refused(openai: Value, field: &str) {
    match request(&openai, "claude-up", 1024) {
        Ok(v) => panic!("{openai} was translated to {v}, expected a refusal of `{field}`"),
        Err(e) => assert_eq!(e.field, field, "{openai}: {e}"),
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[test]
fn request_golden_table() {
    let cases = [
        // The smallest request: the backend's model, the default max_tokens.
        (
            json!({"model": "claude", "messages": [user("hi")]}),
            json!({"model": "claude-up", "max_tokens": 1024, "messages": [user("hi")]}),
        ),
        // System and developer messages become `system`; sampling fields.
        (
            json!({"model": "claude", "messages": [
                {"role": "system", "content": "be brief"}, user("hi")],
                "max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stop": "END",
                "stream": true, "stream_options": {"include_usage": true}, "user": "u-7"}),
            json!({"model": "claude-up", "system": "be brief", "max_tokens": 50,
                "temperature": 0.5, "top_p": 0.9, "stop_sequences": ["END"], "stream": true,
                "metadata": {"user_id": "u-7"}, "messages": [user("hi")]}),
        ),
        (
            json!({"model": "claude", "messages": [
                {"role": "system", "content": "one"},
                {"role": "developer", "content": [{"type": "text", "text": "two"}]},
                user("hi")],
                "max_tokens": 10, "max_completion_tokens": 20, "stop": ["a", "b"]}),
            json!({"model": "claude-up", "max_tokens": 20, "stop_sequences": ["a", "b"],
                "system": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
                "messages": [user("hi")]}),
        ),
        // Consecutive same-role turns merge; the defaults are accepted.
        (
            json!({"model": "claude", "n": 1, "logprobs": false, "presence_penalty": 0,
                "frequency_penalty": 0.0, "logit_bias": {}, "seed": null,
                "response_format": {"type": "text"}, "messages": [
                user("a"), user("b"),
                {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"}]}),
            json!({"model": "claude-up", "max_tokens": 1024, "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "c"}, {"type": "text", "text": "d"}]}]}),
        ),
        // Images: a data URL and an http URL.
        (
            json!({"model": "claude", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K", "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}]}),
            json!({"model": "claude-up", "max_tokens": 1024, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}]}]}),
        ),
    ];
    for (openai, expect) in cases {
        check_request(openai, expect);
    }
}

#[test]
fn untranslatable_fields_are_refused_by_name() {
    let hi = json!([user("hi")]);
    let cases = [
        (json!({"messages": hi, "n": 2}), "n"),
        (json!({"messages": hi, "logprobs": true}), "logprobs"),
        (json!({"messages": hi, "top_logprobs": 3}), "top_logprobs"),
        (
            json!({"messages": hi, "presence_penalty": 0.5}),
            "presence_penalty",
        ),
        (
            json!({"messages": hi, "frequency_penalty": 1}),
            "frequency_penalty",
        ),
        (
            json!({"messages": hi, "logit_bias": {"50256": -100}}),
            "logit_bias",
        ),
        (json!({"messages": hi, "seed": 7}), "seed"),
        (
            json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {}}}),
            "response_format",
        ),
        (json!({"messages": hi, "temperature": 1.5}), "temperature"),
        (
            json!({"messages": hi, "reasoning_effort": "low"}),
            "reasoning_effort",
        ),
        (json!({"messages": hi, "top_k": 5}), "top_k"),
        (json!({"model": "m"}), "messages"),
        (json!([1, 2]), "body"),
    ];
    for (openai, field) in cases {
        check_refused(openai, field);
    }
}

#[test]
fn an_untranslatable_field_becomes_a_400_body_naming_it() {
    let e = request(&json!({"messages": [user("hi")], "n": 3}), "m", 16).unwrap_err();
    let body = e.body();
    assert_eq!(body["error"]["param"], "n");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("`n`"));
}
