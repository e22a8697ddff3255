//! The one binary encoding of the control plane: Raft RPC bodies, log
//! entries, the persisted state machine and snapshots.
//!
//! bincode 2 (serde mode, standard config) sits behind these two functions
//! so it can be swapped without touching callers. bincode 3.0.0 on crates.io
//! is a tombstone that does not compile; stay on 2.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encoding or decoding failed; the message says which and why.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("decode: {0} trailing bytes after the value")]
    TrailingBytes(usize),
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encode a value to bytes.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(value, config())?)
}

/// Decode a value from exactly `bytes`: trailing garbage is an error, so a
/// truncated or concatenated body is never half-read.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - used));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&42u64).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<u64>(&bytes),
            Err(CodecError::TrailingBytes(1))
        ));
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let bytes = encode(&"a longer string".to_string()).unwrap();
        assert!(decode::<String>(&bytes[..3]).is_err());
    }
}
