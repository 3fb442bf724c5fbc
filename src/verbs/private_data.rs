//! Private data that says how long it is. A CM message carries a fixed number of private data
//! bytes (56 in a REQ after RDMA-CM's header, 196 in a REP, 148 in a REJ; IBTA 12.6), padded
//! with zeros by the sender, and no length: what arrives is always the whole field. An
//! application that needs to know how much its peer sent, or sends bytes that may end in
//! zeros, puts the length in the data itself; these two calls do it with one byte in front.
//!
//! ```
//! use softroce::verbs::private_data;
//!
//! let sent = private_data::encode(b"ends in zero\0").unwrap();
//! let mut arrived = sent.clone();
//! arrived.resize(56, 0); // as a REQ's field arrives
//! assert_eq!(private_data::decode(&arrived), Some(&b"ends in zero\0"[..]));
//! ```

use super::{Error, Result};
use crate::transport::VerbsError;

/// `data` behind a byte that says its length, for [`Connection::connect`](super::Connection::connect),
/// [`ConnectionRequest::accept`](super::ConnectionRequest::accept) and the like. Refused
/// beyond 255 bytes; the CM refuses what its message has no room for.
pub fn encode(data: &[u8]) -> Result<Vec<u8>> {
    let len = u8::try_from(data.len()).map_err(|_| {
        Error::Verbs(VerbsError::InvalidRequest(
            "private data with a length byte holds at most 255 bytes",
        ))
    })?;
    let mut framed = Vec::with_capacity(data.len() + 1);
    framed.push(len);
    framed.extend_from_slice(data);
    Ok(framed)
}

/// The bytes [`encode`] sent, from the whole private data field that arrived; `None` if the
/// field is too short for the length its first byte names (a peer that did not encode).
pub fn decode(received: &[u8]) -> Option<&[u8]> {
    let (&len, rest) = received.split_first()?;
    rest.get(..usize::from(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_encoded_comes_back_whatever_the_padding() {
        for data in [&b""[..], b"x", b"\0\0", &[7u8; 255]] {
            let mut field = encode(data).unwrap();
            field.resize(field.len() + 40, 0);
            assert_eq!(decode(&field), Some(data));
        }
        assert!(encode(&[0; 256]).is_err());
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[9, 1, 2]), None, "shorter than it says");
    }
}
