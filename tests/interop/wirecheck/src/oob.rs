//! The guest tools' out-of-band exchanges, as their client: softroce's own implementations
//! (`softroce::tools::oob` for `ibv_*_pingpong`, `softroce::tools::perftest_oob` for perftest,
//! where the formats are documented), on a connection with the lab's timeouts.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

use softroce::tools::oob;
pub use softroce::tools::oob::Dest as PingpongDest;
pub use softroce::tools::perftest_keys::Keys as PerftestDest;
pub use softroce::tools::perftest_oob::BwReport as Report;
use softroce::tools::perftest_oob::{Exchange, Link};
use softroce::transport::PathMtu;

use crate::Result;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// perftest sleeps 1 s after accept() and creates its resources between rounds, under TCG.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The page and cache-line sizes this side announces; the server keeps the larger page.
const PAGE: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// The GID of an IPv4 address: `::ffff:a.b.c.d`, what GID index 1 holds in the lab's guests.
pub fn mapped_gid(ip: Ipv4Addr) -> Ipv6Addr {
    ip.to_ipv6_mapped()
}

fn connect(server: SocketAddrV4) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&server.into(), CONNECT_TIMEOUT)
        .map_err(|e| format!("out-of-band connect to {server}: {e}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(stream)
}

/// The client side of the `ibv_*_pingpong` exchange: returns the server's address. By the time
/// the server answers, its QP is ready to receive (it moves to RTR and RTS before it writes).
pub fn pingpong_exchange(server: SocketAddrV4, me: &PingpongDest) -> Result<PingpongDest> {
    let dest = oob::client_exchange(&mut connect(server)?, me)?;
    println!(
        "oob pingpong: server LID {:#06x} QPN {} PSN {} GID {}",
        dest.lid, dest.qpn, dest.psn, dest.gid
    );
    Ok(dest)
}

/// A perftest client connection between its setup and its end.
pub struct Perftest {
    exchange: Exchange,
    me: PerftestDest,
}

impl Perftest {
    /// Everything before the test: returns the connection and the server's keys.
    pub fn connect(server: SocketAddrV4, me: PerftestDest) -> Result<(Perftest, PerftestDest)> {
        let mut exchange = Exchange::new(Link::Tcp(connect(server)?), true);
        exchange.versions()?;
        exchange.sys_data(PAGE, CACHE_LINE)?;
        // rxe's active MTU in the lab is 1024; the server takes the smaller of the two.
        let mtu = exchange.mtu(PathMtu::Mtu1024)?;
        // Three rounds: before the server's ctx_connect, after it, and "after moving QP to RTR".
        let (dest, _) = exchange.keys(|_| me)?;
        for round in 2..=3 {
            let (again, _) = exchange.keys(|_| me)?;
            if again != dest {
                bail!("the server's keys changed in round {round}: {dest:?} then {again:?}");
            }
        }
        println!(
            "oob perftest: MTU {} QPN {} PSN {} R_Key {} VA {:#x} GID {} outstanding reads {}",
            mtu.bytes(),
            dest.qpn,
            dest.psn,
            dest.rkey,
            dest.vaddr,
            dest.gid,
            dest.out_reads
        );
        Ok((Perftest { exchange, me }, dest))
    }

    /// Everything after the test: a key round, the report, which the server prints as its
    /// result line, and the close.
    pub fn finish(mut self, report: Report) -> Result<()> {
        self.exchange.sync(&self.me)?;
        self.exchange.reports(&report)?;
        Ok(self.exchange.close(&self.me)?)
    }
}
