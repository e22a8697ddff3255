//! The operators' command line: `zonegate ctl` (`ctl`, tables in
//! `render`) and `zonegate check-config`.

pub mod ctl;
