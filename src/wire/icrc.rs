//! The invariant CRC of RoCEv2 (IBTA Annex A17.8), computed and verified.
//!
//! The ICRC is a CRC-32 (the Ethernet polynomial, as `crc32fast` computes it) over:
//!
//! 1. eight bytes of 0xFF, standing in for the InfiniBand LRH that RoCEv2 does not carry;
//! 2. the IP header, with the fields routers may change masked to ones:
//!    IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header, with its checksum masked to ones;
//! 4. the BTH, with byte 4 (FECN, BECN and the reserved bits) masked to ones;
//! 5. the rest of the packet through the pad.
//!
//! It travels least-significant byte first.
//!
//! # What can be verified without the IP header
//!
//! The IPv4 identification and flags are covered and not masked, and a UDP socket does not
//! deliver them. So:
//!
//! - a sender that lets the kernel frame its datagrams must know the ID the kernel will write.
//!   With `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an *unconnected* socket, Linux sends DF with
//!   ID 0 (a connected socket gets a per-socket counter). [`KernelFraming`] computes the ICRC
//!   for that framing;
//! - a receiver on a UDP socket knows, over IPv4, the addresses (with `IP_PKTINFO`), the ports
//!   and the lengths, but not the ID and the flags. rxe writes a per-destination counter,
//!   ConnectX an incrementing one, softroce's own sender 0, and a UDP_SEGMENT send one more per
//!   segment. [`solve_ipv4_id`] finds the one ID that makes the ICRC right, if there is one, and
//!   [`KernelFraming::verify_received`] uses it (see [below](#the-ipv4-id-solved)).
//!   [`KernelFraming::verify`] checks the exact framing, ID 0 included;
//! - over IPv6 every covered field is known or masked, so a UDP receiver verifies fully;
//! - a receiver that sees whole frames (pcap, AF_PACKET, raw sockets) verifies every packet with
//!   [`icrc_ipv4`] and [`icrc_ipv6`], as [`Frame::icrc_status`](super::Frame::icrc_status) does.
//!
//! # The IPv4 ID, solved
//!
//! A CRC is affine over GF(2): flipping bits of the input flips a fixed pattern of the CRC that
//! depends only on which bits and on how many bytes follow them. So the ICRC of a packet framed
//! with ID `x` is its ICRC with ID 0 XOR the contribution of `x` alone, and that contribution is
//! `x(z) · z^(8n + 32) mod P`, where `x(z)` is the 16 ID bits as a polynomial, `n` the number of
//! bytes after the ID field and `P` the CRC-32 polynomial. One CRC pass with ID 0 gives the
//! syndrome `S = ICRC(ID 0) XOR received`. If some ID is right, `S = x(z) · z^(8n+32)`, so
//! `S · z^-(8n+32) mod P` *is* `x(z)`: a polynomial of degree below 16, whose 16 high-order
//! coefficients are zero. (The table of the 65,536 unshifted contributions one might build is the
//! identity, so there is none.) Those 16 zero coefficients are the check. `z^-(8n+32)` is looked
//! up in two 256-entry tables computed at compile time (`n` below 2^16), so a solve costs the CRC
//! pass a plain check makes and two multiplications modulo `P` (one when under 256 bytes follow the ID field: RoCE packets up
//! to 237 bytes), with no
//! allocation and no state: 144 ns against 116 ns for the plain check of a 4 KiB packet, and
//! 29 ns for an ACK (`cargo bench --bench wire`).
//!
//! What that verifies, and what it does not:
//!
//! - every byte the ICRC covers except the ID: the addresses and ports (from the socket), the
//!   lengths, protocol UDP, a 20-byte header (no options, which a UDP socket does not report
//!   unless asked), and the whole RoCE packet, but 16 bits strong instead of 32. Random
//!   corruption gives a random syndrome and passes with probability 2^-16
//!   (`tests/io_icrc_solver.rs` measures it on the rxe fixtures). The 16 unknown bits also cost
//!   the CRC's guarantees for sparse errors: every single flipped bit is still caught in packets
//!   up to 26 KB (the unit tests enumerate up to 9,000 bytes), but a few bytes changed at unlucky
//!   positions pass more often than random corruption does, 1.6 × 2^-16 over the fixtures;
//! - the flags are assumed to be DF with fragment offset 0, as rxe, ConnectX and Linux UDP
//!   sockets with `IP_PMTUDISC_DO` send RoCE. A packet sent without DF fails. Solving the flags as
//!   well would leave no check at all (32 unknown bits, 32 syndrome bits);
//! - the ID itself is whatever makes the ICRC right; it is returned, not checked.

