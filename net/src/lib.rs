//! zonegate's ports, shared by the data plane, the admin API and Raft:
//! listeners with budgets and timeouts ([`listen`]), TLS material that
//! reloads ([`tls`]), and signed calls between members ([`sign`]).

mod h1;
pub mod http1;
pub mod listen;
pub mod sign;
pub mod tls;
