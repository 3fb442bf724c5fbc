//! The guest tools' out-of-band exchanges over TCP, as their clients.
//!
//! * `ibv_*_pingpong` (rdma-core libibverbs/examples): the client writes 52 bytes,
//!   `"%04x:%06x:%06x:%s\0"` = LID:QPN:PSN:GID, the GID as 32 hex digits in wire order; the
//!   server answers with its own 52 bytes, and the client writes `"done\0"`.
//! * perftest 4.5-0.17 (`ib_*_bw`, version string "6.06"), src/perftest_communication.c: the
//!   client writes first in every exchange and then reads the server's answer of the same size.
//!   After the version (16 bytes), the page and cache-line sizes (4 bytes each, big-endian) and
//!   the MTU (2 bytes, "%d" of the enum) come three rounds of the 108-byte key message
//!   `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:\0"` = LID, outstanding reads,
//!   QPN, PSN, R_Key, VA, GID, SRQN. The test runs; then one more key round, the report (five
//!   8-byte big-endian numbers), a last key round and `"done\0"`, after which the server prints
//!   the report it got and exits.
//!
//! The servers read each message with one `read()` of exactly its size, so every message goes
//! out in one `write()`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

use softroce::wire::{Psn, Qpn, RKey};

use crate::Result;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// perftest sleeps 1 s after accept() and creates its resources between rounds, under TCG.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The GID of an IPv4 address: `::ffff:a.b.c.d`, what GID index 1 holds in the lab's guests.
pub fn mapped_gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

fn hex_gid(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex(field: &str, what: &str) -> Result<u64> {
    u64::from_str_radix(field, 16)
        .map_err(|_| format!("bad {what} '{field}' in the server's message").into())
}

/// The text of a NUL-terminated message, for parsing and error messages.
fn text(msg: &[u8]) -> &str {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    std::str::from_utf8(&msg[..end]).unwrap_or("<not UTF-8>")
}

/// A message of exactly `len` bytes: `text`, then NULs.
fn padded(text: &str, len: usize) -> Vec<u8> {
    let mut msg = text.as_bytes().to_vec();
    assert!(
        msg.len() < len,
        "message '{text}' does not fit in {len} bytes"
    );
    msg.resize(len, 0);
    msg
}

struct Oob {
    stream: TcpStream,
}

impl Oob {
    fn connect(server: SocketAddrV4) -> Result<Oob> {
        let stream = TcpStream::connect_timeout(&server.into(), CONNECT_TIMEOUT)
            .map_err(|e| format!("out-of-band connect to {server}: {e}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        Ok(Oob { stream })
    }

    fn write(&mut self, msg: &[u8]) -> Result<()> {
        self.stream
            .write_all(msg)
            .map_err(|e| format!("out-of-band write: {e}").into())
    }

    fn read(&mut self, len: usize) -> Result<Vec<u8>> {
        let mut msg = vec![0; len];
        self.stream
            .read_exact(&mut msg)
            .map_err(|e| format!("out-of-band read of {len} bytes: {e}"))?;
        Ok(msg)
    }

    /// The client's half of one exchange: our message, then the server's of the same size.
    fn exchange(&mut self, msg: &[u8]) -> Result<Vec<u8>> {
        self.write(msg)?;
        self.read(msg.len())
    }
}

/// One side's address in the pingpong exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingpongDest {
    pub lid: u16,
    pub qpn: Qpn,
    pub psn: Psn,
    pub gid: [u8; 16],
}

const PINGPONG_MSG: usize = 52;

impl PingpongDest {
    fn to_wire(self) -> Vec<u8> {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            hex_gid(&self.gid)
        );
        padded(&text, PINGPONG_MSG)
    }

    fn parse(msg: &[u8]) -> Result<PingpongDest> {
        let text = text(msg);
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            bail!("the server's address '{text}' is not LID:QPN:PSN:GID")
        };
        let mut bytes = [0u8; 16];
        if gid.len() != 32 {
            bail!("the server's GID '{gid}' is not 32 hex digits");
        }
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = hex(&gid[2 * i..2 * i + 2], "GID")? as u8;
        }
        Ok(PingpongDest {
            lid: hex(lid, "LID")? as u16,
            qpn: Qpn::try_new(hex(qpn, "QPN")? as u32)?,
            psn: Psn::try_new(hex(psn, "PSN")? as u32)?,
            gid: bytes,
        })
    }
}

/// The client side of the `ibv_*_pingpong` exchange: returns the server's address. By the time
/// the server answers, its QP is ready to receive (it moves to RTR and RTS before it writes).
pub fn pingpong_exchange(server: SocketAddrV4, me: &PingpongDest) -> Result<PingpongDest> {
    let mut oob = Oob::connect(server)?;
    let reply = oob.exchange(&me.to_wire())?;
    oob.write(b"done\0")?;
    let dest = PingpongDest::parse(&reply)?;
    println!(
        "oob pingpong: server LID {:#06x} QPN {} PSN {} GID {}",
        dest.lid,
        dest.qpn,
        dest.psn,
        hex_gid(&dest.gid)
    );
    Ok(dest)
}

