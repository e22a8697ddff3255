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

#[test]
fn tool_calls_and_results_translate_to_tool_use_and_tool_result() {
    let openai = json!({"model": "claude", "messages": [
        user("weather in Paris and Rome?"),
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
        user("thanks; which is warmer?")],
        "tools": [{"type": "function", "function": {"name": "weather",
            "description": "current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "now", "strict": false}}],
        "tool_choice": "required", "parallel_tool_calls": false});
    let expect = json!({"model": "claude-up", "max_tokens": 1024,
        "tools": [{"name": "weather", "description": "current weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"name": "now", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            user("weather in Paris and Rome?"),
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "call_2",
                 "content": [{"type": "text", "text": "21C"}]},
                {"type": "text", "text": "thanks; which is warmer?"}]}]});
    check_request(openai, expect);
}

#[test]
fn tool_choice_table() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let cases = [
        (json!("auto"), json!({"type": "auto"})),
        (json!("none"), json!({"type": "none"})),
        (json!("required"), json!({"type": "any"})),
        (
            json!({"type": "function", "function": {"name": "f"}}),
            json!({"type": "tool", "name": "f"}),
        ),
    ];
    for (choice, expect) in cases {
        let got = request(
            &json!({"messages": [user("x")], "tools": tools, "tool_choice": choice}),
            "m",
            8,
        )
        .unwrap();
        assert_eq!(got["tool_choice"], expect, "tool_choice {choice}");
    }
    // `parallel_tool_calls: false` alone still says so, under `auto`.
    let got = request(
        &json!({"messages": [user("x")], "tools": tools, "parallel_tool_calls": false}),
        "m",
        8,
    )
    .unwrap();
    assert_eq!(
        got["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
}

#[test]
fn message_level_untranslatables_are_refused_by_path() {
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}),
            "messages[0].name",
        ),
        (
            json!({"messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [user("hi"), {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}]}]}),
            "messages[1].content[0].image_url.url",
        ),
        (
            json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "ftp://host/x.png"}}]}]}),
            "messages[0].content[0].image_url.url",
        ),
        (
            json!({"messages": [user("x"), {"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [{"role": "function", "name": "f", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "system", "content": [
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [user("x")], "tools": [{"type": "function",
                "function": {"name": "f", "strict": true}}]}),
            "tools[0].function.strict",
        ),
        (
            json!({"messages": [user("x")], "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"messages": [user("x")], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"messages": [user("x")], "stream_options": {"include_obfuscation": true}}),
            "stream_options.include_obfuscation",
        ),
        (
            json!({"messages": [user("x")], "max_tokens": 0}),
            "max_tokens",
        ),
        (json!({"messages": [user("x")], "stop": [1]}), "stop"),
    ];
    for (openai, field) in cases {
        check_refused(openai, field);
    }
}

#[test]
fn a_pdf_file_part_becomes_a_document_block() {
    let got = request(
        &json!({"messages": [{"role": "user", "content": [{"type": "file",
            "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}}]}]}),
        "m",
        8,
    )
    .unwrap();
    assert_eq!(
        got["messages"][0]["content"][0],
        json!({"type": "document", "source":
            {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}})
    );
}

/// An Anthropic answer with `content` and `stop_reason`.
fn answer(content: Value, stop_reason: &str) -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-up",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 5}})
}

fn completion(message: Value, finish: &str, usage: Value) -> Value {
    json!({"id": "msg_1", "object": "chat.completion", "created": 1_700_000_000u64,
        "model": "claude", "choices": [{"index": 0, "message": message,
        "logprobs": null, "finish_reason": finish}], "usage": usage})
}

#[test]
fn response_golden_table_covers_every_finish_reason() {
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
    let hello = json!([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]);
    let said = json!({"role": "assistant", "content": "Hello", "refusal": null});
    let mut cases = vec![];
    for (stop, finish) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
    ] {
        cases.push((
            answer(hello.clone(), stop),
            completion(said.clone(), finish, usage.clone()),
        ));
    }
    // Tool use: text beside one call, and calls alone (content null).
    cases.push((
        answer(
            json!([{"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]),
            "tool_use",
        ),
        completion(
            json!({"role": "assistant", "content": "Let me look.", "refusal": null, "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
            "tool_calls",
            usage.clone(),
        ),
    ));
    cases.push((
        answer(
            json!([{"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}},
                {"type": "tool_use", "id": "toolu_2", "name": "b", "input": {"x": [1, 2]}}]),
            "tool_use",
        ),
        completion(
            json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": "toolu_2", "type": "function",
                 "function": {"name": "b", "arguments": "{\"x\":[1,2]}"}}]}),
            "tool_calls",
            usage.clone(),
        ),
    ));
    // Cache tokens count in the prompt; cache reads are OpenAI's cached tokens.
    let mut cached = answer(json!([{"type": "text", "text": "Hello"}]), "end_turn");
    cached["usage"] = json!({"input_tokens": 2, "output_tokens": 5,
        "cache_creation_input_tokens": 3, "cache_read_input_tokens": 7});
    cases.push((
        cached,
        completion(
            said.clone(),
            "stop",
            json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 7}}),
        ),
    ));
    for (anthropic, expect) in cases {
        let got = response_at(&anthropic, "claude", 1_700_000_000)
            .unwrap_or_else(|e| panic!("{anthropic}: {e}"));
        assert_eq!(got, expect, "answer {anthropic}");
    }
}

#[test]
fn malformed_answers_are_errors_not_panics() {
    let cases = [
        (json!("text"), "body"),
        (json!({"type": "message", "content": []}), "id"),
        (
            json!({"id": "m", "content": [], "stop_reason": "pause_turn"}),
            "stop_reason",
        ),
        (
            json!({"id": "m", "content": [{"type": "server_tool_use"}], "stop_reason": "end_turn"}),
            "content[0].type",
        ),
        (
            json!({"id": "m", "content": [{"type": "tool_use", "name": "f"}], "stop_reason": "tool_use"}),
            "content[0].id",
        ),
        (json!({"type": "error", "error": {}}), "type"),
    ];
    for (body, field) in cases {
        let e = response_at(&body, "m", 0).unwrap_err();
        assert_eq!(e.field, field, "{body}: {e}");
    }
}

#[test]
fn errors_keep_their_meaning_in_openai_shape() {
    let body =
        |t: &str, m: &str| json!({"type": "error", "error": {"type": t, "message": m}}).to_string();
    let cases = [
        (
            400,
            body("invalid_request_error", "messages: roles must alternate"),
            400,
            "invalid_request_error",
            "invalid_request",
        ),
        (
            400,
            body(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum",
            ),
            400,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (
            401,
            body("authentication_error", "invalid x-api-key"),
            502,
            "server_error",
            "upstream_credentials",
        ),
        (
            403,
            body("permission_error", "no access"),
            502,
            "server_error",
            "upstream_credentials",
        ),
        (
            404,
            body("not_found_error", "model: claude-x"),
            404,
            "invalid_request_error",
            "not_found",
        ),
        (
            413,
            body("request_too_large", "too large"),
            413,
            "invalid_request_error",
            "payload_too_large",
        ),
        (
            429,
            body(
                "rate_limit_error",
                "Number of requests has exceeded your rate limit",
            ),
            429,
            "requests",
            "rate_limit_exceeded",
        ),
        (
            429,
            body(
                "rate_limit_error",
                "exceeds your rate limit of 40000 input tokens per minute",
            ),
            429,
            "tokens",
            "rate_limit_exceeded",
        ),
        (
            500,
            body("api_error", "internal"),
            500,
            "server_error",
            "upstream_error",
        ),
        (
            529,
            body("overloaded_error", "Overloaded"),
            503,
            "server_error",
            "overloaded",
        ),
        (
            502,
            "<html>bad gateway</html>".to_owned(),
            502,
            "server_error",
            "upstream_error",
        ),
        (429, String::new(), 429, "requests", "rate_limit_exceeded"),
        (200, "{}".to_owned(), 502, "server_error", "upstream_error"),
    ];
    for (status, body, want_status, want_type, want_code) in cases {
        let (s, v) = error(status, body.as_bytes());
        assert_eq!(
            (s, &v["error"]["type"], &v["error"]["code"]),
            (want_status, &json!(want_type), &json!(want_code)),
            "{status} {body}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // The provider's words about the gateway's key never reach the client.
    let (_, v) = error(
        401,
        body("authentication_error", "invalid x-api-key sk-ant-123").as_bytes(),
    );
    assert!(!v.to_string().contains("sk-ant"));
}

/// Feeds `(event, data)` pairs through a stream; every payload it gives,
/// JSON parsed (`[DONE]` as the string).
fn run_stream(stream: &mut Stream, events: &[(&str, Value)]) -> Vec<Value> {
    let mut out = Vec::new();
    for (event, data) in events {
        let payloads = stream
            .event(event, data.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{event} {data}: {e}"));
        for p in payloads {
            out.push(if p == "[DONE]" {
                json!("[DONE]")
            } else {
                serde_json::from_str(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
            });
        }
    }
    out
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "msg_9", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
        "model": "claude", "choices": [{"index": 0, "delta": delta, "logprobs": null,
        "finish_reason": finish}]})
}

/// A text block then a tool_use block, as Anthropic streams them.
fn text_then_tool() -> Vec<(&'static str, Value)> {
    vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_9",
            "type": "message", "role": "assistant", "content": [], "model": "claude-up",
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Let me "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "check."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "ris\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 40}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

#[test]
fn a_stream_of_a_text_block_and_a_tool_call_translates_chunk_by_chunk() {
    let mut stream = Stream::new_at("claude", true, 1_700_000_000);
    let got = run_stream(&mut stream, &text_then_tool());
    let args = |s: &str| json!({"tool_calls": [{"index": 0, "function": {"arguments": s}}]});
    let expect = vec![
        chunk(json!({"role": "assistant", "content": ""}), json!(null)),
        chunk(json!({"content": "Let me "}), json!(null)),
        chunk(json!({"content": "check."}), json!(null)),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function",
                "function": {"name": "weather", "arguments": ""}}]}),
            json!(null),
        ),
        chunk(args(""), json!(null)),
        chunk(args("{\"city\": \"Pa"), json!(null)),
        chunk(args("ris\"}"), json!(null)),
        chunk(json!({}), json!("tool_calls")),
        json!({"id": "msg_9", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": "claude", "choices": [],
            "usage": {"prompt_tokens": 25, "completion_tokens": 40, "total_tokens": 65}}),
        json!("[DONE]"),
    ];
    assert_eq!(got, expect);
    assert!(stream.finished() && !stream.failed());
    assert_eq!(stream.finish_reason(), Some("tool_calls"));
    assert_eq!(
        (stream.usage().input_tokens, stream.usage().output_tokens),
        (25, 40)
    );
}

#[test]
fn without_include_usage_the_stream_ends_with_done_and_no_usage_chunk() {
    let mut stream = Stream::new_at("claude", false, 1_700_000_000);
    let got = run_stream(&mut stream, &text_then_tool());
    assert_eq!(got.last(), Some(&json!("[DONE]")));
    assert!(got.iter().all(|c| c.get("usage").is_none()), "{got:?}");
    // Events after the end change nothing.
    assert_eq!(stream.event("message_stop", b"{}"), Ok(vec![]));
}

#[test]
fn every_stop_reason_becomes_the_finish_chunk() {
    for (stop, finish) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ] {
        let mut events = text_then_tool();
        events.retain(|(e, d)| !(e.starts_with("content_block") && d["index"] == 1));
        for (event, data) in &mut events {
            if *event == "message_delta" {
                data["delta"]["stop_reason"] = json!(stop);
            }
        }
        let mut stream = Stream::new_at("claude", false, 1_700_000_000);
        let got = run_stream(&mut stream, &events);
        assert_eq!(
            got[got.len() - 2],
            chunk(json!({}), json!(finish)),
            "{stop}"
        );
    }
}

#[test]
fn an_error_event_becomes_an_openai_error_payload_and_ends_the_stream() {
    let mut stream = Stream::new_at("claude", true, 1_700_000_000);
    let mut events = text_then_tool();
    events.truncate(4);
    events.push((
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let got = run_stream(&mut stream, &events);
    let last = got.last().unwrap();
    assert_eq!(last["error"]["code"], "overloaded");
    assert_eq!(last["error"]["message"], "Overloaded");
    assert!(stream.failed() && stream.finished());
    assert_eq!(stream.event("message_stop", b"{}"), Ok(vec![]));
}

#[test]
fn contradictory_stream_events_are_errors_naming_the_field() {
    let start = text_then_tool()[0].1.to_string();
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (
            vec![("content_block_delta", json!({"index": 0}).to_string())],
            "event",
        ),
        (vec![("message_start", "{not json".to_owned())], "data"),
        (
            vec![
                ("message_start", start.clone()),
                ("message_start", start.clone()),
            ],
            "event",
        ),
        (
            vec![
                ("message_start", start.clone()),
                (
                    "content_block_delta",
                    json!({"index": 3, "delta": {"type": "text_delta", "text": "x"}}).to_string(),
                ),
            ],
            "index",
        ),
        (
            vec![
                ("message_start", start.clone()),
                (
                    "content_block_start",
                    json!({"index": 0, "content_block": {"type": "text"}}).to_string(),
                ),
                (
                    "content_block_delta",
                    json!({"index": 0, "delta": {"type": "input_json_delta", "partial_json": "{"}})
                        .to_string(),
                ),
            ],
            "delta.type",
        ),
        (
            vec![
                ("message_start", start),
                (
                    "message_delta",
                    json!({"delta": {"stop_reason": "pause_turn"}}).to_string(),
                ),
            ],
            "stop_reason",
        ),
    ];
    for (events, field) in cases {
        let mut stream = Stream::new_at("m", false, 0);
        let mut result = Ok(vec![]);
        for (event, data) in &events {
            result = stream.event(event, data.as_bytes());
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result.unwrap_err().field, field, "{events:?}");
    }
}

#[test]
fn unknown_events_and_a_missing_or_default_event_name_are_handled() {
    let mut stream = Stream::new_at("claude", false, 1_700_000_000);
    let events: Vec<(&str, Value)> = text_then_tool()
        .into_iter()
        .enumerate()
        .map(|(i, (_, d))| (if i % 2 == 0 { "" } else { "message" }, d))
        .chain([("future_event", json!({"type": "future_event"}))])
        .collect();
    let got = run_stream(&mut stream, &events);
    assert_eq!(got.last(), Some(&json!("[DONE]")));
}

mod never_panics {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::super::*;

    /// Any JSON value, up to a few levels deep, with the keys the
    /// translation looks for so the random values reach its branches.
    fn any_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("role".to_owned()),
            Just("content".to_owned()),
            Just("type".to_owned()),
            Just("text".to_owned()),
            Just("messages".to_owned()),
            Just("tools".to_owned()),
            Just("tool_calls".to_owned()),
            Just("function".to_owned()),
            Just("image_url".to_owned()),
            Just("url".to_owned()),
            Just("index".to_owned()),
            Just("delta".to_owned()),
            Just("usage".to_owned()),
            Just("id".to_owned()),
            Just("name".to_owned()),
            Just("arguments".to_owned()),
            Just("stop_reason".to_owned()),
            Just("input".to_owned()),
            Just("content_block".to_owned()),
            Just("message".to_owned()),
            Just("error".to_owned()),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            prop_oneof![
                Just("user".to_owned()),
                Just("assistant".to_owned()),
                Just("tool".to_owned()),
                Just("system".to_owned()),
                Just("text".to_owned()),
                Just("tool_use".to_owned()),
                Just("image_url".to_owned()),
                Just("data:image/png;base64,AA".to_owned()),
                Just("text_delta".to_owned()),
                Just("input_json_delta".to_owned()),
                Just("end_turn".to_owned()),
                Just("function".to_owned()),
                ".{0,12}",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_json_never_panics_any_translation(v in any_json(), event in prop_oneof![
            Just("message_start"), Just("content_block_start"), Just("content_block_delta"),
            Just("message_delta"), Just("message_stop"), Just("error"), Just("")]) {
            let _ = request(&v, "m", 16);
            let bytes = v.to_string();
            let _ = request_bytes(bytes.as_bytes(), "m", 16);
            let _ = response_bytes(bytes.as_bytes(), "m", 0);
            let _ = request(&json!({"messages": v.clone()}), "m", 16);
            let _ = response_at(&v, "m", 0);
            let _ = error(529, bytes.as_bytes());
            let mut stream = Stream::new_at("m", true, 0);
            let start = json!({"message": {"id": "x"}}).to_string();
            let _ = stream.event("message_start", start.as_bytes());
            let _ = stream.event("content_block_start", bytes.as_bytes());
            let _ = stream.event(event, bytes.as_bytes());
        }

        #[test]
        fn random_bytes_never_panic_the_stream_or_error(bytes in prop::collection::vec(any::<u8>(), 0..256), status in any::<u16>()) {
            let _ = error(status, &bytes);
            let mut stream = Stream::new_at("m", false, 0);
            let _ = stream.event("message_start", &bytes);
            let _ = stream.event("content_block_delta", &bytes);
            let _ = stream.sse_event(&bytes);
        }
    }
}

#[test]
fn whole_sse_events_are_read_off_the_wire() {
    let mut stream = Stream::new_at("claude", false, 1_700_000_000);
    let start = text_then_tool()[0].1.to_string();
    let raw = format!(": a comment\r\nevent: message_start\r\ndata: {start}\r\n\r\n");
    let out = stream.sse_event(raw.as_bytes()).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        serde_json::from_str::<Value>(&out[0]).unwrap(),
        chunk(json!({"role": "assistant", "content": ""}), json!(null))
    );
    // Data split over two lines joins with a line feed (JSON allows it).
    let raw = "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0,\ndata: \"content_block\": {\"type\": \"text\", \"text\": \"Hi\"}}\n\n";
    let out = stream.sse_event(raw.as_bytes()).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&out[0]).unwrap(),
        chunk(json!({"content": "Hi"}), json!(null))
    );
    assert_eq!(stream.sse_event(b": keep-alive\n\n"), Ok(vec![]));
    assert_eq!(
        stream.sse_event(b"event: message_stop\ndata: {}\n\n"),
        Ok(vec!["[DONE]".to_owned()])
    );
    assert_eq!(
        sse(&["{}".to_owned(), "[DONE]".to_owned()]),
        "data: {}\n\ndata: [DONE]\n\n"
    );
}

