//! Child processes of this binary that announce their addresses: the demo's
//! nodes and mock backends, and the black-box tests' and benchmarks'. The
//! protocol lives in `zonegate-chaos` (the drill needs it, and this
//! package's binary depends on that crate), written once.

pub use zonegate_chaos::spawn::{child_command, concrete_addr, spawn_listening, Spawned};
