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

/// A big-endian 16-bit field.
pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(array(bytes, at))
}

/// A 24-bit field: QPNs, PSNs and MSNs.
pub fn u24_at(bytes: &[u8], at: usize) -> u32 {
    let [a, b, c] = array(bytes, at);
    u32::from_be_bytes([0, a, b, c])
}

/// A big-endian 32-bit field.
pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(array(bytes, at))
}

/// A big-endian 64-bit field.
pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(array(bytes, at))
}

/// Writes a big-endian 16-bit field.
pub fn set_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

/// Writes the low 24 bits of `value`.
pub fn set_u24(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 3].copy_from_slice(&value.to_be_bytes()[1..]);
}

/// Writes a big-endian 32-bit field.
pub fn set_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

/// Writes a big-endian 64-bit field.
pub fn set_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_be_bytes());
}

/// `width` bits of the byte at `at`, starting `from_msb` bits below its most significant bit,
/// as IBTA's tables number bit fields (chapter 12's CM messages pack several into one byte).
pub fn bits_at(bytes: &[u8], at: usize, from_msb: u32, width: u32) -> u8 {
    let shift = 8 - from_msb - width;
    (bytes[at] >> shift) & ((1u16 << width) - 1) as u8
}

/// Writes the low `width` bits of `value` where [`bits_at`] reads them, keeping the byte's
/// other bits.
pub fn set_bits(bytes: &mut [u8], at: usize, from_msb: u32, width: u32, value: u8) {
    let shift = 8 - from_msb - width;
    let mask = (((1u16 << width) - 1) as u8) << shift;
    bytes[at] = (bytes[at] & !mask) | ((value << shift) & mask);
}

/// `N` bytes at `at`: GIDs, private data.
pub fn bytes_at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    array(bytes, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0xa7, as rxe sends a REQ's byte 47: a CM response timeout of 20 in the top five bits
    /// and a retry count of 7 in the low three.
    #[test]
    fn bit_fields_count_from_the_most_significant_bit() {
        let mut b = [0xa7];
        assert_eq!((bits_at(&b, 0, 0, 5), bits_at(&b, 0, 5, 3)), (20, 7));
        set_bits(&mut b, 0, 5, 3, 2);
        assert_eq!(b, [0xa2]);
        set_bits(&mut b, 0, 0, 5, 0xff);
        assert_eq!(b, [0xfa]);
    }
}
