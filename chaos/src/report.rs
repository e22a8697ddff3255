//! The drill report: one [`Report`] value written three ways: `report.md`
//! (verdict first, then each expectation with its measured figure, then
//! the timeline), `report.html` (the same on one self-contained page with
//! an inline SVG timeline of success rate, p99 latency and per-zone
//! traffic share per second) and `report.json` (everything, for CI and
//! week-over-week comparison). The HTML is well-formed XML (every element
//! closed, only XML's five entities) so a strict parser can check it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::history::{Ack, Held, Tick};
use crate::load::{Class, Sample};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    /// Stopped before the end (Ctrl-C, an alarm): faults were restored.
    #[serde(rename = "ABORTED")]
    Aborted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Aborted => "ABORTED",
        }
    }
}

/// One expectation and what was measured.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub expected: String,
    pub measured: String,
    /// `None` (JSON `null`): not evaluated, because the drill was aborted
    /// (what it measured until then proves nothing either way).
    pub pass: Option<bool>,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.pass == Some(true)
    }

    pub fn failed(&self) -> bool {
        self.pass == Some(false)
    }

    /// The expectation of a drill that was aborted: neither met nor
    /// missed.
    pub fn not_evaluated(self) -> Check {
        Check {
            measured: NOT_EVALUATED.into(),
            pass: None,
            ..self
        }
    }

    /// The mark a report shows for it: ✔, ✘, or – (not evaluated).
    fn mark(&self) -> (&'static str, &'static str) {
        match self.pass {
            Some(true) => ("pass", "✔"),
            Some(false) => ("fail", "✘"),
            None => ("not-evaluated", "–"),
        }
    }
}

/// What an aborted drill's expectations measured.
pub const NOT_EVALUATED: &str = "not evaluated: the drill was aborted";

#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    pub index: usize,
    pub action: String,
    pub description: String,
    pub planned_at_ms: Option<i64>,
    pub started_ms: i64,
    pub ended_ms: i64,
    pub ok: bool,
    pub detail: String,
}

/// A point on the timeline, ms from t = 0.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub t_ms: i64,
    /// `fault`, `restore`, `decision`, `leader`, `step`, `abort`.
    pub kind: String,
    pub text: String,
}

/// When a decision happened, measured from the fault (or `ctl` command)
/// that preceded it: detect (the leader proposed) → commit (a node
/// reported it) → applied everywhere → traffic moved.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionTiming {
    pub version: u64,
    pub kind: String,
    pub origin: String,
    pub zones: Vec<String>,
    pub actor: String,
    pub reason: String,
    pub proposed_ms: i64,
    pub first_seen_ms: i64,
    pub applied_everywhere_ms: Option<i64>,
    pub traffic_moved_ms: Option<i64>,
    /// What the times below are measured from (`fault at …`, `ctl at …`).
    pub since: Option<String>,
    pub detect_ms: Option<i64>,
    pub commit_ms: Option<i64>,
    pub apply_ms: Option<i64>,
    pub traffic_ms: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassStats {
    pub total: u64,
    pub ok: u64,
    pub success: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadSummary {
    pub target_rps: f64,
    pub achieved_rps: f64,
    pub sent: u64,
    /// Due but not sent: the generator's own limit was reached.
    pub not_sent: u64,
    /// From t = 0 to the end of the load.
    pub by_class: BTreeMap<String, ClassStats>,
    /// Short requests' p99 in the warm-up, before any fault.
    pub baseline_p99_ms: Option<f64>,
}

/// One second of load.
#[derive(Clone, Debug, Serialize)]
pub struct Second {
    pub t: i64,
    pub sent: u64,
    pub ok: u64,
    pub short_total: u64,
    pub short_ok: u64,
    pub success: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Zone that answered → share of the second's answers.
    pub zone_share: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Restore {
    pub actions: Vec<String>,
    /// Every mock's faults read back equal to the drill's start, every node
    /// running and answering.
    pub verified: bool,
    pub problems: Vec<String>,
}

/// Everything a drill produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub file: String,
    pub description: String,
    pub target: String,
    pub verdict: Verdict,
    pub exit_code: u8,
    /// Why the drill stopped early, if it did.
    pub reason: Option<String>,
    pub started_unix_ms: u64,
    pub t0_unix_ms: u64,
    pub wall_ms: u64,
    pub checks: Vec<Check>,
    pub steps: Vec<StepRecord>,
    pub events: Vec<Event>,
    pub decisions: Vec<DecisionTiming>,
    pub leader_changes: Vec<(i64, u64, u64)>,
    pub load: LoadSummary,
    pub series: Vec<Second>,
    pub restore: Restore,
    pub notes: Vec<String>,
    pub acks: Vec<Ack>,
    pub final_histories: BTreeMap<u64, Vec<Held>>,
    pub ticks: Vec<Tick>,
}

/// The `q` quantile (0–1) of `v` (sorted in place); `None` when empty.
pub fn quantile(v: &mut [f32], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f32::total_cmp);
    let idx = ((v.len() as f64 - 1.0) * q).round() as usize;
    Some(f64::from(v[idx.min(v.len() - 1)]))
}

