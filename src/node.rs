//! One gateway node: start-up (`start`: listeners, the Raft member,
//! probes), the state its planes share (`gateway`), the process's life
//! (`lifecycle`: signals, the parent's exit) and the graceful drain
//! (`drain`).

pub mod drain;
pub mod front;
pub mod gateway;
pub mod lifecycle;
pub mod reconfigure;
pub mod start;

pub use gateway::Gateway;
