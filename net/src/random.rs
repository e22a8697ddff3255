//! Randomness nobody can guess: keys and nonces straight from the OS
//! CSPRNG (`getrandom`); request ids from a ChaCha8 stream per thread,
//! seeded once from the OS, so the request path makes no system call per
//! id. (`fastrand`, seeded from the clock and thread id, stays for what
//! only needs to look random: jitter, load-balancing draws.)

use std::cell::RefCell;

use rand_chacha::rand_core::{RngCore as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

/// Fills `buf` from the OS CSPRNG.
///
/// # Panics
/// When the OS has no random number generator to give (no `getrandom`
/// system call and no `/dev/urandom`): nothing secret can be made then.
pub fn fill(buf: &mut [u8]) {
    if let Err(e) = getrandom::fill(buf) {
        panic!("the operating system's random number generator failed: {e}");
    }
}

/// `n` random bytes from the OS CSPRNG, as lowercase hex (a key, a nonce).
pub fn hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    fill(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

thread_local! {
    static IDS: RefCell<Option<ChaCha8Rng>> = const { RefCell::new(None) };
}

/// 128 unpredictable bits for an id (a request id): ChaCha8 seeded from
/// the OS CSPRNG once per thread.
pub fn id128() -> u128 {
    IDS.with(|cell| {
        let mut cell = cell.borrow_mut();
        let rng = cell.get_or_insert_with(|| {
            let mut seed = [0u8; 32];
            fill(&mut seed);
            ChaCha8Rng::from_seed(seed)
        });
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        u128::from_le_bytes(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nonces_and_ids_do_not_repeat() {
        let keys: std::collections::HashSet<String> = (0..1000).map(|_| hex(32)).collect();
        assert_eq!(keys.len(), 1000);
        assert!(keys.iter().all(|k| k.len() == 64));
        let ids: std::collections::HashSet<u128> = (0..10_000).map(|_| id128()).collect();
        assert_eq!(ids.len(), 10_000);
        // Another thread has its own stream, not a copy of this one.
        let here: Vec<u128> = (0..4).map(|_| id128()).collect();
        let there = std::thread::spawn(|| (0..4).map(|_| id128()).collect::<Vec<_>>())
            .join()
            .unwrap();
        assert_ne!(here, there);
    }
}