pub fn class_name(c: Class) -> &'static str {
    match c {
        Class::Short => "short",
        Class::Long => "long",
        Class::Stream => "stream",
    }
}

/// Success and latency per class over samples sent in `[from, to)`.
pub fn class_stats(samples: &[Sample], from: i64, to: i64) -> BTreeMap<String, ClassStats> {
    let mut out = BTreeMap::new();
    for class in [Class::Short, Class::Long, Class::Stream] {
        let mut lat: Vec<f32> = Vec::new();
        let (mut total, mut ok) = (0u64, 0u64);
        for s in samples
            .iter()
            .filter(|s| s.class == class && s.t_ms >= from && s.t_ms < to)
        {
            total += 1;
            if s.ok {
                ok += 1;
                lat.push(s.latency_ms);
            }
        }
        let p50 = quantile(&mut lat, 0.5);
        out.insert(
            class_name(class).to_owned(),
            ClassStats {
                total,
                ok,
                success: (total > 0).then(|| ok as f64 / total as f64),
                p50_ms: p50,
                p99_ms: quantile(&mut lat, 0.99),
            },
        );
    }
    out
}

/// Per-second series over every sample.
pub fn series(samples: &[Sample]) -> Vec<Second> {
    let mut by_sec: BTreeMap<i64, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_sec.entry(s.t_ms.div_euclid(1000)).or_default().push(s);
    }
    by_sec
        .into_iter()
        .map(|(t, ss)| {
            let sent = ss.len() as u64;
            let ok = ss.iter().filter(|s| s.ok).count() as u64;
            let short: Vec<&&Sample> = ss.iter().filter(|s| s.class == Class::Short).collect();
            let mut lat: Vec<f32> = ss.iter().filter(|s| s.ok).map(|s| s.latency_ms).collect();
            let mut zones: BTreeMap<String, u64> = BTreeMap::new();
            for s in ss.iter().filter(|s| s.ok) {
                if let Some(z) = &s.zone {
                    *zones.entry(z.to_string()).or_default() += 1;
                }
            }
            let answered: u64 = zones.values().sum();
            Second {
                t,
                sent,
                ok,
                short_total: short.len() as u64,
                short_ok: short.iter().filter(|s| s.ok).count() as u64,
                success: (sent > 0).then(|| ok as f64 / sent as f64),
                p99_ms: quantile(&mut lat, 0.99),
                zone_share: zones
                    .into_iter()
                    .map(|(z, n)| (z, n as f64 / answered.max(1) as f64))
                    .collect(),
            }
        })
        .collect()
}

