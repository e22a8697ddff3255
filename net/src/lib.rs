//! zonegate's ports, shared by the data plane, the admin API and Raft:
//! listeners with budgets and timeouts ([`listen`]), TLS material that
//! reloads ([`tls`]), signed calls between members ([`sign`]), the
//! weak slot lists their watchers walk ([`slots`]), a data-plane
//! address's connections spread evenly over its threads ([`spread`]), and
//! randomness nobody can guess ([`random`]).

mod app;
mod body;
mod budget;
mod connection;
#[doc(hidden)]
pub mod fuzzing;
pub mod http1;
pub mod listen;
pub mod random;
mod server;
mod settings;
pub mod sign;
pub mod slots;
pub mod spread;
mod stop;
pub mod tls;
mod watchdog;
mod watched;
