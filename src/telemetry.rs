//! What a node tells the world about itself: tracing set-up (here), the
//! Prometheus registry (`metrics`), observable events (`events`: one
//! call per event, log line and metric together) and OpenTelemetry traces
//! (`traces`).

pub mod events;
pub mod metrics;
pub mod traces;

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
    let colour = {
        use std::io::IsTerminal as _;
        use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        )
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Colour codes in text logs only on a terminal, and never with `NO_COLOR`
/// set to anything but the empty string (no-color.org): a log file or a
/// journal gets plain text.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::use_colour;
    use std::ffi::OsStr;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None), "a file or a pipe gets plain text");
    }
}
