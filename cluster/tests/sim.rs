//! The deterministic simulation of the whole control plane (see
//! cluster/ARCHITECTURE.md, "Simulation"): real `ClusterNode`s on a
//! simulated network and paused clock, faults from a seed, a safety
//! checker over every run's history.
//!
//! - `cargo test -p zonegate-cluster --test sim`: a fixed seed set, the
//!   checker's own tests and the planted bug's.
//! - `ZONEGATE_SIM_SEEDS=0..1000 cargo test -p zonegate-cluster --test sim
//!   -- --nocapture seeds`: a range; ends with
//!   `seeds: N, violations: V, runs/s: R`.
//! - `ZONEGATE_SIM_FOR=600` with a range: stop starting seeds after 600
//!   s of wall time (`cluster/sim-soak` runs as many seeds as fit).
//! - `ZONEGATE_SIM_SEED=42 cargo test -p zonegate-cluster --test sim --
//!   --nocapture seeds`: replay one seed, printing its fault schedule.

// clippy's allow-unwrap-in-tests covers `#[test]` functions, not the
// helpers of an integration test file; here a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "sim/check.rs"]
mod check;
#[path = "sim/net.rs"]
mod net;
#[path = "sim/rng.rs"]
mod rng;
#[path = "sim/world.rs"]
mod world;

use std::time::Instant;

use world::{Options, Report};

/// The seeds `cargo test` runs: 1–8, then the seeds that failed on the
/// way, kept as regression cases. 199 and 240: two nodes led term 3 in
/// turn, which openraft's `(term, node id)` leader ids allow; the checker
/// now holds the run to that rule (see `check::one_leader_per_vote`).
/// 1109: see `a_lagging_node_follows_a_leader_added_after_its_log_ends`.
const FIXED_SEEDS: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 199, 240, 1109];

/// Seed 1109 found it: the learner's clock jumped, so it refused appends
/// while node 100 was added and then elected; back in time, it refused
/// node 100's appends as "not a member" (it had not received the entry
/// that added it, and only the leader could send it), and never caught
/// up. Appends and snapshots from a sender with a committed vote now pass
/// (`network::server::beyond_our_log`).
#[test]
fn a_lagging_node_follows_a_leader_added_after_its_log_ends() {
    // The faults of its day (no wiped members, no slow disks), so the
    // seed replays the scenario that found it.
    let r = world::run(1109, &Options::classic());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 1109: {:?}", r.violations);
}

