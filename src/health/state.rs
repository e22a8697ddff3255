//! The five-state health model of one backend: UNKNOWN → HEALTHY /
//! DEGRADED / UNSTABLE by smoothed score (with hysteresis between bands),
//! DOWN on a low score held for several evaluations or on consecutive
//! failed requests, and back only after a high score held for several
//! evaluations, as a canary that ramps up. Pure: time is passed in as
//! milliseconds, so every rule is a table row and nothing here can fail.

use std::time::Duration;

use serde::Serialize;

use super::score::smooth;
use crate::config::HealthConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// New or just added: no evaluation yet, slow start.
    Unknown,
    Healthy,
    Degraded,
    Unstable,
    /// Ejected: no traffic (outside panic mode), on the watch list.
    Down,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Healthy => "healthy",
            State::Degraded => "degraded",
            State::Unstable => "unstable",
            State::Down => "down",
        }
    }

    /// The value of the `zonegate_backend_state` gauge.
    pub fn code(self) -> i64 {
        match self {
            State::Unknown => 0,
            State::Healthy => 1,
            State::Degraded => 2,
            State::Unstable => 3,
            State::Down => 4,
        }
    }

    /// 0 is best; used to tell moving up a band from moving down.
    fn rank(self) -> u8 {
        match self {
            State::Healthy => 0,
            State::Degraded => 1,
            State::Unstable => 2,
            State::Unknown | State::Down => 3,
        }
    }
}

/// Why a backend was ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The smoothed score stayed below `eject_below`.
    Score,
    /// Consecutive real requests failed (connect refused, reset, 5xx,
    /// first-byte timeout).
    Passive,
    /// A provider refused the backend's credential (401/403).
    Credentials,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Score => "score",
            Cause::Passive => "passive",
            Cause::Credentials => "credentials",
        }
    }
}

/// A share of traffic that holds at `from` for `hold_ms`, then grows
/// linearly to 1.0 over `ramp_ms`: slow start for new backends, the canary
/// and its ramp for rejoining ones.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ramp {
    pub start_ms: u64,
    pub from: f64,
    pub hold_ms: u64,
    pub ramp_ms: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Ramp {
    pub fn slow_start(now_ms: u64, cfg: &HealthConfig) -> Ramp {
        Ramp {
            start_ms: now_ms,
            from: cfg.slow_start_share,
            hold_ms: 0,
            ramp_ms: ms(cfg.slow_start),
        }
    }

    pub fn canary(now_ms: u64, cfg: &HealthConfig) -> Ramp {
        Ramp {
            start_ms: now_ms,
            from: cfg.canary_share,
            hold_ms: ms(cfg.canary_time),
            ramp_ms: ms(cfg.rejoin_ramp),
        }
    }

    /// The share of its weight the backend gets at `now_ms`, in (0, 1].
    pub fn factor(&self, now_ms: u64) -> f64 {
        let t = now_ms.saturating_sub(self.start_ms);
        if t < self.hold_ms {
            return self.from;
        }
        let r = t - self.hold_ms;
        if self.ramp_ms == 0 || r >= self.ramp_ms {
            return 1.0;
        }
        self.from + (1.0 - self.from) * r as f64 / self.ramp_ms as f64
    }

    pub fn done(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.start_ms) >= self.hold_ms.saturating_add(self.ramp_ms)
    }
}

/// A change worth an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Between UNKNOWN, HEALTHY, DEGRADED and UNSTABLE.
    Moved {
        from: State,
        to: State,
    },
    Ejected(Cause),
    /// Back from DOWN, as a canary.
    Rejoined,
    /// Due for ejection, but the pool already has as many backends out as
    /// `max_ejected_percent` allows: it stays in, and its pool routes in
    /// panic mode.
    EjectionRefused,
}

/// The outcome of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    pub score: f64,
    /// The raw score moved more than `moving_delta` from the smoothed one:
    /// probe at the fast interval.
    pub moving: bool,
    pub change: Option<Change>,
}

/// One backend's health state. Owned by the health task; the request path
/// touches it only to record a passive ejection.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub state: State,
    /// Smoothed score; `None` before the first evaluation.
    pub score: Option<f64>,
    /// Consecutive evaluations below `eject_below` (not DOWN).
    pub low: u32,
    /// Consecutive evaluations above `rejoin_above` (DOWN).
    pub high: u32,
    pub ejections: u32,
    pub down_since_ms: u64,
    pub cause: Option<Cause>,
    pub ramp: Option<Ramp>,
    /// Its last due ejection was refused by the cap.
    pub refused: bool,
    /// Consecutive failed probes while DOWN, for the watch backoff.
    pub watch_failures: u32,
    pub moving: bool,
}

