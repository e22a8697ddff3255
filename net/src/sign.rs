//! Signed calls between members: HMAC-SHA256 over method, path, node id,
//! timestamp, nonce and a digest of the body, so the cluster secret is never
//! sent and a captured call cannot be replayed.
//!
//! One header carries everything the receiver checks before it reads the
//! body: `x-zonegate-signature: v1 kid=K ts=MS nonce=N body=SHA256 sig=MAC`.
//! The receiver refuses an unknown key id, a bad MAC, a timestamp more than
//! [`WINDOW`] away from its clock, or a nonce it saw within the window; only
//! then does it read the body (bounded) and compare its digest with the
//! signed one. Answers are signed the same way, bound to the request's
//! nonce, so a stale or forged answer is refused too.
//!
//! Keys: each purpose (Raft calls, session pins) gets its own key, derived
//! from the cluster secret with HKDF-SHA256, so one can never stand in for
//! the other. The secret may be a list (`new,old`): sign with the first,
//! verify with any; key ids (a digest of the derived key) say which.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Header carrying the signature of a call or its answer.
pub const SIGNATURE_HEADER: &str = "x-zonegate-signature";

/// How far a call's timestamp may be from the receiver's clock, either
/// way; also how long a nonce is remembered.
pub const WINDOW: Duration = Duration::from_secs(30);

/// Nonces remembered at most: members sign a few hundred calls per second
/// at most, so this is minutes of headroom; a full cache refuses calls
/// (fail closed) rather than forget a nonce inside its window.
const MAX_REMEMBERED: usize = 1 << 20;

/// What a key is for. Each purpose derives its own key from the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Raft RPCs and zone reports between members.
    Raft,
    /// Session-pin tokens handed to clients.
    Pin,
}

impl Purpose {
    fn info(self) -> &'static [u8] {
        match self {
            Purpose::Raft => b"zonegate/raft-rpc/v1",
            Purpose::Pin => b"zonegate/session-pin/v1",
        }
    }
}

/// One derived key and its id.
#[derive(Clone)]
pub struct Key {
    id: String,
    bytes: [u8; 32],
}

impl Key {
    fn derive(secret: &str, purpose: Purpose) -> Self {
        let hk = hkdf::Hkdf::<Sha256>::new(Some(b"zonegate"), secret.as_bytes());
        let mut bytes = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's 8,160-byte limit.
        let _ = hk.expand(purpose.info(), &mut bytes);
        let id = hex::encode(&Sha256::digest([&b"zonegate key id\n"[..], &bytes].concat())[..4]);
        Self { id, bytes }
    }

    /// The key id: 8 hex digits, the same on every node with this secret.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// HMAC-SHA256 of `parts`, each followed by a newline.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.bytes).expect("HMAC takes any key length");
        for p in parts {
            mac.update(p);
            mac.update(b"\n");
        }
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

/// The keys of one purpose: the first signs, any verifies.
#[derive(Clone, Debug)]
pub struct KeyRing {
    keys: Vec<Key>,
}

/// Why a secret list cannot make keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the cluster secret is empty")]
    Empty,
    #[error("secret #{0} in the list is empty (a stray comma?)")]
    EmptyEntry(usize),
    #[error("secret #{0} is shorter than 16 bytes")]
    TooShort(usize),
}

impl KeyRing {
    /// Keys for `purpose` from a comma-separated secret list (`new,old`).
    pub fn derive(secrets: &str, purpose: Purpose) -> Result<Self, KeyError> {
        if secrets.trim().is_empty() {
            return Err(KeyError::Empty);
        }
        let mut keys = Vec::new();
        for (i, s) in secrets.split(',').enumerate() {
            let s = s.trim();
            if s.is_empty() {
                return Err(KeyError::EmptyEntry(i + 1));
            }
            if s.len() < 16 {
                return Err(KeyError::TooShort(i + 1));
            }
            keys.push(Key::derive(s, purpose));
        }
        Ok(Self { keys })
    }

    /// A ring of one random key (a standalone node's pins).
    pub fn random(purpose: Purpose) -> Self {
        // From the OS CSPRNG: a clock-seeded generator's key could be
        // recomputed by whoever guesses the start time.
        let secret = crate::random::hex(32);
        Self {
            keys: vec![Key::derive(&secret, purpose)],
        }
    }

    /// The key that signs.
    pub fn signer(&self) -> &Key {
        &self.keys[0]
    }

    /// The key with this id, if the ring holds it.
    pub fn find(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// The key ids, signer first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }
}

/// Why a signed call or answer is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("no signature")]
    Missing,
    #[error("malformed signature header")]
    Malformed,
    #[error("signed with key {0}, which this node does not hold")]
    UnknownKey(String),
    #[error("bad signature")]
    BadSignature,
    #[error("signed {0} ms away from this node's clock (at most 30 s)")]
    Stale(u64),
    #[error("replayed: this nonce was seen within the last 30 s")]
    Replayed,
    #[error("too many calls in the replay window")]
    ReplayCacheFull,
    #[error("the body does not match its signed digest")]
    BodyMismatch,
}

