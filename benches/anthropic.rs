//! What the Anthropic adapter costs per request (`provider::anthropic`):
//! a typical chat request and its answer translated through `Value`s
//! (`request`/`response_at` with the parse and write around them) and
//! through the bytes path the request path calls (`request_bytes`,
//! `response_bytes`); a streamed answer of 16 text deltas (`Stream`).
//! Instruction counts of the same work: docs/src/providers-anthropic.md,
//! "Cost".

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use zonegate::provider::anthropic;

const REQUEST: &str = r#"{"model":"claude","messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly."},{"role":"user","content":"What is the capital of France? Explain in one sentence why it became the capital."}],"max_tokens":64,"temperature":0.7,"stream":false}"#;
const ANSWER: &str = r#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Paris is the capital of France; it became the capital because the Capetian kings made it their seat of power in the late 10th century."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":31,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":34,"service_tier":"standard"}}"#;
const START: &str = r#"{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#;
const DELTA: &str =
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok12 "}}"#;

fn translate(c: &mut Criterion) {
    let mut group = c.benchmark_group("anthropic");
    group.bench_function("request_and_answer_value", |b| {
        b.iter(|| {
            let v: serde_json::Value =
                serde_json::from_str(black_box(REQUEST)).expect("the bench inputs translate");
            let up = anthropic::request(&v, "claude-sonnet-4-5", 1024)
                .expect("the bench inputs translate");
            let a: serde_json::Value =
                serde_json::from_str(black_box(ANSWER)).expect("the bench inputs translate");
            let r = anthropic::response_at(&a, "claude", 1).expect("the bench inputs translate");
            serde_json::to_vec(&up)
                .expect("the bench inputs translate")
                .len()
                + serde_json::to_vec(&r)
                    .expect("the bench inputs translate")
                    .len()
        })
    });
    group.bench_function("request_and_answer_bytes", |b| {
        b.iter(|| {
            let up =
                anthropic::request_bytes(black_box(REQUEST.as_bytes()), "claude-sonnet-4-5", 1024)
                    .expect("the bench inputs translate");
            let r = anthropic::response_bytes(black_box(ANSWER.as_bytes()), "claude", 1)
                .expect("the bench inputs translate");
            up.body.len() + r.len()
        })
    });
    group.bench_function("stream_of_16_text_deltas", |b| {
        b.iter(|| {
            let mut s = anthropic::Stream::new_at("claude", true, 1);
            let mut n = s.event("message_start", START.as_bytes()).expect("the bench inputs translate").len();
            let block = br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
            n += s.event("content_block_start", block).expect("the bench inputs translate").len();
            for _ in 0..16 {
                n += s.event("content_block_delta", black_box(DELTA.as_bytes())).expect("the bench inputs translate").len();
            }
            n += s.event("content_block_stop", br#"{"type":"content_block_stop","index":0}"#).expect("the bench inputs translate").len();
            let stop = br#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":16}}"#;
            n += s.event("message_delta", stop).expect("the bench inputs translate").len();
            n + s.event("message_stop", br#"{"type":"message_stop"}"#).expect("the bench inputs translate").len()
        })
    });
    group.finish();
}

criterion_group!(benches, translate);
criterion_main!(benches);