/// The bytes path gives what the `Value` path gives, whichever way it
/// takes (typed for the common shapes, the `Value` path otherwise).
fn same_request(openai: &Value) {
    // Both from the same bytes: serde_json's float parse is not exact to
    // the last bit, the same way on both paths.
    let bytes = openai.to_string();
    let slow = request(&serde_json::from_str(&bytes).unwrap(), "claude-up", 1024);
    let fast = request_bytes(bytes.as_bytes(), "claude-up", 1024);
    let flags = fast.as_ref().ok().map(|t| (t.stream, t.include_usage));
    let fast = fast.map(|t| serde_json::from_slice::<Value>(&t.body).unwrap());
    assert_eq!(fast, slow, "{openai}");
    if flags.is_some() {
        let want = (
            openai["stream"] == json!(true),
            openai["stream_options"]["include_usage"] == json!(true),
        );
        assert_eq!(flags, Some(want), "{openai}");
    }
}

fn same_response(anthropic: &Value) {
    let slow = response_at(anthropic, "claude", 7);
    let fast = response_bytes(anthropic.to_string().as_bytes(), "claude", 7)
        .map(|b| serde_json::from_slice::<Value>(&b).unwrap());
    assert_eq!(fast, slow, "{anthropic}");
}

#[test]
fn the_bytes_path_agrees_with_the_value_path() {
    let simple = [
        json!({"model": "claude", "messages": [user("hi")]}),
        json!({"model": "claude", "messages": [{"role": "developer", "content": "be \"brief\""},
            user("hi \u{e9}"), {"role": "assistant", "content": "yo"}, user("again")],
            "max_tokens": 50, "temperature": 1, "top_p": 0.25, "stop": ["x"],
            "stream": true, "stream_options": {"include_usage": true}, "user": "u"}),
        json!({"messages": [user("hi")], "max_completion_tokens": 9, "max_tokens": 3, "stop": "s"}),
        json!({"messages": [user("hi")], "stop": [], "stream": null, "user": null}),
        // The long way: merges, refusals, tools, parts.
        json!({"messages": [user("a"), user("b")]}),
        json!({"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, user("c")]}),
        json!({"messages": [user("hi")], "temperature": 1.5}),
        json!({"messages": [user("hi")], "max_tokens": 0}),
        json!({"messages": [user("hi")], "n": 2}),
        json!({"messages": [user("hi")], "stop": [1]}),
        json!({"model": 3, "messages": [user("hi")]}),
        json!({"messages": [{"role": "tool", "content": "x"}]}),
    ];
    for openai in &simple {
        same_request(openai);
    }
    assert_eq!(request_bytes(b"{nope", "m", 1).unwrap_err().field, "body");
    let text = json!([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]);
    let tool = json!({"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1]}});
    for (content, stop) in [
        (text.clone(), "end_turn"),
        (
            json!([{"type": "text", "text": ""}, tool.clone()]),
            "tool_use",
        ),
        (json!([tool.clone()]), "tool_use"),
        (json!([]), "max_tokens"),
        (
            json!([{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "x"}]),
            "refusal",
        ),
        (
            json!([{"type": "tool_use", "id": "t1", "name": "f", "input": null}]),
            "tool_use",
        ),
        (json!([{"type": "server_tool_use"}]), "end_turn"),
        (text.clone(), "pause_turn"),
    ] {
        let mut a = answer(content, stop);
        same_response(&a);
        a["usage"]["cache_read_input_tokens"] = json!(4);
        same_response(&a);
        a.as_object_mut().unwrap().remove("usage");
        same_response(&a);
    }
    assert_eq!(response_bytes(b"[", "m", 1).unwrap_err().field, "body");
}

mod paths_agree {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// Requests near the fast path's edge: plain turns of any role order,
    /// with optional sampling fields in and out of range.
    fn simple_request() -> impl Strategy<Value = Value> {
        let role = prop_oneof![
            Just("system"),
            Just("developer"),
            Just("user"),
            Just("assistant"),
            Just("tool")
        ];
        let message = (role, ".{0,8}").prop_map(|(r, c)| json!({"role": r, "content": c}));
        (
            prop::collection::vec(message, 0..6),
            prop::option::of(0u64..3),
            prop::option::of(-0.5f64..2.0),
            prop::option::of(prop_oneof![
                Just(json!("x")),
                Just(json!(["a", "b"])),
                Just(json!([]))
            ]),
            prop::option::of(".{0,4}"),
        )
            .prop_map(|(messages, max_tokens, temperature, stop, user)| {
                let mut v = json!({"model": "m", "messages": messages});
                if let Some(n) = max_tokens {
                    v["max_tokens"] = json!(n);
                }
                if let Some(t) = temperature {
                    v["temperature"] = json!(t);
                }
                if let Some(s) = stop {
                    v["stop"] = s;
                }
                if let Some(u) = user {
                    v["user"] = json!(u);
                }
                v
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn the_bytes_path_agrees_with_the_value_path_on_random_requests(v in simple_request()) {
            super::same_request(&v);
        }
    }
}
