//! Communication management (IBTA chapter 12): the MADs two CMs exchange on QP1 to set up,
//! resolve and tear down connections, and RDMA-CM's IP addressing in them.
//!
//! A CM message is a 256-byte MAD carried as a UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key
//! 0x80010000: a 24-byte MAD header ([`mad`]) and 232 bytes whose layout the attribute ID names.
//! One module per message, each a checked view and a `Repr`, at the offsets of the kernel's
//! `include/rdma/ibta_vol1_c12.h`: [`req`], [`mra`], [`rej`], [`rep`], [`rtu`], [`dreq`], [`drep`],
//! [`sidr_req`], [`sidr_rep`]. [`ip`] is RDMA-CM's 36-byte IP header at the start of a REQ's and a
//! SIDR_REQ's private data. [`CmMessage`] parses and emits a whole MAD.
//!
//! LAP and APR (alternate paths) have no use on RoCE and are kept as [`CmMessage::Other`].

pub mod drep;
pub mod dreq;
pub mod ip;
pub mod mad;
pub mod mra;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod sidr_rep;
pub mod sidr_req;

use std::fmt;
#[cfg(test)]
use std::net::IpAddr;

use super::{Error, Layer, Result};
pub use drep::{CmDrep, CmDrepRepr, DREP_PRIVATE_DATA};
pub use dreq::{CmDreq, CmDreqRepr, DREQ_PRIVATE_DATA};
pub use ip::{CmaHeader, CmaHeaderRepr, CMA_HEADER_LEN};
pub use mad::{MadHeader, MadHeaderRepr};
pub use mra::{CmMra, CmMraRepr, MRA_PRIVATE_DATA};
pub use rej::{CmRej, CmRejRepr, RejReason, REJ_PRIVATE_DATA};
pub use rep::{CmRep, CmRepRepr, REP_PRIVATE_DATA};
pub use req::{CmPath, CmReq, CmReqRepr, REQ_PRIVATE_DATA};
pub use rtu::{CmRtu, CmRtuRepr, RTU_PRIVATE_DATA};
pub use sidr_rep::{CmSidrRep, CmSidrRepRepr, SidrStatus, SIDR_REP_PRIVATE_DATA};
pub use sidr_req::{CmSidrReq, CmSidrReqRepr, SIDR_REQ_PRIVATE_DATA};

/// A management datagram's length.
pub const MAD_LEN: usize = 256;
/// Where a CM message starts in its MAD.
pub const CM_DATA_AT: usize = 24;

/// The attribute IDs of CM messages (IBTA table 104).
pub mod attr {
    /// ConnectRequest (REQ): the active side asks for a connection.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck (MRA): the message arrived; a reply will take longer than the sender's timeout.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject (REJ): a connection attempt is refused.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply (REP): the passive side accepts a REQ.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse (RTU): the active side's QP is ready to send.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest (DREQ): one side leaves the connection.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply (DREP): the answer to a DREQ.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq (SIDR_REQ): asks which UD QP serves a service ID.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp (SIDR_REP): the answer to a SIDR_REQ.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (LAP): not used on RoCE.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (APR): not used on RoCE.
    pub const APR: u16 = 0x001a;
}

/// RDMA-CM's port spaces (librdmacm `enum rdma_port_space`): the upper bits of a service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RC connections (`RDMA_PS_TCP`, 0x0106).
    Tcp,
    /// UD, resolved with SIDR (`RDMA_PS_UDP`, 0x0111).
    Udp,
    /// RC or UD addressed by service ID directly (`RDMA_PS_IB`, 0x013F).
    Ib,
}

impl PortSpace {
    /// The port space's value: bits 16 to 31 of an RDMA-CM service ID.
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// librdmacm's short name, e.g. `TCP`.
    pub const fn name(self) -> &'static str {
        match self {
            PortSpace::Tcp => "TCP",
            PortSpace::Udp => "UDP",
            PortSpace::Ib => "IB",
        }
    }
}

