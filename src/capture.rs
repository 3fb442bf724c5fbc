//! Reading pcap and pcapng captures, with byte offsets for every error.
//!
//! `pcap-file` does the format work; this module adds what `softroce decode` and the fixture
//! tests need: one iterator over both formats, the link type of every record, and errors that
//! say where in the file they happened.

use core::fmt;
use std::borrow::Cow;
use std::time::Duration;

use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, PcapError};

use crate::wire::{Frame, FrameError};

/// How a record's bytes start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// The record starts at an Ethernet II header.
    Ethernet,
    /// The record starts at the IPv4 or IPv6 header.
    RawIp,
    /// Linux cooked capture v1 (`tcpdump -i any`).
    LinuxSll,
    /// Anything else, by its pcap link-type number.
    Other(u32),
}

impl From<DataLink> for LinkType {
    fn from(link: DataLink) -> Self {
        match link {
            DataLink::ETHERNET => LinkType::Ethernet,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => LinkType::RawIp,
            DataLink::LINUX_SLL => LinkType::LinuxSll,
            other => LinkType::Other(u32::from(other)),
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    /// 1-based, counting captured frames only, as Wireshark numbers them.
    pub number: usize,
    /// Where the record starts in the file.
    pub offset: usize,
    /// When the frame was captured, since the Unix epoch; zero for a pcapng simple packet block.
    pub timestamp: Duration,
    /// How the record's bytes start.
    pub link: LinkType,
    /// The captured bytes, possibly fewer than the frame had on the wire.
    pub data: Cow<'a, [u8]>,
}

impl Record<'_> {
    /// Parses the record as a RoCEv2 frame.
    pub fn frame(&self) -> Result<Frame<'_>, FrameError> {
        match self.link {
            LinkType::Ethernet => Frame::parse_ethernet(&self.data),
            LinkType::RawIp => Frame::parse_ip(&self.data),
            LinkType::LinuxSll => Frame::parse_linux_sll(&self.data),
            LinkType::Other(_) => Err(FrameError::NotRoce("a link type softroce does not read")),
        }
    }
}

/// A capture file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureError {
    /// The byte offset where the bad header, block or record starts.
    pub offset: usize,
    /// What was wrong, in words.
    pub reason: String,
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte offset {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for CaptureError {}

fn describe(e: PcapError) -> String {
    match e {
        PcapError::IncompleteBuffer => "truncated: the file ends inside a record".to_string(),
        other => other.to_string(),
    }
}

enum Format {
    Pcap(PcapParser),
    PcapNg(Box<PcapNgParser>),
}

/// An iterator over the records of a pcap or pcapng file held in memory. It stops after the
/// first error.
pub struct Capture<'a> {
    file: &'a [u8],
    rest: &'a [u8],
    format: Format,
    number: usize,
    failed: bool,
}

impl fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("offset", &(self.file.len() - self.rest.len()))
            .field("number", &self.number)
            .finish()
    }
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl<'a> Capture<'a> {
    /// Reads the file header, telling pcap from pcapng by the first four bytes.
    pub fn new(file: &'a [u8]) -> Result<Self, CaptureError> {
        let header_error = |e| CaptureError {
            offset: 0,
            reason: format!("not a pcap or pcapng file: {}", describe(e)),
        };
        let (rest, format) = if file.starts_with(&PCAPNG_MAGIC) {
            let (rest, parser) = PcapNgParser::new(file).map_err(header_error)?;
            (rest, Format::PcapNg(Box::new(parser)))
        } else {
            let (rest, parser) = PcapParser::new(file).map_err(header_error)?;
            (rest, Format::Pcap(parser))
        };
        Ok(Capture {
            file,
            rest,
            format,
            number: 0,
            failed: false,
        })
    }

    fn offset(&self) -> usize {
        self.file.len() - self.rest.len()
    }

    fn next_record(&mut self) -> Result<Option<Record<'a>>, CaptureError> {
        loop {
            if self.rest.is_empty() {
                return Ok(None);
            }
            let offset = self.offset();
            let fail = |e| CaptureError {
                offset,
                reason: describe(e),
            };
            match &mut self.format {
                Format::Pcap(parser) => {
                    let link = LinkType::from(parser.header().datalink);
                    let (rest, packet) = parser.next_packet(self.rest).map_err(fail)?;
                    self.rest = rest;
                    self.number += 1;
                    return Ok(Some(Record {
                        number: self.number,
                        offset,
                        timestamp: packet.timestamp,
                        link,
                        data: packet.data,
                    }));
                }
                Format::PcapNg(parser) => {
                    let (rest, block) = parser.next_block(self.rest).map_err(fail)?;
                    self.rest = rest;
                    let (timestamp, interface, data) = match block {
                        Block::EnhancedPacket(epb) => (epb.timestamp, epb.interface_id, epb.data),
                        // A simple packet block has no timestamp and belongs to interface 0.
                        Block::SimplePacket(spb) => (Duration::ZERO, 0, spb.data),
                        _ => continue,
                    };
                    let link = parser
                        .interfaces()
                        .get(interface as usize)
                        .map(|idb| LinkType::from(idb.linktype))
                        .ok_or_else(|| CaptureError {
                            offset,
                            reason: "a packet block names an interface that was never described"
                                .to_string(),
                        })?;
                    self.number += 1;
                    return Ok(Some(Record {
                        number: self.number,
                        offset,
                        timestamp,
                        link,
                        data,
                    }));
                }
            }
        }
    }
}

impl<'a> Iterator for Capture<'a> {
    type Item = Result<Record<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_record();
        self.failed = next.is_err();
        next.transpose()
    }
}
