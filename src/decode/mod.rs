//! `softroce decode`: one summary per RoCE packet of a capture, as text or JSON, and counts.
//!
//! Every RoCEv2 frame gets an ICRC verdict: those softroce parses, with their headers and, for
//! a CM MAD on QP1, the MAD ([`cm`]); and those whose opcode it does not parse (RD, which
//! ConnectX's Dynamically Connected transport reuses, XRC, manufacturer-specific, reserved),
//! with their BTH, counted by opcode like the rest.

pub mod cm;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::capture::{Capture, CaptureError, Record};
use crate::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ecn, Frame, FrameError,
    FrameRepr, IethRepr, ImmDtRepr, IpRepr, OpaqueRoce, PacketRepr, Qpn, RethRepr,
};
pub use cm::CmJson;

/// A RETH (IBTA 9.3.3.1) in JSON form: the target of an RDMA READ or WRITE.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RethJson {
    /// The remote virtual address.
    pub va: u64,
    /// The R_Key of the remote region or window.
    pub rkey: u32,
    /// The DMA length of the whole message, in bytes.
    pub dma_len: u32,
}

/// An AETH (IBTA 9.3.5) in JSON form: an ACK, RNR NAK or NAK.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AethJson {
    /// The syndrome byte, as on the wire.
    pub syndrome: u8,
    /// The syndrome in words, e.g. `ACK credits=4` or `RNR-NAK timer=640us`.
    pub meaning: String,
    /// The message sequence number, 24 bits.
    pub msn: u32,
}

/// A DETH (IBTA 9.3.4) in JSON form: a UD packet's Q_Key and source QP.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DethJson {
    /// The Q_Key the receiving QP checks.
    pub qkey: u32,
    /// The sending QP's number.
    pub src_qp: u32,
}

/// An AtomicETH (IBTA 9.3.3.2) in JSON form: the target and operands of an atomic.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AtomicEthJson {
    /// The remote virtual address, 8-byte aligned.
    pub va: u64,
    /// The R_Key of the remote region or window.
    pub rkey: u32,
    /// The value to add (FETCH & ADD) or to swap in (COMPARE & SWAP).
    pub swap_add: u64,
    /// The value COMPARE & SWAP compares against; unused by FETCH & ADD.
    pub compare: u64,
}

/// What every RoCEv2 packet shows, parsed or not: where it is in the capture, its addresses,
/// and the BTH fields that name it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PacketHead {
    /// The frame's 1-based number in the capture, as Wireshark counts.
    pub frame: usize,
    /// Seconds since the epoch, as captured.
    pub time: f64,
    /// Seconds since the capture's first frame.
    pub time_relative: f64,
    /// The source IP address.
    pub src: String,
    /// The destination IP address.
    pub dst: String,
    /// The UDP source port (the destination is 4791).
    pub src_port: u16,
    /// The IP header's DSCP.
    pub dscp: u8,
    /// The IP header's ECN codepoint: `Not-ECT`, `ECT(1)`, `ECT(0)` or `CE` (a switch marked
    /// the packet: congestion on the way).
    pub ecn: &'static str,
    /// The BTH opcode byte.
    pub opcode: u8,
    /// IBTA's name for the opcode, e.g. `RC_SEND_ONLY`.
    pub opcode_name: &'static str,
    /// The BTH's destination QP number.
    pub dest_qp: u32,
    /// The BTH's packet sequence number, 24 bits.
    pub psn: u32,
    /// The BTH's AckReq bit: the requester asks for an acknowledgement.
    pub ack_req: bool,
}

