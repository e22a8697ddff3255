//! zonegate's ports, shared by the data plane, the admin API and Raft:
//! listeners with budgets and timeouts ([`listen`]), TLS material that
//! reloads ([`tls`]), signed calls between members ([`sign`]), the
//! weak slot lists their watchers walk ([`slots`]), a data-plane
//! address's connections spread evenly over its threads ([`spread`]), and
//! randomness nobody can guess ([`random`]).

mod h1;
pub mod http1;
pub mod listen;
pub mod random;
pub mod sign;
pub mod slots;
pub mod spread;
pub mod tls;