/// A CM service ID. RDMA-CM's are `port space << 16 | port` (IBTA annex A11.2: the prefix
/// 0x0000000001 is RDMA IP CM's), e.g. 0x0000000001061C06 for rping's TCP port 7174.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// RDMA-CM's service ID for `port` in `space` (librdmacm `rdma_get_service_id`).
    pub const fn ip(space: PortSpace, port: u16) -> ServiceId {
        ServiceId(((space.value() as u64) << 16) | port as u64)
    }

    /// The port space and port of an RDMA-CM service ID; `None` for any other.
    pub fn ip_port(self) -> Option<(PortSpace, u16)> {
        let space = match self.0 >> 16 {
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013f => PortSpace::Ib,
            _ => return None,
        };
        Some((space, self.0 as u16))
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// A CM message of any kind, its fields parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// A ConnectRequest.
    Req(Box<CmReqRepr>),
    /// A MsgRcptAck.
    Mra(Box<CmMraRepr>),
    /// A ConnectReject.
    Rej(Box<CmRejRepr>),
    /// A ConnectReply.
    Rep(Box<CmRepRepr>),
    /// A ReadyToUse.
    Rtu(Box<CmRtuRepr>),
    /// A DisconnectRequest.
    Dreq(Box<CmDreqRepr>),
    /// A DisconnectReply.
    Drep(Box<CmDrepRepr>),
    /// A ServiceIDResReq.
    SidrReq(Box<CmSidrReqRepr>),
    /// A ServiceIDResReqResp.
    SidrRep(Box<CmSidrRepRepr>),
    /// LAP, APR, ClassPortInfo, or an attribute IBTA does not define: kept by its ID.
    Other {
        /// The MAD header's AttributeID.
        attr_id: u16,
    },
}

impl CmMessage {
    /// The attribute ID the message travels under.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
            CmMessage::Other { attr_id } => *attr_id,
        }
    }

    /// The message's name, as IBTA and Wireshark give it.
    pub fn name(&self) -> &'static str {
        attr_name(self.attr_id())
    }

    /// Parses a whole MAD: its header must be a CM message's (see [`MadHeaderRepr::check_cm`]),
    /// and it must be [`MAD_LEN`] bytes long.
    pub fn parse(mad: &[u8]) -> Result<(MadHeaderRepr, CmMessage)> {
        if mad.len() != MAD_LEN {
            return Err(Error::Field {
                layer: Layer::Mad,
                field: "length",
                found: mad.len() as u64,
                expected: "256 bytes",
            });
        }
        let header = MadHeaderRepr::parse(&MadHeader::new_checked(mad)?)?;
        header.check_cm()?;
        let data = &mad[CM_DATA_AT..];
        let message = match header.attr_id {
            attr::REQ => CmMessage::Req(Box::new(CmReqRepr::parse(&CmReq::new_checked(data)?)?)),
            attr::MRA => CmMessage::Mra(Box::new(CmMraRepr::parse(&CmMra::new_checked(data)?)?)),
            attr::REJ => CmMessage::Rej(Box::new(CmRejRepr::parse(&CmRej::new_checked(data)?)?)),
            attr::REP => CmMessage::Rep(Box::new(CmRepRepr::parse(&CmRep::new_checked(data)?)?)),
            attr::RTU => CmMessage::Rtu(Box::new(CmRtuRepr::parse(&CmRtu::new_checked(data)?)?)),
            attr::DREQ => {
                CmMessage::Dreq(Box::new(CmDreqRepr::parse(&CmDreq::new_checked(data)?)?))
            }
            attr::DREP => {
                CmMessage::Drep(Box::new(CmDrepRepr::parse(&CmDrep::new_checked(data)?)?))
            }
            attr::SIDR_REQ => CmMessage::SidrReq(Box::new(CmSidrReqRepr::parse(
                &CmSidrReq::new_checked(data)?,
            )?)),
            attr::SIDR_REP => CmMessage::SidrRep(Box::new(CmSidrRepRepr::parse(
                &CmSidrRep::new_checked(data)?,
            )?)),
            attr_id => CmMessage::Other { attr_id },
        };
        Ok((header, message))
    }

    /// Emits the whole MAD, with the CM header for transaction `tid` (and `attr_mod`), into
    /// `mad`. [`CmMessage::Other`] has no body to write: its 232 bytes are zero.
    pub fn emit(&self, tid: u64, attr_mod: u32, mad: &mut [u8; MAD_LEN]) {
        let mut header = MadHeaderRepr::cm(tid, self.attr_id());
        header.attr_mod = attr_mod;
        let (head, data) = mad.split_at_mut(CM_DATA_AT);
        header.emit(&mut MadHeader::new_unchecked(head));
        data.fill(0);
        match self {
            CmMessage::Req(m) => m.emit(&mut CmReq::new_unchecked(data)),
            CmMessage::Mra(m) => m.emit(&mut CmMra::new_unchecked(data)),
            CmMessage::Rej(m) => m.emit(&mut CmRej::new_unchecked(data)),
            CmMessage::Rep(m) => m.emit(&mut CmRep::new_unchecked(data)),
            CmMessage::Rtu(m) => m.emit(&mut CmRtu::new_unchecked(data)),
            CmMessage::Dreq(m) => m.emit(&mut CmDreq::new_unchecked(data)),
            CmMessage::Drep(m) => m.emit(&mut CmDrep::new_unchecked(data)),
            CmMessage::SidrReq(m) => m.emit(&mut CmSidrReq::new_unchecked(data)),
            CmMessage::SidrRep(m) => m.emit(&mut CmSidrRep::new_unchecked(data)),
            CmMessage::Other { .. } => {}
        }
    }
}

