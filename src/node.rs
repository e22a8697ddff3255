//! One gateway node: start-up (`start`: listeners, the Raft member,
//! probes), the state its planes share (`gateway`), and the process's life
//! (`lifecycle`: signals, the parent's exit).

pub mod gateway;
pub mod lifecycle;
pub mod start;

pub use gateway::Gateway;
