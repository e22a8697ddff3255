//! The mock backend's faults: what is in force, and the partial update
//! `POST /mock/faults` applies to it.

use http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};

/// Faults in force; every field is set at run time by `POST /mock/faults`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Faults {
    /// Delay before the response head, on inference and health endpoints.
    pub latency_ms: u64,
    /// Delay before the response head of inference requests only: a long
    /// generation on a healthy server (its health endpoint answers at once).
    pub generation_ms: u64,
    /// Share of inference requests answered with `error_status`.
    pub error_rate: f64,
    pub error_status: u16,
    /// Reported as `vllm:num_requests_waiting`.
    pub queue_depth: u64,
    /// Reported as `vllm:gpu_cache_usage_perc` / `vllm:kv_cache_usage_perc` (0–1).
    pub kv_cache_usage: f64,
    /// Accept requests and never answer.
    pub hang: bool,
    /// Close the connection without answering.
    pub reset: bool,
    /// Cut the response body after this many chunks (abort the connection).
    pub stream_cut_after: Option<u64>,
    /// `Retry-After` seconds on error responses (for 429s).
    pub retry_after: Option<u64>,
    /// Pause between streamed chunks.
    pub stream_interval_ms: u64,
    /// `/health` answers 503.
    pub unhealthy: bool,
    /// Statuses for the next inference requests, one each (200 serves
    /// normally), e.g. `[500, 200]`; consumed as requests arrive.
    pub status_sequence: Vec<u16>,
    /// Stop sending (connection kept open) after this many stream chunks.
    pub stream_stall_after: Option<u64>,
    /// With `stream_cut_after`: send half of the next event before the cut.
    pub cut_inside_event: bool,
    /// Send a chunk that is not JSON after this many stream chunks.
    pub malformed_chunk_after: Option<u64>,
    /// Send an SSE error event (and end) after this many stream chunks.
    pub error_event_after: Option<u64>,
    /// Answer 400 to a chat whose last message is the assistant's (a
    /// server without prefill support).
    pub reject_prefill: bool,
    /// Answer 400 `context_length_exceeded`.
    pub context_length_exceeded: bool,
    /// Prefixes every generated word: a different salt is a different
    /// (non-deterministic) answer.
    pub answer_salt: String,
    /// Faults apply only to requests for these models (empty: all).
    pub only_models: Vec<String>,
    /// Answers carry OpenAI's `x-ratelimit-remaining-requests` with this
    /// value (a provider mock's default is 9999).
    pub ratelimit_remaining: Option<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            generation_ms: 0,
            error_rate: 0.0,
            error_status: 500,
            queue_depth: 0,
            kv_cache_usage: 0.1,
            hang: false,
            reset: false,
            stream_cut_after: None,
            retry_after: None,
            stream_interval_ms: 0,
            unhealthy: false,
            status_sequence: Vec::new(),
            stream_stall_after: None,
            cut_inside_event: false,
            malformed_chunk_after: None,
            error_event_after: None,
            reject_prefill: false,
            context_length_exceeded: false,
            answer_salt: String::new(),
            only_models: Vec::new(),
            ratelimit_remaining: None,
        }
    }
}

/// A partial update: omitted keys keep their value; `null` clears the
/// optional ones.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    latency_ms: Option<u64>,
    generation_ms: Option<u64>,
    error_rate: Option<f64>,
    error_status: Option<u16>,
    queue_depth: Option<u64>,
    kv_cache_usage: Option<f64>,
    hang: Option<bool>,
    reset: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    stream_cut_after: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    retry_after: Option<Option<u64>>,
    stream_interval_ms: Option<u64>,
    unhealthy: Option<bool>,
    status_sequence: Option<Vec<u16>>,
    #[serde(default, deserialize_with = "present")]
    stream_stall_after: Option<Option<u64>>,
    cut_inside_event: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    malformed_chunk_after: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    error_event_after: Option<Option<u64>>,
    reject_prefill: Option<bool>,
    context_length_exceeded: Option<bool>,
    answer_salt: Option<String>,
    only_models: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    ratelimit_remaining: Option<Option<u64>>,
}

/// Tells "key absent" (outer `None`) from "key: null" (`Some(None)`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl Faults {
    pub(super) fn apply(&mut self, p: FaultsPatch) -> Result<(), String> {
        if let Some(r) = p.error_rate {
            if !(0.0..=1.0).contains(&r) {
                return Err("error_rate must be between 0 and 1".into());
            }
            self.error_rate = r;
        }
        if let Some(k) = p.kv_cache_usage {
            if !(0.0..=1.0).contains(&k) {
                return Err("kv_cache_usage must be between 0 and 1".into());
            }
            self.kv_cache_usage = k;
        }
        if let Some(s) = p.error_status {
            if StatusCode::from_u16(s).is_err() {
                return Err("error_status must be an HTTP status code".into());
            }
            self.error_status = s;
        }
        if let Some(seq) = &p.status_sequence {
            if seq.iter().any(|s| StatusCode::from_u16(*s).is_err()) {
                return Err("status_sequence must hold HTTP status codes".into());
            }
        }
        macro_rules! copy {
            ($($f:ident),*) => { $( if let Some(v) = p.$f { self.$f = v; } )* };
        }
        copy!(
            latency_ms,
            generation_ms,
            queue_depth,
            hang,
            reset,
            stream_cut_after,
            retry_after,
            stream_interval_ms,
            unhealthy,
            status_sequence,
            stream_stall_after,
            cut_inside_event,
            malformed_chunk_after,
            error_event_after,
            reject_prefill,
            context_length_exceeded,
            answer_salt,
            only_models,
            ratelimit_remaining
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_patch_keeps_omitted_keys_and_clears_on_null() {
        let mut f = Faults::default();
        let p: FaultsPatch =
            serde_json::from_str(r#"{"latency_ms": 5, "stream_cut_after": 3}"#).unwrap();
        f.apply(p).unwrap();
        assert_eq!((f.latency_ms, f.stream_cut_after), (5, Some(3)));
        let p: FaultsPatch = serde_json::from_str(r#"{"error_rate": 0.5}"#).unwrap();
        f.apply(p).unwrap();
        assert_eq!(
            (f.latency_ms, f.error_rate, f.stream_cut_after),
            (5, 0.5, Some(3))
        );
        let p: FaultsPatch = serde_json::from_str(r#"{"stream_cut_after": null}"#).unwrap();
        f.apply(p).unwrap();
        assert_eq!(f.stream_cut_after, None);
    }

    #[test]
    fn fault_patch_rejects_nonsense() {
        assert!(serde_json::from_str::<FaultsPatch>(r#"{"latency": 5}"#).is_err());
        let mut f = Faults::default();
        let p: FaultsPatch = serde_json::from_str(r#"{"error_rate": 2}"#).unwrap();
        assert!(f.apply(p).is_err());
    }
}
