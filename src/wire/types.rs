//! Newtypes for the numbers that travel in RoCE headers, so that a PSN is never mistaken for a
//! QPN and a 24-bit field never silently carries 32 bits.

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, Sub};

use super::{Error, Layer};

const U24_MASK: u32 = 0x00ff_ffff;

/// Displays a key in hexadecimal, zero-padded to its width.
macro_rules! hex_display {
    ($($name:ident: $width:literal),*) => {$(
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#0w$x}", self.0, w = $width + 2)
            }
        }

        /// In hex, as rdma-core prints it.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }
    )*};
}

/// Declares a 24-bit number type: the constructor masks, `try_new` refuses wider values.
macro_rules! u24_type {
    ($(#[$meta:meta])* $name:ident, $layer:expr, $field:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(try_from = "u32", into = "u32"))]
        pub struct $name(u32);

        impl TryFrom<u32> for $name {
            type Error = Error;

            /// As [`try_new`](Self::try_new): a value wider than 24 bits is refused.
            fn try_from(value: u32) -> Result<Self, Error> {
                Self::try_new(value)
            }
        }

        impl From<$name> for u32 {
            fn from(number: $name) -> u32 {
                number.0
            }
        }

        impl $name {
            /// The largest value the 24-bit field holds.
            pub const MAX: $name = $name(U24_MASK);

            /// Keeps the low 24 bits of `value`.
            pub const fn new(value: u32) -> Self {
                Self(value & U24_MASK)
            }

            /// Refuses a value that does not fit in 24 bits.
            pub const fn try_new(value: u32) -> Result<Self, Error> {
                if value > U24_MASK {
                    return Err(Error::Field {
                        layer: $layer,
                        field: $field,
                        found: value as u64,
                        expected: "a 24-bit value",
                    });
                }
                Ok(Self(value))
            }

            /// The number, at most 2^24 - 1.
            pub const fn value(self) -> u32 {
                self.0
            }
        }
    };
}

u24_type!(
    /// A packet sequence number: 24 bits with serial-number arithmetic (IBTA 9.7.1).
    ///
    /// PSNs wrap at 2^24, so they have no total order. `serial_cmp` orders two PSNs that lie within
    /// 2^23 of each other, which is the window the transport keeps; `Psn - Psn` gives the signed
    /// distance.
    Psn,
    Layer::Bth,
    "psn"
);
u24_type!(
    /// A queue pair number (24 bits).
    Qpn,
    Layer::Bth,
    "dest_qp"
);
u24_type!(
    /// A message sequence number, carried in the AETH (24 bits).
    Msn,
    Layer::Aeth,
    "msn"
);

impl Psn {
    /// The PSN `n` packets after this one, wrapping at 2^24.
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// The PSN `n` packets before this one, wrapping at 2^24.
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The signed distance from `earlier` to `self`, in -2^23 ..= 2^23 - 1.
    pub const fn distance_from(self, earlier: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign extension does the
        // serial-number folding.
        ((self.0.wrapping_sub(earlier.0) << 8) as i32) >> 8
    }

    /// Serial order: `Less` when `self` comes before `other` within half the PSN space.
    pub const fn serial_cmp(self, other: Psn) -> Ordering {
        let d = self.distance_from(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// True when `self` comes strictly before `other` in serial order.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_from(other) < 0
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        self.wrapping_sub(n)
    }
}

impl Sub<Psn> for Psn {
    type Output = i32;
    /// The serial distance, as [`Psn::distance_from`].
    fn sub(self, earlier: Psn) -> i32 {
        self.distance_from(earlier)
    }
}

impl Msn {
    /// The next MSN, wrapping at 2^24.
    pub const fn next(self) -> Msn {
        Msn::new(self.0.wrapping_add(1))
    }
}

impl Qpn {
    /// QP1, the general services interface that connection management uses.
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN, 0xFFFFFF.
    pub const MULTICAST: Qpn = Qpn(U24_MASK);
}

// PSNs and MSNs are counts: decimal, as Wireshark shows them.
macro_rules! decimal_display {
    ($($name:ident),*) => {$(
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    )*};
}

decimal_display!(Psn, Msn);
hex_display!(Qpn: 6);

/// A partition key (IBTA 10.9). Bit 15 is the membership type: 1 for full membership.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition, full membership; rxe accepts only this one.
    pub const DEFAULT: PKey = PKey(0xffff);

    /// True for a full member of the partition.
    pub const fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }

    /// The partition, without the membership bit.
    pub const fn partition(self) -> u16 {
        self.0 & 0x7fff
    }

    /// Whether a packet carrying `self` may reach a QP whose P_Key is `own` (IBTA 10.9.3,
    /// C10-117, rxe_recv.c `pkey_match`): the same partition, neither of them the invalid
    /// partition 0, and at least one of the two a full member. Two limited members may not
    /// talk; a limited and a full member may, so 0x7FFF reaches a QP of the default 0xFFFF.
    pub const fn matches(self, own: PKey) -> bool {
        self.partition() != 0
            && self.partition() == own.partition()
            && (self.is_full_member() || own.is_full_member())
    }
}

