//! The store under SIGKILL: a child process appends entries and saves votes
//! in a loop, printing an acknowledgement after each returns; the test
//! kills it with SIGKILL at random points, reopens the store, and checks
//! that every acknowledged entry and vote is there, 200 times over.
//!
//! The child is this test binary re-executed with
//! `ZONEGATE_CRASH_CHILD=<dir>`, running [`crash_child`].

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader, Vote};
use zonegate_cluster::store;
use zonegate_cluster::types::alias::Entry;
use zonegate_cluster::{Command, Decision};

const CHILD_ENV: &str = "ZONEGATE_CRASH_CHILD";
const KILLS: u32 = 200;

fn entry(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command::decide(
            Decision::Freeze,
            "crash-test",
            format!("entry {index}"),
        )),
    }
}

/// Not a test on its own: the child's loop, when the parent starts it.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut log, _sm, _) = store::open(std::path::Path::new(&dir)).unwrap();
        let state = log.get_log_state().await.unwrap();
        let mut next = state.last_log_id.map_or(1, |l| l.index + 1);
        let vote = log.read_vote().await.unwrap();
        let mut term = vote.map_or(0, |v| v.leader_id().term) + 1;
        loop {
            // A batch of one to three entries per append.
            let n = 1 + next % 3;
            log.append_durably((next..next + n).map(entry))
                .await
                .unwrap();
            println!("ack entries {next} {}", next + n - 1);
            next += n;
            log.save_vote(&Vote::new(term, 1)).await.unwrap();
            println!("ack vote {term}");
            term += 1;
        }
    });
}

/// xorshift: enough randomness for kill timing, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn acknowledged_appends_and_votes_survive_sigkill_at_random_points() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut acked_entries, mut acked_vote) = (Vec::<(u64, u64)>::new(), None::<u64>);
    let started = Instant::now();
    for kill in 0..KILLS {
        let mut child = Process::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Kill after 0 to 7 acknowledgements, then 0 to 2 ms more, so
        // the kill lands anywhere: before the first write, mid-append,
        // mid-flush, between an append and a vote.
        let wait_acks = rng.below(8);
        let mut seen = 0;
        while seen < wait_acks {
            let Some(line) = lines.next() else { break };
            let line = line.unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ack", "entries", a, b] => {
                    acked_entries.push((a.parse().unwrap(), b.parse().unwrap()));
                    seen += 1;
                }
                ["ack", "vote", t] => {
                    acked_vote = Some(t.parse().unwrap());
                    seen += 1;
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_micros(rng.below(2000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acknowledgements printed before the kill but not read yet count
        // too: they were acknowledged.
        for line in lines.map_while(Result::ok) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ack", "entries", a, b] => {
                    acked_entries.push((a.parse().unwrap(), b.parse().unwrap()))
                }
                ["ack", "vote", t] => acked_vote = Some(t.parse().unwrap()),
                _ => {}
            }
        }

        rt.block_on(async {
            let (mut log, _sm, liveness) = store::open(dir.path())
                .unwrap_or_else(|e| panic!("kill {kill}: the store does not reopen: {e}"));
            let vote = log.read_vote().await.unwrap();
            if let Some(term) = acked_vote {
                let stored = vote.map(|v| v.leader_id().term).unwrap_or(0);
                assert!(
                    stored >= term,
                    "kill {kill}: vote {term} acknowledged, {stored} stored"
                );
            }
            let mut reader = log.get_log_reader().await;
            for &(a, b) in &acked_entries {
                let got = reader.try_get_log_entries(a..=b).await.unwrap();
                let indexes: Vec<u64> = got.iter().map(|e| e.log_id.index).collect();
                assert_eq!(
                    indexes,
                    (a..=b).collect::<Vec<_>>(),
                    "kill {kill}: acknowledged entries {a}..={b} lost"
                );
                assert_eq!(format!("{:?}", got[0]), format!("{:?}", entry(a)));
            }
            drop((log, reader, _sm));
            assert!(!liveness.is_open());
        });
        // Keep the bookkeeping small: entries stay checked every round.
        acked_entries.sort_unstable();
        acked_entries.dedup();
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged appends checked, {:?}",
        acked_entries.len(),
        started.elapsed()
    );
}
