//! Zone-pinned sessions: a session's first request pins it to the zone that
//! served it, and later requests go back there from any node that can know
//! the pin: through a signed token the client echoes (`x-zonegate-pin`), or
//! through this node's bounded pin table (LRU with TTL).

use std::time::Duration;

use hmac::{Hmac, Mac};
use lru::LruCache;
use parking_lot::Mutex;
use sha2::Sha256;
use zonegate_cluster::ZoneId;

type HmacSha256 = Hmac<Sha256>;

/// The header that carries a pin token, in responses and in requests.
pub const PIN_HEADER: &str = "x-zonegate-pin";

/// Signs and verifies pin tokens: `v1:<expiry unix s>:<zone>:<hex mac>`,
/// where the MAC (HMAC-SHA256 with the cluster secret) covers the session
/// key's hash, the zone and the expiry. A token is only good for the session
/// it was issued to, and a forged or expired one is ignored.
#[derive(Clone)]
pub struct PinSigner {
    key: Vec<u8>,
}

impl std::fmt::Debug for PinSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PinSigner(<secret>)")
    }
}

impl PinSigner {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: secret.to_vec(),
        }
    }

    fn mac(&self, session: u64, zone: &str, expiry_s: u64) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.key).ok()?;
        mac.update(b"zonegate-pin-v1|");
        mac.update(&session.to_le_bytes());
        mac.update(b"|");
        mac.update(zone.as_bytes());
        mac.update(b"|");
        mac.update(&expiry_s.to_le_bytes());
        Some(mac)
    }

    /// A token pinning `session` (its hash) to `zone` until `expiry_s`.
    pub fn sign(&self, session: u64, zone: &ZoneId, expiry_s: u64) -> Option<String> {
        let tag = self
            .mac(session, zone.as_str(), expiry_s)?
            .finalize()
            .into_bytes();
        Some(format!("v1:{expiry_s}:{}:{}", zone, hex::encode(tag)))
    }

    /// The zone a token pins `session` to, if it is authentic and unexpired
    /// at `now_s`. Anything else is `None`: never an error.
    pub fn verify(&self, token: &str, session: u64, now_s: u64) -> Option<ZoneId> {
        let rest = token.strip_prefix("v1:")?;
        let (expiry, rest) = rest.split_once(':')?;
        let (zone, tag) = rest.rsplit_once(':')?;
        let expiry_s: u64 = expiry.parse().ok()?;
        if expiry_s <= now_s || zone.is_empty() {
            return None;
        }
        let tag = hex::decode(tag).ok()?;
        // `verify_slice` compares in constant time.
        self.mac(session, zone, expiry_s)?.verify_slice(&tag).ok()?;
        Some(ZoneId::new(zone))
    }
}

/// Shards of the pin table: sessions spread over them by hash, so requests
/// of different sessions rarely wait on one lock.
const SHARDS: usize = 16;

/// This node's memory of session → home zone: bounded (least recently used
/// out first) and expiring.
pub struct PinTable {
    shards: Vec<Mutex<LruCache<u64, (ZoneId, u64)>>>,
    per_shard: usize,
    ttl_s: u64,
}

impl std::fmt::Debug for PinTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinTable")
            .field("capacity", &(self.per_shard * SHARDS))
            .field("ttl_s", &self.ttl_s)
            .finish()
    }
}

impl PinTable {
    /// Room for about `capacity` sessions, each remembered for `ttl`.
    /// Memory grows with use, not with capacity.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            // Unbounded caches trimmed by hand: `LruCache::new(cap)` would
            // reserve the whole capacity up front.
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::unbounded()))
                .collect(),
            per_shard,
            ttl_s: ttl.as_secs().max(1),
        }
    }

    fn shard(&self, session: u64) -> &Mutex<LruCache<u64, (ZoneId, u64)>> {
        &self.shards[(session as usize) % SHARDS]
    }

    /// The pinned zone of `session`, if remembered and unexpired.
    pub fn get(&self, session: u64, now_s: u64) -> Option<ZoneId> {
        let mut shard = self.shard(session).lock();
        match shard.get(&session) {
            Some((zone, expiry)) if *expiry > now_s => Some(zone.clone()),
            Some(_) => {
                shard.pop(&session);
                None
            }
            None => None,
        }
    }

    /// Remembers (or refreshes) `session` → `zone`; returns the expiry.
    pub fn put(&self, session: u64, zone: ZoneId, now_s: u64) -> u64 {
        let expiry = now_s + self.ttl_s;
        let mut shard = self.shard(session).lock();
        shard.put(session, (zone, expiry));
        while shard.len() > self.per_shard {
            shard.pop_lru();
        }
        expiry
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_for_its_session_only() {
        let s = PinSigner::new(b"secret");
        let zone = ZoneId::new("az-b");
        let t = s.sign(42, &zone, 1_000).unwrap();
        assert_eq!(s.verify(&t, 42, 999), Some(zone));
        assert_eq!(s.verify(&t, 43, 999), None, "another session's token");
        assert_eq!(s.verify(&t, 42, 1_000), None, "expired");
        assert_eq!(
            PinSigner::new(b"other").verify(&t, 42, 999),
            None,
            "another cluster's secret"
        );
    }

    #[test]
    fn forged_or_garbled_tokens_are_ignored() {
        let s = PinSigner::new(b"secret");
        let good = s.sign(7, &ZoneId::new("az-a"), 5_000).unwrap();
        let moved = good.replace(":az-a:", ":az-c:");
        let later = good.replacen("5000", "9000", 1);
        for bad in [
            "",
            "v1",
            "v2:1:a:00",
            "v1:x:az-a:00",
            "v1:5000:az-a:zz",
            &moved,
            &later,
        ] {
            assert_eq!(s.verify(bad, 7, 10), None, "{bad}");
        }
    }

    #[test]
    fn the_table_expires_and_stays_bounded() {
        let t = PinTable::new(32, Duration::from_secs(10));
        t.put(1, ZoneId::new("az-a"), 100);
        assert_eq!(t.get(1, 105), Some(ZoneId::new("az-a")));
        assert_eq!(t.get(1, 110), None, "expired after the TTL");
        for k in 0..10_000u64 {
            t.put(k, ZoneId::new("az-b"), 200);
        }
        assert!(t.len() <= 32, "{} entries", t.len());
        // The most recent sessions are the ones kept.
        assert_eq!(t.get(9_999, 201), Some(ZoneId::new("az-b")));
    }
}
