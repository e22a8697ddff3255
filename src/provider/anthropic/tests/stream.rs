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
            // Every event the one-pass readers take (verbatim/events.rs),
            // after a good start, so the bytes reach them.
            for name in ["content_block_start", "content_block_delta", "content_block_stop",
                "message_delta", "ping", "message_stop"] {
                let mut stream = Stream::new_at("m", true, 0);
                let start = json!({"type": "message_start", "message": {"id": "x",
                    "usage": {"input_tokens": 1, "output_tokens": 0}}}).to_string();
                let _ = stream.event("message_start", start.as_bytes());
                let _ = stream.event(name, &bytes);
            }
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

/// One stream's events through [`Stream::event`] (the one-pass readers
/// first) and through `Stream::general` (typed, then `Value`): the same
/// payloads (as JSON), the same errors and the same final state.
fn same_both_ways(events: &[(&str, &str)]) {
    let mut fast = Stream::new_at("claude", true, 1_700_000_000);
    let mut general = Stream::new_at("claude", true, 1_700_000_000);
    let parse = |payloads: Vec<String>| -> Vec<Value> {
        payloads
            .iter()
            .map(|p| serde_json::from_str(p).unwrap_or_else(|_| json!(p)))
            .collect()
    };
    for (event, data) in events {
        let a = fast.event(event, data.as_bytes()).map(parse);
        let b = general.general(event, data.as_bytes()).map(parse);
        assert_eq!(a, b, "{event} {data}");
        // The wire path writes the same payloads.
    }
    assert_eq!(fast.usage(), general.usage());
    assert_eq!(fast.finish_reason(), general.finish_reason());
    assert_eq!(
        (fast.finished(), fast.failed()),
        (general.finished(), general.failed())
    );
}

/// Anthropic's events as the API writes them (`type` first), with `text`
/// as the delta's JSON string.
fn anthropic_order(text: &str) -> Vec<(&'static str, String)> {
    vec![
        ("message_start", r#"{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}"#.to_owned()),
        ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned()),
        ("ping", r#"{"type": "ping"}"#.to_owned()),
        ("content_block_delta", format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{text}}}}}"#)),
        ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" more"}}"#.to_owned()),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.to_owned()),
        ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#.to_owned()),
        ("message_stop", r#"{"type":"message_stop"}"#.to_owned()),
    ]
}

fn borrow<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(e, d)| (*e, d.as_str())).collect()
}

