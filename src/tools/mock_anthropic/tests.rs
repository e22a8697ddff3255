//! The mock's Anthropic wire format, and the translation round trip
//! through it: what `provider::anthropic` sends, the mock accepts; what the
//! mock answers, `provider::anthropic` translates.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

use super::*;
use crate::provider::anthropic;

fn body(resp: &Response<Bytes>) -> Value {
    serde_json::from_slice(resp.body()).expect("JSON body")
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

/// `event: …\ndata: …` texts → (event, data) pairs, checking the framing.
fn split(events: &[String]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            let rest = e
                .strip_suffix("\n\n")
                .expect("an event ends in a blank line");
            let (name, data) = rest.split_once('\n').expect("two lines");
            let name = name.strip_prefix("event: ").expect("event line");
            let data = data.strip_prefix("data: ").expect("data line");
            let v: Value = serde_json::from_str(data).expect("JSON data");
            assert_eq!(v["type"], name, "the data's type is the event's name");
            (name.to_owned(), data.to_owned())
        })
        .collect()
}

fn words() -> Vec<String> {
    vec!["tok0 ".into(), "tok1 ".into(), "tok2 ".into()]
}

#[test]
fn authentication_checks_the_key_and_the_version() {
    let key = Some("sk-ant-demo");
    let cases = [
        (
            vec![("anthropic-version", VERSION)],
            Some((401, "x-api-key header is required")),
        ),
        (
            vec![
                ("x-api-key", "sk-ant-other"),
                ("anthropic-version", VERSION),
            ],
            Some((401, "invalid x-api-key")),
        ),
        // A client's bearer token is not Anthropic's credential.
        (
            vec![
                ("authorization", "Bearer sk-ant-demo"),
                ("anthropic-version", VERSION),
            ],
            Some((401, "x-api-key header is required")),
        ),
        (
            vec![("x-api-key", "sk-ant-demo")],
            Some((400, "anthropic-version: header is required")),
        ),
        (
            vec![("x-api-key", "sk-ant-demo"), ("anthropic-version", VERSION)],
            None,
        ),
    ];
    for (pairs, want) in cases {
        let got = authenticate(&headers(&pairs), key, "req_1");
        match (got, want) {
            (Ok(()), None) => {}
            (Err(resp), Some((status, message))) => {
                assert_eq!(resp.status().as_u16(), status, "{pairs:?}");
                let b = body(&resp);
                assert_eq!(b["type"], "error");
                assert_eq!(b["error"]["message"], message);
                assert_eq!(b["error"]["type"], error_type(status));
                assert_eq!(resp.headers()["request-id"], "req_1");
            }
            (got, want) => panic!("{pairs:?}: got {got:?}, want {want:?}"),
        }
    }
    // Without --expect-key any key (or none) passes; the version is still due.
    assert!(authenticate(&headers(&[("anthropic-version", VERSION)]), None, "r").is_ok());
}

#[test]
fn error_bodies_and_rate_limit_headers_are_anthropics() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let resp = error_response(529, None, Some(3), "req_2", now);
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(
        body(&resp),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
            "request_id": "req_2"})
    );
    assert_eq!(resp.headers()["retry-after"], "3");

    let resp = error_response(429, None, Some(20), "req_3", now);
    assert_eq!(body(&resp)["error"]["type"], "rate_limit_error");
    let h = resp.headers();
    assert_eq!(h["retry-after"], "20");
    assert_eq!(h["anthropic-ratelimit-requests-limit"], "1000");
    assert_eq!(h["anthropic-ratelimit-requests-remaining"], "0");
    assert_eq!(
        h["anthropic-ratelimit-requests-reset"],
        "2023-11-14T22:13:40Z"
    );
    assert_eq!(h["anthropic-ratelimit-input-tokens-remaining"], "0");
    assert_eq!(
        h["anthropic-ratelimit-output-tokens-reset"],
        "2023-11-14T22:13:40Z"
    );
    assert_eq!(h["anthropic-ratelimit-tokens-limit"], "96000");

    for (status, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (500, "api_error"),
        (503, "api_error"),
    ] {
        let resp = error_response(status, None, None, "r", now);
        assert_eq!(body(&resp)["error"]["type"], kind, "{status}");
        assert!(resp.headers().get("retry-after").is_none());
    }
    assert_eq!(not_found("r").status().as_u16(), 404);
    let e = split(&[error_event(529, None)]);
    assert_eq!(e[0].0, "error");
}

