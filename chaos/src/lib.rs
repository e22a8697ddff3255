//! zonegate-chaos: the library behind `zonegate drill`. A drill reads a
//! scenario (`scenario`), starts or targets a cluster (`local`, `target`),
//! drives load (`load`), injects timed faults through mock backends,
//! processes and Raft relays (`relay`), records what every node said
//! (`observe`, `history`), checks the expectations (`checks`), always
//! restores every fault, and writes the report (`report`).
//!
//! It talks to zonegate only over HTTP and child processes of the
//! `zonegate` binary: the data plane and the control plane never depend
//! on it, and it does not depend on them.

pub mod checks;
pub mod history;
pub mod load;
pub mod local;
pub mod observe;
pub mod relay;
pub mod report;
pub mod run;
pub mod scenario;
pub mod spawn;
pub mod window;

pub use run::{run, Options};

/// Exit codes of `zonegate drill`.
pub mod exit {
    /// Every expectation met.
    pub const PASS: u8 = 0;
    /// An expectation was not met (or an alarm aborted the drill).
    pub const FAIL: u8 = 1;
    /// The drill could not run: a bad scenario, a blocked window, a
    /// cluster that did not come up, or an operator's Ctrl-C.
    pub const NOT_RUN: u8 = 2;
}