#[test]
fn the_one_pass_readers_agree_with_the_typed_and_value_ways() {
    let owned = |v: &[(&'static str, Value)]| -> Vec<(&'static str, String)> {
        v.iter().map(|(e, d)| (*e, d.to_string())).collect()
    };
    // serde_json's sorted keys (another order), with a tool block.
    let sorted = owned(&text_then_tool());
    same_both_ways(&borrow(&sorted));
    // Anthropic's order; odd escapes, unicode, `\u` (the typed way's).
    for text in [
        r#""Hi""#,
        r#""""#,
        r#""a \"quoted\" \\ back\/slash\n\t\r\b\f""#,
        "\"h\u{e9}llo \u{65e5}\u{672c} \u{1f600}\"",
        r#""\u00e9 and \ud83d\ude00""#,
        r#""\u0000""#,
    ] {
        same_both_ways(&borrow(&anthropic_order(text)));
    }
    // Each event changed in a way one reader may not take: extra and
    // reordered fields, whitespace, nulls, escapes in ids, unknown stop
    // reasons, a block that does not exist, things after the end.
    let edits: Vec<(usize, &str)> = vec![
        (
            0,
            r#"{"message":{"usage":{"output_tokens":1,"input_tokens":3},"id":"msg_01"},"type":"message_start"}"#,
        ),
        (
            0,
            r#"{"type":"message_start","message":{"id":"msg\/01","usage":{"input_tokens":3}}}"#,
        ),
        (
            0,
            r#"{"type":"message_start","message":{"id":"msg_\u0041","usage":{"input_tokens":3}}}"#,
        ),
        (
            0,
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":null,"cache_read_input_tokens":7}}}"#,
        ),
        (
            0,
            r#"{"type":"message_start","message":{"id":"m","usage":null}}"#,
        ),
        (
            0,
            r#"{"type":"message_start","message":{"id":"m"},"extra":{"a":[1,{"b":null}]}}"#,
        ),
        (
            0,
            r#" { "type" : "message_start" , "message" : { "id" : "m" } } "#,
        ),
        (
            1,
            r#"{"index":0,"content_block":{"text":"Start \"q\" é","type":"text"},"type":"content_block_start"}"#,
        ),
        (
            1,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"\u00e9"}}"#,
        ),
        (
            1,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","citations":[]}}"#,
        ),
        (
            1,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        ),
        (2, r#"{"type":"ping","extra":"\u0041"}"#),
        (
            3,
            r#"{"index":0,"type":"content_block_delta","delta":{"text":"x","type":"text_delta"}}"#,
        ),
        (
            3,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x","citations":null}}"#,
        ),
        (
            3,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"x"}}"#,
        ),
        (
            3,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}} "#,
        ),
        (5, r#"{"type":"content_block_stop","index":0,"x":"\u00e9"}"#),
        (
            6,
            r#"{"usage":{"output_tokens":15},"delta":{"stop_sequence":null,"stop_reason":"max_tokens"},"type":"message_delta"}"#,
        ),
        (
            6,
            r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":15}}"#,
        ),
        (
            6,
            r#"{"type":"message_delta","delta":{"stop_reason":"pause_turn"},"usage":{"output_tokens":15}}"#,
        ),
        (
            6,
            r#"{"type":"message_delta","delta":{"stop_reason":"end\/turn"}}"#,
        ),
        (
            6,
            r#"{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":"15"}}"#,
        ),
        (
            6,
            r#"{"type":"message_delta","usage":{"output_tokens":15,"cache_read_input_tokens":2}}"#,
        ),
        (7, r#"{"type":"message_stop","x":[]}"#),
        (7, r#"{"type":"message_stop","x":"\ud800"}"#),
        (7, "{not json"),
    ];
    for (at, data) in edits {
        let mut events = anthropic_order(r#""Hi""#);
        events[at].1 = data.to_owned();
        same_both_ways(&borrow(&events));
    }
    // Out of order: a delta before its block, a second start, after the end.
    let events = anthropic_order(r#""Hi""#);
    let mut wrong = vec![events[3].clone()];
    wrong.extend(events.iter().cloned());
    wrong.push(events[0].clone());
    wrong.push(events[3].clone());
    same_both_ways(&borrow(&wrong));
    let mut twice = events.clone();
    twice.insert(2, events[1].clone());
    same_both_ways(&borrow(&twice));
}

#[test]
fn the_wire_path_writes_what_the_payloads_say() {
    let events = anthropic_order(r#""a \"b\" \u00e9 é""#);
    let mut by_payload = Stream::new_at("claude", true, 1_700_000_000);
    let mut by_wire = Stream::new_at("claude", true, 1_700_000_000);
    let (mut expect, mut got) = (Vec::new(), Vec::new());
    for (event, data) in &events {
        expect.extend(by_payload.event(event, data.as_bytes()).unwrap());
        let raw = format!("event: {event}\ndata: {data}");
        by_wire.sse_event_into(raw.as_bytes(), &mut got).unwrap();
    }
    assert_eq!(String::from_utf8(got).unwrap(), sse(&expect));
}

/// A backend that stops mid-event (a cut connection, a truncated write)
/// never has the piece taken for a whole event: every proper prefix of
/// every event of a real stream is refused, by the one-pass readers and
/// the typed way alike, and none panics.
#[test]
fn every_truncated_event_is_refused_never_taken_for_a_whole_one() {
    let events = text_then_tool();
    for (i, (name, data)) in events.iter().enumerate() {
        let whole = data.to_string();
        for cut in 0..whole.len() {
            let mut stream = Stream::new_at("claude", true, 1_700_000_000);
            for (before, data) in &events[..i] {
                stream.event(before, data.to_string().as_bytes()).unwrap();
            }
            let piece = &whole.as_bytes()[..cut];
            assert!(
                stream.event(name, piece).is_err(),
                "{name} cut at {cut} of {} was taken: {:?}",
                whole.len(),
                String::from_utf8_lossy(piece)
            );
        }
    }
}