/// Seed 10 found it (and 34, 36, 40 of the first 60 with wiped members):
/// a member wiped and restarted with `--rejoin` while node 100, added
/// during the run, led never rejoined. It asked the leader for its next
/// step at the address in its own `[[cluster.members]]`, which has no
/// node 100 (nor a readdressed member's new address), so it never asked,
/// stayed a non-voting rejoiner and the run did not converge. The rejoin
/// loop now takes the leader's address from the applied membership first.
#[test]
fn a_wiped_member_rejoins_under_a_leader_added_after_its_config() {
    let r = world::run(10, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 10: {:?}", r.violations);
}

/// Seed 5001005 (found by the soak): the joiner (node 100) was added as a
/// learner by a leader that was then cut off, wiped while that entry was
/// in the leader's log, and restarted with `--rejoin`; the next leaders
/// never had the entry, so node 100 is in no membership; the operator's
/// later adds are refused (`NodeIdReused`: it held the cluster's state,
/// and ids are never reused, so an operator starts it under a new id).
/// The harness counted it among the members still rejoining and the run
/// never converged; a harness fault, not the product's: only members of
/// the membership must finish a rejoin (`World::converge`). Seed 5005150
/// is the same case.
#[test]
fn a_wiped_joiner_whose_add_was_lost_is_not_a_member_to_wait_for() {
    let r = world::run(5_001_005, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 5001005: {:?}", r.violations);
}

/// Seed 46 found it: six voters, three of them behind (node 3 wiped and
/// rejoining, so it voted for nobody) and two ahead. The ones behind
/// granted each other's pre-votes and campaigned in turn; openraft
/// refuses a vote for a log that is behind without taking on its term,
/// so the two voters ahead kept campaigning with a term already spent:
/// term 161 and no leader that lasted, no convergence. A pre-vote grant
/// now names the voter's last log entry and counts only for a candidate
/// at least as up to date (`prevote::grants`).
#[test]
fn elections_end_when_the_voters_behind_outnumber_the_ones_ahead() {
    let r = world::run(46, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 46: {:?}", r.violations);
}

/// Seed 2000013 (found by the soak): node 2, wiped and restarted with
/// `--rejoin`, took appends from node 3, which had led term 7 but not
/// the later term 8 (a wiped node forgot the vote it had granted): with
/// node 2 still a voter in node 3's membership its acknowledgements made
/// a quorum, and node 3 committed entries over the ones term 8 had
/// committed (openraft's `debug_assert` in `has_log_id` fired on a
/// follower; configs 5 and 6, acknowledged, were lost). A rejoining node
/// now takes appends only once a leader answered that it is a learner in
/// that leader's committed membership, and only under that leader's vote
/// or a later one (`Identity::admits`).
#[test]
fn acknowledged_writes_survive_a_stale_leader_reaching_a_wiped_voter() {
    let r = world::run(2_000_013, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 2000013: {:?}", r.violations);
}

/// Seed 2000423 (found by the soak): during the joint change that
/// promoted a rejoined member back (`[{1, 2}, {1, 2, 3}]`), node 1 held
/// the newest entry and refused the others' pre-votes; nodes 2 and 3, a
/// majority of the union but not of `{1, 2}`, campaigned in turn for the
/// whole 30 s bound and their terms outran node 1's. A pre-vote round now
/// needs a majority of each config (`prevote::Tally`).
#[test]
fn elections_settle_during_a_joint_change() {
    let r = world::run(2_000_423, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 2000423: {:?}", r.violations);
}

/// Seed 2001565 (found by the soak): node 2, wiped, rejoined while the
/// operator added node 100. The rejoin's demotion (`RemoveVoters {2}`,
/// `retain`) had committed its joint config when the operator's promotion
/// of node 100 (`AddVoterIds`, without `retain`) ran atop it, and openraft
/// left node 2 out of the members altogether: a rejoiner not in the
/// membership is never made a learner again, so it rejoined until the
/// end. Every membership step but a voter's removal now keeps the voters
/// it leaves out as learners, and a removal refuses to run atop another
/// change's joint config (`ClusterNode::run_step`). The fix changed the
/// seed's schedule; it stays as a regression case.
#[test]
fn a_rejoining_member_stays_a_member_when_a_voter_is_promoted_meanwhile() {
    let r = world::run(2_001_565, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 2001565: {:?}", r.violations);
}

/// Seeds 2003428 and 3000778 (found by the soak): the harness wiped a
/// second voter while the first wipe's repair was under way (the config
/// `{1, 2}`, or the joint `[{2, 3}, {1, 2, 3}]` promoting the first back:
/// a config in which the second loss leaves no quorum, which no Raft
/// survives without an operator); the others never elected. A wipe now
/// waits until every member's membership is whole again
/// (`World::membership_whole`). Seed 2003425: a restart found sled still
/// holding its directory's lock; a crash now waits for sled to let go,
/// as a process exit would (`world::wait_for_store_lock`). Seeds 2004353
/// and 3000553: an automatic decision 9,998 and 9,999 ms after the last
/// on its zone (dwell 10 s) by the simulation's true clock: the harness
/// noted a stamp's true time after the dry run that follows the stamp (a
/// quorum round trip), not at the stamp; noted at the stamp, the same
/// schedule keeps the dwell (a harness fault, not the product's). Their
/// schedules changed with the fixes; they stay as regression cases.
#[test]
fn the_final_soak_s_findings_stay_fixed() {
    for seed in [2_003_428, 3_000_778, 2_003_425, 2_004_353, 3_000_553] {
        let r = world::run(seed, &Options::default());
        if !r.violations.is_empty() {
            print_failure(&r);
        }
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
}

/// Seed 2005193: node 4 led term 10 before node 5 by openraft's own log,
/// but its leadership was reported after node 5's (a node publishes its
/// metrics after the new leader's first entry is written), and the
/// checker took that for a lower leader id winning later. Reports of one
/// term within `check::REPORT_SLACK_MS` may cross.
#[test]
fn leaderships_reported_out_of_order_within_the_slack_are_no_violation() {
    let r = world::run(2_005_193, &Options::default());
    if !r.violations.is_empty() {
        print_failure(&r);
    }
    assert!(r.violations.is_empty(), "seed 2005193: {:?}", r.violations);
}

/// Seeds the planted bug runs under; the checker must flag at least one.
const BUG_SEEDS: std::ops::Range<u64> = 1..9;

fn print_failure(r: &Report) {
    eprintln!(
        "seed {} FAILED ({}; replay: ZONEGATE_SIM_SEED={} cargo test -p zonegate-cluster --test sim -- --nocapture seeds)",
        r.seed, r.layout, r.seed
    );
    for v in &r.violations {
        eprintln!("  violation: {v}");
    }
    for f in &r.faults {
        eprintln!("  fault at {f}");
    }
}

/// This process's CPU time so far (user + system), from /proc; `None`
/// where there is none. The machine is shared: CPU per run says more
/// than runs per wall-clock second.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) close with ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    // Clock ticks; 100 per second on Linux.
    Some((user + system) / 100.0)
}

/// Parse `A..B` (or a single seed `A`).
fn parse_range(text: &str) -> Option<std::ops::Range<u64>> {
    match text.split_once("..") {
        Some((a, b)) => Some(a.trim().parse().ok()?..b.trim().parse().ok()?),
        None => {
            let a: u64 = text.trim().parse().ok()?;
            Some(a..a.checked_add(1)?)
        }
    }
}

/// Run `seeds`; print every failing seed and one summary line.
fn run_all(
    seeds: impl IntoIterator<Item = u64>,
    opts: &Options,
    verbose: bool,
) -> (u64, Vec<Report>) {
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let budget = std::env::var("ZONEGATE_SIM_FOR")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let mut runs = 0u64;
    let mut failed = Vec::new();
    let mut converge = Vec::new();
    let (mut auto_zone, mut unstamped) = (0usize, 0usize);
    for seed in seeds {
        if budget.is_some_and(|b| started.elapsed() >= b) {
            eprintln!("time budget spent: stopped before seed {seed}");
            break;
        }
        // A panic (a node that cannot start or stop) fails the seed, which
        // still prints itself.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| world::run(seed, opts)));
        let r = match run {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                zonegate_cluster::sim::uninstall();
                Report::panicked(seed, what)
            }
        };
        runs += 1;
        auto_zone += r.auto_zone;
        unstamped += r.unstamped;
        if let Some(ms) = r.converged_ms {
            converge.push(ms);
        }
        if verbose {
            eprintln!(
                "seed {seed}: {} | {} ops, {} acknowledged, {} messages, {} automatic zone decisions ({} stamps unknown), converged after {:?} ms, {} violations",
                r.layout,
                r.ops,
                r.acked,
                r.messages,
                r.auto_zone,
                r.unstamped,
                r.converged_ms,
                r.violations.len()
            );
            for f in &r.faults {
                eprintln!("  fault at {f}");
            }
            eprintln!("  leaders (term, node): {:?}", r.leaders);
            eprintln!("  answers: {:?}", r.outcomes);
        }
        if !r.violations.is_empty() {
            print_failure(&r);
            failed.push(r);
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    converge.sort_unstable();
    let p = |q: f64| {
        converge
            .get(((converge.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    eprintln!(
        "liveness: time to converge after heal (simulated ms): median {:?}, p99 {:?}, max {:?}",
        p(0.5),
        p(0.99),
        converge.last()
    );
    eprintln!(
        "dwell rule: {auto_zone} automatic zone decisions checked; {unstamped} committed decisions with no known stamp"
    );
    eprintln!(
        "store: {} crashes waited for sled to release its lock",
        world::STORE_LOCK_WAITS.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let (Some(a), Some(b)) = (cpu_start, cpu_seconds()) {
        eprintln!(
            "cpu: {:.2} s per run (user + system, this process)",
            (b - a) / (runs.max(1) as f64)
        );
    }
    eprintln!(
        "seeds: {runs}, violations: {}, runs/s: {:.2}",
        failed.iter().map(|r| r.violations.len()).sum::<usize>(),
        runs as f64 / secs
    );
    (runs, failed)
}

/// The fixed seed set (or `ZONEGATE_SIM_SEEDS` / `ZONEGATE_SIM_SEED`):
/// every run must break no rule.
#[test]
fn seeds() {
    let (seeds, verbose): (Box<dyn Iterator<Item = u64>>, bool) = match (
        std::env::var("ZONEGATE_SIM_SEED"),
        std::env::var("ZONEGATE_SIM_SEEDS"),
    ) {
        (Ok(one), _) => (
            Box::new(parse_range(&one).expect("ZONEGATE_SIM_SEED=<n>")),
            true,
        ),
        (_, Ok(range)) => (
            Box::new(parse_range(&range).expect("ZONEGATE_SIM_SEEDS=<start>..<end>")),
            false,
        ),
        _ => (Box::new(FIXED_SEEDS.iter().copied()), false),
    };
    if verbose && std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    // `ZONEGATE_SIM_BUG=1`: run the range with the planted bug, to see
    // how often the checker catches it (the test then fails, as it should).
    let opts = Options {
        bug: std::env::var_os("ZONEGATE_SIM_BUG").is_some(),
        ..Options::default()
    };
    let (runs, failed) = run_all(seeds, &opts, verbose);
    assert!(runs > 0, "no seeds in the range");
    let bad: Vec<u64> = failed.iter().map(|r| r.seed).collect();
    assert!(bad.is_empty(), "seeds with violations: {bad:?}");
}

/// Proof that the checker can fail: with the planted bug (a decision
/// acknowledged once it is in the leader's log, before it commits), the
/// fixed seed set reports a violation.
#[test]
fn the_planted_ack_before_commit_bug_is_caught() {
    let opts = Options {
        bug: true,
        ..Options::default()
    };
    let caught = BUG_SEEDS.map(|seed| world::run(seed, &opts)).find(|r| {
        r.violations.iter().any(|v| {
            matches!(
                v,
                check::Violation::AckLost { .. } | check::Violation::StaleCas { .. }
            )
        })
    });
    let Some(r) = caught else {
        panic!("the checker missed the planted bug on seeds {BUG_SEEDS:?}");
    };
    eprintln!("planted bug caught on seed {}:", r.seed);
    for v in r.violations.iter().take(3) {
        eprintln!("  {v}");
    }
}

#[test]
fn seed_ranges_parse() {
    assert_eq!(parse_range("3..10"), Some(3..10));
    assert_eq!(parse_range("7"), Some(7..8));
    assert_eq!(parse_range("x..1"), None);
}
