//! The retry budget: retries may add at most `ratio` of the requests seen in
//! a sliding window (plus a small floor), so a failing fleet is not buried
//! under its own retries. Pure: callers pass the time in.

use std::collections::VecDeque;

/// Sliding-window counts of requests and retries in one-second buckets.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    window_s: u64,
    min_retries: u64,
    /// (second, requests, retries), oldest first.
    buckets: VecDeque<(u64, u64, u64)>,
}

impl RetryBudget {
    pub fn new(ratio: f64, window_s: u64, min_retries: u64) -> Self {
        Self {
            ratio,
            window_s: window_s.max(1),
            min_retries,
            buckets: VecDeque::new(),
        }
    }

    /// Drops buckets that left the window and opens the one for `now_s`.
    fn advance(&mut self, now_s: u64) {
        while self
            .buckets
            .front()
            .is_some_and(|b| b.0 + self.window_s <= now_s)
        {
            self.buckets.pop_front();
        }
        if self.buckets.back().is_none_or(|b| b.0 != now_s) {
            self.buckets.push_back((now_s, 0, 0));
        }
    }

    /// Counts one client request.
    pub fn record_request(&mut self, now_s: u64) {
        self.advance(now_s);
        if let Some(b) = self.buckets.back_mut() {
            b.1 += 1;
        }
    }

    /// Takes one retry from the budget if there is room, and counts it.
    pub fn try_retry(&mut self, now_s: u64) -> bool {
        self.advance(now_s);
        let (requests, retries) = self
            .buckets
            .iter()
            .fold((0, 0), |(q, r), b| (q + b.1, r + b.2));
        let allowed = ((requests as f64 * self.ratio) as u64).max(self.min_retries);
        if retries >= allowed {
            return false;
        }
        if let Some(b) = self.buckets.back_mut() {
            b.2 += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_capped_at_the_ratio_of_requests() {
        let mut b = RetryBudget::new(0.2, 10, 0);
        for _ in 0..100 {
            b.record_request(5);
        }
        let granted = (0..100).filter(|_| b.try_retry(5)).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn the_floor_allows_retries_on_a_quiet_node() {
        let mut b = RetryBudget::new(0.2, 10, 3);
        b.record_request(0);
        let granted = (0..10).filter(|_| b.try_retry(0)).count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn old_buckets_leave_the_window() {
        let mut b = RetryBudget::new(0.5, 10, 0);
        for _ in 0..10 {
            b.record_request(0);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(0)).count(), 5);
        assert!(!b.try_retry(9), "still inside the window");
        // At t=10 the second-0 bucket (requests and retries) has expired.
        assert!(!b.try_retry(10), "no requests left in the window");
        for _ in 0..4 {
            b.record_request(10);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(10)).count(), 2);
    }
}
