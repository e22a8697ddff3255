//! Config loading (`src/config.rs` and its sections): any text is a
//! `Config` or a clear `ConfigError`, never a panic.
//!
//! Input: the config file's text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zonegate::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::parse("fuzz.toml", text) {
        assert!(!e.reason.is_empty(), "an error says why: {e:?}");
    }
});