use core::net::{SocketAddrV4, SocketAddrV6};
use std::sync::OnceLock;

use crc32fast::Hasher;

use super::bth;

/// The ICRC's length on the wire.
pub const ICRC_LEN: usize = 4;

const IPV4_MAX_HEADER: usize = 60;
const IPV6_HEADER: usize = 40;
const UDP_HEADER: usize = 8;
const IP_PROTO_UDP: u8 = 17;

/// The outcome of checking a received packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcStatus {
    /// The received ICRC matches the one computed.
    Ok,
    /// The received ICRC differs from the one computed.
    Bad {
        /// The ICRC the covered bytes call for.
        computed: u32,
        /// The ICRC the packet carried.
        received: u32,
    },
    /// The covered bytes were not all known, so nothing was checked.
    Unverified,
}

impl IcrcStatus {
    /// Compares a computed ICRC with the one received.
    pub fn check(computed: u32, received: u32) -> Self {
        if computed == received {
            IcrcStatus::Ok
        } else {
            IcrcStatus::Bad { computed, received }
        }
    }

    /// `ok`, `bad` or `unverified`.
    pub fn as_str(self) -> &'static str {
        match self {
            IcrcStatus::Ok => "ok",
            IcrcStatus::Bad { .. } => "bad",
            IcrcStatus::Unverified => "unverified",
        }
    }
}

/// Bytes hashed in the ICRC's first update: the pseudo-header (8 bytes of ones, the masked IP
/// header, the masked UDP header: at most 76 bytes) and as much of the packet as fits after it.
/// crc32fast folds 64 bytes at a time with carry-less multiplication and takes shorter inputs
/// a few bytes at a time, at a cost per call: fed piece by piece (ones, IP, UDP, the BTH up to
/// its masked byte, the mask, the rest), a 64-byte WRITE's ICRC was six short updates, and
/// solving the received ID alone was 6% of the 64 B x8 bench's samples.
const FIRST_UPDATE: usize = 192;

/// A hasher in its initial state. `Hasher::new` goes through std's cached CPU feature checks
/// each time (some 36 instructions, a tenth of a 64-byte packet's ICRC); a clone of one made
/// once does not.
fn fresh_hasher() -> Hasher {
    static INITIAL: OnceLock<Hasher> = OnceLock::new();
    INITIAL.get_or_init(Hasher::new).clone()
}

/// The ICRC over the pseudo-header `ip` (masked, after the 8 bytes of ones), the masked UDP
/// header and `covered`, the packet from its BTH on up to the ICRC, with the BTH's masked byte
/// set to ones: two updates, the first one copied together on the stack.
fn framed_icrc(ip: &[u8], udp_header: [u8; UDP_HEADER], covered: &[u8]) -> u32 {
    let mut first = [0u8; FIRST_UPDATE];
    first[..8].fill(0xff);
    let ip_end = 8 + ip.len();
    first[8..ip_end].copy_from_slice(ip);
    let udp_end = ip_end + UDP_HEADER;
    first[ip_end..udp_end].copy_from_slice(&udp_header);
    first[udp_end - 2..udp_end].fill(0xff);
    let taken = covered.len().min(FIRST_UPDATE - udp_end);
    first[udp_end..udp_end + taken].copy_from_slice(&covered[..taken]);
    let masked = bth::ICRC_MASKED_BYTE;
    if covered.len() > masked {
        // Within `taken`: the first update has room for more than a BTH.
        first[udp_end + masked] = 0xff;
    }
    let mut hasher = fresh_hasher();
    hasher.update(&first[..udp_end + taken]);
    hasher.update(&covered[taken..]);
    hasher.finalize()
}

/// The ICRC of a packet carried over IPv4.
///
/// `ip_header` is the whole IPv4 header as sent (20 to 60 bytes, options included),
/// `udp_header` the UDP header, and `covered` the RoCE packet from the BTH through the pad,
/// without the ICRC. A longer `ip_header` is cut at 60 bytes.
pub fn icrc_ipv4(ip_header: &[u8], udp_header: [u8; UDP_HEADER], covered: &[u8]) -> u32 {
    let len = ip_header.len().min(IPV4_MAX_HEADER);
    let mut ip = [0u8; IPV4_MAX_HEADER];
    ip[..len].copy_from_slice(&ip_header[..len]);
    for masked in [1, 8, 10, 11] {
        ip[masked] = 0xff;
    }
    framed_icrc(&ip[..len], udp_header, covered)
}

