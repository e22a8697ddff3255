//! CPU cost of active health checking: 1,000 backends (real mock servers on
//! loopback, each with a Prometheus metrics page) probed at the 2 s
//! interval, health GET plus metrics scrape, by the production prober and
//! health task on one current-thread runtime. Reports that thread's CPU
//! time as a share of one core. Target: under 5%.
//!
//! Run: `cargo bench --bench probe` (optionally `-- BACKENDS SECONDS`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use zonegate::config::Config;
use zonegate::node::gateway::Gateway;
use zonegate::node::sched::stat_field;
use zonegate::telemetry::Metrics;
use zonegate::tools::mock::{self, MockOptions};
use zonegate_cluster::ClusterView;

/// CPU seconds (user + system) of the calling thread, from procfs.
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
    // Fields 14 and 15 of stat(5) (utime, stime) in clock ticks; the
    // kernel's USER_HZ is 100 on every mainstream Linux build.
    let ticks = |n| stat_field(&stat, n).and_then(|f| f.parse::<f64>().ok());
    (ticks(14).expect("utime") + ticks(15).expect("stime")) / 100.0
}

fn probes_done(gw: &Gateway) -> f64 {
    gw.metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("zonegate_probe_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);

    // The backends: their own runtime on other threads, so their CPU is
    // not counted against the prober.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("mock runtime");
        rt.block_on(async move {
            let mut handles = Vec::new();
            for i in 0..n {
                let h = mock::start(MockOptions {
                    listen: "127.0.0.1:0".parse().expect("addr"),
                    name: format!("m{i}"),
                    zone: Some("az-a".into()),
                    models: vec!["m".into()],
                    provider: Default::default(),
                    expect_key: None,
                    capacity: None,
                })
                .await
                .expect("mock starts");
                addr_tx.send(h.addr).expect("send addr");
                handles.push(h);
            }
            std::future::pending::<()>().await;
        });
    });
    let addrs: Vec<_> = (0..n)
        .map(|_| addr_rx.recv().expect("mock address"))
        .collect();

    let mut text = String::from(
        "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\
         [health]\ninterval = \"2s\"\nstable_interval = \"2s\"\n",
    );
    for (i, a) in addrs.iter().enumerate() {
        text.push_str(&format!(
            "[[backends]]\nname = \"b{i}\"\nzone = \"az-a\"\nurl = \"http://{a}\"\nmodels = [\"m\"]\nmetrics_path = \"/metrics\"\n"
        ));
    }
    let cfg = Arc::new(Config::parse("bench.toml", &text).unwrap_or_else(|e| panic!("{e}")));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("prober runtime");
    rt.block_on(async move {
        let (_tx, rx) =
            tokio::sync::watch::channel(Arc::new(ClusterView::initial([&cfg.node.zone])));
        let gw = Arc::new(Gateway::new(
            Arc::clone(&cfg),
            rx,
            None,
            zonegate_net::sign::KeyRing::random(zonegate_net::sign::Purpose::Pin),
            Metrics::new(),
        ));
        let _probes = zonegate::health::spawn_probes(&gw);
        // Warm-up: every backend probed a few times, connections pooled.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (cpu0, probes0, t0) = (thread_cpu_seconds(), probes_done(&gw), Instant::now());
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (cpu1, probes1, wall) = (thread_cpu_seconds(), probes_done(&gw), t0.elapsed());
        let cpu = cpu1 - cpu0;
        let rate = (probes1 - probes0) / wall.as_secs_f64();
        println!(
            "probe: {n} backends at 2 s (health GET + metrics scrape): {rate:.0} probes/s, \
             {:.2}% of one core ({cpu:.2} s CPU in {:.1} s), {:.1} µs CPU per probe",
            100.0 * cpu / wall.as_secs_f64(),
            wall.as_secs_f64(),
            1e6 * cpu / (probes1 - probes0).max(1.0),
        );
    });
}
