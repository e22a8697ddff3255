//! The operators' command line: `zonegate ctl` (`ctl`, tables in
//! `render`) and `zonegate check-config`.

pub mod ctl;
pub mod members;

use std::path::Path;

use crate::config::Config;

/// `zonegate check-config FILE`: validates the file and says what it holds,
/// or fails with the file, key and reason.
pub fn check_config(file: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(file)?;
    println!(
        "{}: ok ({} backends, {} models, {} tenants)",
        file.display(),
        cfg.backends.len(),
        cfg.models.len(),
        cfg.tenants.len()
    );
    Ok(())
}
