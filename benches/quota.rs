//! Admission cost on the real quota stages: `Quotas::count_request` and
//! `Quotas::admit` for a tenant
//! with rpm, tpm and concurrency limits, a model limit and zone capacity,
//! its `x-ratelimit-*` headers written into a response map, then the
//! admission's end (settle and release), as a request pays it.
//! Also the unlimited tenant's path. Target: ≤ 1 µs per admission.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use zonegate::clock::now_ns;
use zonegate::config::Config;
use zonegate::dataplane::quota::{Ask, Quotas};
use zonegate::dataplane::request::RequestClass;
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
name = "limited"
key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
priority = "P1"
# Far above what the bench sends (a bucket runs at most one unit per ns),
# so every admission succeeds.
quota = { rpm = 1000000000, tpm = 1000000000000, concurrency = 1000 }

[[tenants]]
name = "free"
key_sha256 = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"

[[backends]]
name = "a1"
zone = "az-a"
url = "http://127.0.0.1:8000"
models = ["m"]
capacity = 100000

[[models]]
name = "m"
limits = { rpm = 1000000000, tpm = 1000000000000 }
"#;

fn admission(c: &mut Criterion) {
    let cfg = match Config::parse("bench.toml", CONFIG) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let zone = ZoneId::new("az-a");
    let view = ClusterView::initial([&zone]);
    let quotas = Quotas::new(&cfg, &view, &Metrics::new());
    let mut group = c.benchmark_group("quota");
    for (name, tenant) in [("admit_limited", 0usize), ("admit_unlimited", 1)] {
        let ask = Ask {
            tenant_index: tenant,
            model: "m",
            class: RequestClass::Short,
            body_len: 64,
            max_tokens: Some(16),
            zone: &zone,
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                quotas.refresh(&view);
                let now = now_ns();
                if let Err(e) = quotas.count_request(black_box(tenant), now) {
                    panic!("{e}");
                }
                let mut adm = match quotas.admit(black_box(&ask), now) {
                    Ok(a) => a,
                    Err(e) => panic!("{e}"),
                };
                let mut headers = http::HeaderMap::with_capacity(16);
                adm.write_headers(&mut headers);
                adm.finish(Some(20), 80);
                black_box((adm, headers))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
