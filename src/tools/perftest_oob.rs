//! The out-of-band exchange of perftest's `ib_*_bw` and `ib_*_lat` (linux-rdma/perftest
//! src/perftest_communication.c), as Debian's perftest 4.5-0.17 does it, on TCP port 18515 by
//! default.
//!
//! Every exchange is a round: the client writes its message and then reads the server's, of the
//! same size; the server reads first and then writes. The rounds, in order:
//!
//! - the version, 16 bytes: `"6.06"` and NULs. perftest refuses a peer older than 5.70, and from
//!   5.33 on the numbers below have the sizes given here;
//! - the page size and the cache-line size, 4-byte big-endian integers each; both sides go on
//!   with the larger of the two (the "cycle buffer" their addresses cycle through). Since the
//!   peer's value sizes this side's buffer, it is checked ([`PAGE_SIZES`], [`CACHE_LINES`]):
//!   a peer claiming a 2 GiB page made a server allocate 4 GiB a session;
//! - the MTU, 2 bytes: `"%d"` of `enum ibv_mtu` (1 = 256 bytes ... 5 = 4096) and a NUL; both
//!   go on with the smaller;
//! - the key rounds: 108 bytes, `"%04x:%04x:%06x:%06x:%08x:%016llx:"`, 16 × `"%02x:"` and
//!   `"%08x:"` with a NUL: LID, outstanding reads, QPN, PSN, R_Key, VA, GID (in wire order)
//!   and SRQN ([`Keys`]). Which rounds a test has, and what happens between them, is the test's
//!   own: see [`super::perftest`]. On RoCE perftest always sends the GID form; the 59-byte form
//!   without it is InfiniBand's, and softroce refuses it;
//! - at the end of the bandwidth tests that report remotely, five 8-byte rounds of the client's
//!   report ([`BwReport`]): size and iterations as big-endian integers, peak and average
//!   bandwidth and message rate as big-endian IEEE doubles. The server's half is whatever it
//!   had: perftest sends an uninitialised structure, softroce zeros;
//! - the close: one more key round, then each side writes `"done\0"` and closes. Neither
//!   perftest side reads the other's `"done"`; softroce reads it (or the end of the stream)
//!   before closing, so that its close never resets the connection under a `write` the peer
//!   has not made yet.
//!
//! perftest reads each message with one `read()` of its size and fails on a short one, so every
//! message here goes out in one `write()`.
//!
//! With `-R` the same rounds run over an RDMA-CM connection instead ([`super::perftest_cm`]).

use std::io::{ErrorKind, Read};
use std::net::{Shutdown, TcpStream};
use std::ops::RangeInclusive;
use std::time::Duration;

use super::oob::{give_up, nul_terminated, read_exactly, write_all, DONE};
use super::perftest_cm::CmLink;
use super::perftest_keys::{Keys, DEST_LEN, KEYS_LEN};
use super::{Error, Limits, PeerActivity, Result};
use crate::transport::PathMtu;

/// The version this side announces: the packaged perftest's (`ib_write_bw --version`).
pub const VERSION: &str = "6.06";
/// `MAX_VERSION`: the version field's size.
const VERSION_LEN: usize = 16;
/// The oldest peer perftest 4.5 talks to (`check_version_compatibility`).
const OLDEST_PEER: f64 = 5.70;
/// `sizeof(char[2])`: the MTU message since perftest 5.31.
const MTU_LEN: usize = 2;
/// How long the closing side waits for the peer's `"done"` before it closes anyway.
const DONE_WAIT: Duration = Duration::from_secs(5);
/// The page sizes a peer may announce: powers of two, from 4 KiB (x86, most of arm64) to 64 KiB
/// (ppc64le, some arm64), as perftest sends `sysconf(_SC_PAGESIZE)`.
pub const PAGE_SIZES: RangeInclusive<u32> = 4096..=65536;
/// The cache lines a peer may announce: powers of two from 16 to 1024 bytes, below any page.
pub const CACHE_LINES: RangeInclusive<u32> = 16..=1024;

