//! One QP's keys (`struct pingpong_dest`), what perftest's two sides exchange for each QP, in
//! both of its wire forms: the 108-byte text of the TCP exchange ([`super::perftest_oob`]) and
//! the 56 big-endian bytes of the RDMA-CM mode ([`super::perftest_cm`]). Both exchanges use
//! them; neither depends on the other for them.

use std::net::Ipv6Addr;

use super::oob::nul_terminated;
use super::{Error, Result};
use crate::wire::{Psn, Qpn, RKey};

/// `KEY_MSG_SIZE_GID`: the TCP exchange's key message.
pub const KEYS_LEN: usize = 108;
/// `sizeof(struct pingpong_dest)`: the RDMA-CM mode's key message, and the receive every control
/// message there lands in.
pub const DEST_LEN: usize = 56;

/// One QP's keys (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    /// 0 on RoCE, which addresses by GID.
    pub lid: u16,
    /// READs and atomics the sender answers at once (its `max_dest_rd_atomic`); 1 in the tests
    /// that issue neither.
    pub out_reads: u16,
    /// The sender's QP number.
    pub qpn: Qpn,
    /// The first PSN the sender sends.
    pub psn: Psn,
    /// The R_Key of the sender's buffer, for its peer's WRITEs, READs and atomics.
    pub rkey: RKey,
    /// Where the sender's peer writes, reads or adds: the sender's receive buffer.
    pub vaddr: u64,
    /// The sender's GID; IPv4-mapped for an IPv4 device.
    pub gid: Ipv6Addr,
    /// Only XRC and DC use it; 0 otherwise.
    pub srqn: u32,
}

impl Keys {
    /// The 108-byte message.
    pub fn to_wire(&self) -> [u8; KEYS_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.value(),
            self.psn.value(),
            self.rkey.0,
            self.vaddr
        );
        for byte in self.gid.octets() {
            text.push_str(&format!("{byte:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut msg = [0; KEYS_LEN];
        // Every field is at its widest, so the text fills the message but its last byte, the NUL.
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a peer's message; `who` ("client" or "server") names the peer in errors.
    pub fn parse(msg: &[u8], who: &str) -> Result<Keys> {
        let text = nul_terminated(msg);
        let bad = |why: &str| {
            Error::Exchange(format!(
                "the {who}'s keys {text:?} are not perftest's \
                 LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID[16]:SRQN: {why}"
            ))
        };
        let fields: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, the SRQN, and the empty string after the last ':'.
        if fields.len() != 24 || !fields[23].is_empty() {
            return Err(bad("it does not have 23 fields, each ended by ':'"));
        }
        let hex = |field: &str, what: &str, max: u64| {
            u64::from_str_radix(field, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| bad(&format!("bad {what} {field:?}")))
        };
        let mut gid = [0; 16];
        for (byte, field) in gid.iter_mut().zip(&fields[6..22]) {
            *byte = hex(field, "GID byte", 0xff)? as u8;
        }
        Ok(Keys {
            lid: hex(fields[0], "LID", 0xffff)? as u16,
            out_reads: hex(fields[1], "outstanding reads", 0xffff)? as u16,
            qpn: Qpn::new(hex(fields[2], "QPN", Qpn::MAX.value().into())? as u32),
            psn: Psn::new(hex(fields[3], "PSN", Psn::MAX.value().into())? as u32),
            rkey: RKey(hex(fields[4], "R_Key", u32::MAX.into())? as u32),
            vaddr: hex(fields[5], "VA", u64::MAX)?,
            gid: Ipv6Addr::from(gid),
            srqn: hex(fields[22], "SRQN", u32::MAX.into())? as u32,
        })
    }
}

impl Keys {
    /// `struct pingpong_dest` as `rdma_write_keys` sends it: LID, outstanding reads, QPN, PSN
    /// and R_Key as big-endian 32-bit words, 4 bytes of padding, the VA as a big-endian 64-bit
    /// word, the GID, the SRQN and the GID index.
    pub fn to_dest(&self, gid_index: u32) -> [u8; DEST_LEN] {
        let mut msg = [0u8; DEST_LEN];
        let words = [
            u32::from(self.lid),
            u32::from(self.out_reads),
            self.qpn.value(),
            self.psn.value(),
            self.rkey.0,
        ];
        for (at, word) in (0..).step_by(4).zip(words) {
            msg[at..at + 4].copy_from_slice(&word.to_be_bytes());
        }
        msg[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        msg[32..48].copy_from_slice(&self.gid.octets());
        msg[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        msg[52..56].copy_from_slice(&gid_index.to_be_bytes());
        msg
    }

    /// A peer's `struct pingpong_dest`, as `rdma_read_keys` reads it: every field but the
    /// padding, the SRQN and the GID index, which it ignores too. Values wider than the field
    /// they stand for are refused; `who` names the peer in errors.
    pub fn from_dest(msg: &[u8], who: &str) -> Result<Keys> {
        let word = |at: usize| u32::from_be_bytes(msg[at..at + 4].try_into().expect("4 bytes"));
        let bad = |what: &str, value: u32| {
            Error::Exchange(format!(
                "the {who}'s keys (struct pingpong_dest) carry {what} {value:#x}: too wide"
            ))
        };
        let narrow = |at: usize, what: &str, max: u32| {
            let value = word(at);
            if value > max {
                Err(bad(what, value))
            } else {
                Ok(value)
            }
        };
        Ok(Keys {
            lid: narrow(0, "the LID", 0xffff)? as u16,
            out_reads: narrow(4, "the outstanding reads", 0xffff)? as u16,
            qpn: Qpn::new(narrow(8, "the QPN", Qpn::MAX.value())?),
            psn: Psn::new(narrow(12, "the PSN", Psn::MAX.value())?),
            rkey: RKey(word(16)),
            vaddr: u64::from_be_bytes(msg[24..32].try_into().expect("8 bytes")),
            gid: Ipv6Addr::from(<[u8; 16]>::try_from(&msg[32..48]).expect("16 bytes")),
            srqn: word(48),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys {
            lid: 0,
            out_reads: 0x80,
            qpn: Qpn::new(0x15),
            psn: Psn::new(0x6c0406),
            rkey: RKey(0x663),
            vaddr: 0x7fe0_f46c_9000,
            gid: "::ffff:10.99.0.12".parse().unwrap(),
            srqn: 0,
        }
    }

    #[test]
    fn keys_are_perftests() {
        let msg = keys().to_wire();
        assert_eq!(
            &msg[..107],
            &b"0000:0080:000015:6c0406:00000663:00007fe0f46c9000:\
               00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:0c:00000000:"[..]
        );
        assert_eq!(msg[107], 0);
        assert_eq!(Keys::parse(&msg, "server").unwrap(), keys());
    }

    #[test]
    fn malformed_keys_are_refused_with_the_message() {
        let mut short = keys().to_wire();
        short[40] = 0;
        let mut not_hex = keys().to_wire();
        not_hex[0] = b'g';
        for msg in [&b"hello"[..], &short[..], &not_hex[..]] {
            let error = Keys::parse(msg, "client").unwrap_err().to_string();
            assert!(error.contains("the client's keys"), "{error}");
            assert!(error.contains(&*nul_terminated(msg)), "{error}");
        }
    }
}
