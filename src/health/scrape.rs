//! Reads the load signals the health score needs out of a backend's
//! Prometheus text: queue depth, running requests and KV-cache use, under
//! vLLM's, TGI's and SGLang's metric names. Pure: text in, numbers out.

use serde::Serialize;

/// Requests waiting for a slot.
const QUEUE: &[&str] = &[
    "vllm:num_requests_waiting",
    "tgi_queue_size",
    "sglang:num_queue_reqs",
];
/// Requests being generated now.
const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "tgi_batch_current_size",
    "sglang:num_running_reqs",
];
/// KV-cache (or token pool) in use, 0–1. vLLM renamed its gauge; both
/// names are read.
const KV: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// What a scrape found; `None` where the backend exports no such metric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Scraped {
    pub queue_depth: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
}

/// Parses Prometheus text exposition. Series of one metric are summed for
/// counts (one backend may serve several models) and maxed for the KV
/// share (the fullest cache is the one that stalls).
pub fn parse(text: &str) -> Scraped {
    let mut out = Scraped::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let value = line[name_end..]
            .rsplit_once('}')
            .map_or(&line[name_end..], |(_, rest)| rest)
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite());
        let Some(value) = value else { continue };
        if QUEUE.contains(&name) {
            *out.queue_depth.get_or_insert(0.0) += value;
        } else if RUNNING.contains(&name) {
            *out.running.get_or_insert(0.0) += value;
        } else if KV.contains(&name) {
            // Some exporters write a percentage despite the 0–1 convention.
            let share = if value > 1.0 { value / 100.0 } else { value };
            out.kv_usage = Some(out.kv_usage.map_or(share, |k: f64| k.max(share)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrape_table() {
        let cases: &[(&str, &str, Scraped)] = &[
            (
                "vllm (old name)",
                "# HELP vllm:num_requests_waiting x\n\
                 vllm:num_requests_waiting{model_name=\"q\"} 7.0\n\
                 vllm:num_requests_running{model_name=\"q\"} 3\n\
                 vllm:gpu_cache_usage_perc{model_name=\"q\"} 0.42\n",
                Scraped {
                    queue_depth: Some(7.0),
                    running: Some(3.0),
                    kv_usage: Some(0.42),
                },
            ),
            (
                "vllm (new name), two models",
                "vllm:num_requests_waiting{model_name=\"a\"} 2\n\
                 vllm:num_requests_waiting{model_name=\"b\"} 5\n\
                 vllm:kv_cache_usage_perc{model_name=\"a\"} 0.3\n\
                 vllm:kv_cache_usage_perc{model_name=\"b\"} 0.9\n",
                Scraped {
                    queue_depth: Some(7.0),
                    running: None,
                    kv_usage: Some(0.9),
                },
            ),
            (
                "tgi",
                "tgi_queue_size 4\ntgi_batch_current_size 16\ntgi_request_count 99\n",
                Scraped {
                    queue_depth: Some(4.0),
                    running: Some(16.0),
                    kv_usage: None,
                },
            ),
            (
                "sglang, percent written as 0-100",
                "sglang:num_queue_reqs{name=\"x\"} 1\nsglang:num_running_reqs 2\nsglang:token_usage 85\n",
                Scraped {
                    queue_depth: Some(1.0),
                    running: Some(2.0),
                    kv_usage: Some(0.85),
                },
            ),
            (
                "labels with spaces and a timestamp",
                "vllm:num_requests_waiting{model_name=\"a b\",x=\"}\"} 3 1700000000000\n",
                Scraped {
                    queue_depth: Some(3.0),
                    ..Scraped::default()
                },
            ),
            (
                "garbage and unrelated metrics",
                "nonsense\nvllm:num_requests_waiting NaN\nvllm:num_requests_waiting_x 5\nprocess_cpu 1\n",
                Scraped::default(),
            ),
        ];
        for (what, text, want) in cases {
            assert_eq!(parse(text), *want, "{what}");
        }
    }
}