impl Machine {
    /// A new backend: UNKNOWN, in slow start from `now_ms`.
    pub fn new(now_ms: u64, cfg: &HealthConfig) -> Machine {
        Machine {
            state: State::Unknown,
            score: None,
            low: 0,
            high: 0,
            ejections: 0,
            down_since_ms: 0,
            cause: None,
            ramp: Some(Ramp::slow_start(now_ms, cfg)),
            refused: false,
            watch_failures: 0,
            moving: true,
        }
    }

    /// Feeds one evaluation's raw score. `may_eject` is asked only when an
    /// ejection is due (the pool-wide cap is the caller's knowledge).
    pub fn evaluate(
        &mut self,
        raw: f64,
        probe_ok: bool,
        now_ms: u64,
        cfg: &HealthConfig,
        may_eject: impl FnOnce() -> bool,
    ) -> Evaluation {
        let previous = self.score;
        let score = smooth(previous, raw, cfg.smoothing);
        self.score = Some(score);
        self.moving = previous.is_none_or(|p| (raw - p).abs() > cfg.moving_delta);
        if self.ramp.is_some_and(|r| r.done(now_ms)) {
            self.ramp = None;
        }
        let change = if self.state == State::Down {
            self.evaluate_down(score, probe_ok, now_ms, cfg)
        } else {
            self.evaluate_up(score, probe_ok, now_ms, cfg, may_eject)
        };
        Evaluation {
            score,
            moving: self.moving,
            change,
        }
    }

    fn evaluate_down(
        &mut self,
        score: f64,
        probe_ok: bool,
        now_ms: u64,
        cfg: &HealthConfig,
    ) -> Option<Change> {
        self.watch_failures = if probe_ok { 0 } else { self.watch_failures + 1 };
        self.high = if score > cfg.rejoin_above {
            self.high + 1
        } else {
            0
        };
        let watched_long_enough =
            now_ms >= self.down_since_ms.saturating_add(ms(self.watch_time(cfg)));
        if self.high < cfg.healthy_threshold || !watched_long_enough {
            return None;
        }
        self.rejoin(score, now_ms, cfg)
    }

