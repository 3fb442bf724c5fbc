//! The two I/O paths to the guest, and the decoding and logging of every packet.
//!
//! * `udp`: one UDP socket bound to LOCAL:4791. It sends unconnected (`sendto`) with
//!   `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so the kernel frames each datagram with DF and IP ID 0,
//!   the framing [`KernelFraming`] seals the ICRC for (a connected socket would get a per-socket
//!   ID counter and every ICRC would be wrong). A UDP socket does not deliver the IP header, and
//!   rxe writes a non-zero IP ID into it, so the ICRC of what rxe sends is *unverified* here.
//! * `raw`: whole IPv4 datagrams built by [`FrameRepr::emit`] (with a non-zero IP ID of our
//!   choosing, which the ICRC covers) go out through an `IPPROTO_RAW` socket (IP_HDRINCL);
//!   packets come in through a raw `IPPROTO_UDP` socket, which delivers the IP header too, so
//!   every packet's ICRC is verified, and a bad one fails the check. The UDP socket on 4791 is
//!   still bound: without it the kernel would answer rxe's packets with ICMP port unreachable.

use std::fmt::{self, Write as _};
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use softroce::wire::frame::UdpRepr;
use softroce::wire::{
    Frame, FrameError, FrameRepr, IcrcStatus, IpRepr, KernelFraming, PacketRepr, RocePacket,
    UdpChecksum, ROCEV2_UDP_PORT,
};

use crate::Result;

/// Which sockets carry the packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Udp,
    Raw,
}

impl FromStr for Path {
    type Err = Box<dyn std::error::Error>;
    fn from_str(s: &str) -> Result<Path> {
        match s {
            "udp" => Ok(Path::Udp),
            "raw" => Ok(Path::Raw),
            _ => bail!("--path: '{s}' is neither udp nor raw"),
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::Udp => "udp",
            Path::Raw => "raw",
        })
    }
}

/// A packet received from the guest, decoded.
#[derive(Debug)]
pub struct Received {
    pub repr: PacketRepr,
    pub payload: Vec<u8>,
}

/// Whether a sent packet carries the ICRC its framing calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    Good,
    /// The right ICRC with its bits flipped: a receiver must drop the packet.
    Corrupt,
}

struct RawSockets {
    send: Socket,
    recv: Socket,
}

/// Packet counts for the verdict line.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    sent: usize,
    received: usize,
    icrc_ok: usize,
}

/// One side's sockets, talking to one guest.
pub struct Link {
    path: Path,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    udp: UdpSocket,
    raw: Option<RawSockets>,
    next_ip_id: u16,
    buf: Vec<u8>,
    counts: Counts,
}

impl Link {
    /// Binds LOCAL:4791 (and the raw sockets for `Path::Raw`) to talk RoCEv2 with `peer`.
    pub fn open(path: Path, local: Ipv4Addr, peer: Ipv4Addr) -> Result<Link> {
        let local = SocketAddrV4::new(local, ROCEV2_UDP_PORT);
        let udp = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        set_pmtudisc_do(&udp)?;
        udp.bind(&local.into())
            .map_err(|e| format!("cannot bind UDP {local}: {e}"))?;
        let raw = match path {
            Path::Udp => None,
            Path::Raw => {
                // We write the IP header ourselves. IPPROTO_RAW implies IP_HDRINCL (raw(7));
                // setting it too says what the path relies on.
                let send = Socket::new(Domain::IPV4, Type::RAW, Some(libc::IPPROTO_RAW.into()))?;
                send.set_header_included_v4(true)?;
                let recv = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
                recv.bind(&SocketAddrV4::new(*local.ip(), 0).into())?;
                Some(RawSockets { send, recv })
            }
        };
        Ok(Link {
            path,
            local,
            peer: SocketAddrV4::new(peer, ROCEV2_UDP_PORT),
            udp: udp.into(),
            raw,
            // Any ID will do, as long as the ICRC covers it. Non-zero IDs (the UDP path always
            // sends 0) show that the ICRC follows the ID we chose.
            next_ip_id: 0x5300,
            buf: vec![0; 65536],
            counts: Counts::default(),
        })
    }

    /// What went over the wire, for the verdict line.
    pub fn summary(&self) -> String {
        let Counts {
            sent,
            received,
            icrc_ok,
        } = self.counts;
        let icrc = match self.path {
            Path::Raw => format!("ICRC verified on all {icrc_ok}"),
            Path::Udp => "ICRC unverified (IPv4 over a UDP socket)".to_string(),
        };
        format!("{sent} packets sent, {received} received, {icrc}")
    }

    /// Builds the packet with softroce's codec and sends it.
    pub fn send(&mut self, repr: &PacketRepr, payload: &[u8], seal: Seal) -> Result<()> {
        let mut note = String::new();
        let mut out = match self.path {
            Path::Udp => {
                let mut out = vec![0; repr.buffer_len()];
                repr.emit_with_payload(&mut out, payload)?;
                KernelFraming::V4 {
                    src: self.local,
                    dst: self.peer,
                }
                .seal(&mut out);
                out
            }
            Path::Raw => {
                let frame = FrameRepr {
                    ethernet: None,
                    ip: IpRepr::V4 {
                        src: *self.local.ip(),
                        dst: *self.peer.ip(),
                        dscp: 0,
                        ecn: 0,
                        identification: self.next_ip_id,
                        dont_fragment: true,
                        ttl: 64,
                    },
                    udp: UdpRepr {
                        src_port: self.local.port(),
                        dst_port: ROCEV2_UDP_PORT,
                        checksum: UdpChecksum::Zero,
                    },
                };
                let _ = write!(note, " ipid={:#06x}", self.next_ip_id);
                self.next_ip_id = self.next_ip_id.wrapping_add(1).max(1);
                let mut out = vec![0; frame.buffer_len(repr)];
                frame.emit(repr, payload, &mut out)?;
                out
            }
        };
        if seal == Seal::Corrupt {
            // The ICRC is the last four bytes in both framings.
            let at = out.len() - 4;
            out[at] ^= 0xff;
            note.push_str(" icrc=CORRUPTED");
        }
        let sent = match &self.raw {
            None => self.udp.send_to(&out, self.peer)?,
            Some(raw) => raw
                .send
                .send_to(&out, &SockAddr::from(SocketAddrV4::new(*self.peer.ip(), 0)))?,
        };
        if sent != out.len() {
            bail!("sent {sent} of {} bytes", out.len());
        }
        self.counts.sent += 1;
        println!("tx {}{note}", describe(repr));
        Ok(())
    }

