//! The cost of a durable append: one entry through the store's append path
//! (sled insert, `flush_async`, then `fdatasync` of sled's files) against
//! the same write with sled's flush alone (what the store did before it
//! synced: `sync_file_range`, not power-loss safe).
//!
//! `cargo bench -p zonegate-cluster --bench durable_append` prints
//! criterion's estimates and then p50/p99 over 2,000 single appends each.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use openraft::{CommittedLeaderId, EntryPayload, LogId};
use zonegate_cluster::types::alias::Entry;
use zonegate_cluster::{codec, store, Command, Decision, ZoneId};

fn entry(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(
            Command::decide(
                Decision::Failover {
                    from: ZoneId::new("az-a"),
                    to: ZoneId::new("az-b"),
                },
                "ops",
                "zone az-a is failing its health checks; moving its traffic",
            )
            .stamped(1_700_000_000_000),
        ),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Time `n` single-entry appends with `append`.
fn times(n: u64, mut append: impl FnMut(u64)) -> Vec<Duration> {
    (1..=n)
        .map(|i| {
            let start = Instant::now();
            append(i);
            start.elapsed()
        })
        .collect()
}

fn report(name: &str, mut t: Vec<Duration>) {
    t.sort_unstable();
    let at = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)];
    println!(
        "{name}: p50 {:?}  p99 {:?}  max {:?}  (n = {})",
        at(0.50),
        at(0.99),
        t[t.len() - 1],
        t.len()
    );
}

fn bench(c: &mut Criterion) {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _sm, _) = store::open(dir.path()).unwrap();
    let mut next = 0;
    c.bench_function("durable append, 1 entry (flush + fdatasync)", |b| {
        b.iter(|| {
            next += 1;
            rt.block_on(log.append_durably([entry(next)])).unwrap();
        })
    });

    let raw_dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(raw_dir.path().join("raw.sled"))
        .open()
        .unwrap();
    let tree = db.open_tree("raft_log").unwrap();
    let mut raw_next = 0u64;
    let raw_append = |i: u64| {
        tree.insert(i.to_be_bytes(), codec::encode(&entry(i)).unwrap())
            .unwrap();
        rt.block_on(db.flush_async()).unwrap();
    };
    c.bench_function("sled flush only, 1 entry (before)", |b| {
        b.iter(|| {
            raw_next += 1;
            raw_append(raw_next);
        })
    });

    let base = next;
    report(
        "durable append",
        times(2000, |i| {
            rt.block_on(log.append_durably([entry(base + i)])).unwrap()
        }),
    );
    let raw_base = raw_next;
    report("sled flush only", times(2000, |i| raw_append(raw_base + i)));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(50)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