/// What a bandwidth test's client reports to its server (`struct bw_report_data`, the fields
/// that cross the wire).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// The message size in bytes.
    pub size: u64,
    /// Messages counted, over all QPs.
    pub iters: u64,
    /// In the unit the client reports in (MB/sec or Gb/sec).
    pub bw_peak: f64,
    /// The average bandwidth, in the same unit.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

/// C's `atof` of a version: the leading decimal number, 0 if there is none.
fn version_number(version: &str) -> f64 {
    let end = version
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !version[..i].contains('.'))))
        .map_or(version.len(), |(i, _)| i);
    version[..end].parse().unwrap_or(0.0)
}

/// What the exchange runs on: perftest's TCP connection, or with `-R` its RDMA-CM control
/// connection.
#[derive(Debug)]
pub enum Link {
    /// perftest's TCP connection, to port `-p`.
    Tcp(TcpStream),
    /// `-R`: SENDs on an RDMA-CM connected control QP.
    RdmaCm(Box<CmLink>),
}

/// One side of the exchange on its connection.
pub struct Exchange {
    link: Link,
    client: bool,
    /// "client" or "server": the peer, for error messages.
    peer: &'static str,
    /// Asked whenever a read times out, once the handshake is over (see
    /// [`watch_reads`](Self::watch_reads)); `None` before, when a timed-out read fails.
    activity: Option<PeerActivity>,
    /// The served session's limits, before the handshake is over: over TCP the connection's
    /// read timeout stands for the idle limit, over RDMA-CM the reads check both.
    limits: Limits,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("link", &self.link)
            .field("client", &self.client)
            .finish()
    }
}

impl Exchange {
    /// `client`: this side connected, and so writes first in every round.
    pub fn new(link: Link, client: bool) -> Exchange {
        let peer = if client { "server" } else { "client" };
        Exchange {
            link,
            client,
            peer,
            activity: None,
            limits: Limits::default(),
        }
    }

    /// A served session's limits: a read that waits longer than the idle limit during the
    /// handshake ends the session with [`Error::PeerSilent`], and one that waits while the
    /// daemon stops with [`Error::Stopped`] (over TCP the daemon shuts the connection instead).
    pub fn set_limits(&mut self, limits: &Limits) {
        self.limits = limits.clone();
    }

