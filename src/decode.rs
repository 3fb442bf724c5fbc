//! `softroce decode`: one summary per RoCE packet of a capture, as text or JSON, and counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::capture::{Capture, CaptureError, Record};
use crate::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, Frame, FrameError, IethRepr, ImmDtRepr,
    IpRepr, PacketRepr, RethRepr,
};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RethJson {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AethJson {
    pub syndrome: u8,
    pub meaning: String,
    pub msn: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DethJson {
    pub qkey: u32,
    pub src_qp: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AtomicEthJson {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// One decoded RoCE packet.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Decoded {
    pub frame: usize,
    /// Seconds since the epoch, as captured.
    pub time: f64,
    /// Seconds since the capture's first frame.
    pub time_relative: f64,
    pub src: String,
    pub dst: String,
    pub src_port: u16,
    pub opcode: u8,
    pub opcode_name: &'static str,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<RethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<AethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<DethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immdt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_eth: Option<AtomicEthJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack_eth: Option<u64>,
    pub payload_len: usize,
    /// `ok`, `bad` or `unverified`.
    pub icrc: &'static str,
}

impl Decoded {
    fn new(record: &Record<'_>, first: Duration, frame: &Frame<'_>, repr: &PacketRepr) -> Self {
        let (src, dst) = match frame.repr.ip {
            IpRepr::V4 { src, dst, .. } => (src.to_string(), dst.to_string()),
            IpRepr::V6 { src, dst, .. } => (src.to_string(), dst.to_string()),
        };
        let bth = &repr.bth;
        let ext = &repr.ext;
        Decoded {
            frame: record.number,
            time: record.timestamp.as_secs_f64(),
            time_relative: record.timestamp.saturating_sub(first).as_secs_f64(),
            src,
            dst,
            src_port: frame.repr.udp.src_port,
            opcode: bth.opcode.value(),
            opcode_name: bth.opcode.name(),
            dest_qp: bth.dest_qp.value(),
            psn: bth.psn.value(),
            ack_req: bth.ack_req,
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
        }
    }

    /// A one-line summary in the manner of tshark's.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "{:>5} {:>12.6} {} -> {} {} QP={:#08x} PSN={} A={}",
            self.frame,
            self.time_relative,
            self.src,
            self.dst,
            self.opcode_name,
            self.dest_qp,
            self.psn,
            u8::from(self.ack_req)
        );
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
        let _ = write!(line, " len={} ICRC={}", self.payload_len, self.icrc_label());
        line
    }

    fn icrc_label(&self) -> &'static str {
        match self.icrc {
            "bad" => "BAD",
            other => other,
        }
    }
}

/// What one capture record turned out to be.
#[derive(Debug)]
pub enum Item {
    Roce(Box<Decoded>),
    /// UDP to port 4791 whose RoCE packet is malformed.
    Malformed {
        frame: usize,
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
        Err(error) => Item::Malformed {
            frame: record.number,
            error,
        },
    }
}

/// Counts kept over a whole capture.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub by_opcode: BTreeMap<String, usize>,
    pub by_icrc: BTreeMap<&'static str, usize>,
    pub malformed: usize,
    pub not_roce: usize,
}

impl Summary {
    pub fn count(&mut self, item: &Item) {
        match item {
            Item::Roce(d) => {
                *self.by_opcode.entry(d.opcode_name.to_string()).or_default() += 1;
                *self.by_icrc.entry(d.icrc).or_default() += 1;
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