    /// The next RoCE packet from the guest, or `None` once `deadline` passes. Anything else
    /// that reaches the sockets (another host, another UDP port) is skipped. On the raw path a
    /// packet with a bad ICRC is an error: kernel rxe never sends one.
    pub fn recv(&mut self, deadline: Instant) -> Result<Option<Received>> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let timeout = Some(deadline - now);
            let read = match &self.raw {
                None => {
                    self.udp.set_read_timeout(timeout)?;
                    self.udp
                        .recv_from(&mut self.buf)
                        .map(|(n, from)| (n, Some(from)))
                }
                Some(raw) => {
                    raw.recv.set_read_timeout(timeout)?;
                    (&raw.recv).read(&mut self.buf).map(|n| (n, None))
                }
            };
            let (n, from) = match read {
                Ok(read) => read,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(received) = self.decode(n, from)? {
                return Ok(Some(received));
            }
        }
    }

    /// Decodes the `n` bytes in the buffer: a UDP payload from `from`, or (raw path) an IPv4
    /// datagram. `None` for a datagram that is not RoCEv2 from the peer.
    fn decode(&mut self, n: usize, from: Option<SocketAddr>) -> Result<Option<Received>> {
        let bytes = &self.buf[..n];
        let (packet, icrc) = match from {
            Some(from) => {
                if from.ip() != *self.peer.ip() {
                    println!("rx skipped: a UDP datagram from {from}");
                    return Ok(None);
                }
                let packet = RocePacket::new_checked(bytes)
                    .map_err(|e| format!("undecodable packet from {from}: {e}"))?;
                (packet, IcrcStatus::Unverified)
            }
            None => {
                let frame = match Frame::parse_ip(bytes) {
                    Ok(frame) => frame,
                    // Other UDP traffic reaches a raw IPPROTO_UDP socket too.
                    Err(FrameError::NotRoce(_)) => return Ok(None),
                    Err(e) => bail!("undecodable datagram: {e}"),
                };
                let IpRepr::V4 { src, dst, .. } = frame.repr.ip else {
                    return Ok(None);
                };
                if src != *self.peer.ip() || dst != *self.local.ip() {
                    return Ok(None);
                }
                (frame.packet, frame.icrc_status())
            }
        };
        let repr = PacketRepr::parse(&packet)?;
        println!("rx {} icrc={}", describe(&repr), icrc.as_str());
        self.counts.received += 1;
        match icrc {
            IcrcStatus::Ok => self.counts.icrc_ok += 1,
            IcrcStatus::Bad { computed, received } => bail!(
                "{} psn={} arrived with ICRC {received:#010x}, but its bytes give {computed:#010x}",
                repr.bth.opcode,
                repr.bth.psn
            ),
            IcrcStatus::Unverified => {}
        }
        Ok(Some(Received {
            repr,
            payload: packet.payload().to_vec(),
        }))
    }
}

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: DF on every datagram, and with it IP ID 0 on an
/// unconnected socket. socket2 has no setter for it.
fn set_pmtudisc_do(socket: &Socket) -> io::Result<()> {
    let value: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid socket descriptor, and a pointer to a c_int with its exact length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One log line's worth of a packet: the BTH and whichever extension headers it has.
pub fn describe(repr: &PacketRepr) -> String {
    let bth = &repr.bth;
    let mut s = format!("{} qp={} psn={}", bth.opcode, bth.dest_qp, bth.psn);
    if bth.ack_req {
        s.push_str(" ackreq");
    }
    let ext = &repr.ext;
    if let Some(reth) = ext.reth {
        let _ = write!(
            s,
            " reth(va={:#x} rkey={} len={})",
            reth.virtual_address, reth.rkey, reth.dma_len
        );
    }
    if let Some(aeth) = ext.aeth {
        let _ = write!(
            s,
            " aeth(syndrome={:#04x} {} msn={})",
            aeth.syndrome.to_byte(),
            aeth.syndrome,
            aeth.msn
        );
    }
    if let Some(deth) = ext.deth {
        let _ = write!(s, " deth(qkey={} src_qp={})", deth.qkey, deth.src_qp);
    }
    if let Some(atomic) = ext.atomic_eth {
        let _ = write!(
            s,
            " atomic(va={:#x} rkey={} add={:#x})",
            atomic.virtual_address, atomic.rkey, atomic.swap_add
        );
    }
    if let Some(ack) = ext.atomic_ack_eth {
        let _ = write!(s, " orig={:#x}", ack.original_data);
    }
    let _ = write!(s, " payload={}", repr.payload_len);
    if bth.pad_count != 0 {
        let _ = write!(s, "+pad{}", bth.pad_count);
    }
    s
}