    fn evaluate_up(
        &mut self,
        score: f64,
        probe_ok: bool,
        now_ms: u64,
        cfg: &HealthConfig,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Change> {
        self.low = if score < cfg.eject_below {
            self.low + 1
        } else {
            0
        };
        if self.low >= cfg.unhealthy_threshold {
            if may_eject() {
                self.eject(Cause::Score, now_ms);
                self.watch_failures = u32::from(!probe_ok);
                return Some(Change::Ejected(Cause::Score));
            }
            return self.refuse_ejection();
        }
        self.refused = false;
        let to = band(self.state, score, cfg);
        if to == self.state {
            return None;
        }
        let from = std::mem::replace(&mut self.state, to);
        Some(Change::Moved { from, to })
    }

    /// `streak` consecutive real requests have failed. Ejects when it
    /// reaches `passive_failures`, within the pool-wide cap like a score
    /// ejection (`may_eject`, Envoy's outlier detection does the same): one
    /// tenant's poison requests must not take a whole model down. Beyond
    /// the cap the backend stays in as UNSTABLE and its pool routes in
    /// panic mode.
    pub fn passive_failures(
        &mut self,
        streak: u32,
        now_ms: u64,
        cfg: &HealthConfig,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Change> {
        if self.state == State::Down || streak < cfg.passive_failures {
            return None;
        }
        if may_eject() {
            self.eject(Cause::Passive, now_ms);
            return Some(Change::Ejected(Cause::Passive));
        }
        self.refuse_ejection()
    }

    /// A provider refused the backend's credential: DOWN at once, beyond
    /// the pool-wide cap (it cannot serve anyone); `None` if it was DOWN.
    pub fn credentials_refused(&mut self, now_ms: u64) -> Option<Change> {
        if self.state == State::Down {
            return None;
        }
        self.eject(Cause::Credentials, now_ms);
        Some(Change::Ejected(Cause::Credentials))
    }

    /// Back from DOWN as a canary, in the band `score` places it.
    fn rejoin(&mut self, score: f64, now_ms: u64, cfg: &HealthConfig) -> Option<Change> {
        self.state = band(State::Unknown, score, cfg);
        self.ramp = Some(Ramp::canary(now_ms, cfg));
        self.high = 0;
        self.low = 0;
        self.cause = None;
        self.watch_failures = 0;
        Some(Change::Rejoined)
    }

    /// An ejection was due but the pool-wide cap said no: the backend stays
    /// in as UNSTABLE. The refusal is an event once; a later move into
    /// UNSTABLE is a state change; staying there is nothing.
    fn refuse_ejection(&mut self) -> Option<Change> {
        let (was_refused, from) = (self.refused, self.state);
        self.refused = true;
        self.state = State::Unstable;
        if !was_refused {
            Some(Change::EjectionRefused)
        } else if from != State::Unstable {
            Some(Change::Moved {
                from,
                to: State::Unstable,
            })
        } else {
            None
        }
    }

    /// A trial request (half-open, see `Backend::claim_trial`) succeeded
    /// while the backend was out: it rejoins early, as a canary.
    pub fn trial_succeeded(&mut self, now_ms: u64, cfg: &HealthConfig) -> Option<Change> {
        if self.state != State::Down {
            return None;
        }
        let score = self.score.unwrap_or(cfg.rejoin_above).max(cfg.rejoin_above);
        self.rejoin(score, now_ms, cfg)
    }

    fn eject(&mut self, cause: Cause, now_ms: u64) {
        self.state = State::Down;
        self.cause = Some(cause);
        self.ejections += 1;
        self.down_since_ms = now_ms;
        self.low = 0;
        self.high = 0;
        self.ramp = None;
        self.refused = false;
        self.watch_failures = 0;
    }

    /// How long the n-th ejection keeps a backend out at least: n × the
    /// base time, capped (Envoy's outlier detection does the same).
    pub fn watch_time(&self, cfg: &HealthConfig) -> Duration {
        cfg.ejection_time
            .saturating_mul(self.ejections.max(1))
            .min(cfg.max_ejection_time)
    }

    /// The state's weight multiplier times the slow-start/canary ramp.
    pub fn factor(&self, now_ms: u64, cfg: &HealthConfig) -> f64 {
        let m = match self.state {
            State::Unknown | State::Healthy => 1.0,
            State::Degraded => cfg.degraded_multiplier,
            State::Unstable => cfg.unstable_multiplier,
            State::Down => 0.0,
        };
        m * self.ramp.map_or(1.0, |r| r.factor(now_ms))
    }

    /// Whether the health model counts this backend as bad for the pool
    /// cap and panic mode.
    pub fn is_bad(&self) -> bool {
        self.state == State::Down || self.refused
    }

    /// When to probe next. `unit` is a uniform draw in [0, 1) for the
    /// jitter, passed in so this stays a pure function.
    pub fn next_probe(&self, cfg: &HealthConfig, unit: f64) -> Duration {
        let base = match self.state {
            // Failing probes on the watch list back off exponentially; a
            // passing one switches to the fast interval to gather the
            // evaluations a rejoin needs.
            State::Down if self.watch_failures > 0 => {
                let doublings = (self.watch_failures - 1).min(16);
                cfg.watch_interval
                    .saturating_mul(1 << doublings)
                    .min(cfg.max_watch_interval)
            }
            State::Healthy if !self.moving => cfg.stable_interval,
            _ => cfg.interval,
        };
        base.mul_f64(1.0 - cfg.jitter + 2.0 * cfg.jitter * unit.clamp(0.0, 1.0))
    }
}

/// The band for `score`, moving up only past the boundary plus the margin
/// so a score hovering on a boundary does not flap between two bands.
fn band(current: State, score: f64, cfg: &HealthConfig) -> State {
    let at = |margin: f64| {
        if score >= cfg.healthy_above + margin {
            State::Healthy
        } else if score >= cfg.degraded_above + margin {
            State::Degraded
        } else {
            State::Unstable
        }
    };
    let plain = at(0.0);
    match current {
        State::Unknown | State::Down => plain,
        cur if plain.rank() > cur.rank() => plain,
        cur => {
            let up = at(cfg.band_margin);
            if up.rank() < cur.rank() {
                up
            } else {
                cur
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use State::*;

    fn cfg() -> HealthConfig {
        HealthConfig::default()
    }

    /// Runs raw scores through a machine, one evaluation every 2 s, and
    /// returns the state after each.
    fn run(m: &mut Machine, start_ms: u64, raws: &[f64], may_eject: bool) -> Vec<State> {
        let c = cfg();
        raws.iter()
            .enumerate()
            .map(|(i, &raw)| {
                let now = start_ms + 2_000 * i as u64;
                m.evaluate(raw, raw > 0.0, now, &c, || may_eject);
                m.state
            })
            .collect()
    }

    #[test]
    fn transition_table() {
        // (what, raw scores, may eject, expected state after each)
        let cases: &[(&str, &[f64], bool, &[State])] = &[
            ("first evaluation places it", &[100.0], true, &[Healthy]),
            ("first evaluation, middling", &[70.0], true, &[Degraded]),
            ("first evaluation, poor", &[40.0], true, &[Unstable]),
            (
                "one bad evaluation never ejects",
                &[100.0, 0.0, 100.0, 100.0],
                true,
                // 50, 75, 87.5: back up one band at a time, HEALTHY only
                // past 85 + the 5-point margin.
                &[Healthy, Unstable, Degraded, Degraded],
            ),
            (
                "three evaluations under 30 eject",
                // smoothed: 100, 50, 25, 12.5, 6.25
                &[100.0, 0.0, 0.0, 0.0, 0.0],
                true,
                &[Healthy, Unstable, Unstable, Unstable, Down],
            ),
            (
                "the cap refuses: unstable, not down",
                &[100.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                false,
                &[Healthy, Unstable, Unstable, Unstable, Unstable, Unstable],
            ),
            (
                "deep queue (80) degrades without ejecting",
                &[100.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0],
                true,
                // smoothed: 100, 90, 85, 82.5, 81.25, ...
                &[
                    Healthy, Healthy, Healthy, Degraded, Degraded, Degraded, Degraded, Degraded,
                ],
            ),
            (
                "alternating good and bad never ejects",
                &[100.0, 0.0, 100.0, 0.0, 100.0, 0.0, 100.0, 0.0, 100.0, 0.0],
                true,
                &[
                    Healthy, Unstable, Degraded, Unstable, Degraded, Unstable, Degraded, Unstable,
                    Degraded, Unstable,
                ],
            ),
        ];
        for (what, raws, may_eject, want) in cases {
            let mut m = Machine::new(0, &cfg());
            let got = run(&mut m, 0, raws, *may_eject);
            assert_eq!(&got, want, "{what}");
        }
    }

    #[test]
    fn hovering_on_a_band_boundary_does_not_flap() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        m.evaluate(100.0, true, 0, &c, || true);
        let mut states = Vec::new();
        // Raw scores around the HEALTHY boundary (85) settle the smoothed
        // score between 84 and 87: it drops once and stays.
        for (i, raw) in [84.0, 86.0, 84.0, 87.0, 84.0, 86.0, 85.0, 84.0]
            .iter()
            .enumerate()
        {
            m.evaluate(*raw, true, 2_000 * (i as u64 + 1), &c, || true);
            states.push(m.state);
        }
        let changes = states.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes <= 1, "{states:?}");
    }

    fn ejected(c: &HealthConfig, now: u64) -> Machine {
        let mut m = Machine::new(0, c);
        for i in 0..3 {
            m.evaluate(0.0, false, now + i, c, || true);
        }
        assert_eq!(m.state, Down, "three evaluations under 30");
        m
    }

    #[test]
    fn rejoin_needs_five_high_evaluations_and_the_watch_time() {
        let c = cfg();
        let mut m = ejected(&c, 0);
        assert_eq!(m.cause, Some(Cause::Score));
        // Smoothed from ~0: 50, 75, 87.5, 93.75, 96.9, 98.4 → the 2nd is
        // the first above 70, so the 6th evaluation completes five.
        let start = 60_000; // past the 30 s watch time
        let states = run(&mut m, start, &[100.0; 6], true);
        assert_eq!(states, [Down, Down, Down, Down, Down, Healthy]);
        assert!(m.ramp.is_some(), "rejoins as a canary");
        assert!((m.factor(start + 10_000, &c) - c.canary_share).abs() < 1e-9);
    }

    #[test]
    fn rejoin_waits_out_the_watch_time_even_when_scores_are_high() {
        let c = cfg();
        let mut m = ejected(&c, 0);
        let states = run(&mut m, 1_000, &[100.0; 8], true);
        // Eight evaluations 2 s apart end at 15 s, inside the 30 s watch.
        assert!(states.iter().all(|s| *s == Down), "{states:?}");
        m.evaluate(100.0, true, 31_000, &c, || true);
        assert_eq!(m.state, Healthy);
    }

    #[test]
    fn alternating_good_and_bad_never_rejoins() {
        let c = cfg();
        let mut m = ejected(&c, 0);
        let raws: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { 100.0 } else { 0.0 })
            .collect();
        let states = run(&mut m, 60_000, &raws, true);
        assert!(states.iter().all(|s| *s == Down), "{states:?}");
    }

    #[test]
    fn passive_failures_eject_at_once_and_only_once() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        assert_eq!(m.passive_failures(4, 10, &c, || true), None);
        assert_eq!(
            m.passive_failures(5, 10, &c, || true),
            Some(Change::Ejected(Cause::Passive))
        );
        assert_eq!(m.passive_failures(6, 11, &c, || true), None, "already out");
        assert_eq!(m.ejections, 1);
    }

    #[test]
    fn passive_failures_beyond_the_cap_keep_the_backend_in_as_unstable() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        assert_eq!(
            m.passive_failures(5, 10, &c, || false),
            Some(Change::EjectionRefused)
        );
        assert_eq!((m.state, m.refused, m.ejections), (Unstable, true, 0));
        assert_eq!(
            m.passive_failures(6, 11, &c, || false),
            None,
            "refused once, said once"
        );
    }

    #[test]
    fn a_successful_trial_rejoins_an_ejected_backend_as_a_canary() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        assert_eq!(m.trial_succeeded(5, &c), None, "not out");
        m.passive_failures(5, 10, &c, || true);
        assert_eq!(m.trial_succeeded(1_000, &c), Some(Change::Rejoined));
        assert_ne!(m.state, State::Down);
        assert_eq!(m.ramp, Some(Ramp::canary(1_000, &c)));
    }

