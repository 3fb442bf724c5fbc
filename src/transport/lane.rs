//! Which of a device's engines a QP lives on.
//!
//! A device may run several engines, each with an endpoint of its own, over one address and
//! one shared memory table. The QPs are spread over them by number, so that any layer can say
//! from a packet's BTH alone which engine it belongs to: the io layer steers datagrams by it
//! in the kernel (`io::udp`'s reuse-port program), and an engine hands a datagram that reached
//! it anyway to the right one.

use crate::wire::Qpn;

/// The most engines a device may run: far more than the cores this is measured on, few enough
/// that every engine still draws its QP numbers from a range of millions.
pub const MAX_LANES: u32 = 64;

/// One engine of a device, of `count`: it owns QP1 if it is the first, and every other QP whose
/// number is `index` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    index: u32,
    count: u32,
}

impl Lane {
    /// The only engine of a device: it owns every QP.
    pub const SOLE: Lane = Lane { index: 0, count: 1 };

    /// Engine `index` of `count`; `None` unless `index < count <= MAX_LANES`.
    pub fn new(index: u32, count: u32) -> Option<Lane> {
        (index < count && count <= MAX_LANES).then_some(Lane { index, count })
    }

    /// This engine's place among the device's engines, from 0.
    pub fn index(self) -> u32 {
        self.index
    }

    /// How many engines the device runs.
    pub fn count(self) -> u32 {
        self.count
    }

    /// The engine that owns `qpn` on a device of `count` engines: the first for QP0 and QP1 (the
    /// CM's), `qpn % count` for every other.
    pub fn owner(qpn: Qpn, count: u32) -> u32 {
        match qpn.value() {
            0 | 1 => 0,
            n => n % count.max(1),
        }
    }

    /// Whether this engine owns `qpn`.
    pub fn owns(self, qpn: Qpn) -> bool {
        Lane::owner(qpn, self.count) == self.index
    }

    /// The engine a RoCE packet (a UDP payload, from its BTH) belongs to; `None` when it is too
    /// short to hold a BTH, which whoever parses it next drops and counts.
    pub fn owner_of_packet(packet: &[u8], count: u32) -> Option<u32> {
        // BTH bytes 5..8 are DestQP (IBTA 9.2, rxe_hdr.h's BTH_QPN_MASK).
        let qpn = packet.get(5..8)?;
        let qpn = u32::from_be_bytes([0, qpn[0], qpn[1], qpn[2]]);
        Some(Lane::owner(Qpn::new(qpn), count))
    }

    /// The number of this engine nearest `candidate`, within `range`: QP numbers are drawn at
    /// random, then moved here.
    pub(crate) fn nearest(self, candidate: u32, range: &std::ops::RangeInclusive<u32>) -> u32 {
        let n = candidate - candidate % self.count + self.index;
        if n < *range.start() {
            n + self.count
        } else if n > *range.end() {
            n - self.count
        } else {
            n
        }
    }
}

/// The QP numbers of a device that shares its address with devices of other processes (an
/// address group, `io::group`): each ends in the device's place in the group, which the kernel
/// steers by, and none is a number that an earlier device of that place still held when it
/// ended, so that a packet for a QP of a process that is gone never reaches a QP of another.
pub trait QpnLedger: Send + Sync + std::fmt::Debug {
    /// The place: the low byte of every QP number of the device.
    fn place(&self) -> u8;
    /// Takes `qpn` for a new QP: false if a device of the place holds it, or held it when it
    /// ended.
    fn claim(&self, qpn: Qpn) -> bool;
    /// Gives back the number of a QP destroyed.
    fn release(&self, qpn: Qpn);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_qp_has_one_owner_and_the_cm_is_on_the_first() {
        for count in 1..=MAX_LANES {
            for n in [0, 1, 2, 3, 0x1234, 0xff_fffe, 0xff_ffff] {
                let qpn = Qpn::new(n);
                let owners: Vec<u32> = (0..count)
                    .filter(|&i| Lane::new(i, count).unwrap().owns(qpn))
                    .collect();
                assert_eq!(owners, [Lane::owner(qpn, count)], "QP {n:#x} of {count}");
            }
            assert_eq!(Lane::owner(Qpn::GSI, count), 0);
        }
        assert_eq!(Lane::new(2, 2), None);
        assert_eq!(Lane::new(0, MAX_LANES + 1), None);
    }

    #[test]
    fn a_drawn_number_moves_into_the_range_and_onto_its_engine() {
        let range = 2..=0xff_fffe;
        for count in [1, 2, 3, 7, MAX_LANES] {
            for index in 0..count {
                let lane = Lane::new(index, count).unwrap();
                for candidate in [2, 3, 4, 63, 64, 65, 0xff_fff0, 0xff_fffd, 0xff_fffe] {
                    let n = lane.nearest(candidate, &range);
                    assert!(range.contains(&n), "{candidate} became {n} on {lane:?}");
                    assert!(lane.owns(Qpn::new(n)), "{candidate} became {n} on {lane:?}");
                }
            }
        }
    }

    #[test]
    fn a_packet_is_owned_by_its_dest_qp_engine() {
        let mut bth = [0u8; 12];
        bth[5..8].copy_from_slice(&[0x12, 0x34, 0x57]);
        assert_eq!(Lane::owner_of_packet(&bth, 2), Some(0x12_3457 % 2));
        assert_eq!(Lane::owner_of_packet(&bth, 5), Some(0x12_3457 % 5));
        assert_eq!(Lane::owner_of_packet(&bth[..7], 2), None);
    }
}