fn secs(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn opt_secs(ms: Option<i64>) -> String {
    ms.map(secs).unwrap_or_else(|| "–".into())
}

impl Report {
    /// Writes `report.md`, `report.html` and `report.json` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        std::fs::write(dir.join("report.html"), self.html())?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)
    }

    fn headline(&self) -> String {
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.failed())
            .map(|c| c.name.as_str())
            .collect();
        match (self.verdict, &self.reason) {
            (Verdict::Pass, _) => format!(
                "PASS: {} of {} expectations met",
                self.checks.len(),
                self.checks.len()
            ),
            (Verdict::Fail, _) => format!("FAIL: {} not met", failed.join(", ")),
            (Verdict::Aborted, Some(r)) => format!("ABORTED: {r}"),
            (Verdict::Aborted, None) => "ABORTED".into(),
        }
    }

    /// Timeline rows: (t_ms, kind, text), sorted.
    fn timeline(&self) -> Vec<(i64, String, String)> {
        let mut rows: Vec<(i64, String, String)> = self
            .events
            .iter()
            .map(|e| (e.t_ms, e.kind.clone(), e.text.clone()))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }

    pub fn markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "# Drill `{}`: {}\n", self.scenario, self.headline());
        if !self.description.is_empty() {
            let _ = writeln!(m, "{}\n", self.description);
        }
        let _ = writeln!(
            m,
            "Target: {} · scenario file `{}` · {:.0} s wall time · load {:.0} req/s wanted, {:.0} req/s sent ({} not sent by the generator).\n",
            self.target,
            self.file,
            self.wall_ms as f64 / 1000.0,
            self.load.target_rps,
            self.load.achieved_rps,
            self.load.not_sent
        );
        let _ = writeln!(
            m,
            "## Expectations\n\n| | expectation | wanted | measured |\n| --- | --- | --- | --- |"
        );
        for c in &self.checks {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} |",
                match c.pass {
                    Some(true) => "✅",
                    Some(false) => "❌",
                    None => "–",
                },
                c.name,
                c.expected,
                c.measured.replace('|', "\\|")
            );
        }
        let _ = writeln!(
            m,
            "\n## Decisions: detect → commit → applied everywhere → traffic moved\n"
        );
        if self.decisions.is_empty() {
            let _ = writeln!(m, "No decision was committed during the drill.");
        } else {
            let _ = writeln!(m, "| version | kind | origin | zones | measured from | detect | commit | applied everywhere | traffic moved |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
            for d in &self.decisions {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    d.version,
                    d.kind,
                    d.origin,
                    d.zones.join(", "),
                    d.since.clone().unwrap_or_else(|| "–".into()),
                    opt_secs(d.detect_ms),
                    opt_secs(d.commit_ms),
                    opt_secs(d.apply_ms),
                    opt_secs(d.traffic_ms)
                );
            }
        }
        let _ = writeln!(m, "\n## Timeline (t = 0 is the first step's clock)\n\n| t | what | |\n| --- | --- | --- |");
        for (t, kind, text) in self.timeline() {
            let _ = writeln!(m, "| {} | {kind} | {} |", secs(t), text.replace('|', "\\|"));
        }
        let _ = writeln!(m, "\n## Load\n\n| class | requests | success | p50 | p99 |\n| --- | --- | --- | --- | --- |");
        for (name, c) in &self.load.by_class {
            if c.total == 0 {
                continue;
            }
            let _ = writeln!(
                m,
                "| {name} | {} | {} | {} | {} |",
                c.total,
                c.success
                    .map(|s| format!("{:.3}%", s * 100.0))
                    .unwrap_or_default(),
                c.p50_ms.map(|v| format!("{v:.1} ms")).unwrap_or_default(),
                c.p99_ms.map(|v| format!("{v:.1} ms")).unwrap_or_default()
            );
        }
        let _ = writeln!(m, "\n## Restore\n");
        let _ = writeln!(
            m,
            "{}",
            if self.restore.verified {
                "Every fault was restored and checked: each mock backend's faults read back as at the start, every node runs and answers."
            } else {
                "Restore could NOT be verified:"
            }
        );
        for p in &self.restore.problems {
            let _ = writeln!(m, "- {p}");
        }
        for a in &self.restore.actions {
            let _ = writeln!(m, "- {a}");
        }
        if !self.notes.is_empty() {
            let _ = writeln!(m, "\n## Notes\n");
            for n in &self.notes {
                let _ = writeln!(m, "- {n}");
            }
        }
        m
    }

    pub fn html(&self) -> String {
        let mut h = String::new();
        let verdict_class = match self.verdict {
            Verdict::Pass => "pass",
            _ => "fail",
        };
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>{title}</title><style>{css}</style></head><body>",
            title = esc(&format!("Drill {}: {}", self.scenario, self.verdict.as_str())),
            css = CSS
        );
        let _ = write!(
            h,
            "<h1 class=\"{verdict_class}\">{}</h1><p>{}</p><p class=\"meta\">Target {} · <code>{}</code> · {:.0} s · load {:.0} req/s wanted, {:.0} sent, {} not sent by the generator</p>",
            esc(&format!("Drill {}: {}", self.scenario, self.headline())),
            esc(&self.description),
            esc(&self.target),
            esc(&self.file),
            self.wall_ms as f64 / 1000.0,
            self.load.target_rps,
            self.load.achieved_rps,
            self.load.not_sent
        );
        h.push_str("<h2>Expectations</h2><table><thead><tr><th></th><th>expectation</th><th>wanted</th><th>measured</th></tr></thead><tbody>");
        for c in &self.checks {
            let _ = write!(
                h,
                "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                c.mark().0,
                c.mark().1,
                esc(&c.name),
                esc(&c.expected),
                esc(&c.measured)
            );
        }
        h.push_str("</tbody></table><h2>Timeline</h2>");
        h.push_str(&self.svg());
        h.push_str("<h2>Decisions: detect → commit → applied everywhere → traffic moved</h2>");
        if self.decisions.is_empty() {
            h.push_str("<p>No decision was committed during the drill.</p>");
        } else {
            h.push_str("<table><thead><tr><th>version</th><th>kind</th><th>origin</th><th>zones</th><th>measured from</th><th>detect</th><th>commit</th><th>applied everywhere</th><th>traffic moved</th></tr></thead><tbody>");
            for d in &self.decisions {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    d.version,
                    esc(&d.kind),
                    esc(&d.origin),
                    esc(&d.zones.join(", ")),
                    esc(d.since.as_deref().unwrap_or("–")),
                    opt_secs(d.detect_ms),
                    opt_secs(d.commit_ms),
                    opt_secs(d.apply_ms),
                    opt_secs(d.traffic_ms)
                );
            }
            h.push_str("</tbody></table>");
        }
        h.push_str(
            "<h2>Events</h2><table><thead><tr><th>t</th><th>what</th><th></th></tr></thead><tbody>",
        );
        for (t, kind, text) in self.timeline() {
            let _ = write!(
                h,
                "<tr class=\"ev-{}\"><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&kind),
                secs(t),
                esc(&kind),
                esc(&text)
            );
        }
        h.push_str("</tbody></table><h2>Load</h2><table><thead><tr><th>class</th><th>requests</th><th>success</th><th>p50</th><th>p99</th></tr></thead><tbody>");
        for (name, c) in &self.load.by_class {
            if c.total == 0 {
                continue;
            }
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                c.total,
                c.success
                    .map(|s| format!("{:.3}%", s * 100.0))
                    .unwrap_or_default(),
                c.p50_ms.map(|v| format!("{v:.1} ms")).unwrap_or_default(),
                c.p99_ms.map(|v| format!("{v:.1} ms")).unwrap_or_default()
            );
        }
        let _ = write!(
            h,
            "</tbody></table><h2>Restore</h2><p class=\"{}\">{}</p><ul>",
            if self.restore.verified {
                "pass"
            } else {
                "fail"
            },
            if self.restore.verified {
                "Every fault was restored and checked: each mock backend's faults read back as at the start; every node runs and answers."
            } else {
                "Restore could NOT be verified."
            }
        );
        for line in self
            .restore
            .problems
            .iter()
            .chain(&self.restore.actions)
            .chain(&self.notes)
        {
            let _ = write!(h, "<li>{}</li>", esc(line));
        }
        h.push_str("</ul></body></html>\n");
        h
    }

    /// Three panels sharing one time axis: success rate, p99 latency,
    /// per-zone share of answers; faults, restores, decisions and leader
    /// changes as vertical markers.
    pub fn svg(&self) -> String {
        const W: f64 = 960.0;
        const LEFT: f64 = 60.0;
        const RIGHT: f64 = 20.0;
        const PANEL: f64 = 120.0;
        const GAP: f64 = 36.0;
        let top = 20.0;
        let height = top + 3.0 * (PANEL + GAP) + 20.0;
        let mut s = String::new();
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" role=\"img\" aria-label=\"drill timeline\">"
        );
        let (t_min, t_max) = match (self.series.first(), self.series.last()) {
            (Some(a), Some(b)) => (a.t.min(0) as f64, (b.t + 1).max(a.t + 1) as f64),
            _ => (0.0, 1.0),
        };
        let x = |t_s: f64| LEFT + (t_s - t_min) / (t_max - t_min).max(1.0) * (W - LEFT - RIGHT);
        let zones: Vec<String> = {
            let mut z: Vec<String> = self
                .series
                .iter()
                .flat_map(|p| p.zone_share.keys().cloned())
                .collect();
            z.sort();
            z.dedup();
            z
        };
        let p99_max = self
            .series
            .iter()
            .filter_map(|p| p.p99_ms)
            .fold(1.0_f64, f64::max)
            * 1.1;
        let panels: [(&str, String); 3] = [
            ("success rate (%)", "0–100".into()),
            ("p99 latency (ms)", format!("0–{p99_max:.0}")),
            ("traffic share by answering zone", "0–1".into()),
        ];
        for (i, (title, range)) in panels.iter().enumerate() {
            let y0 = top + i as f64 * (PANEL + GAP);
            let _ = write!(
                s,
                "<rect x=\"{LEFT}\" y=\"{y0}\" width=\"{}\" height=\"{PANEL}\" fill=\"#fafafa\" stroke=\"#ccc\"/><text x=\"{LEFT}\" y=\"{}\" class=\"t\">{} ({})</text>",
                W - LEFT - RIGHT,
                y0 - 4.0,
                esc(title),
                esc(range)
            );
        }
        // Seconds on the axis, every 5 s.
        let mut t = (t_min / 5.0).ceil() * 5.0;
        let bottom = top + 3.0 * (PANEL + GAP) - GAP;
        while t <= t_max {
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"a\">{t:.0}s</text>",
                x(t) - 8.0,
                bottom + 14.0
            );
            t += 5.0;
        }
        let line = |points: Vec<(f64, f64)>, color: &str| -> String {
            if points.is_empty() {
                return String::new();
            }
            let pts: Vec<String> = points
                .iter()
                .map(|(a, b)| format!("{a:.1},{b:.1}"))
                .collect();
            format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
                pts.join(" ")
            )
        };
        let mid = |p: &Second| p.t as f64 + 0.5;
        let y_success = top;
        s.push_str(&line(
            self.series
                .iter()
                .filter_map(|p| {
                    p.success
                        .map(|v| (x(mid(p)), y_success + PANEL - v * PANEL))
                })
                .collect(),
            "#1a7f37",
        ));
        let y_p99 = top + PANEL + GAP;
        s.push_str(&line(
            self.series
                .iter()
                .filter_map(|p| {
                    p.p99_ms
                        .map(|v| (x(mid(p)), y_p99 + PANEL - v / p99_max * PANEL))
                })
                .collect(),
            "#9a6700",
        ));
        let y_share = top + 2.0 * (PANEL + GAP);
        for (i, z) in zones.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            s.push_str(&line(
                self.series
                    .iter()
                    .map(|p| {
                        let v = p.zone_share.get(z).copied().unwrap_or(0.0);
                        (x(mid(p)), y_share + PANEL - v * PANEL)
                    })
                    .collect(),
                color,
            ));
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"a\" fill=\"{color}\">{}</text>",
                LEFT + 200.0 + 70.0 * i as f64,
                y_share - 4.0,
                esc(z)
            );
        }
        for e in &self.events {
            let color = match e.kind.as_str() {
                "fault" => "#cf222e",
                "restore" => "#1a7f37",
                "decision" => "#0969da",
                "leader" => "#8250df",
                "abort" => "#000",
                _ => continue,
            };
            let xe = x(e.t_ms as f64 / 1000.0);
            let _ = write!(
                s,
                "<line x1=\"{xe:.1}\" y1=\"{top}\" x2=\"{xe:.1}\" y2=\"{bottom}\" stroke=\"{color}\" stroke-dasharray=\"4 3\"><title>{}</title></line>",
                esc(&format!("{} {}: {}", secs(e.t_ms), e.kind, e.text))
            );
        }
        s.push_str("</svg>");
        s
    }
}