/// One side's keys in the perftest exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerftestDest {
    pub lid: u16,
    pub out_reads: u16,
    pub qpn: Qpn,
    pub psn: Psn,
    pub rkey: RKey,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
}

const PERFTEST_KEYS: usize = 108;
/// What this client reports as its perftest version: new enough for the server's format of
/// every exchange (it refuses versions below 5.70) and the same as the packaged one.
const PERFTEST_VERSION: &str = "6.06";
const VERSION_LEN: usize = 16;
/// The MTU this side offers, as perftest's `enum ibv_mtu` (3 = 1024). The server takes the
/// smaller of the two, and rxe's active MTU in the lab is 1024 anyway.
const MTU_ENUM_1024: &str = "3";

impl PerftestDest {
    fn to_wire(self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.value(),
            self.psn.value(),
            self.rkey.0,
            self.vaddr
        );
        for b in self.gid {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        padded(&text, PERFTEST_KEYS)
    }

    fn parse(msg: &[u8]) -> Result<PerftestDest> {
        let text = text(msg);
        // 6 fields, 16 GID bytes, the SRQN, and the empty string after the last ':'.
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 24 {
            bail!("the server's keys '{text}' do not have 23 fields");
        }
        let mut gid = [0u8; 16];
        for (byte, field) in gid.iter_mut().zip(&fields[6..22]) {
            *byte = hex(field, "GID byte")? as u8;
        }
        Ok(PerftestDest {
            lid: hex(fields[0], "LID")? as u16,
            out_reads: hex(fields[1], "outstanding reads")? as u16,
            qpn: Qpn::try_new(hex(fields[2], "QPN")? as u32)?,
            psn: Psn::try_new(hex(fields[3], "PSN")? as u32)?,
            rkey: RKey(hex(fields[4], "R_Key")? as u32),
            vaddr: hex(fields[5], "VA")?,
            gid,
            srqn: hex(fields[22], "SRQN")? as u32,
        })
    }
}

/// What the client reports at the end; the server prints it as its result line.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub size: u64,
    pub iters: u64,
    pub bw_mb_per_s: f64,
    pub msg_rate_mpps: f64,
}

/// A perftest client connection between its setup and its end.
pub struct Perftest {
    oob: Oob,
    me: PerftestDest,
}

impl Perftest {
    /// Everything before the test: returns the connection and the server's keys.
    pub fn connect(server: SocketAddrV4, me: PerftestDest) -> Result<(Perftest, PerftestDest)> {
        let mut oob = Oob::connect(server)?;
        let version = oob.exchange(&padded(PERFTEST_VERSION, VERSION_LEN))?;
        // Page size (the server keeps the larger) and cache-line size, as 4-byte big-endian ints.
        oob.exchange(&4096u32.to_be_bytes())?;
        oob.exchange(&64u32.to_be_bytes())?;
        let mtu = oob.exchange(&padded(MTU_ENUM_1024, 2))?;
        let mut session = Perftest { oob, me };
        // Three rounds: before the server's ctx_connect, after it, and "after moving QP to RTR".
        let dest = session.keys()?;
        for round in 2..=3 {
            let again = session.keys()?;
            if again != dest {
                bail!("the server's keys changed in round {round}: {dest:?} then {again:?}");
            }
        }
        println!(
            "oob perftest: server version {} MTU enum {} QPN {} PSN {} R_Key {} VA {:#x} GID {} \
             outstanding reads {}",
            text(&version),
            text(&mtu),
            dest.qpn,
            dest.psn,
            dest.rkey,
            dest.vaddr,
            hex_gid(&dest.gid),
            dest.out_reads
        );
        Ok((session, dest))
    }

    fn keys(&mut self) -> Result<PerftestDest> {
        let reply = self.oob.exchange(&self.me.to_wire())?;
        PerftestDest::parse(&reply)
    }

    /// Everything after the test: the server prints `report` and exits.
    pub fn finish(mut self, report: Report) -> Result<()> {
        self.keys()?;
        let bw = report.bw_mb_per_s;
        // size, iters, peak BW, average BW, message rate; doubles byte-swapped to big-endian.
        let numbers = [
            report.size.to_be_bytes(),
            report.iters.to_be_bytes(),
            bw.to_be_bytes(),
            bw.to_be_bytes(),
            report.msg_rate_mpps.to_be_bytes(),
        ];
        for number in numbers {
            self.oob.exchange(&number)?;
        }
        self.keys()?;
        self.oob.write(b"done\0")
    }
}
