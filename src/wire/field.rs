//! Byte-range helpers shared by the header views.
//!
//! Each header module names its fields' byte offsets in a `mod field`. Every view checks its
//! length once, in `new_checked`; after that these helpers index inside the checked range only.
//! All IBTA fields are big-endian.

fn array<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(array(bytes, at))
}

/// A 24-bit field: QPNs, PSNs and MSNs.
pub fn u24_at(bytes: &[u8], at: usize) -> u32 {
    let [a, b, c] = array(bytes, at);
    u32::from_be_bytes([0, a, b, c])
}

pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(array(bytes, at))
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(array(bytes, at))
}

pub fn set_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

/// Writes the low 24 bits of `value`.
pub fn set_u24(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 3].copy_from_slice(&value.to_be_bytes()[1..]);
}

pub fn set_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

pub fn set_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_be_bytes());
}