impl PacketHead {
    fn new(record: &Record<'_>, first: Duration, repr: &FrameRepr, bth: &BthRepr) -> Self {
        let (src, dst, dscp, ecn) = match repr.ip {
            IpRepr::V4 {
                src,
                dst,
                dscp,
                ecn,
                ..
            } => (src.to_string(), dst.to_string(), dscp, ecn),
            IpRepr::V6 {
                src,
                dst,
                dscp,
                ecn,
                ..
            } => (src.to_string(), dst.to_string(), dscp, ecn),
        };
        let ecn = match Ecn::from_bits(ecn) {
            Some(Ecn::NotEct) | None => "Not-ECT",
            Some(Ecn::Ect1) => "ECT(1)",
            Some(Ecn::Ect0) => "ECT(0)",
            Some(Ecn::Ce) => "CE",
        };
        PacketHead {
            frame: record.number,
            time: record.timestamp.as_secs_f64(),
            time_relative: record.timestamp.saturating_sub(first).as_secs_f64(),
            src,
            dst,
            src_port: repr.udp.src_port,
            dscp,
            ecn,
            opcode: bth.opcode.value(),
            opcode_name: bth.opcode.name(),
            dest_qp: bth.dest_qp.value(),
            psn: bth.psn.value(),
            ack_req: bth.ack_req,
        }
    }

    /// The start of the text form: frame, time, addresses, opcode (named as `name`), QPN,
    /// PSN and AckReq, and `CE` if a switch marked the packet.
    fn summary(&self, name: &str) -> String {
        let marked = if self.ecn == "CE" { " CE" } else { "" };
        format!(
            "{:>5} {:>12.6} {} -> {} {name} QP={:#08x} PSN={} A={}{marked}",
            self.frame,
            self.time_relative,
            self.src,
            self.dst,
            self.dest_qp,
            self.psn,
            u8::from(self.ack_req)
        )
    }
}

/// One decoded RoCE packet.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Decoded {
    /// What every RoCEv2 packet shows.
    #[serde(flatten)]
    pub head: PacketHead,
    /// The BTH's SE bit: the responder should raise a solicited event.
    pub solicited: bool,
    /// The BTH's MigReq bit, shown as sent.
    pub mig_req: bool,
    /// The BTH's PadCnt: 0 to 3 pad bytes after the payload.
    pub pad_count: u8,
    /// The BTH's partition key.
    pub pkey: u16,
    /// The BTH's FECN bit: congestion seen on the way.
    pub fecn: bool,
    /// The BTH's BECN bit: set in CNPs.
    pub becn: bool,
    /// The RETH, if the opcode has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<RethJson>,
    /// The AETH, if the opcode has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<AethJson>,
    /// The DETH of a UD packet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<DethJson>,
    /// The immediate data (ImmDt), if the opcode carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immdt: Option<u32>,
    /// The R_Key a SEND with Invalidate's IETH names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<u32>,
    /// The AtomicETH of an atomic request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_eth: Option<AtomicEthJson>,
    /// An ATOMIC ACKNOWLEDGE's original remote value, from its AtomicAckETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack_eth: Option<u64>,
    /// The payload length in bytes, without pad or ICRC.
    pub payload_len: usize,
    /// `ok`, `bad` or `unverified`.
    pub icrc: &'static str,
    /// The CM MAD of a UD packet to QP1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cm: Option<CmJson>,
}

impl Decoded {
    fn new(record: &Record<'_>, first: Duration, frame: &Frame<'_>, repr: &PacketRepr) -> Self {
        let bth = &repr.bth;
        let to_qp1 = bth.dest_qp == Qpn::GSI && repr.ext.deth.is_some();
        let cm = to_qp1.then(|| cm::decode(frame.packet.payload())).flatten();
        let ext = &repr.ext;
        Decoded {
            head: PacketHead::new(record, first, &frame.repr, bth),
            solicited: bth.solicited,
            mig_req: bth.mig_req,
            pad_count: bth.pad_count,
            pkey: bth.pkey.0,
            fecn: bth.fecn,
            becn: bth.becn,
            reth: ext.reth.map(|r: RethRepr| RethJson {
                va: r.virtual_address,
                rkey: r.rkey.0,
                dma_len: r.dma_len,
            }),
            aeth: ext.aeth.map(|a: AethRepr| AethJson {
                syndrome: a.syndrome.to_byte(),
                meaning: a.syndrome.to_string(),
                msn: a.msn.value(),
            }),
            deth: ext.deth.map(|d: DethRepr| DethJson {
                qkey: d.qkey.0,
                src_qp: d.src_qp.value(),
            }),
            immdt: ext.immdt.map(|i: ImmDtRepr| i.data),
            ieth: ext.ieth.map(|i: IethRepr| i.rkey.0),
            atomic_eth: ext.atomic_eth.map(|a: AtomicEthRepr| AtomicEthJson {
                va: a.virtual_address,
                rkey: a.rkey.0,
                swap_add: a.swap_add,
                compare: a.compare,
            }),
            atomic_ack_eth: ext
                .atomic_ack_eth
                .map(|a: AtomicAckEthRepr| a.original_data),
            payload_len: repr.payload_len,
            icrc: frame.icrc_status().as_str(),
            cm,
        }
    }

