//! The command line: a subcommand and a handful of `--name value` options.

use std::net::Ipv4Addr;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::link::Path;
use crate::Result;

pub const USAGE: &str = "\
usage: wirecheck CHECK --server IP [options]
       wirecheck --help

checks (the guest server each one talks to, in the interop lab's vmB):
  rc-pingpong      client of `ibv_rc_pingpong -g 1 -s SIZE -n ITERS`
  ud-pingpong      client of `ibv_ud_pingpong -g 1 -s SIZE -n ITERS`
  write            RDMA WRITEs to `ib_write_bw -x 1 -F`
  read             two overlapping RDMA READs from `ib_read_bw -x 1 -F`
  atomic           FETCH_ADDs on `ib_atomic_bw -x 1 -F`
  bad-icrc         a SEND with a corrupted ICRC, then the right one (`ibv_rc_pingpong -g 1 -n 1`)
  psn-gap          a SEND ahead of the expected PSN, then the right one (`ibv_rc_pingpong -g 1 -n 1`)
  write-no-access  an RDMA WRITE to a QP without remote write (`ibv_rc_pingpong -g 1`)
  cnp              a CNP to the QP, then a round trip (`ibv_rc_pingpong -g 1 -n 1`)

options:
  --server IP      the guest running the server (required)
  --local IP       this side's address and GID (default 10.99.0.1, the lab's br0)
  --path udp|raw   udp: UDP socket, kernel framing with IP_PMTUDISC_DO (default);
                   raw: IP_HDRINCL raw socket out, raw IPPROTO_UDP socket in (ICRC verified)
  --size N         message size in bytes (default: per check)
  --iters N        round trips or operations (default: per check)
  --psn N          this side's first PSN, decimal or 0x-hex (default: from the clock)
  --port N         the server's out-of-band TCP port (default 18515)";

/// The live checks, one per subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    RcPingpong,
    UdPingpong,
    Write,
    Read,
    Atomic,
    BadIcrc,
    PsnGap,
    WriteNoAccess,
    Cnp,
}

impl Check {
    const ALL: [Check; 9] = [
        Check::RcPingpong,
        Check::UdPingpong,
        Check::Write,
        Check::Read,
        Check::Atomic,
        Check::BadIcrc,
        Check::PsnGap,
        Check::WriteNoAccess,
        Check::Cnp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Check::RcPingpong => "rc-pingpong",
            Check::UdPingpong => "ud-pingpong",
            Check::Write => "write",
            Check::Read => "read",
            Check::Atomic => "atomic",
            Check::BadIcrc => "bad-icrc",
            Check::PsnGap => "psn-gap",
            Check::WriteNoAccess => "write-no-access",
            Check::Cnp => "cnp",
        }
    }

    /// (size, iters) when the command line does not say.
    fn defaults(self) -> (usize, usize) {
        match self {
            // 4 packets per message at MTU 1024: SEND_FIRST, MIDDLE, MIDDLE, LAST.
            Check::RcPingpong | Check::Write | Check::Read => (4096, 10),
            // ibv_ud_pingpong refuses a size above the path MTU.
            Check::UdPingpong => (512, 10),
            // perftest's atomics are 8 bytes.
            Check::Atomic => (8, 2),
            Check::BadIcrc | Check::PsnGap | Check::WriteNoAccess | Check::Cnp => (64, 1),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Args {
    pub check: Check,
    pub server: Ipv4Addr,
    pub local: Ipv4Addr,
    pub path: Path,
    pub size: usize,
    pub iters: usize,
    pub psn: u32,
    pub port: u16,
}

fn number(option: &str, value: &str) -> Result<u64> {
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|_| format!("{option}: '{value}' is not a number").into())
}

impl Args {
    pub fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args> {
        let Some(cmd) = argv.next() else {
            bail!("no check given")
        };
        let Some(check) = Check::ALL.into_iter().find(|c| c.name() == cmd) else {
            bail!("unknown check '{cmd}'")
        };
        let (mut size, mut iters) = check.defaults();
        let mut server = None;
        let mut local = Ipv4Addr::new(10, 99, 0, 1);
        let mut path = Path::Udp;
        let mut psn = None;
        let mut port = 18515;
        while let Some(option) = argv.next() {
            let Some(value) = argv.next() else {
                bail!("{option} needs a value")
            };
            let ip = |v: &str| -> Result<Ipv4Addr> {
                v.parse()
                    .map_err(|_| format!("{option}: '{v}' is not an IPv4 address").into())
            };
            match option.as_str() {
                "--server" => server = Some(ip(&value)?),
                "--local" => local = ip(&value)?,
                "--path" => path = value.parse()?,
                "--size" => size = number(&option, &value)? as usize,
                "--iters" => iters = number(&option, &value)? as usize,
                "--psn" => psn = Some(number(&option, &value)? as u32),
                "--port" => port = number(&option, &value)? as u16,
                _ => bail!("unknown option '{option}'"),
            }
        }
        let Some(server) = server else {
            bail!("--server is required")
        };
        if iters == 0 {
            bail!("--iters must be at least 1");
        }
        // Any 24-bit value will do; a new one each run exercises PSNs anywhere in the space.
        let psn = psn.unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            now.subsec_nanos() ^ std::process::id()
        }) & 0x00ff_ffff;
        Ok(Args {
            check,
            server,
            local,
            path,
            size,
            iters,
            psn,
            port,
        })
    }
}