impl SignError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SignError::Missing | SignError::Malformed => "unsigned",
            SignError::UnknownKey(_) => "unknown_key",
            SignError::BadSignature | SignError::BodyMismatch => "bad_signature",
            SignError::Stale(_) => "stale",
            SignError::Replayed | SignError::ReplayCacheFull => "replayed",
        }
    }
}

/// The parsed signature header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub kid: String,
    pub ts_ms: u64,
    pub nonce: String,
    /// Hex SHA-256 of the body.
    pub body: String,
    pub sig: String,
}

impl Signature {
    /// The header value.
    pub fn header(&self) -> String {
        format!(
            "v1 kid={} ts={} nonce={} body={} sig={}",
            self.kid, self.ts_ms, self.nonce, self.body, self.sig
        )
    }

    /// Parses a header value; fields in any order, all required.
    pub fn parse(value: &str) -> Result<Self, SignError> {
        let mut words = value.split_ascii_whitespace();
        if words.next() != Some("v1") {
            return Err(SignError::Malformed);
        }
        let (mut kid, mut ts, mut nonce, mut body, mut sig) = (None, None, None, None, None);
        for w in words {
            let (k, v) = w.split_once('=').ok_or(SignError::Malformed)?;
            let slot = match k {
                "kid" => &mut kid,
                "ts" => &mut ts,
                "nonce" => &mut nonce,
                "body" => &mut body,
                "sig" => &mut sig,
                _ => return Err(SignError::Malformed),
            };
            if slot.replace(v).is_some() || v.len() > 128 {
                return Err(SignError::Malformed);
            }
        }
        let field = |v: Option<&str>| v.map(str::to_owned).ok_or(SignError::Malformed);
        Ok(Self {
            kid: field(kid)?,
            ts_ms: ts
                .and_then(|t| t.parse().ok())
                .ok_or(SignError::Malformed)?,
            nonce: field(nonce)?,
            body: field(body)?,
            sig: field(sig)?,
        })
    }
}

/// Hex SHA-256 of a body.
pub fn body_digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// What a call's signature covers.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub node: u64,
}

fn request_mac(key: &Key, call: Call<'_>, ts_ms: u64, nonce: &str, body: &str) -> [u8; 32] {
    key.mac(&[
        b"zonegate-call-v1",
        call.method.as_bytes(),
        call.path.as_bytes(),
        call.node.to_string().as_bytes(),
        ts_ms.to_string().as_bytes(),
        nonce.as_bytes(),
        body.as_bytes(),
    ])
}

fn answer_mac(
    key: &Key,
    status: u16,
    call: Call<'_>,
    ts_ms: u64,
    nonce: &str,
    body: &str,
) -> [u8; 32] {
    key.mac(&[
        b"zonegate-answer-v1",
        status.to_string().as_bytes(),
        call.path.as_bytes(),
        call.node.to_string().as_bytes(),
        ts_ms.to_string().as_bytes(),
        nonce.as_bytes(),
        body.as_bytes(),
    ])
}

/// Signs a call with the ring's first key and a fresh nonce.
pub fn sign_call(ring: &KeyRing, call: Call<'_>, body: &[u8], now_ms: u64) -> Signature {
    let key = ring.signer();
    let nonce = crate::random::hex(16);
    let body = body_digest(body);
    let sig = hex::encode(request_mac(key, call, now_ms, &nonce, &body));
    Signature {
        kid: key.id.clone(),
        ts_ms: now_ms,
        nonce,
        body,
        sig,
    }
}

/// Signs an answer to the call that carried `nonce` with `key` (the key
/// the call was signed with, so a caller still on an older key can check
/// the answer during a rotation); `call.node` is the answering node.
pub fn sign_answer(
    key: &Key,
    status: u16,
    call: Call<'_>,
    nonce: &str,
    body: &[u8],
    now_ms: u64,
) -> Signature {
    let body = body_digest(body);
    let sig = hex::encode(answer_mac(key, status, call, now_ms, nonce, &body));
    Signature {
        kid: key.id.clone(),
        ts_ms: now_ms,
        nonce: nonce.to_owned(),
        body,
        sig,
    }
}

fn fresh(ts_ms: u64, now_ms: u64) -> Result<(), SignError> {
    let skew = ts_ms.abs_diff(now_ms);
    if skew > WINDOW.as_millis() as u64 {
        return Err(SignError::Stale(skew));
    }
    Ok(())
}