/// The ICRC of a packet carried over IPv6: `ip_header` is the fixed 40-byte header.
pub fn icrc_ipv6(
    ip_header: &[u8; IPV6_HEADER],
    udp_header: [u8; UDP_HEADER],
    covered: &[u8],
) -> u32 {
    let mut ip = *ip_header;
    // Version stays; traffic class and flow label (the rest of the first word) are masked.
    ip[0] |= 0x0f;
    ip[1..4].fill(0xff);
    ip[7] = 0xff;
    framed_icrc(&ip, udp_header, covered)
}

/// The IP and UDP framing the kernel gives a datagram sent through a UDP socket with
/// `IP_PMTUDISC_DO` (unconnected): IPv4 with DF and ID 0, or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFraming {
    /// IPv4 with DF, fragment offset 0 and a 20-byte header.
    V4 {
        /// The sender's address and UDP port.
        src: SocketAddrV4,
        /// The receiver's address and UDP port.
        dst: SocketAddrV4,
    },
    /// IPv6 with no extension headers.
    V6 {
        /// The sender's address and UDP port.
        src: SocketAddrV6,
        /// The receiver's address and UDP port.
        dst: SocketAddrV6,
    },
}

impl KernelFraming {
    fn udp_header(src_port: u16, dst_port: u16, roce_len: usize) -> [u8; UDP_HEADER] {
        let mut udp = [0u8; UDP_HEADER];
        udp[0..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&((UDP_HEADER + roce_len) as u16).to_be_bytes());
        udp
    }

    /// The ICRC of `covered` (the RoCE packet without its ICRC) as the kernel will frame it,
    /// with IPv4 ID 0.
    pub fn icrc(&self, covered: &[u8]) -> u32 {
        self.icrc_with_ipv4_id(covered, 0)
    }

    /// The ICRC of `covered` framed with IPv4 ID `ipv4_id`; IPv6, which has no ID, ignores it.
    fn icrc_with_ipv4_id(&self, covered: &[u8], ipv4_id: u16) -> u32 {
        let roce_len = covered.len() + ICRC_LEN;
        match self {
            KernelFraming::V4 { src, dst } => {
                let mut ip = [0u8; 20];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&((20 + UDP_HEADER + roce_len) as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&ipv4_id.to_be_bytes());
                // DF and fragment offset 0.
                ip[6] = 0x40;
                ip[9] = IP_PROTO_UDP;
                ip[12..16].copy_from_slice(&src.ip().octets());
                ip[16..20].copy_from_slice(&dst.ip().octets());
                let udp = Self::udp_header(src.port(), dst.port(), roce_len);
                icrc_ipv4(&ip, udp, covered)
            }
            KernelFraming::V6 { src, dst } => {
                let mut ip = [0u8; IPV6_HEADER];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&((UDP_HEADER + roce_len) as u16).to_be_bytes());
                ip[6] = IP_PROTO_UDP;
                ip[8..24].copy_from_slice(&src.ip().octets());
                ip[24..40].copy_from_slice(&dst.ip().octets());
                let udp = Self::udp_header(src.port(), dst.port(), roce_len);
                icrc_ipv6(&ip, udp, covered)
            }
        }
    }

    /// Writes the ICRC into the last four bytes of `packet`, a whole RoCE packet.
    /// Does nothing to a buffer shorter than an ICRC.
    pub fn seal(&self, packet: &mut [u8]) {
        self.seal_with_ipv4_id(packet, 0);
    }

    /// [`seal`](Self::seal) for a datagram the kernel will frame with IPv4 ID `ipv4_id`: segment
    /// `i` of a `UDP_SEGMENT` send from an unconnected DF socket gets ID `i`, as Linux's software
    /// segmentation and NICs' segmentation offloads number them. IPv6 ignores `ipv4_id`.
    pub fn seal_with_ipv4_id(&self, packet: &mut [u8], ipv4_id: u16) {
        let Some(split) = packet.len().checked_sub(ICRC_LEN) else {
            return;
        };
        let icrc = self.icrc_with_ipv4_id(&packet[..split], ipv4_id);
        packet[split..].copy_from_slice(&icrc.to_le_bytes());
    }

    /// Checks a received packet's ICRC against exactly this framing: fully over IPv6; over IPv4
    /// it holds only for senders that frame with ID 0 and DF (see the module documentation).
    pub fn verify(&self, packet: &[u8]) -> IcrcStatus {
        let Some((covered, received)) = split_icrc(packet) else {
            return IcrcStatus::Unverified;
        };
        IcrcStatus::check(self.icrc(covered), received)
    }

    /// Checks the ICRC of a packet received on a UDP socket, which does not show the IPv4 ID:
    /// over IPv6 as [`verify`](Self::verify); over IPv4 `Ok` when [`solve_ipv4_id`] finds an
    /// ID, a 16-bit check (see [the module documentation](self#the-ipv4-id-solved)), and
    /// otherwise `Bad`, with `computed` the ICRC for ID 0.
    pub fn verify_received(&self, packet: &[u8]) -> IcrcStatus {
        match self {
            KernelFraming::V4 { src, dst } => match split_icrc(packet) {
                None => IcrcStatus::Unverified,
                Some(_) if solve_ipv4_id(*src, *dst, packet).is_some() => IcrcStatus::Ok,
                Some((covered, received)) => IcrcStatus::Bad {
                    computed: self.icrc(covered),
                    received,
                },
            },
            KernelFraming::V6 { .. } => self.verify(packet),
        }
    }
}

