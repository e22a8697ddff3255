//! API keys → tenants, and admin tokens → roles. Keys are stored as SHA-256
//! digests, so the config does not reveal them. A tenant's key is found by
//! its digest in a map (one lookup at any number of keys): the lookup's
//! timing depends on the digest, which nobody can steer without a SHA-256
//! preimage, and the entry found is confirmed in constant time. Admin
//! tokens, a handful, are compared in constant time one by one.

use std::collections::HashMap;
use std::hash::BuildHasher;

use http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};
use zonegate_net::http1::name_is;

use crate::config::{AdminToken, Role, Tenant};

/// A header map's `Authorization` value, when it is text.
pub fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()
}

/// The bearer token of a request's `Authorization` value (as text), if
/// it sent one.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.split_once(' ')?;
    name_is(scheme.as_bytes(), b"bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Two digests equal, in constant time, compared as four 64-bit words:
/// `subtle` hides each compared unit from the optimiser, so 32 bytes cost
/// ~29 ns and four words ~3 ns.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> Choice {
    words(a).ct_eq(&words(b))
}

fn words(d: &[u8; 32]) -> [u64; 4] {
    let mut out = [0u64; 4];
    for (word, bytes) in out.iter_mut().zip(d.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        *word = u64::from_le_bytes(b);
    }
    out
}

/// Index of the entry whose digest list holds SHA-256(`secret`). Every
/// digest is compared, whatever matches, so timing says nothing.
fn find<'a, T>(
    secret: &str,
    entries: &'a [T],
    digests: impl Fn(&'a T) -> &'a [[u8; 32]],
) -> Option<&'a T> {
    let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    let mut found = None;
    for entry in entries {
        for d in digests(entry) {
            if bool::from(same_digest(d, &presented)) {
                found = Some(entry);
            }
        }
    }
    found
}

/// An authenticated tenant and its place in the config's `tenants` (its
/// quota state and metric handles are kept by that index).
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub index: usize,
    pub tenant: &'a Tenant,
}

/// The tenant whose key is `key`, found by its digest in `keys` (digest →
/// index into `tenants`, as `Config::tenant_keys` holds them).
pub fn tenant<'a, S: BuildHasher>(
    key: &str,
    tenants: &'a [Tenant],
    keys: &HashMap<[u8; 32], usize, S>,
) -> Option<Caller<'a>> {
    let presented: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    let index = *keys.get(&presented)?;
    let tenant = tenants.get(index)?;
    tenant
        .key_hashes
        .iter()
        .any(|d| bool::from(same_digest(d, &presented)))
        .then_some(Caller { index, tenant })
}

pub fn admin_token<'a>(token: &str, tokens: &'a [AdminToken]) -> Option<&'a AdminToken> {
    find(token, tokens, |t| std::slice::from_ref(&t.hash))
}

/// Whether `role` may use `method` on the admin API: viewers read,
/// operators read and write.
pub fn allows(role: Role, method: &http::Method) -> bool {
    role == Role::Operator || method == http::Method::GET || method == http::Method::HEAD
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Priority;

    fn digest(s: &str) -> [u8; 32] {
        Sha256::digest(s.as_bytes()).into()
    }

    #[test]
    fn digests_are_equal_only_when_every_byte_is() {
        let d = digest("tenant-key");
        assert!(bool::from(same_digest(&d, &d)));
        for i in 0..32 {
            for bit in [0x01, 0x80] {
                let mut other = d;
                other[i] ^= bit;
                assert!(!bool::from(same_digest(&d, &other)), "byte {i}");
            }
        }
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(authorization(&h)), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(authorization(&h)), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(authorization(&h)), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(authorization(&h)), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(authorization(&h)), None);
    }

    #[test]
    fn keys_map_to_tenants() {
        let tenants = vec![
            Tenant {
                name: "a".into(),
                key_hashes: vec![digest("ka1"), digest("ka2")],
                priority: Priority::P0,
            },
            Tenant {
                name: "b".into(),
                key_hashes: vec![digest("kb")],
                priority: Priority::P2,
            },
        ];
        let keys: HashMap<[u8; 32], usize> =
            [(digest("ka1"), 0), (digest("ka2"), 0), (digest("kb"), 1)].into();
        let found = |key| tenant(key, &tenants, &keys).map(|c| (c.index, &*c.tenant.name));
        assert_eq!(found("ka2"), Some((0, "a")));
        assert_eq!(found("kb"), Some((1, "b")));
        assert!(tenant("nope", &tenants, &keys).is_none());
        // An index that disagrees with the tenant's own digests finds no one.
        let stale: HashMap<[u8; 32], usize> = [(digest("kb"), 0), (digest("ka1"), 7)].into();
        assert!(tenant("kb", &tenants, &stale).is_none());
        assert!(tenant("ka1", &tenants, &stale).is_none());
    }

    #[test]
    fn viewers_read_operators_write() {
        assert!(allows(Role::Viewer, &http::Method::GET));
        assert!(!allows(Role::Viewer, &http::Method::POST));
        assert!(allows(Role::Operator, &http::Method::POST));
    }
}
