//! Observable events (a backend's state change, an ejection refused by the
//! cap, panic mode, the global breaker): one call logs the structured
//! line, bumps the metric and, for the events operators page on (eject,
//! rejoin, refused ejection, panic, breaker), keeps it for the admin API.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::Serialize;

use crate::dataplane::backend::Backend;
use crate::health::state::{Change, State};
use crate::telemetry::Metrics;

/// How many recent events the admin API can show.
const KEEP: usize = 1_000;

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub kind: &'static str,
    /// Empty for pool-wide and node-wide events.
    pub backend: String,
    pub zone: String,
    /// Set for pool-wide events (panic mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<State>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<State>,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct EventLog {
    events: Mutex<VecDeque<Event>>,
    /// Ejected backends and when (ms on this process's clock), for
    /// `zonegate_backend_ejection_duration_seconds` at their rejoin.
    ejected: Mutex<std::collections::HashMap<String, u64>>,
}

impl EventLog {
    /// Records one backend health change: log line, metrics, and (for
    /// ejections, rejoins and refused ejections) the event list.
    pub fn backend(&self, metrics: &Metrics, b: &Backend, change: Change, reason: &str) {
        let zone = b.zone.as_str();
        let (kind, from, to, listed) = match change {
            Change::Moved { from, to } => ("state_changed", Some(from), Some(to), false),
            Change::Ejected(cause) => {
                metrics
                    .backend_ejections
                    .with_label_values(&[&b.name, zone, cause.as_str()])
                    .inc();
                let kind = match cause {
                    crate::health::state::Cause::Score => "ejected_score",
                    crate::health::state::Cause::Passive => "ejected_passive",
                    crate::health::state::Cause::Credentials => "ejected_credentials",
                };
                self.ejected
                    .lock()
                    .entry(b.name.clone())
                    .or_insert_with(crate::clock::now_ms);
                (kind, None, Some(State::Down), true)
            }
            Change::Rejoined => {
                if let Some(at) = self.ejected.lock().remove(&b.name) {
                    let secs = crate::clock::now_ms().saturating_sub(at) as f64 / 1000.0;
                    metrics
                        .ejection_duration
                        .with_label_values(&[zone])
                        .observe(secs);
                }
                ("rejoined", Some(State::Down), None, true)
            }
            Change::EjectionRefused => ("ejection_refused", None, Some(State::Unstable), true),
        };
        if listed {
            tracing::warn!(backend = %b.name, zone, event = kind, ?from, ?to, reason, "backend {kind}");
        } else {
            tracing::info!(backend = %b.name, zone, event = kind, ?from, ?to, reason, "backend {kind}");
        }
        metrics.health_events.with_label_values(&[kind]).inc();
        metrics
            .backend_up
            .with_label_values(&[&b.name, zone])
            .set(i64::from(b.is_up()));
        if listed {
            self.keep(Event {
                at_ms: crate::clock::unix_ms(),
                kind,
                backend: b.name.clone(),
                zone: zone.to_owned(),
                model: None,
                from,
                to,
                reason: reason.to_owned(),
            });
        }
    }

    /// Records a pool entering or leaving panic mode.
    pub fn panic(&self, metrics: &Metrics, model: &str, zone: &str, on: bool, reason: &str) {
        let kind = if on { "panic_entered" } else { "panic_left" };
        tracing::warn!(model, zone, event = kind, reason, "pool {kind}");
        metrics.health_events.with_label_values(&[kind]).inc();
        metrics
            .pool_panic
            .with_label_values(&[model, zone])
            .set(i64::from(on));
        self.keep(Event {
            at_ms: crate::clock::unix_ms(),
            kind,
            backend: String::new(),
            zone: zone.to_owned(),
            model: Some(model.to_owned()),
            from: None,
            to: None,
            reason: reason.to_owned(),
        });
    }

    /// Records the global breaker opening or closing.
    pub fn breaker(&self, metrics: &Metrics, open: bool, reason: &str) {
        let kind = if open {
            "breaker_opened"
        } else {
            "breaker_closed"
        };
        tracing::warn!(event = kind, reason, "global breaker {kind}");
        metrics.health_events.with_label_values(&[kind]).inc();
        metrics.breaker_open.set(i64::from(open));
        self.keep(Event {
            at_ms: crate::clock::unix_ms(),
            kind,
            backend: String::new(),
            zone: String::new(),
            model: None,
            from: None,
            to: None,
            reason: reason.to_owned(),
        });
    }

    fn keep(&self, e: Event) {
        let mut events = self.events.lock();
        if events.len() == KEEP {
            events.pop_front();
        }
        events.push_back(e);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::health::state::Cause;

    #[test]
    fn the_time_from_ejection_to_rejoin_is_observed_once_per_ejection() {
        let cfg = Config::parse("t.toml", crate::config::tests::MINIMAL).unwrap();
        let b = Backend::new(&cfg.backends[0], &cfg.health, 0);
        let (log, metrics) = (EventLog::default(), Metrics::new());
        log.backend(&metrics, &b, Change::Ejected(Cause::Score), "score");
        // A second ejection while down keeps the first time.
        log.backend(&metrics, &b, Change::Ejected(Cause::Passive), "passive");
        log.backend(&metrics, &b, Change::Rejoined, "score recovered");
        log.backend(&metrics, &b, Change::Rejoined, "again");
        let h = metrics.ejection_duration.with_label_values(&["az-a"]);
        assert_eq!(h.get_sample_count(), 1);
        assert!(h.get_sample_sum() >= 0.0);
    }
}
