//! The process's life: how a node learns it should stop (a signal, or its
//! parent gone), and the bound on how long stopping may take.

use std::time::Duration;

/// How much longer than its drain (`drain_grace` + `drain_timeout`) a
/// stopping node may take before [`exit_after`] ends it: the drain's own
/// steps after the timeout are bounded well within it (2 s for the last
/// requests, 2 s for the data-plane threads, 8 s for the admin API, the
/// probes and the control plane).
pub const EXIT_SLACK: Duration = Duration::from_secs(15);

/// The exit code when [`exit_after`] had to end the process.
pub const EXIT_OVERRAN: i32 = 1;

/// From now on the process ends within `limit`, whatever still runs: a
/// wedged control plane (a store that never answers, a Raft core that
/// never stops, a blocking thread the runtime waits for at exit) must not
/// keep a stopped node alive holding its store's lock, so that a
/// supervisor's replacement can start. A plain thread, not a task: it
/// needs nothing from the runtime.
pub fn exit_after(limit: Duration, what: &'static str) {
    let spawned = std::thread::Builder::new()
        .name("zonegate-exit-bound".into())
        .spawn(move || {
            std::thread::sleep(limit);
            tracing::error!(
                limit = ?limit,
                "{what} did not finish within its bound: exiting now"
            );
            eprintln!("zonegate: {what} did not finish within {limit:?}: exiting now");
            std::process::exit(EXIT_OVERRAN);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot bound the time to stop: {e}");
    }
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// How a node was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: an orchestrator's stop; drain with the grace.
    Terminate,
    /// Ctrl-C (SIGINT): someone at a terminal.
    Interrupt,
}

/// SIGTERM and SIGINT handlers, installed when this is built: build it
/// before announcing the node's addresses, so a stop sent the moment a
/// supervisor sees them drains instead of killing the process.
pub struct StopSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves with the first stop signal.
    pub async fn recv(&mut self) -> Stop {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = next(&mut self.term) => Stop::Terminate,
                () = next(&mut self.int) => Stop::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
}

/// Exits the process when stdin reaches end of file (see `--exit-with-parent`).
pub fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        loop {
            match std::io::Read::read(&mut std::io::stdin(), &mut buf) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
}