/// A whole RoCE packet split into the bytes its ICRC covers and the ICRC as received.
fn split_icrc(packet: &[u8]) -> Option<(&[u8], u32)> {
    let split = packet.len().checked_sub(ICRC_LEN)?;
    let (covered, icrc) = packet.split_at(split);
    Some((
        covered,
        u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]),
    ))
}

/// The CRC-32 polynomial without its z^32 term, reflected as `crc32fast` keeps it: bit 31 is the
/// coefficient of z^0, bit 0 that of z^31.
const POLY: u32 = 0xedb8_8320;
/// The polynomial 1, reflected.
const ONE: u32 = 1 << 31;

/// `b · z mod P`, reflected: a shift toward the high-order terms, and `POLY` added back when
/// the z^31 term (bit 0) overflows.
const fn times_z(b: u32) -> u32 {
    (b >> 1) ^ (POLY & (b & 1).wrapping_neg())
}

/// `OVERFLOW_TIMES_Z4[n] = n · z^4 mod P` for the 16 values of a polynomial's four high-order
/// terms (its low four bits, reflected), so that `b · z^4 = (b >> 4) ^ OVERFLOW_TIMES_Z4[b & 0xf]`:
/// the terms below z^28 shift without overflowing.
const OVERFLOW_TIMES_Z4: [u32; 16] = {
    let mut table = [0; 16];
    let mut n = 0;
    while n < 16 {
        table[n] = times_z(times_z(times_z(times_z(n as u32))));
        n += 1;
    }
    table
};

/// `a · b mod P`, reflected (zlib's `multmodp`), four terms of `a` at a time by Horner's rule:
/// `a`'s eight nibbles, from its high-order terms down, each a lookup in a table of the 16
/// multiples of `b` of degree below 4. About a fifth of the work of the bit-at-a-time loop,
/// which took 460 instructions of every received packet's ID solve.
const fn multmodp(a: u32, b: u32) -> u32 {
    // A nibble of `a`, reflected like it, has its bit 3 for z^0 and its bit 0 for z^3.
    let mut multiples = [0; 16];
    multiples[8] = b;
    multiples[4] = times_z(b);
    multiples[2] = times_z(multiples[4]);
    multiples[1] = times_z(multiples[2]);
    let mut n = 3;
    while n < 16 {
        // Every value but the four single terms above: its lowest set bit and the rest.
        if n & (n - 1) != 0 {
            multiples[n] = multiples[n & (n - 1)] ^ multiples[n & n.wrapping_neg()];
        }
        n += 1;
    }
    let mut product = 0;
    // Bits 0..4 of `a` are its terms z^31..z^28: the first nibble, as Horner's rule takes them.
    let mut shift = 0;
    while shift < 32 {
        product = (product >> 4)
            ^ OVERFLOW_TIMES_Z4[(product & 0xf) as usize]
            ^ multiples[((a >> shift) & 0xf) as usize];
        shift += 4;
    }
    product
}

/// `a · z^-1 mod P`: the inverse of one step of `b · z`, which shifts right and adds `POLY` when
/// the z^31 term overflows. `POLY`'s z^0 term says whether it did.
const fn div_z(a: u32) -> u32 {
    let overflowed = a >> 31;
    ((a ^ (POLY & overflowed.wrapping_neg())) << 1) | overflowed
}