/// The name of a CM attribute ID: IBTA's short names (REQ, REP, ...).
pub fn attr_name(attr_id: u16) -> &'static str {
    match attr_id {
        0x0001 => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => "unknown",
    }
}

/// The MADs of kernel rxe's rping handshake, for tests of the layers above.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::MAD_LEN;
    use crate::capture::Capture;
    use crate::wire::DethRepr;

    /// The QP1 payloads of `packet-fixtures/rxe/rdma_cm_rping.pcap`: REQ, REP, RTU, DREQ and
    /// DREP.
    pub(crate) fn rping_mads() -> Vec<[u8; MAD_LEN]> {
        fixture_mads("rdma_cm_rping.pcap")
            .into_iter()
            .map(|(_, mad)| mad)
            .collect()
    }

    /// The QP1 payloads of a fixture in `packet-fixtures/rxe/`, with their senders.
    pub(crate) fn fixture_mads(file: &str) -> Vec<(std::net::IpAddr, [u8; MAD_LEN])> {
        let path = format!("{}/packet-fixtures/rxe/{file}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(path).unwrap();
        let mut mads = Vec::new();
        for record in Capture::new(&bytes).unwrap() {
            let record = record.unwrap();
            let frame = record.frame().unwrap();
            if frame.packet.ext::<DethRepr>().is_some() {
                let src = match frame.repr.ip {
                    crate::wire::IpRepr::V4 { src, .. } => src.into(),
                    crate::wire::IpRepr::V6 { src, .. } => src.into(),
                };
                mads.push((src, frame.packet.payload().try_into().unwrap()));
            }
        }
        mads
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::rping_mads;
    use super::*;
    use std::net::Ipv4Addr;

    /// The CM MADs of rping between two kernel rxe peers (packet-fixtures/rxe), in order.
    #[test]
    fn rxes_rping_handshake_parses_and_reemits_byte_for_byte() {
        let mads = rping_mads();
        let names: Vec<_> = mads
            .iter()
            .map(|m| CmMessage::parse(m).unwrap().1.name())
            .collect();
        assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
        for mad in &mads {
            let (header, message) = CmMessage::parse(mad).unwrap();
            assert_eq!(header.tid, 0x0000_0002_1179_24d1, "one TID throughout");
            let mut out = [0; MAD_LEN];
            message.emit(header.tid, header.attr_mod, &mut out);
            assert_eq!(out[..], mad[..], "{}", message.name());
        }
        let CmMessage::Req(req) = CmMessage::parse(&mads[0]).unwrap().1 else {
            panic!()
        };
        // The TID's low half is this ID byte-swapped: the kernel ORs the big-endian ID into a
        // CPU-order u64 (cm.c `cm_form_tid`) on a little-endian host. Peers only echo TIDs.
        assert_eq!(req.local_comm_id, 0xd124_7911);
        assert_eq!(req.service_id, ServiceId::ip(PortSpace::Tcp, 7174));
        assert_eq!(req.service_id.ip_port(), Some((PortSpace::Tcp, 7174)));
        assert_eq!(req.local_qpn.value(), 0x1d);
        assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
        assert_eq!(
            (
                req.remote_cm_response_timeout,
                req.local_cm_response_timeout
            ),
            (20, 20)
        );
        assert_eq!(
            (req.retry_count, req.rnr_retry_count, req.max_cm_retries),
            (7, 7, 15)
        );
        assert_eq!(
            (req.path_mtu, req.pkey.0, req.starting_psn.value()),
            (3, 0xffff, 0xc05a62)
        );
        let path = req.primary_path;
        assert_eq!((path.local_lid, path.remote_lid), (0xffff, 0xffff));
        assert_eq!(
            path.local_gid,
            Ipv4Addr::new(10, 99, 0, 11).to_ipv6_mapped()
        );
        assert_eq!(
            path.remote_gid,
            Ipv4Addr::new(10, 99, 0, 12).to_ipv6_mapped()
        );
        assert_eq!((path.hop_limit, path.local_ack_timeout), (64, 19));
        assert!(!path.subnet_local);
        assert_eq!(req.alternate_path, CmPath::default());
        let header =
            CmaHeaderRepr::parse(&CmaHeader::new_checked(&req.private_data[..]).unwrap()).unwrap();
        assert_eq!(header.src, IpAddr::from(Ipv4Addr::new(10, 99, 0, 11)));
        assert_eq!(header.dst, IpAddr::from(Ipv4Addr::new(10, 99, 0, 12)));
        assert_eq!(header.src_port, 0xe482);
        assert!(req.private_data[CMA_HEADER_LEN..].iter().all(|&b| b == 0));

        let CmMessage::Rep(rep) = CmMessage::parse(&mads[1]).unwrap().1 else {
            panic!()
        };
        assert_eq!(
            (rep.local_comm_id, rep.remote_comm_id),
            (0x589c_56fb, 0xd124_7911)
        );
        assert_eq!(
            (rep.local_qpn.value(), rep.starting_psn.value()),
            (0x29, 0x07b848)
        );
        assert_eq!((rep.target_ack_delay, rep.rnr_retry_count), (15, 7));
        let CmMessage::Dreq(dreq) = CmMessage::parse(&mads[3]).unwrap().1 else {
            panic!()
        };
        assert_eq!(dreq.remote_qpn.value(), 0x29, "the REP's QPN");
    }

    #[test]
    fn a_mad_that_is_not_cm_is_refused_with_the_field() {
        let mut mad = rping_mads()[0];
        mad[1] = 0x04; // the performance management class
        let err = CmMessage::parse(&mad).unwrap_err().to_string();
        assert!(err.contains("MAD.mgmt_class"), "{err}");
        let err = CmMessage::parse(&mad[..255]).unwrap_err().to_string();
        assert!(err.contains("MAD.length"), "{err}");
        let mut other = rping_mads()[0];
        other[17] = 0x19; // LAP
        assert_eq!(
            CmMessage::parse(&other).unwrap().1,
            CmMessage::Other { attr_id: attr::LAP }
        );
    }

    #[test]
    fn cma_headers_refuse_what_the_kernel_refuses() {
        let header = CmaHeaderRepr {
            src: "fd00::1".parse().unwrap(),
            src_port: 5,
            dst: "fd00::2".parse().unwrap(),
        };
        let mut bytes = [0u8; CMA_HEADER_LEN];
        header.emit(&mut CmaHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[1], 0x60);
        let parse = |b: &[u8]| CmaHeaderRepr::parse(&CmaHeader::new_checked(b).unwrap());
        assert_eq!(parse(&bytes).unwrap(), header);
        let mut bad = bytes;
        bad[0] = 1;
        assert!(parse(&bad).unwrap_err().to_string().contains("version"));
        bad = bytes;
        bad[1] = 0x50;
        assert!(parse(&bad).unwrap_err().to_string().contains("ip_version"));
        bad[1] = 0x40;
        assert!(parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("12 zero bytes"));
    }
}
