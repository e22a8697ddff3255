//! The process's life: how a node learns it should stop (a signal, or its
//! parent gone).

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
