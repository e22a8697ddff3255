//! Cost accounting and budget admission as a request pays them: the
//! budget stage (`Budgets::refresh` and `Budgets::admit`, the ceiling at
//! the model's dearest price), then at the answer's end the price lookup,
//! `cost::answer_cost`, the hold's settlement, `zonegate_spend_total` and
//! the spend ledger. Target: ≤ 1 µs per request.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use zonegate::clock::unix_ms;
use zonegate::config::Config;
use zonegate::dataplane::budget::Budgets;
use zonegate::dataplane::cost::{answer_cost, units, Estimate};
use zonegate::dataplane::spend::Ledger;
use zonegate::dataplane::sse::Usage;
use zonegate::telemetry::metrics::Metrics;
use zonegate_cluster::{ClusterView, ZoneId};

const CONFIG: &str = r#"
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "d"

[[tenants]]
name = "budgeted"
key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
# Far above what the bench spends, so every admission succeeds.
budget = { per_day = 1000000000.0, per_month = 1000000000.0 }

[[backends]]
name = "a1"
zone = "az-a"
url = "http://127.0.0.1:8000"
models = ["m"]
price = { input_per_mtok = 0.6, output_per_mtok = 1.8 }

[[models]]
name = "m"
price = { input_per_mtok = 0.5, output_per_mtok = 1.5 }
"#;

fn accounting(c: &mut Criterion) {
    let cfg = match Config::parse("bench.toml", CONFIG) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let zone = ZoneId::new("az-a");
    let view = ClusterView::initial([&zone]);
    let metrics = Metrics::new();
    let budgets = Budgets::new(&cfg, &metrics, None, unix_ms());
    let ledger = Ledger::default();
    let tenant = "budgeted";
    let estimate = Estimate {
        prompt: 16,
        max_output: 256,
    };
    let usage = Some(Usage {
        prompt_tokens: 14,
        completion_tokens: 120,
    });
    c.bench_function("cost/admit_settle_count", |b| {
        b.iter(|| {
            let now = unix_ms();
            budgets.refresh(&view, now);
            let ceiling = estimate.ceiling(cfg.costs.ceiling(black_box("m")));
            let mut hold = match budgets.admit(black_box(0), ceiling, now) {
                Ok(Some(h)) => h,
                other => panic!("not admitted: {:?}", other.err()),
            };
            let price = cfg.costs.price(black_box("a1"), "m");
            let cost = answer_cost(usage, estimate, 480, &[], price);
            hold.settle(cost);
            metrics
                .spend
                .with_label_values(&[tenant, "m", zone.as_str()])
                .inc_by(units(cost));
            ledger.record(tenant, "m", cost, now);
            black_box(cost)
        })
    });
}

criterion_group!(benches, accounting);
criterion_main!(benches);
