//! One gateway node: start-up (`start`: listeners, the Raft member,
//! probes), the state its planes share (`gateway`), the process's life
//! (`lifecycle`: signals, the parent's exit), the graceful drain
//! (`drain`) and the data-plane threads' scheduling policy (`sched`).

pub mod drain;
pub mod front;
pub mod gateway;
pub mod heap;
pub mod lifecycle;
pub mod reconfigure;
pub mod sched;
pub mod start;

pub use gateway::Gateway;
