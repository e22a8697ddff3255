//! zonegate's ports, shared by the data plane, the admin API and Raft:
//! listeners with budgets and timeouts ([`listen`]), TLS material that
//! reloads ([`tls`]), signed calls between members ([`sign`]), and the
//! weak slot lists their watchers walk ([`slots`]).

mod h1;
pub mod http1;
pub mod listen;
pub mod sign;
pub mod slots;
pub mod tls;
