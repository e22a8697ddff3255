//! Zone-pinned sessions: a session's first request pins it to the zone that
//! served it, and later requests go back there from any node that can know
//! the pin: through a signed token the client echoes (`x-zonegate-pin`), or
//! through this node's bounded pin table (LRU with TTL).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use lru::LruCache;
use parking_lot::Mutex;
use subtle::ConstantTimeEq;
use zonegate_cluster::ZoneId;
use zonegate_net::sign::{Key, KeyRing};

/// The header that carries a pin token, in responses and in requests.
pub const PIN_HEADER: &str = "x-zonegate-pin";

/// Signs and verifies pin tokens: `v2:<key id>:<expiry unix s>:<zone>:<hex
/// mac>`, where the MAC (HMAC-SHA256 with the pin key, derived from the
/// cluster secret apart from the Raft key) covers the tenant, the session
/// key's hash, the zone and the expiry. A token is only good for the tenant
/// and session it was issued to; a forged, expired or other-tenant one is
/// ignored. Tokens signed with any key of the ring are honoured, so pins
/// survive a rotation while the old secret is still listed.
#[derive(Clone)]
pub struct PinSigner {
    keys: KeyRing,
}

impl std::fmt::Debug for PinSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinSigner({:?})", self.keys.ids())
    }
}

impl PinSigner {
    pub fn new(keys: KeyRing) -> Self {
        Self { keys }
    }

    fn mac(key: &Key, tenant: &str, session: u64, zone: &str, expiry_s: u64) -> [u8; 32] {
        key.mac(&[
            b"zonegate-pin-v2",
            tenant.as_bytes(),
            &session.to_le_bytes(),
            zone.as_bytes(),
            &expiry_s.to_le_bytes(),
        ])
    }

    /// A token pinning `tenant`'s `session` (its hash) to `zone` until
    /// `expiry_s`.
    pub fn sign(&self, tenant: &str, session: u64, zone: &ZoneId, expiry_s: u64) -> String {
        let key = self.keys.signer();
        let tag = Self::mac(key, tenant, session, zone.as_str(), expiry_s);
        format!("v2:{}:{expiry_s}:{}:{}", key.id(), zone, hex::encode(tag))
    }

    /// The zone a token pins `tenant`'s `session` to, if it is authentic
    /// and unexpired at `now_s`. Anything else is `None`: never an error.
    pub fn verify(&self, token: &str, tenant: &str, session: u64, now_s: u64) -> Option<ZoneId> {
        let rest = token.strip_prefix("v2:")?;
        let (kid, rest) = rest.split_once(':')?;
        let (expiry, rest) = rest.split_once(':')?;
        let (zone, tag) = rest.rsplit_once(':')?;
        let expiry_s: u64 = expiry.parse().ok()?;
        if expiry_s <= now_s || zone.is_empty() {
            return None;
        }
        let key = self.keys.find(kid)?;
        let mut given = [0u8; 32];
        hex::decode_to_slice(tag, &mut given).ok()?;
        let expected = Self::mac(key, tenant, session, zone, expiry_s);
        bool::from(expected.ct_eq(&given)).then(|| ZoneId::new(zone))
    }
}

/// Shards of the pin table: sessions spread over them by hash, so requests
/// of different sessions rarely wait on one lock.
const SHARDS: usize = 16;

/// This node's memory of session → home zone: bounded (least recently used
/// out first) and expiring.
pub struct PinTable {
    shards: Vec<Mutex<LruCache<u64, (ZoneId, u64)>>>,
    /// Both follow the config in effect ([`PinTable::resize`]).
    per_shard: AtomicUsize,
    ttl_s: AtomicU64,
}

impl std::fmt::Debug for PinTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinTable")
            .field("capacity", &(self.per_shard.load(Relaxed) * SHARDS))
            .field("ttl_s", &self.ttl_s.load(Relaxed))
            .finish()
    }
}