    /// A one-line summary in the manner of tshark's.
    pub fn summary(&self) -> String {
        let mut line = self.head.summary(self.head.opcode_name);
        if let Some(r) = &self.reth {
            let _ = write!(
                line,
                " RETH va={:#x} rkey={:#010x} len={}",
                r.va, r.rkey, r.dma_len
            );
        }
        if let Some(a) = &self.aeth {
            let _ = write!(line, " AETH {} MSN={}", a.meaning, a.msn);
        }
        if let Some(d) = &self.deth {
            let _ = write!(line, " DETH qkey={:#010x} srcQP={:#08x}", d.qkey, d.src_qp);
        }
        if let Some(i) = self.immdt {
            let _ = write!(line, " ImmDt={i:#010x}");
        }
        if let Some(r) = self.ieth {
            let _ = write!(line, " IETH rkey={r:#010x}");
        }
        if let Some(a) = &self.atomic_eth {
            let _ = write!(
                line,
                " AtomicETH va={:#x} rkey={:#010x} swap_add={:#x} compare={:#x}",
                a.va, a.rkey, a.swap_add, a.compare
            );
        }
        if let Some(o) = self.atomic_ack_eth {
            let _ = write!(line, " AtomicAckETH orig={o:#x}");
        }
        if self.becn {
            line.push_str(" BECN");
        }
        if self.fecn {
            line.push_str(" FECN");
        }
        let _ = write!(
            line,
            " len={} ICRC={}",
            self.payload_len,
            icrc_label(self.icrc)
        );
        if let Some(cm) = &self.cm {
            line.push_str(&cm.summary());
        }
        line
    }
}

/// How the text form shows an ICRC verdict: a bad one stands out.
fn icrc_label(icrc: &'static str) -> &'static str {
    match icrc {
        "bad" => "BAD",
        other => other,
    }
}

/// A RoCEv2 packet whose opcode softroce does not parse: its BTH, length and ICRC verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unparsed {
    /// What every RoCEv2 packet shows.
    #[serde(flatten)]
    pub head: PacketHead,
    /// The RoCE packet's length, BTH through ICRC.
    pub len: usize,
    /// `ok`, `bad` or `unverified`.
    pub icrc: &'static str,
    /// Why it is not parsed.
    pub not_parsed: String,
}

impl Unparsed {
    fn new(record: &Record<'_>, first: Duration, opaque: &OpaqueRoce) -> Self {
        Unparsed {
            head: PacketHead::new(record, first, &opaque.repr, &opaque.bth),
            len: opaque.len,
            icrc: opaque.icrc.as_str(),
            not_parsed: opaque.reason.to_string(),
        }
    }

    /// The name it is counted under: RD's and XRC's name each value; the vendor and reserved
    /// ranges add it.
    pub fn counted_as(&self) -> String {
        match self.head.opcode_name {
            "MANUFACTURER_SPECIFIC" | "RESERVED" => {
                format!("{} {:#04x}", self.head.opcode_name, self.head.opcode)
            }
            name => name.to_string(),
        }
    }

    /// A one-line summary like [`Decoded::summary`], with why the packet is not parsed.
    pub fn summary(&self) -> String {
        let dc = if self.head.opcode_name.starts_with("RD_") {
            " (RD, or ConnectX DC)"
        } else {
            ""
        };
        let head = self.head.summary(&format!("{}{dc}", self.counted_as()));
        format!(
            "{head} not parsed: {} len={} ICRC={}",
            self.not_parsed,
            self.len,
            icrc_label(self.icrc)
        )
    }
}