    /// "client" or "server": the peer.
    pub fn peer(&self) -> &'static str {
        self.peer
    }

    /// Past the handshake a round can wait for a whole test. With `activity` (a served
    /// session), a read that hears nothing for [`PeerActivity::TICK`] asks it whether the peer
    /// is still there, by its QPs' traffic, and ends the session if not; without (a tool run
    /// from the command line), reads wait as long as the peer takes, as perftest's do.
    pub(crate) fn watch_reads(&mut self, activity: Option<PeerActivity>) -> Result<()> {
        let timeout = activity.as_ref().map(|_| PeerActivity::TICK);
        self.activity = activity;
        match &self.link {
            Link::Tcp(stream) => stream
                .set_read_timeout(timeout)
                .map_err(|e| Error::Exchange(format!("the TCP connection: {e}"))),
            Link::RdmaCm(_) => Ok(()),
        }
    }

    /// The peer's address, on RDMA-CM; the unspecified address over TCP, which needs none.
    pub fn peer_address(&self) -> std::net::IpAddr {
        match &self.link {
            Link::RdmaCm(cm) => cm.peer_address(),
            Link::Tcp(stream) => stream
                .peer_addr()
                .map(|a| a.ip())
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
        }
    }

    /// Whether the exchange runs on RDMA-CM (`-R`).
    pub fn is_rdma_cm(&self) -> bool {
        matches!(self.link, Link::RdmaCm(_))
    }

    /// Reads one message of the peer's. A wait that hears nothing asks the session's
    /// activity, once there is one; before, over TCP it fails at the idle limit, and over
    /// RDMA-CM (whose reads have no timeout of their own) it waits on.
    fn read(&mut self, len: usize, what: &str) -> Result<Vec<u8>> {
        let Exchange {
            link,
            activity,
            limits,
            ..
        } = self;
        let started = std::time::Instant::now();
        let waited: &mut dyn FnMut() -> Result<()> = match activity {
            Some(activity) => &mut || activity.check(),
            None => match link {
                Link::Tcp(_) => &mut give_up(limits.idle),
                Link::RdmaCm(_) => &mut || limits.check_since(started),
            },
        };
        match link {
            Link::Tcp(stream) => read_exactly(stream, len, what, waited),
            Link::RdmaCm(cm) => cm.read(len, what, waited),
        }
    }

    /// Writes one message of this side's, in one piece.
    fn write(&mut self, msg: &[u8], what: &str) -> Result<()> {
        match &mut self.link {
            Link::Tcp(stream) => write_all(stream, msg, what),
            Link::RdmaCm(cm) => cm.write(msg, what),
        }
    }

    /// One round: `mine` is computed from the peer's message when this side reads first (the
    /// server), before the peer's is known otherwise (the client).
    fn round<T>(
        &mut self,
        len: usize,
        what: &str,
        mine: impl FnOnce(Option<&[u8]>) -> Result<(Vec<u8>, T)>,
    ) -> Result<(Vec<u8>, T)> {
        if self.client {
            let (msg, kept) = mine(None)?;
            self.write(&msg, what)?;
            let theirs = self.read(len, what)?;
            Ok((theirs, kept))
        } else {
            let theirs = self.read(len, what)?;
            let (msg, kept) = mine(Some(&theirs))?;
            self.write(&msg, what)?;
            Ok((theirs, kept))
        }
    }

    /// A round whose message does not depend on the peer's.
    fn swap(&mut self, msg: &[u8], what: &str) -> Result<Vec<u8>> {
        let (theirs, ()) = self.round(msg.len(), what, |_| Ok((msg.to_vec(), ())))?;
        Ok(theirs)
    }

    /// The version round (`exchange_versions`, `check_version_compatibility`).
    pub fn versions(&mut self) -> Result<()> {
        let mut msg = [0; VERSION_LEN];
        msg[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let theirs = nul_terminated(&self.swap(&msg, "the version")?).into_owned();
        if version_number(&theirs) < OLDEST_PEER {
            return Err(Error::Exchange(format!(
                "the {} runs perftest version {theirs:?}: perftest {VERSION} is not compatible \
                 with versions older than 5.70",
                self.peer
            )));
        }
        Ok(())
    }

    /// The page- and cache-line-size rounds (`check_sys_data`): returns the larger of each.
    /// The peer's values size this side's buffer, so each must be a power of two within its
    /// range ([`PAGE_SIZES`], [`CACHE_LINES`]); anything else is refused.
    pub fn sys_data(&mut self, page: u32, cache_line: u32) -> Result<(u32, u32)> {
        let peer = self.peer;
        let mut larger = |mine: u32, what: &str, range: RangeInclusive<u32>| -> Result<u32> {
            let theirs = self.swap(&mine.to_be_bytes(), what)?;
            let theirs = u32::from_be_bytes([theirs[0], theirs[1], theirs[2], theirs[3]]);
            if !theirs.is_power_of_two() || !range.contains(&theirs) {
                return Err(Error::Exchange(format!(
                    "the {peer} announced {what} {theirs}: not a power of two from {} to {} \
                     bytes; refusing it",
                    range.start(),
                    range.end()
                )));
            }
            Ok(theirs.max(mine))
        };
        Ok((
            larger(page, "the page size", PAGE_SIZES)?,
            larger(cache_line, "the cache line size", CACHE_LINES)?,
        ))
    }

    /// The MTU round (`check_mtu`): returns the smaller MTU, or this side's if the peer's is
    /// not an MTU.
    pub fn mtu(&mut self, mine: PathMtu) -> Result<PathMtu> {
        let mut msg = [0; MTU_LEN];
        msg[0] = b'0' + mine.ibv_enum();
        let theirs = nul_terminated(&self.swap(&msg, "the MTU")?).into_owned();
        let theirs = theirs.parse().ok().and_then(PathMtu::from_ibv_enum);
        Ok(theirs.map_or(mine, |theirs| theirs.min(mine)))
    }

    /// One key round (`ctx_hand_shake`): `mine` makes this side's keys, given the peer's when
    /// this side reads first (the server). Returns the peer's keys and this side's.
    /// Over RDMA-CM the keys are `struct pingpong_dest` itself ([`Keys::to_dest`]).
    pub fn keys(&mut self, mine: impl FnOnce(Option<&Keys>) -> Keys) -> Result<(Keys, Keys)> {
        let peer = self.peer;
        let rdma_cm = self.is_rdma_cm();
        let parse = |msg: &[u8]| {
            if rdma_cm {
                Keys::from_dest(msg, peer)
            } else {
                Keys::parse(msg, peer)
            }
        };
        let len = if rdma_cm { DEST_LEN } else { KEYS_LEN };
        let (theirs, sent) = self.round(len, "the keys", |theirs| {
            let theirs = theirs.map(parse).transpose()?;
            let keys = mine(theirs.as_ref());
            let msg = if rdma_cm {
                keys.to_dest(0).to_vec()
            } else {
                keys.to_wire().to_vec()
            };
            Ok((msg, keys))
        })?;
        Ok((parse(&theirs)?, sent))
    }

    /// The key round of zeros before and after the data connections of `-R`
    /// (`create_rdma_cm_connection`, whose keys are not made yet): it only synchronises the
    /// two sides.
    pub fn zeros(&mut self) -> Result<()> {
        let zeros = [0u8; DEST_LEN];
        self.swap(&zeros, "the keys").map(drop)
    }

    /// A key round that only synchronises the two sides, with keys already exchanged.
    pub fn sync(&mut self, mine: &Keys) -> Result<()> {
        self.keys(|_| *mine).map(drop)
    }

    /// The report rounds (`xchg_bw_reports`): returns the peer's report.
    pub fn reports(&mut self, mine: &BwReport) -> Result<BwReport> {
        let mut number = |bytes: [u8; 8], what: &str| -> Result<[u8; 8]> {
            let theirs = self.swap(&bytes, what)?;
            Ok(theirs.try_into().expect("swap reads exactly 8 bytes"))
        };
        let size = number(mine.size.to_be_bytes(), "the report's size")?;
        let iters = number(mine.iters.to_be_bytes(), "the report's iterations")?;
        let peak = number(mine.bw_peak.to_be_bytes(), "the report's peak bandwidth")?;
        let avg = number(mine.bw_avg.to_be_bytes(), "the report's average bandwidth")?;
        let rate = number(mine.msg_rate.to_be_bytes(), "the report's message rate")?;
        Ok(BwReport {
            size: u64::from_be_bytes(size),
            iters: u64::from_be_bytes(iters),
            bw_peak: f64::from_be_bytes(peak),
            bw_avg: f64::from_be_bytes(avg),
            msg_rate: f64::from_be_bytes(rate),
        })
    }

    /// The close (`ctx_close_connection`): a last key round and, over TCP, `"done"`, then the
    /// peer's `"done"` or the end of its stream, and the connection is closed. Over RDMA-CM
    /// the round is all: the connection ends with the process.
    pub fn close(&mut self, mine: &Keys) -> Result<()> {
        self.sync(mine)?;
        let Link::Tcp(stream) = &mut self.link else {
            return Ok(());
        };
        write_all(stream, DONE, "\"done\"")?;
        // What the peer sends now is not checked: perftest does not read it at all.
        let _ = stream.set_read_timeout(Some(DONE_WAIT));
        let mut theirs = [0; DONE.len()];
        let mut got = 0;
        while got < theirs.len() {
            match stream.read(&mut theirs[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = stream.shutdown(Shutdown::Both);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_atof_does() {
        assert_eq!(version_number("6.06"), 6.06);
        assert_eq!(version_number("5.70.1"), 5.70);
        assert_eq!(version_number("x"), 0.0);
        assert_eq!(
            PathMtu::from_ibv_enum(PathMtu::Mtu2048.ibv_enum()),
            Some(PathMtu::Mtu2048)
        );
        assert_eq!(PathMtu::from_ibv_enum(6), None);
    }
}