#[test]
fn requests_are_checked_as_anthropic_checks_them() {
    let ok = json!({"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let head = parse_request(ok.to_string().as_bytes(), "r").unwrap();
    assert_eq!(
        head,
        Head {
            model: "claude".into(),
            max_tokens: 8,
            stream: false,
            prefill: None,
            tool: None
        }
    );
    let cases = [
        (
            json!({"model": "c", "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (json!({"model": "c", "max_tokens": 8}), "messages"),
        (
            json!({"model": "c", "max_tokens": 8, "n": 1, "messages": [{"role": "user", "content": "x"}]}),
            "n: Extra inputs are not permitted",
        ),
        (
            json!({"model": "c", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
            "Unexpected role",
        ),
        (
            json!({"model": "c", "max_tokens": 8, "temperature": 1.5,
                "messages": [{"role": "user", "content": "x"}]}),
            "temperature",
        ),
        (
            json!({"model": "c", "max_tokens": 8, "messages": [
                {"role": "user", "content": "x"}, {"role": "assistant", "content": "tok0 "}]}),
            "trailing whitespace",
        ),
    ];
    for (req, want) in cases {
        let resp = parse_request(req.to_string().as_bytes(), "r").unwrap_err();
        assert_eq!(resp.status().as_u16(), 400);
        let b = body(&resp);
        assert_eq!(b["error"]["type"], "invalid_request_error");
        let m = b["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{req}: {m}");
    }
    assert_eq!(
        parse_request(b"{oops", "r").unwrap_err().status().as_u16(),
        400
    );
}

#[test]
fn a_prefill_and_a_forced_tool_are_read_from_the_request() {
    let req = json!({"model": "c", "max_tokens": 8, "stream": true,
        "tools": [{"name": "a", "input_schema": {}},
            {"name": "weather", "input_schema": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}}],
        "tool_choice": {"type": "tool", "name": "weather"},
        "messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "text", "text": "tok0 tok1"}]}]});
    let head = parse_request(req.to_string().as_bytes(), "r").unwrap();
    assert!(head.stream);
    assert_eq!(head.prefill.as_deref(), Some("tok0 tok1"));
    let tool = head.tool.unwrap();
    assert_eq!(tool.name, "weather");
    assert_eq!(
        tool_input(&tool.input_schema, "tok0"),
        json!({"city": "tok0", "days": 1})
    );
    let mut any = req.clone();
    any["tool_choice"] = json!({"type": "any"});
    let head = parse_request(any.to_string().as_bytes(), "r").unwrap();
    assert_eq!(head.tool.map(|t| t.name).as_deref(), Some("a"));
    any["tool_choice"] = json!({"type": "auto"});
    assert_eq!(
        parse_request(any.to_string().as_bytes(), "r").unwrap().tool,
        None
    );
}

#[test]
fn the_message_and_its_stream_are_anthropics_shape() {
    let words = words();
    let input = json!({"city": "Paris"});
    let answer = Answer {
        id: "msg_mock_1",
        model: "claude",
        words: &words,
        tool_use: Some(("toolu_mock_1", "weather", &input)),
        stop_reason: "tool_use",
        input_tokens: 8,
        output_tokens: 4,
    };
    assert_eq!(
        answer.message(),
        json!({"id": "msg_mock_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "tok0 tok1 tok2 "},
                {"type": "tool_use", "id": "toolu_mock_1", "name": "weather", "input": {"city": "Paris"}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 8, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 4, "service_tier": "standard"}})
    );
    let names: Vec<String> = split(&answer.events())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let resp = message_response(&answer, "req_9");
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(body(&resp), answer.message());
    assert_eq!(
        stream_response("req_9").headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let listed = models(&["claude".to_owned()]);
    assert_eq!(listed["data"][0]["id"], "claude");
    assert_eq!(listed["has_more"], false);
}

/// The two halves agree: an OpenAI request translated by the adapter is
/// accepted by the mock; the mock's answer, streamed or not, translates
/// back to the same text, tool call, finish reason and usage.
#[test]
fn the_adapter_and_the_mock_round_trip() {
    let openai = json!({"model": "claude", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}, "user": "u1",
        "messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}}});
    let upstream = anthropic::request(&openai, "claude-up", 1024).unwrap();
    let head = parse_request(upstream.to_string().as_bytes(), "r").unwrap();
    assert_eq!(
        (head.model.as_str(), head.max_tokens, head.stream),
        ("claude-up", 3, true)
    );
    let tool = head.tool.expect("a forced tool");
    let input = tool_input(&tool.input_schema, "tok0");
    let words = words();
    let answer = Answer {
        id: "msg_mock_2",
        model: &head.model,
        words: &words,
        tool_use: Some(("toolu_mock_2", &tool.name, &input)),
        stop_reason: "tool_use",
        input_tokens: 8,
        output_tokens: 3,
    };
    let full = anthropic::response_at(&answer.message(), "claude", 7).unwrap();
    let message = &full["choices"][0]["message"];
    assert_eq!(message["content"], "tok0 tok1 tok2 ");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "weather");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"tok0\"}"
    );
    assert_eq!(full["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(full["usage"]["prompt_tokens"], 8);
    assert_eq!(full["usage"]["completion_tokens"], 3);

    let mut stream = anthropic::Stream::new_at("claude", true, 7);
    let (mut text, mut args, mut finish, mut usage, mut done) =
        (String::new(), String::new(), None, None, false);
    // Through the wire reader: each event as the mock writes it.
    for raw in answer.events() {
        for payload in stream.sse_event(raw.as_bytes()).unwrap() {
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(&payload).unwrap();
            if let Some(u) = chunk.get("usage") {
                usage = Some(u.clone());
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(a) = choice["delta"]["tool_calls"][0]["function"]["arguments"].as_str() {
                args.push_str(a);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
        }
    }
    assert!(done);
    assert_eq!(text, "tok0 tok1 tok2 ");
    assert_eq!(args, "{\"city\":\"tok0\"}");
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let usage = usage.unwrap();
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(8), Some(3))
    );

    // A mid-stream error event reaches the client as OpenAI's error object.
    let mut stream = anthropic::Stream::new_at("claude", false, 7);
    let (event, data) = &split(&[error_event(529, None)])[0];
    let out = stream.event(event, data.as_bytes()).unwrap();
    let e: Value = serde_json::from_str(&out[0]).unwrap();
    assert_eq!(e["error"]["code"], "overloaded");
    // And an error answer keeps its meaning.
    let resp = error_response(529, None, None, "r", SystemTime::UNIX_EPOCH);
    let (status, e) = anthropic::error(resp.status().as_u16(), resp.body());
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (503, Some("overloaded"))
    );
}