/// What one capture record turned out to be.
#[derive(Debug)]
pub enum Item {
    /// RoCEv2 that softroce parses.
    Roce(Box<Decoded>),
    /// RoCEv2 whose opcode softroce does not parse; its ICRC is checked all the same.
    Unparsed(Box<Unparsed>),
    /// UDP to port 4791 whose RoCE packet is malformed.
    Malformed {
        /// The frame's 1-based number in the capture.
        frame: usize,
        /// What is wrong with it.
        error: FrameError,
    },
    /// Any other frame.
    NotRoce,
}

/// Decodes one record; `first` is the timestamp of the capture's first frame.
pub fn decode_record(record: &Record<'_>, first: Duration) -> Item {
    match record.frame() {
        Ok(frame) => match PacketRepr::parse(&frame.packet) {
            Ok(repr) => Item::Roce(Box::new(Decoded::new(record, first, &frame, &repr))),
            Err(e) => Item::Malformed {
                frame: record.number,
                error: e.into(),
            },
        },
        Err(FrameError::NotRoce(_)) => Item::NotRoce,
        Err(FrameError::Opaque(opaque)) => {
            Item::Unparsed(Box::new(Unparsed::new(record, first, &opaque)))
        }
        Err(error) => Item::Malformed {
            frame: record.number,
            error,
        },
    }
}

/// Counts kept over a whole capture.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Summary {
    /// RoCE packets per opcode name; unparsed ones as [`Unparsed::counted_as`] names them.
    pub by_opcode: BTreeMap<String, usize>,
    /// RoCE packets per ICRC verdict: `ok`, `bad` or `unverified`.
    pub by_icrc: BTreeMap<&'static str, usize>,
    /// Frames to UDP port 4791 whose RoCE packet is malformed.
    pub malformed: usize,
    /// Frames that are not RoCEv2, skipped.
    pub not_roce: usize,
    /// RoCEv2 packets whose opcode softroce does not parse (also counted by opcode and ICRC).
    pub not_parsed: usize,
}

impl Summary {
    /// Counts one decoded record.
    pub fn count(&mut self, item: &Item) {
        match item {
            Item::Roce(d) => {
                *self
                    .by_opcode
                    .entry(d.head.opcode_name.to_string())
                    .or_default() += 1;
                *self.by_icrc.entry(d.icrc).or_default() += 1;
            }
            Item::Unparsed(u) => {
                *self.by_opcode.entry(u.counted_as()).or_default() += 1;
                *self.by_icrc.entry(u.icrc).or_default() += 1;
                self.not_parsed += 1;
            }
            Item::Malformed { .. } => self.malformed += 1,
            Item::NotRoce => self.not_roce += 1,
        }
    }

    /// The closing table of `softroce decode`.
    pub fn render(&self) -> String {
        let mut out = String::from("\nRoCE packets by opcode:\n");
        for (name, n) in &self.by_opcode {
            let _ = writeln!(out, "  {name:<36} {n:>8}");
        }
        out.push_str("ICRC:\n");
        for status in ["ok", "bad", "unverified"] {
            let _ = writeln!(
                out,
                "  {status:<36} {:>8}",
                self.by_icrc.get(status).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(
            out,
            "not parsed (RD, XRC, vendor or reserved opcodes): {}",
            self.not_parsed
        );
        let _ = writeln!(out, "malformed RoCE frames: {}", self.malformed);
        let _ = writeln!(out, "non-RoCE frames skipped: {}", self.not_roce);
        out
    }
}

/// Decodes a whole capture held in memory, calling `each` for every record in order.
pub fn decode_capture(file: &[u8], mut each: impl FnMut(&Item)) -> Result<Summary, CaptureError> {
    let mut summary = Summary::default();
    let mut first = None;
    for record in Capture::new(file)? {
        let record = record?;
        let item = decode_record(&record, *first.get_or_insert(record.timestamp));
        each(&item);
        summary.count(&item);
    }
    Ok(summary)
}