impl Default for PKey {
    fn default() -> Self {
        PKey::DEFAULT
    }
}

/// A queue key, checked by UD and RD receivers (IBTA 10.2.4).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct QKey(pub u32);

impl QKey {
    /// The well-known Q_Key of QP1, the general services QP.
    pub const GSI: QKey = QKey(0x8001_0000);

    /// A controlled Q_Key has its high bit set. In a work request it means "use the QP's own
    /// Q_Key" (IBTA 10.2.4.1); only privileged consumers may set one on a QP.
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

/// A remote key: names a memory region to a peer's RDMA READ, WRITE or atomic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct RKey(pub u32);

/// A local key: names a memory region to the local scatter/gather lists.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct LKey(pub u32);

hex_display!(PKey: 4, QKey: 8, RKey: 8, LKey: 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_arithmetic_wraps_at_2_pow_24() {
        let last = Psn::MAX;
        assert_eq!(last + 1, Psn::new(0));
        assert_eq!(Psn::new(0) - 1, last);
        assert_eq!(Psn::new(5) - Psn::new(0xff_fffe), 7);
        assert_eq!(Psn::new(0xff_fffe) - Psn::new(5), -7);
        assert_eq!(
            Psn::new(0x12_3456).wrapping_add(1 << 24),
            Psn::new(0x12_3456)
        );
    }

    #[test]
    fn psn_serial_order_across_the_wrap() {
        let before_wrap = Psn::new(0xff_fff0);
        let after_wrap = Psn::new(0x10);
        assert!(before_wrap.is_before(after_wrap));
        assert!(!after_wrap.is_before(before_wrap));
        assert_eq!(after_wrap.serial_cmp(before_wrap), Ordering::Greater);
        assert_eq!(after_wrap.serial_cmp(after_wrap), Ordering::Equal);
    }

    #[test]
    fn psn_order_holds_within_half_the_space() {
        let base = Psn::new(0xff_0000);
        let half = 1u32 << 23;
        // Just under half the space ahead is still "after".
        assert!(base.is_before(base + (half - 1)));
        assert_eq!((base + (half - 1)) - base, (half - 1) as i32);
        // Exactly half ahead folds to the negative side: it reads as "before".
        assert_eq!((base + half) - base, -(half as i32));
        assert!((base + half).is_before(base));
    }

    #[test]
    fn u24_types_refuse_wide_values() {
        assert!(Psn::try_new(0x100_0000).is_err());
        assert_eq!(Qpn::try_new(0xff_ffff), Ok(Qpn::MULTICAST));
        assert_eq!(Msn::new(0x1ff_ffff), Msn::MAX);
        assert_eq!(Msn::MAX.next(), Msn::new(0));
    }

    #[test]
    fn display_formats() {
        assert_eq!(Qpn::new(0x118).to_string(), "0x000118");
        // Debug too, as rdma-core and Wireshark print keys and QP numbers.
        assert_eq!(format!("{:?}", Qpn::new(0x118)), "Qpn(0x000118)");
        assert_eq!(format!("{:?}", QKey(0x0123_4567)), "QKey(0x01234567)");
        assert_eq!(format!("{:?}", RKey(0xabc)), "RKey(0x00000abc)");
        assert_eq!(format!("{:?}", Psn::new(12)), "Psn(12)");
        assert_eq!(RKey(0xab).to_string(), "0x000000ab");
        assert_eq!(PKey::DEFAULT.to_string(), "0xffff");
        assert_eq!(Psn::new(42).to_string(), "42");
    }

    #[test]
    fn key_bits() {
        assert!(QKey::GSI.is_controlled());
        assert!(!QKey(0x1111_1111).is_controlled());
        assert!(PKey::DEFAULT.is_full_member());
        assert_eq!(PKey(0x7fff).partition(), 0x7fff);
        assert!(!PKey(0x7fff).is_full_member());
    }

    /// IBTA 10.9.3: the partition must match and one side must be a full member.
    #[test]
    fn pkeys_match_by_partition_and_membership() {
        let full = PKey::DEFAULT;
        assert!(
            PKey(0x7fff).matches(full),
            "a limited member reaches a full one"
        );
        assert!(full.matches(PKey(0x7fff)));
        assert!(full.matches(full));
        assert!(!PKey(0x7fff).matches(PKey(0x7fff)), "two limited members");
        assert!(!PKey(0x8001).matches(full), "another partition");
        assert!(
            !PKey(0x8000).matches(PKey(0x8000)),
            "partition 0 is invalid"
        );
        assert!(!PKey(0).matches(full));
    }
}
