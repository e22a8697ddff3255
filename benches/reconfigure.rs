//! Applying a replicated config on a node: merge the cluster's sections
//! into the node's file, validate, and build the route table reusing the
//! live backends, for a version of 1,000 and one of 10,000 backends (one
//! backend added; issue 12's target: ≤ 100 ms at 1,000; issue 48's: ≤ 100
//! ms at 10,000).
//!
//! ```sh
//! cargo bench --bench reconfigure
//! cargo bench --bench reconfigure -- 10000   # one size
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zonegate::config::Config;
use zonegate::dataplane::routing::Routes;

fn node_file(backends: usize) -> String {
    let mut s = String::from(
        "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"data\"\n\n[[tenants]]\nname = \"t\"\nkey_sha256 = \"2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"\n",
    );
    for i in 0..backends {
        let zone = ["az-a", "az-b", "az-c"][i % 3];
        s.push_str(&format!(
            "\n[[backends]]\nname = \"b{i}\"\nzone = \"{zone}\"\nurl = \"http://10.{}.{}.{}:8000\"\nmodels = [\"m{}\", \"shared\"]\n",
            i / 62_500,
            i / 250 % 250,
            i % 250,
            i % 20
        ));
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_config");
    // A 10,000-backend apply takes tens of milliseconds or more: fewer,
    // longer samples.
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for backends in [1_000, 10_000] {
        // The live version, one backend short of the size (10,000 is the
        // most a config may list).
        let base = Config::parse("node.toml", &node_file(backends - 1)).expect("valid");
        let old = Routes::build(&base, None);
        // The next version: one backend more.
        let next = format!(
            "{}\n[[backends]]\nname = \"new\"\nzone = \"az-b\"\nurl = \"http://10.9.9.9:8000\"\nmodels = [\"shared\"]\n",
            base.replicated_toml()
        );
        group.bench_function(BenchmarkId::new("backends", backends), |b| {
            b.iter(|| {
                let cfg = base
                    .with_replicated(black_box(&next), 2, "cluster config v2")
                    .expect("valid");
                black_box(Routes::build(&cfg, Some(&old)))
            })
        });
        // Its two halves: the config read (TOML, merge, validation) and
        // the route table built from it.
        group.bench_function(BenchmarkId::new("read", backends), |b| {
            b.iter(|| {
                base.with_replicated(black_box(&next), 2, "cluster config v2")
                    .expect("valid")
            })
        });
        let cfg = base
            .with_replicated(&next, 2, "cluster config v2")
            .expect("valid");
        group.bench_function(BenchmarkId::new("routes", backends), |b| {
            b.iter(|| black_box(Routes::build(black_box(&cfg), Some(&old))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