const PALETTE: [&str; 6] = [
    "#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e",
];

const CSS: &str =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:1000px;color:#1f2328}\
h1.pass{color:#1a7f37}h1.fail{color:#cf222e}table{border-collapse:collapse;margin:8px 0}\
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}tr.fail td{background:#ffebe9}\
tr.pass td:first-child{color:#1a7f37}.meta{color:#57606a}p.fail{color:#cf222e}\
svg text.t{font-size:12px;fill:#1f2328}svg text.a{font-size:10px;fill:#57606a}";

/// Escapes text for XML/HTML content and attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: i64, class: Class, ok: bool, lat: f32, zone: &str) -> Sample {
        Sample {
            t_ms,
            class,
            entry: 1,
            tenant: 0,
            ok,
            status: if ok { 200 } else { 503 },
            latency_ms: lat,
            zone: Some(std::sync::Arc::from(zone)),
            version: Some(0),
        }
    }

    #[test]
    fn quantiles_and_series() {
        let mut v: Vec<f32> = (1..=100).map(|i| i as f32).collect();
        assert_eq!(quantile(&mut v, 0.99), Some(99.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        let samples = vec![
            sample(-500, Class::Short, true, 2.0, "az-a"),
            sample(100, Class::Short, true, 3.0, "az-a"),
            sample(200, Class::Short, false, 3.0, "az-a"),
            sample(300, Class::Long, true, 5.0, "az-b"),
            sample(1100, Class::Short, true, 4.0, "az-b"),
        ];
        let s = series(&samples);
        assert_eq!(s.iter().map(|p| p.t).collect::<Vec<_>>(), vec![-1, 0, 1]);
        assert_eq!(
            (s[1].sent, s[1].ok, s[1].short_total, s[1].short_ok),
            (3, 2, 2, 1)
        );
        assert_eq!(s[1].zone_share["az-a"], 0.5);
        let c = class_stats(&samples, 0, 2000);
        assert_eq!(c["short"].total, 3);
        assert_eq!(c["short"].ok, 2);
        assert_eq!(c["long"].success, Some(1.0));
    }

    /// An aborted drill printed `converged_within: FAIL never`, and
    /// `steps: 0 of 0 ran` as met when it stopped before its first step.
    #[test]
    fn an_aborted_drills_expectations_are_neither_met_nor_missed() {
        let judged = |name: &str, pass| Check {
            name: name.into(),
            expected: "x".into(),
            measured: "never".into(),
            pass: Some(pass),
        };
        let checks: Vec<Check> = [judged("converged_within", false), judged("steps", true)]
            .into_iter()
            .map(Check::not_evaluated)
            .collect();
        assert!(checks
            .iter()
            .all(|c| c.pass.is_none() && !c.passed() && !c.failed()));
        assert!(checks.iter().all(|c| c.measured == NOT_EVALUATED));
        let json = serde_json::to_value(&checks[0]).unwrap();
        assert!(json["pass"].is_null(), "{json}");
        assert_eq!(checks[1].mark(), ("not-evaluated", "–"));
    }

    #[test]
    fn escaping_covers_markup() {
        assert_eq!(esc("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}