fn mac_matches(expected: [u8; 32], given: &str) -> bool {
    let mut given_bytes = [0u8; 32];
    hex::decode_to_slice(given, &mut given_bytes).is_ok()
        && bool::from(expected.ct_eq(&given_bytes))
}

/// Checks an answer's signature and body against the call it answers.
pub fn verify_answer(
    ring: &KeyRing,
    header: Option<&str>,
    status: u16,
    call: Call<'_>,
    nonce: &str,
    body: &[u8],
    now_ms: u64,
) -> Result<(), SignError> {
    let s = Signature::parse(header.ok_or(SignError::Missing)?)?;
    let key = ring
        .find(&s.kid)
        .ok_or_else(|| SignError::UnknownKey(s.kid.clone()))?;
    if s.nonce != nonce {
        return Err(SignError::BadSignature);
    }
    let expected = answer_mac(key, status, call, s.ts_ms, &s.nonce, &s.body);
    if !mac_matches(expected, &s.sig) {
        return Err(SignError::BadSignature);
    }
    fresh(s.ts_ms, now_ms)?;
    if body_digest(body) != s.body {
        return Err(SignError::BodyMismatch);
    }
    Ok(())
}

/// The receiving side: checks calls against a key ring and remembers
/// nonces for [`WINDOW`].
pub struct Verifier {
    ring: KeyRing,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// nonce → when it may be forgotten (ms).
    until: HashMap<String, u64>,
    next_prune_ms: u64,
}

