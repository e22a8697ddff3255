//! Golden tables of the translation, both ways, and random input that
//! must never panic.

use serde_json::{json, Value};

use super::*;

mod stream;

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

/// The one-pass reader's edges, as JSON text other writers send: spaces
/// around keys and colons, an escaped key, numbers that are not a `u64`.
#[test]
fn the_bytes_path_agrees_on_spacing_escaped_keys_and_odd_numbers() {
    let turns = r#""messages": [ {"role" :"user", "content": "hi"} ]"#;
    for text in [
        format!(r#"{{ "model": "m", {turns} }}"#),
        format!("{{\n\t\"model\"\n:\"m\",\r\n{turns}}}"),
        format!(r#"{{"mod\u0065l":"m",{turns}}}"#),
        format!(r#"{{"model":"m",{turns},"us\"er":"u"}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens": 7 }}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":07}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":7.0}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":7e1}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":-7}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":18446744073709551616}}"#),
        format!(r#"{{"model":"m",{turns},"max_tokens":18446744073709551615}}"#),
        format!(r#"{{"model":"m",{turns},"stream":true}}"#),
        format!(r#"{{"model":"m",{turns},"stream":true,"a":1"#),
    ] {
        let fast = request_bytes(text.as_bytes(), "claude-up", 1024)
            .map(|t| serde_json::from_slice::<Value>(&t.body).unwrap());
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => assert_eq!(fast, request(&v, "claude-up", 1024), "{text}"),
            Err(_) => assert_eq!(fast.unwrap_err().field, "body", "{text}"),
        }
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
