//! `--pcap`: a backend wrapper that writes every RoCE packet sent and received to a pcap file,
//! as whole Ethernet frames that Wireshark and `softroce decode` read. It matters because a
//! kernel rxe's loopback traffic never reaches tcpdump, and a UDP socket's never shows its IP
//! header: softroce records what it sent and received itself.
//!
//! Frames seen through a UDP socket get synthesised Ethernet and IP headers: addresses and
//! ports are real; over IPv4 the ID is the one that makes the ICRC verify (found with
//! [`crate::wire::solve_ipv4_id`]; 0 when none does, so a bad ICRC shows as
//! bad), TTL 64, DF; the DSCP and ECN as sent or received (`IP_RECVTOS`); MAC addresses are made up from the IP addresses (02:00 and the last four
//! bytes). A raw backend's received IP header is used as it is. The file is buffered, and
//! complete once the device is closed.

use std::fs::File;
use std::io::{self, BufWriter};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapPacket, PcapWriter};

use super::{Backend, IoCounters};
use crate::transport::Datagram;
use crate::wire::frame::{EthernetRepr, UdpRepr};
use crate::wire::{solve_ipv4_id, FrameRepr, IpRepr, UdpChecksum, ROCEV2_UDP_PORT};

/// Writes frames to a pcap file.
struct Recorder {
    pcap: PcapWriter<BufWriter<File>>,
    frame: Vec<u8>,
}

/// A made-up, locally administered MAC address for an IP address.
fn mac(ip: IpAddr) -> [u8; 6] {
    let tail = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, tail[0], tail[1], tail[2], tail[3]]
}

impl Recorder {
    fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let pcap = PcapWriter::new(BufWriter::new(file)).map_err(io::Error::other)?;
        Ok(Recorder {
            pcap,
            frame: Vec::new(),
        })
    }

    /// Records one packet. A capture that cannot be written must not stop the traffic, so
    /// failures are ignored here; the file is then short.
    fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ip_header: Option<&[u8]>,
        class: u8,
        packet: &[u8],
    ) {
        let ip = match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                let identification = match ip_header {
                    Some(header) if header.len() >= 6 => u16::from_be_bytes([header[4], header[5]]),
                    _ => solve_ipv4_id(s, d, packet).unwrap_or(0),
                };
                IpRepr::V4 {
                    src: *s.ip(),
                    dst: *d.ip(),
                    dscp: class >> 2,
                    ecn: class & 3,
                    identification,
                    dont_fragment: true,
                    ttl: 64,
                }
            }
            (SocketAddr::V6(s), SocketAddr::V6(d)) => IpRepr::V6 {
                src: *s.ip(),
                dst: *d.ip(),
                dscp: class >> 2,
                ecn: class & 3,
                flow_label: 0,
                hop_limit: 64,
            },
            _ => return,
        };
        let repr = FrameRepr {
            ethernet: Some(EthernetRepr {
                src: mac(src.ip()),
                dst: mac(dst.ip()),
                vlan: None,
            }),
            ip,
            udp: UdpRepr {
                src_port: src.port(),
                dst_port: dst.port(),
                checksum: UdpChecksum::Zero,
            },
        };
        self.frame.resize(repr.header_len() + packet.len(), 0);
        let Ok(len) = repr.frame(packet, &mut self.frame) else {
            return;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let record = PcapPacket::new(now, len as u32, &self.frame[..len]);
        let _ = self.pcap.write_packet(&record);
    }
}

/// A backend that records everything `inner` sends, as sealed, and receives. A packet `inner`
/// drops before sealing it (to an unreachable destination, or too big) is not recorded.
pub struct Recording<B: Backend> {
    inner: B,
    recorder: Recorder,
    /// The last packet sent, as sealed: a copy, so that `inner` can be asked its source port.
    sealed: Vec<u8>,
}

impl<B: Backend> std::fmt::Debug for Recording<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recording({})", self.inner.local_addr())
    }
}

impl<B: Backend> Recording<B> {
    /// Records `inner`'s traffic into a new pcap file at `path`.
    pub fn new(inner: B, path: &Path) -> io::Result<Self> {
        Ok(Recording {
            inner,
            recorder: Recorder::create(path)?,
            sealed: Vec::new(),
        })
    }

    fn local(&self) -> SocketAddr {
        SocketAddr::new(self.inner.local_addr(), ROCEV2_UDP_PORT)
    }
}

impl<B: Backend> Backend for Recording<B> {
    fn local_addr(&self) -> IpAddr {
        self.inner.local_addr()
    }

    fn room(&mut self) -> io::Result<&mut [u8]> {
        self.inner.room()
    }

    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]> {
        let sealed = self.inner.commit(dst, len)?;
        if sealed.is_empty() {
            return Ok(&[]);
        }
        self.sealed.clear();
        self.sealed.extend_from_slice(sealed);
        // Sealed by now: the record shows the ICRC that goes on the wire, and the source port
        // it was sealed for.
        let port = self.inner.udp_source_port(&self.sealed);
        let local = SocketAddr::new(self.inner.local_addr(), port);
        let dst = SocketAddr::new(dst, ROCEV2_UDP_PORT);
        let class = self.inner.traffic_class(&self.sealed);
        self.recorder.record(local, dst, None, class, &self.sealed);
        Ok(&self.sealed)
    }

    fn udp_source_port(&self, packet: &[u8]) -> u16 {
        self.inner.udp_source_port(packet)
    }

    fn traffic_class(&self, packet: &[u8]) -> u8 {
        self.inner.traffic_class(packet)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn drain_unreachable(&mut self, each: &mut dyn FnMut(IpAddr)) {
        self.inner.drain_unreachable(each);
    }

    fn drain_refusals(&mut self, each: &mut dyn FnMut(IpAddr, &[u8])) {
        self.inner.drain_refusals(each);
    }

    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize> {
        let local = self.local();
        let recorder = &mut self.recorder;
        self.inner.receive(budget, &mut |datagram| {
            let src = SocketAddr::new(datagram.src, datagram.src_port);
            let dst = SocketAddr::new(datagram.dst, local.port());
            recorder.record(
                src,
                dst,
                datagram.ip_header,
                datagram.traffic_class,
                datagram.packet,
            );
            deliver(datagram);
        })
    }

    fn source(&mut self) -> &mut dyn mio::event::Source {
        self.inner.source()
    }

    fn counters(&self) -> IoCounters {
        self.inner.counters()
    }
}