impl Verifier {
    pub fn new(ring: KeyRing) -> Self {
        Self {
            ring,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The ring this verifier checks against (also signs answers).
    pub fn ring(&self) -> &KeyRing {
        &self.ring
    }

    /// Checks a call's head, before its body is read: a known key, a valid
    /// MAC, a fresh timestamp, an unseen nonce (remembered from now on).
    /// Returns the signature: its `body` digest must match the body.
    pub fn check_head(
        &self,
        header: Option<&str>,
        call: Call<'_>,
        now_ms: u64,
    ) -> Result<Signature, SignError> {
        let s = Signature::parse(header.ok_or(SignError::Missing)?)?;
        let key = self
            .ring
            .find(&s.kid)
            .ok_or_else(|| SignError::UnknownKey(s.kid.clone()))?;
        let expected = request_mac(key, call, s.ts_ms, &s.nonce, &s.body);
        if !mac_matches(expected, &s.sig) {
            return Err(SignError::BadSignature);
        }
        fresh(s.ts_ms, now_ms)?;
        self.remember(&s.nonce, now_ms)?;
        Ok(s)
    }

    fn remember(&self, nonce: &str, now_ms: u64) -> Result<(), SignError> {
        let window = WINDOW.as_millis() as u64;
        let mut seen = self.seen.lock();
        if now_ms >= seen.next_prune_ms || seen.until.len() >= MAX_REMEMBERED {
            seen.until.retain(|_, until| *until >= now_ms);
            seen.next_prune_ms = now_ms.saturating_add(1_000);
        }
        if seen.until.get(nonce).is_some_and(|until| *until >= now_ms) {
            return Err(SignError::Replayed);
        }
        if seen.until.len() >= MAX_REMEMBERED {
            return Err(SignError::ReplayCacheFull);
        }
        // A call signed up to WINDOW ahead of this clock stays acceptable
        // for twice the window: remember it that long.
        seen.until
            .insert(nonce.to_owned(), now_ms.saturating_add(2 * window));
        Ok(())
    }
}

/// The body of a checked call matches its signed digest.
pub fn check_body(signature: &Signature, body: &[u8]) -> Result<(), SignError> {
    if bool::from(
        body_digest(body)
            .as_bytes()
            .ct_eq(signature.body.as_bytes()),
    ) {
        Ok(())
    } else {
        Err(SignError::BodyMismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-secret-0123456789";
    const NEW: &str = "new-secret-0123456789";

    fn call() -> Call<'static> {
        Call {
            method: "POST",
            path: "/raft/v1/append",
            node: 2,
        }
    }

    fn verifier(secrets: &str) -> Verifier {
        Verifier::new(KeyRing::derive(secrets, Purpose::Raft).unwrap())
    }

    #[test]
    fn a_signed_call_verifies_once_and_its_replay_is_refused() {
        let ring = KeyRing::derive(OLD, Purpose::Raft).unwrap();
        let v = verifier(OLD);
        let s = sign_call(&ring, call(), b"body", 1_000_000);
        let head = s.header();
        let checked = v.check_head(Some(&head), call(), 1_000_500).unwrap();
        check_body(&checked, b"body").unwrap();
        assert_eq!(
            v.check_head(Some(&head), call(), 1_001_000),
            Err(SignError::Replayed)
        );
    }

    #[test]
    fn a_call_checked_at_the_end_of_the_clock_is_remembered_without_overflow() {
        // Found by the `sign` fuzz target: remembering a nonce added the
        // window to the clock unchecked.
        let ring = KeyRing::derive(OLD, Purpose::Raft).unwrap();
        let v = verifier(OLD);
        for now in [u64::MAX - 10, u64::MAX] {
            let head = sign_call(&ring, call(), b"body", now).header();
            v.check_head(Some(&head), call(), now).unwrap();
            assert_eq!(
                v.check_head(Some(&head), call(), now),
                Err(SignError::Replayed)
            );
        }
    }

    #[test]
    fn refusals_table() {
        let ring = KeyRing::derive(OLD, Purpose::Raft).unwrap();
        let v = verifier(OLD);
        let now = 10_000_000;
        let good = sign_call(&ring, call(), b"x", now);
        let mut tampered = good.clone();
        tampered.sig = hex::encode([0u8; 32]);
        let other_node = Call { node: 3, ..call() };
        let other_path = Call {
            path: "/raft/v1/vote",
            ..call()
        };
        let cases: Vec<(&str, Option<String>, Call, u64, SignError)> = vec![
            ("missing", None, call(), now, SignError::Missing),
            (
                "garbage",
                Some("v1 nonsense".into()),
                call(),
                now,
                SignError::Malformed,
            ),
            (
                "tampered mac",
                Some(tampered.header()),
                call(),
                now,
                SignError::BadSignature,
            ),
            (
                "another sender",
                Some(good.header()),
                other_node,
                now,
                SignError::BadSignature,
            ),
            (
                "another path",
                Some(good.header()),
                other_path,
                now,
                SignError::BadSignature,
            ),
            (
                "31 s old",
                Some(good.header()),
                call(),
                now + 31_000,
                SignError::Stale(31_000),
            ),
            (
                "31 s ahead",
                Some(good.header()),
                call(),
                now - 31_000,
                SignError::Stale(31_000),
            ),
        ];
        for (name, header, c, at, want) in cases {
            assert_eq!(v.check_head(header.as_deref(), c, at), Err(want), "{name}");
        }
        // None of the refusals consumed the nonce.
        assert!(v.check_head(Some(&good.header()), call(), now).is_ok());
        assert_eq!(check_body(&good, b"y"), Err(SignError::BodyMismatch));
    }

    #[test]
    fn the_right_secret_with_a_wrong_key_id_or_purpose_is_refused() {
        let pin_ring = KeyRing::derive(OLD, Purpose::Pin).unwrap();
        let s = sign_call(&pin_ring, call(), b"", 0);
        assert!(matches!(
            verifier(OLD).check_head(Some(&s.header()), call(), 0),
            Err(SignError::UnknownKey(_))
        ));
    }

    #[test]
    fn rotation_signs_with_the_first_and_verifies_with_any() {
        let old = KeyRing::derive(OLD, Purpose::Raft).unwrap();
        let both = KeyRing::derive(&format!("{NEW},{OLD}"), Purpose::Raft).unwrap();
        let new = KeyRing::derive(NEW, Purpose::Raft).unwrap();
        // old → new,old: the rotated node still verifies the old one.
        let from_old = sign_call(&old, call(), b"", 0);
        assert!(Verifier::new(both.clone())
            .check_head(Some(&from_old.header()), call(), 0)
            .is_ok());
        // new,old signs with new, which a new-only node verifies.
        let from_both = sign_call(&both, call(), b"", 0);
        assert_eq!(from_both.kid, new.signer().id());
        assert!(Verifier::new(new)
            .check_head(Some(&from_both.header()), call(), 0)
            .is_ok());
        assert_ne!(old.signer().id(), both.signer().id());
    }

    #[test]
    fn answers_are_bound_to_their_call() {
        let ring = KeyRing::derive(OLD, Purpose::Raft).unwrap();
        let c = Call { node: 1, ..call() };
        let a = sign_answer(ring.signer(), 200, c, "n1", b"ok", 5_000);
        let h = a.header();
        assert!(verify_answer(&ring, Some(&h), 200, c, "n1", b"ok", 5_000).is_ok());
        for (status, nonce, body) in [
            (200, "n2", &b"ok"[..]),
            (500, "n1", b"ok"),
            (200, "n1", b"no"),
        ] {
            assert!(verify_answer(&ring, Some(&h), status, c, nonce, body, 5_000).is_err());
        }
    }

    #[test]
    fn bad_secret_lists_are_refused() {
        assert!(matches!(
            KeyRing::derive("", Purpose::Raft),
            Err(KeyError::Empty)
        ));
        assert!(matches!(
            KeyRing::derive(&format!("{NEW},"), Purpose::Raft),
            Err(KeyError::EmptyEntry(2))
        ));
        assert!(matches!(
            KeyRing::derive("short", Purpose::Raft),
            Err(KeyError::TooShort(1))
        ));
    }
}
