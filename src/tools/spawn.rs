//! Child processes of this binary that announce their addresses, and how
//! to start its nodes, mock backends and `ctl`: the demo's, the black-box
//! tests' and the benchmarks'. The
//! protocol lives in `zonegate-chaos` (the drill needs it, and this
//! package's binary depends on that crate), written once.

pub use zonegate_chaos::spawn::{
    child_command, child_command_logging, concrete_addr, ctl_command, mock_backend,
    mock_backend_with, serve, spawn_listening, Spawned, SECRET_ENV,
};
