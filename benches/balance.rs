//! Pick cost on the real request-path structures: a `ZonePool` of live
//! `Backend`s built from config, for p2c and the bounded-load ring, at 100
//! and 10,000 backends. Target: ≤ 1 µs at 100, ≤ 5 µs at 10,000.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zonegate::clock::now_ms;
use zonegate::config::{Balance, Config};
use zonegate::dataplane::balance::hash_key;
use zonegate::dataplane::routing::Routes;
use zonegate_cluster::ZoneId;

fn config(backends: usize, balance: Balance) -> Config {
    let mut text = String::from(
        "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n",
    );
    for i in 0..backends {
        text.push_str(&format!(
            "[[backends]]\nname = \"b{i}\"\nzone = \"az-a\"\nurl = \"http://10.0.{}.{}:8000\"\nmodels = [\"m\"]\n",
            i / 250,
            i % 250
        ));
    }
    text.push_str(&format!(
        "[[models]]\nname = \"m\"\nbalance = \"{}\"\n",
        balance.as_str()
    ));
    match Config::parse("bench.toml", &text) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

fn picks(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    for n in [100usize, 10_000] {
        for balance in [Balance::P2c, Balance::Ring] {
            let cfg = config(n, balance);
            let routes = Routes::build(&cfg, None);
            let model = routes.model("m").expect("model m");
            let pool = model.pool(&ZoneId::new("az-a")).expect("pool");
            let mut rng = fastrand::Rng::with_seed(42);
            let tried: Vec<usize> = Vec::new();
            let mut key = 0u64;
            group.bench_with_input(BenchmarkId::new(balance.as_str(), n), &n, |b, _| {
                b.iter(|| {
                    key = key.wrapping_add(1);
                    let session = (balance == Balance::Ring).then(|| hash_key(&key.to_le_bytes()));
                    black_box(pool.pick(balance, session, now_ms(), &tried, &mut rng))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, picks);
criterion_main!(benches);