    #[test]
    fn repeat_ejections_lengthen_the_watch_time_up_to_the_cap() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        let mut times = Vec::new();
        for n in 1..=12u64 {
            m.passive_failures(5, n, &c, || true);
            times.push(m.watch_time(&c).as_secs());
            m.state = Healthy;
        }
        assert_eq!(&times[..4], &[30, 60, 90, 120]);
        assert_eq!(*times.last().unwrap(), 300);
    }

    #[test]
    fn ramps_hold_then_grow_linearly() {
        let c = cfg();
        let slow = Ramp::slow_start(1_000, &c);
        assert!((slow.factor(1_000) - 0.01).abs() < 1e-9);
        assert!((slow.factor(1_000 + 150_000) - 0.505).abs() < 1e-9);
        assert_eq!(slow.factor(1_000 + 300_000), 1.0);
        assert!(slow.done(301_000) && !slow.done(300_999));
        let canary = Ramp::canary(0, &c);
        assert_eq!(canary.factor(29_999), 0.05);
        assert!((canary.factor(30_000 + 60_000) - 0.525).abs() < 1e-9);
        assert_eq!(canary.factor(150_000), 1.0);
    }

    #[test]
    fn probe_interval_table() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        let secs = |m: &Machine| m.next_probe(&c, 0.5).as_secs_f64();
        assert_eq!(secs(&m), 2.0, "unknown: fast");
        m.evaluate(100.0, true, 0, &c, || true);
        assert_eq!(secs(&m), 2.0, "first evaluation moved");
        m.evaluate(100.0, true, 2_000, &c, || true);
        assert_eq!(secs(&m), 10.0, "healthy and steady: stable");
        m.evaluate(80.0, true, 4_000, &c, || true);
        assert_eq!(secs(&m), 2.0, "score moving: fast");
        let mut down = ejected(&c, 0);
        assert_eq!(secs(&down), 30.0, "ejected with a failed probe");
        let mut backoff = Vec::new();
        for i in 0..6 {
            down.evaluate(0.0, false, 10_000 + i, &c, || true);
            backoff.push(secs(&down));
        }
        assert_eq!(backoff, [60.0, 120.0, 240.0, 300.0, 300.0, 300.0]);
        down.evaluate(100.0, true, 20_000, &c, || true);
        assert_eq!(secs(&down), 2.0, "a passing probe ends the backoff");
        // Jitter: ±10% around the base, never in lockstep.
        assert!((m.next_probe(&c, 0.0).as_secs_f64() - 1.8).abs() < 1e-9);
        assert!((m.next_probe(&c, 0.999_999).as_secs_f64() - 2.2).abs() < 1e-3);
    }

    #[test]
    fn factors_follow_state_and_ramp() {
        let c = cfg();
        let mut m = Machine::new(0, &c);
        m.ramp = None;
        for (state, want) in [
            (Healthy, 1.0),
            (Degraded, 0.6),
            (Unstable, 0.2),
            (Down, 0.0),
        ] {
            m.state = state;
            assert_eq!(m.factor(0, &c), want, "{state:?}");
        }
    }
}
