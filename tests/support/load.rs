//! Open-loop request load for quota tests: a rate per node, every
//! answer's status recorded with when it was sent, and the tally of one
//! measurement window.

// Test code: a poisoned lock is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{chat_body, client};

/// (node index, send time, status; 0 when no answer) of every request.
type Samples = Arc<Mutex<Vec<(usize, Instant, u16)>>>;

/// Chat requests sent to each node at its own rate until stopped, whatever
/// the answers (open loop: a slow answer does not slow the load).
pub struct OpenLoop {
    samples: Samples,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What one window admitted.
#[derive(Debug)]
pub struct Tally {
    /// Requests sent in the window.
    pub offered: usize,
    /// Of them, answered 200.
    pub admitted: usize,
    /// Admitted per node, in the order the nodes were given.
    pub per_node: Vec<usize>,
    /// Statuses other than 200 and 429 (none expected).
    pub others: Vec<u16>,
}

impl Tally {
    /// `admitted` over what `rpm` allows in the window.
    pub fn ratio(&self, rpm: u64, window: Duration) -> f64 {
        self.admitted as f64 / (rpm as f64 * window.as_secs_f64() / 60.0)
    }

    /// Asserts that every answer was a 200 or a 429 and that the window
    /// admitted 0.95 to 1.05 times what `rpm` allows; returns the
    /// admitted count per node.
    pub fn assert_limit_held(&self, rpm: u64, window: Duration) -> &[usize] {
        assert!(
            self.others.is_empty(),
            "only 200 and 429 expected: {:?}",
            self.others
        );
        let (ratio, per_node) = (self.ratio(rpm, window), &self.per_node);
        eprintln!(
            "offered {} in {window:?}, admitted {} ({ratio:.3} of the limit), per node {per_node:?}",
            self.offered, self.admitted
        );
        assert!(
            (0.95..=1.05).contains(&ratio),
            "admitted {ratio:.3} of the limit; per node {per_node:?}"
        );
        per_node
    }
}

impl OpenLoop {
    /// Twice what `rpm` allows, split 70/20/10 over the nodes whose data
    /// planes are `data`: uneven demand on one shared limit.
    pub fn uneven(key: &str, data: &[&str], rpm: u64) -> OpenLoop {
        let total_per_s = 2.0 * rpm as f64 / 60.0;
        let targets: Vec<_> = data
            .iter()
            .zip([0.7, 0.2, 0.1])
            .map(|(url, share)| (format!("{url}/v1/chat/completions"), share * total_per_s))
            .collect();
        OpenLoop::start(key, &targets)
    }

    /// Starts `(chat completions URL, requests per second)` per node, all
    /// with `key`.
    pub fn start(key: &str, targets: &[(String, f64)]) -> OpenLoop {
        let samples: Samples = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = targets
            .iter()
            .enumerate()
            .map(|(i, (url, rate))| {
                let (samples, stop) = (Arc::clone(&samples), Arc::clone(&stop));
                let (url, key, every) = (url.clone(), key.to_owned(), 1.0 / rate);
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs_f64(every));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    let c = client();
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let (c, url, key) = (c.clone(), url.clone(), key.clone());
                        let samples = Arc::clone(&samples);
                        tokio::spawn(async move {
                            let sent = Instant::now();
                            let status = match c
                                .post(url)
                                .bearer_auth(key)
                                .json(&chat_body(8, false))
                                .send()
                                .await
                            {
                                Ok(r) => r.status().as_u16(),
                                Err(_) => 0,
                            };
                            samples.lock().unwrap().push((i, sent, status));
                        });
                    }
                })
            })
            .collect();
        OpenLoop {
            samples,
            stop,
            tasks,
        }
    }

    /// Runs the load for `window`, stops it, lets the last answers arrive
    /// and tallies the requests sent within the window.
    pub async fn measure(self, window: Duration) -> Tally {
        let from = Instant::now();
        tokio::time::sleep(window).await;
        let to = Instant::now();
        self.stop.store(true, Ordering::Relaxed);
        let nodes = self.tasks.len();
        for t in self.tasks {
            let _ = t.await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let samples = self.samples.lock().unwrap().clone();
        let in_window: Vec<_> = samples
            .iter()
            .filter(|(_, t, _)| *t >= from && *t < to)
            .collect();
        let ok = |n: &usize| {
            in_window
                .iter()
                .filter(|(i, _, s)| i == n && *s == 200)
                .count()
        };
        Tally {
            offered: in_window.len(),
            admitted: in_window.iter().filter(|(_, _, s)| *s == 200).count(),
            per_node: (0..nodes).map(|n| ok(&n)).collect(),
            others: in_window
                .iter()
                .map(|(_, _, s)| *s)
                .filter(|s| *s != 200 && *s != 429)
                .collect(),
        }
    }
}
