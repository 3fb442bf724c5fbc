//! The ECN field: the low two bits of the IPv4 TOS byte or the IPv6 traffic class (RFC 3168
//! section 5). RoCEv2 leaves both bytes out of the ICRC (IBTA Annex A17.8.1), so a switch may
//! mark a packet on its way without breaking it.

/// An ECN codepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// Not ECN-capable transport: a congested switch drops the packet instead of marking it.
    #[default]
    NotEct,
    /// ECT(1).
    Ect1,
    /// ECT(0): what ConnectX and softroce send RoCE with.
    Ect0,
    /// Congestion experienced: a switch marked the packet.
    Ce,
}

impl Ecn {
    /// The codepoint of a TOS or traffic class byte.
    pub const fn of_traffic_class(class: u8) -> Ecn {
        match class & 0b11 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The codepoint's two bits.
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }

    /// The codepoint of two bits, or `None` past 3.
    pub const fn from_bits(bits: u8) -> Option<Ecn> {
        if bits > 3 {
            None
        } else {
            Some(Ecn::of_traffic_class(bits))
        }
    }

    /// Whether a switch marked the packet.
    pub const fn is_ce(self) -> bool {
        matches!(self, Ecn::Ce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_two_bits_of_the_traffic_class() {
        // DSCP 26 (AF31) with each codepoint.
        for bits in 0..4 {
            let ecn = Ecn::of_traffic_class(26 << 2 | bits);
            assert_eq!(ecn.bits(), bits);
            assert_eq!(Ecn::from_bits(bits), Some(ecn));
        }
        assert_eq!(Ecn::from_bits(4), None);
        assert!(Ecn::of_traffic_class(0xff).is_ce());
        assert!(!Ecn::Ect0.is_ce());
    }
}
