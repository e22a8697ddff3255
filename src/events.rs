//! Observable events (backend ejected, rejoined, …): one call logs the
//! structured line, bumps the metric and keeps the event for the admin API.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;

use crate::backend::{Backend, Transition};
use crate::telemetry::Metrics;

/// How many recent events the admin API can show.
const KEEP: usize = 1_000;

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub kind: &'static str,
    pub backend: String,
    pub zone: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct EventLog {
    events: Mutex<VecDeque<Event>>,
}

impl EventLog {
    /// Records a backend's transition: log line, metric, event list.
    pub fn backend(&self, metrics: &Metrics, b: &Backend, t: Transition, reason: &str) {
        let zone = b.zone.as_str();
        tracing::warn!(backend = %b.name, zone, event = t.as_str(), reason, "backend {}", t.as_str());
        metrics
            .backend_transitions
            .with_label_values(&[&b.name, zone, t.as_str()])
            .inc();
        metrics
            .backend_up
            .with_label_values(&[&b.name, zone])
            .set(i64::from(b.is_up()));
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut events = self.events.lock();
        if events.len() == KEEP {
            events.pop_front();
        }
        events.push_back(Event {
            at_ms,
            kind: t.as_str(),
            backend: b.name.clone(),
            zone: zone.to_owned(),
            reason: reason.to_owned(),
        });
    }

    /// The most recent events, newest first.
    pub fn recent(&self, limit: usize) -> Vec<Event> {
        self.events
            .lock()
            .iter()
            .rev()
            .take(limit)
            .cloned()
            .collect()
    }
}