/// `z^-(8n + 32)` for the low byte of `n`: `UNSHIFT_LOW[i] = z^-(8i + 32)`.
static UNSHIFT_LOW: [u32; 256] = {
    let mut table = [0; 256];
    let mut power = ONE;
    let mut i = 0;
    while i < 32 {
        power = div_z(power);
        i += 1;
    }
    let mut byte = 0;
    while byte < 256 {
        table[byte] = power;
        let mut bit = 0;
        while bit < 8 {
            power = div_z(power);
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// `z^-(8n)` for the high byte of `n`: `UNSHIFT_HIGH[j] = z^-(8 · 256 · j)`.
static UNSHIFT_HIGH: [u32; 256] = {
    let mut step = ONE;
    let mut i = 0;
    while i < 8 * 256 {
        step = div_z(step);
        i += 1;
    }
    let mut table = [0; 256];
    let mut power = ONE;
    let mut j = 0;
    while j < 256 {
        table[j] = power;
        power = multmodp(power, step);
        j += 1;
    }
    table
};

/// The bytes of a 20-byte IPv4 header after the identification field.
const IPV4_AFTER_ID: usize = 14;

/// The IPv4 identification that makes `packet`'s ICRC right, for a datagram from `src` to `dst`
/// received on a UDP socket, framed with a 20-byte header, DF and fragment offset 0: `None` when
/// no ID does, which means the packet is corrupt (or was sent without DF, or with IP options).
///
/// `packet` is the whole UDP payload, ICRC included. A `Some` is a 16-bit check: randomly
/// corrupted packets pass once in 2^16 (see [the module documentation](self#the-ipv4-id-solved)).
pub fn solve_ipv4_id(src: SocketAddrV4, dst: SocketAddrV4, packet: &[u8]) -> Option<u16> {
    let (covered, received) = split_icrc(packet)?;
    let syndrome = KernelFraming::V4 { src, dst }.icrc(covered) ^ received;
    if syndrome == 0 {
        // ID 0, as a lone datagram and a train's first segment carry it: no multiplication.
        return Some(0);
    }
    let after_id = IPV4_AFTER_ID + UDP_HEADER + covered.len();
    // An IPv4 datagram is under 64 KiB, so the two tables cover every n.
    let low = multmodp(syndrome, UNSHIFT_LOW[after_id & 0xff]);
    // RoCE packets up to 237 bytes (ACKs, small messages) need only the low table:
    // UNSHIFT_HIGH[0] is 1, so one of the two multiplications is saved.
    let id = match after_id >> 8 {
        0 => low,
        high => multmodp(low, *UNSHIFT_HIGH.get(high)?),
    };
    // The first ID byte's bits 0..7 are the coefficients of z^15..z^8 (bits 16..23, reflected),
    // the second byte's of z^7..z^0 (bits 24..31); z^16 and above must be zero.
    (id & 0xffff == 0).then(|| u16::from_be_bytes([(id >> 16) as u8, (id >> 24) as u8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    /// z, reflected.
    const Z: u32 = ONE >> 1;

    fn z_power(n: usize) -> u32 {
        (0..n).fold(ONE, |power, _| multmodp(power, Z))
    }

    /// The ICRC as IBTA 17.3.3 / Annex A17.4.1 define it, one contiguous buffer hashed at once:
    /// what the two-update path must equal at every length, across the first update's end.
    fn icrc_in_one_piece(ip: &[u8], udp: [u8; UDP_HEADER], covered: &[u8]) -> u32 {
        let mut all = vec![0xff; 8];
        all.extend_from_slice(ip);
        all.extend_from_slice(&udp[..6]);
        all.extend_from_slice(&[0xff; 2]);
        all.extend_from_slice(covered);
        if covered.len() > bth::ICRC_MASKED_BYTE {
            all[8 + ip.len() + UDP_HEADER + bth::ICRC_MASKED_BYTE] = 0xff;
        }
        crc32fast::hash(&all)
    }

    #[test]
    fn the_icrc_in_two_updates_is_the_icrc_in_one() {
        let udp = [0x12, 0x34, 0x12, 0xb7, 0, 99, 0xab, 0xcd];
        let packet: Vec<u8> = (0..400u32).map(|i| (i * 31 + 7) as u8).collect();
        // IPv4 without and with options (masked already), and IPv6's 40 bytes.
        for ip_len in [20, 60, IPV6_HEADER] {
            let ip: Vec<u8> = (0..ip_len as u8).map(|i| i ^ 0x5a).collect();
            for len in (0..300).chain([FIRST_UPDATE - 36, FIRST_UPDATE, 399]) {
                assert_eq!(
                    framed_icrc(&ip, udp, &packet[..len]),
                    icrc_in_one_piece(&ip, udp, &packet[..len]),
                    "IP header {ip_len}, packet {len}"
                );
            }
        }
    }

    /// `a · b mod P` a term at a time, sharing nothing with the code under test but `POLY`:
    /// what the nibble-wise `multmodp` must equal.
    fn multmodp_by_terms(a: u32, b: u32) -> u32 {
        let (mut product, mut b) = (0, b);
        for k in 0..32 {
            if a >> (31 - k) & 1 == 1 {
                product ^= b;
            }
            // b · z: the z^31 term, bit 0, overflows into z^32 = POLY.
            let overflows = b & 1 == 1;
            b >>= 1;
            if overflows {
                b ^= POLY;
            }
        }
        product
    }

    proptest::proptest! {
        #[test]
        fn multmodp_multiplies_as_term_by_term(a: u32, b: u32) {
            proptest::prop_assert_eq!(multmodp(a, b), multmodp_by_terms(a, b));
        }
    }

    #[test]
    fn multmodp_multiplies_the_edge_values_as_term_by_term() {
        let edges = [
            0,
            1,
            ONE,
            Z,
            POLY,
            0xf,
            0xf000_0000,
            0xdead_beef,
            0xffff_ffff,
        ];
        for a in edges {
            for b in edges {
                assert_eq!(multmodp(a, b), multmodp_by_terms(a, b), "{a:#x} {b:#x}");
            }
        }
    }

    #[test]
    fn div_z_undoes_a_multiplication_by_z() {
        for a in [ONE, 1, POLY, 0xdead_beef, 0x0000_0001, 0xffff_ffff] {
            assert_eq!(multmodp(div_z(a), Z), a, "{a:#x}");
            assert_eq!(div_z(multmodp(a, Z)), a, "{a:#x}");
        }
    }

    #[test]
    fn the_unshift_tables_invert_their_powers_of_z() {
        for i in [0, 1, 2, 17, 255] {
            assert_eq!(
                multmodp(UNSHIFT_LOW[i], z_power(8 * i + 32)),
                ONE,
                "low {i}"
            );
        }
        for j in [0, 1, 3] {
            assert_eq!(
                multmodp(UNSHIFT_HIGH[j], z_power(8 * 256 * j)),
                ONE,
                "high {j}"
            );
        }
    }

    #[test]
    fn every_id_is_solved_at_every_length_class() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 0xc123);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 4, 5, 6), 4791);
        let framing = KernelFraming::V4 { src, dst };
        // Lengths that cross both tables' byte boundaries.
        for covered in [12, 13, 200, 233, 234, 235, 1036, 4108, 4124, 9000] {
            let mut packet = vec![0u8; covered + ICRC_LEN];
            for (i, b) in packet.iter_mut().enumerate() {
                *b = (i * 7) as u8;
            }
            for id in [0, 1, 0x00ff, 0x0100, 0x1234, 0x8000, 0xfffe, 0xffff] {
                framing.seal_with_ipv4_id(&mut packet, id);
                assert_eq!(solve_ipv4_id(src, dst, &packet), Some(id), "{covered} {id}");
                assert_eq!(framing.verify_received(&packet), IcrcStatus::Ok);
            }
        }
    }

    #[test]
    fn no_single_bit_error_passes_in_a_jumbo_packet() {
        // A flipped bit k bits after the ID field unshifts to z^-k; it would pass as an ID change
        // if that had degree below 16, i.e. zero low 16 bits, reflected.
        let mut unshifted = ONE;
        for k in 1..=8 * 9000 {
            unshifted = div_z(unshifted);
            assert_ne!(unshifted & 0xffff, 0, "a flip {k} bits after the ID passes");
        }
    }

    #[test]
    fn a_packet_too_short_or_too_long_for_ipv4_is_not_solved() {
        let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
        assert_eq!(solve_ipv4_id(src, src, &[0; 3]), None);
        assert_eq!(solve_ipv4_id(src, src, &vec![0; 1 << 16]), None);
    }
}
