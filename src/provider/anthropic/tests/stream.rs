//! The stream translation: Anthropic's SSE events, one by one and off
//! the wire, into `chat.completion.chunk` payloads; random events never
//! panic.

use serde_json::{json, Value};

use super::super::*;

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

    use super::super::super::*;

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
