//! The control plane's bincode decoders (`cluster/src/codec.rs`): every
//! type a node decodes from the network or its disk. Never a panic, never
//! an allocation past the type's limit (libFuzzer's -rss_limit_mb and
//! -malloc_limit_mb catch one); a value decoded encodes and decodes again.
//!
//! Input: one byte choosing the type (`fuzzing::KINDS`), then the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zonegate_cluster::fuzzing::KINDS;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    let (name, decode) = KINDS[usize::from(kind) % KINDS.len()];
    if let Err(e) = decode(bytes) {
        panic!("{name}: {e}");
    }
});
