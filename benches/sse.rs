//! What reading one streamed chunk costs the relay: the full parse, the
//! skimmer's single pass (`sse::skim`), and a stream's skimmer reading a
//! chunk against the last one it read in full (`sse::Skimmer`), for a
//! vLLM-style chunk and an OpenAI-style one whose `obfuscation` member
//! changes on every chunk (so each is read in full). And what reading a
//! whole (non-streamed) answer's `usage` costs (`sse::body_usage`), for
//! the bench's static answer, a vLLM-style one and an OpenAI-style one.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use zonegate::dataplane::sse::{self, Skimmer};

/// `count` chunks of one stream, `TEXT` and `PAD` filled in per chunk.
fn stream(template: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            template
                .replace("TEXT", &format!(" tok{i}"))
                .replace("PAD", &"abcdefghij"[..1 + i % 9])
                .into_bytes()
        })
        .collect()
}

const VLLM: &str = "data: {\"id\":\"chatcmpl-0b5e8a6f3c1d4e2f\",\"object\":\"chat.completion.chunk\",\"created\":1733011200,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"TEXT\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
const OPENAI: &str = "data: {\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1733011200,\"model\":\"gpt-4o-mini-2024-07-18\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"TEXT\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"PAD\"}\n\n";

fn chunks(c: &mut Criterion) {
    for (name, template) in [("vllm", VLLM), ("openai", OPENAI)] {
        let events = stream(template, 64);
        let mut group = c.benchmark_group(format!("sse_chunk_{name}"));
        group.bench_function("parse", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % events.len();
                matches!(sse::parse(black_box(&events[i])), sse::Event::Data(_))
            })
        });
        group.bench_function("skim", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % events.len();
                matches!(sse::skim(black_box(&events[i])), sse::Skim::Text { .. })
            })
        });
        group.bench_function("skimmer", |b| {
            let mut skimmer = Skimmer::default();
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % events.len();
                matches!(skimmer.skim(black_box(&events[i])), sse::Skim::Text { .. })
            })
        });
        group.finish();
    }
}

const STATIC_ANSWER: &str = r#"{"id":"chatcmpl-static","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"hello from a static backend"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}"#;
const VLLM_ANSWER: &str = r#"{"id":"chatcmpl-0b5e8a6f3c1d4e2f","object":"chat.completion","created":1733011200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":"TEXT","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":21,"total_tokens":149,"completion_tokens":128,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#;
const OPENAI_ANSWER: &str = r#"{"id":"chatcmpl-AbC123","object":"chat.completion","created":1733011200,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"TEXT","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":21,"completion_tokens":128,"total_tokens":149,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_0ba0d124f1"}"#;

fn answers(c: &mut Criterion) {
    let text = "word ".repeat(100);
    let mut group = c.benchmark_group("body_usage");
    for (name, answer) in [
        ("static", STATIC_ANSWER),
        ("vllm", VLLM_ANSWER),
        ("openai", OPENAI_ANSWER),
    ] {
        let body = answer.replace("TEXT", &text).into_bytes();
        assert!(sse::body_usage(&body).is_some(), "{name}");
        group.bench_function(name, |b| b.iter(|| sse::body_usage(black_box(&body))));
    }
    group.finish();
}

criterion_group!(benches, chunks, answers);
criterion_main!(benches);
