//! What a node tells the world about itself: tracing set-up (here), the
//! Prometheus registry (`metrics`) and observable events (`events`: one
//! call per event, log line and metric together).

pub mod events;
pub mod metrics;

pub use metrics::Metrics;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global tracing subscriber. `RUST_LOG` overrides the level
/// (default `info`, with openraft's chatty internals at `warn`); per-request
/// access lines use target `zonegate::access`, operator writes
/// `zonegate::audit`.
pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
