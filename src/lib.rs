//! zonegate