impl PinTable {
    /// Room for about `capacity` sessions, each remembered for `ttl`.
    /// Memory grows with use, not with capacity.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        let table = Self {
            // Unbounded caches trimmed by hand: `LruCache::new(cap)` would
            // reserve the whole capacity up front.
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::unbounded()))
                .collect(),
            per_shard: AtomicUsize::new(1),
            ttl_s: AtomicU64::new(1),
        };
        table.resize(capacity, ttl);
        table
    }

    /// A new capacity and TTL (an applied config): pins made from now on
    /// live `ttl`; a smaller table sheds its least recent pins as sessions
    /// arrive; pins already made keep their expiry.
    pub fn resize(&self, capacity: usize, ttl: Duration) {
        self.per_shard
            .store(capacity.div_ceil(SHARDS).max(1), Relaxed);
        self.ttl_s.store(ttl.as_secs().max(1), Relaxed);
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
        let expiry = now_s + self.ttl_s.load(Relaxed);
        let per_shard = self.per_shard.load(Relaxed);
        let mut shard = self.shard(session).lock();
        shard.put(session, (zone, expiry));
        while shard.len() > per_shard {
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

    use zonegate_net::sign::Purpose;

    const OLD: &str = "old-cluster-secret-0123";
    const NEW: &str = "new-cluster-secret-0123";

    fn signer(secrets: &str) -> PinSigner {
        PinSigner::new(KeyRing::derive(secrets, Purpose::Pin).unwrap())
    }

    #[test]
    fn a_resized_table_uses_the_new_ttl_and_sheds_down_to_the_new_capacity() {
        let table = PinTable::new(SHARDS * 4, Duration::from_secs(60));
        let zone = ZoneId::new("az-a");
        // Sessions 0, SHARDS, 2 × SHARDS, … share shard 0.
        for i in 0..4 {
            assert_eq!(table.put(i * SHARDS as u64, zone.clone(), 100), 160);
        }
        table.resize(SHARDS, Duration::from_secs(5));
        // The next pin in shard 0 lives 5 s and leaves room for one.
        assert_eq!(table.put(4 * SHARDS as u64, zone.clone(), 100), 105);
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(4 * SHARDS as u64, 104), Some(zone));
        assert_eq!(table.get(4 * SHARDS as u64, 105), None);
    }

    #[test]
    fn a_token_round_trips_for_its_tenant_and_session_only() {
        let s = signer(OLD);
        let zone = ZoneId::new("az-b");
        let t = s.sign("deptA", 42, &zone, 1_000);
        assert_eq!(s.verify(&t, "deptA", 42, 999), Some(zone));
        assert_eq!(
            s.verify(&t, "deptA", 43, 999),
            None,
            "another session's token"
        );
        assert_eq!(
            s.verify(&t, "deptB", 42, 999),
            None,
            "another tenant's token"
        );
        assert_eq!(s.verify(&t, "deptA", 42, 1_000), None, "expired");
        assert_eq!(
            signer(NEW).verify(&t, "deptA", 42, 999),
            None,
            "another cluster's secret"
        );
    }

    #[test]
    fn pins_signed_with_the_old_key_hold_while_it_is_listed() {
        let zone = ZoneId::new("az-a");
        let t = signer(OLD).sign("deptA", 1, &zone, 100);
        assert_eq!(
            signer(&format!("{NEW},{OLD}")).verify(&t, "deptA", 1, 50),
            Some(zone.clone())
        );
        assert_eq!(signer(NEW).verify(&t, "deptA", 1, 50), None);
        // Pin and Raft keys differ: a Raft-key MAC is no pin.
        let raft = PinSigner::new(KeyRing::derive(OLD, Purpose::Raft).unwrap());
        assert_eq!(
            signer(OLD).verify(&raft.sign("deptA", 1, &zone, 100), "deptA", 1, 50),
            None
        );
    }

    #[test]
    fn forged_or_garbled_tokens_are_ignored() {
        let s = signer(OLD);
        let good = s.sign("t", 7, &ZoneId::new("az-a"), 5_000);
        let moved = good.replace(":az-a:", ":az-c:");
        let later = good.replacen("5000", "9000", 1);
        for bad in [
            "",
            "v2",
            "v2:1:a:00",
            "v2:k:x:az-a:00",
            "v2:k:5000:az-a:zz",
            "v1:5000:az-a:00",
            &moved,
            &later,
        ] {
            assert_eq!(s.verify(bad, "t", 7, 10), None, "{bad}");
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
