//! The `softroce` command line.

use std::io::{BufWriter, IsTerminal, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use softroce::decode::{decode_capture, Item};
use softroce::demo::DemoConfig;
use softroce::tools::daemon::{self, Service};
use softroce::tools::perftest::{self, AtomicOp, Test};
use softroce::tools::pingpong::{self, Transport};
use softroce::tools::DeviceOptions;
use softroce::tools::{self, rping, ucmatose, udaddy};
use softroce::transport::{CongestionConfig, PathMtu};
use softroce::verbs::{BackendKind, Progress};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "softroce",
    version,
    about = "A userspace software RoCEv2 transport"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Move data between two devices over UDP on loopback: RDMA WRITE, then RDMA READ back,
    /// every byte checked. Needs no root.
    Demo {
        /// How many MiB to move each way.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
        /// The RDMA message size, in KiB.
        #[arg(long, default_value_t = 1024)]
        message_kib: usize,
    },
    /// Print one line per RoCEv2 packet of a pcap or pcapng file, with its ICRC checked.
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, raw IP or Linux cooked link types).
        file: PathBuf,
        /// Print one JSON object per packet instead; the counts go to standard error.
        #[arg(long)]
        json: bool,
    },
    /// A long-running peer for hosts with RDMA NICs or kernel rxe: serves the clients of the
    /// pingpong and perftest tools below, one after another and several at once, on one device.
    #[command(after_help = DAEMON_NOTES)]
    Daemon {
        #[command(flatten)]
        device: DeviceArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// ibv_rc_pingpong over softroce: RC SENDs back and forth with a peer running rdma-core's
    /// ibv_rc_pingpong or softroce. Without HOST, wait for a client; with it, connect to it.
    #[command(after_help = PINGPONG_NOTES)]
    RcPingpong {
        #[command(flatten)]
        common: PingpongArgs,
        #[command(flatten)]
        path: PathMtuArg,
    },
    /// ibv_uc_pingpong over softroce: the same with UC SENDs (unacknowledged: a lost packet
    /// stalls the run, as it does rdma-core's).
    #[command(after_help = PINGPONG_NOTES)]
    UcPingpong {
        #[command(flatten)]
        common: PingpongArgs,
        #[command(flatten)]
        path: PathMtuArg,
    },
    /// ibv_ud_pingpong over softroce: UD SENDs (Q_Key 0x11111111) of at most the port MTU,
    /// which follows the MTU of the link under the device's address, as rxe's does (1024 on a
    /// 1500-byte Ethernet link, 4096 on jumbo frames or loopback).
    #[command(after_help = PINGPONG_NOTES)]
    UdPingpong {
        #[command(flatten)]
        common: PingpongArgs,
    },
    /// librdmacm's rping over softroce: ping-pongs of an RDMA READ and an RDMA WRITE over an
    /// RC connection made by RDMA-CM, against rping on kernel rxe or a ConnectX NIC, or
    /// softroce.
    #[command(after_help = RPING_NOTES)]
    Rping {
        #[command(flatten)]
        args: RpingArgs,
    },
    /// librdmacm's ucmatose over softroce: RC connections made by RDMA-CM, SENDs both ways,
    /// ended by the server. Without -s, wait for clients; with it, connect to that server.
    #[command(after_help = CM_TOOL_NOTES)]
    Ucmatose {
        #[command(flatten)]
        args: UcmatoseArgs,
    },
    /// librdmacm's udaddy over softroce: UD service resolution (SIDR) and datagrams both ways.
    /// Without -s, wait for a client; with it, resolve that server.
    #[command(after_help = CM_TOOL_NOTES)]
    Udaddy {
        #[command(flatten)]
        args: UdaddyArgs,
    },
    /// ib_write_bw over softroce: RDMA WRITE bandwidth against perftest's ib_write_bw or
    /// softroce. Without HOST, wait for a client; with it, connect to it.
    #[command(after_help = PERFTEST_NOTES)]
    WriteBw {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// ib_read_bw over softroce: RDMA READ bandwidth.
    #[command(after_help = PERFTEST_NOTES)]
    ReadBw {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// ib_send_bw over softroce: SEND bandwidth, measured by both sides.
    #[command(after_help = PERFTEST_NOTES)]
    SendBw {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// ib_atomic_bw over softroce: 8-byte atomics (FETCH_AND_ADD unless -A says otherwise).
    #[command(after_help = PERFTEST_NOTES)]
    AtomicBw {
        #[command(flatten)]
        common: PerftestArgs,
        /// The atomic: CMP_AND_SWAP or FETCH_AND_ADD.
        #[arg(short = 'A', long = "atomic_type", value_name = "TYPE", default_value = "FETCH_AND_ADD", value_parser = atomic_type)]
        atomic: AtomicOp,
    },
    /// ib_write_lat over softroce: RDMA WRITE ping-pong latency, each side polling its buffer.
    #[command(after_help = PERFTEST_NOTES)]
    WriteLat {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// ib_read_lat over softroce: RDMA READ latency, timed by the client.
    #[command(after_help = PERFTEST_NOTES)]
    ReadLat {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// ib_send_lat over softroce: SEND ping-pong latency.
    #[command(after_help = PERFTEST_NOTES)]
    SendLat {
        #[command(flatten)]
        common: PerftestArgs,
    },
    /// Run an unmodified RDMA program (perftest's, rdma-core's, librdmacm's, your own) over
    /// softroce: no root, no kernel module, no RDMA NIC.
    #[command(after_help = RUN_NOTES)]
    Run {
        /// The program's device address (UDP 4791 on it); repeat for one device per address.
        /// Default: 127.0.0.1. Two programs on one host need two addresses.
        #[arg(long = "addr", value_name = "ADDR")]
        addrs: Vec<std::net::IpAddr>,
        /// Who runs each device's engine: hybrid (default), thread or inline.
        #[arg(long, value_parser = ["thread", "hybrid", "inline"])]
        progress: Option<String>,
        /// The ports' active MTU: 256, 512, 1024, 2048 or 4096 [default: the link's, as rxe
        /// has it: 1024 on a 1500-byte link, 4096 on jumbo frames or loopback]. A CM client
        /// names it in its REQ; a peer whose port is smaller needs it no larger.
        #[arg(long, value_name = "SIZE", value_parser = path_mtu)]
        mtu: Option<PathMtu>,
        /// Congestion control, as the tools' --cc: `off`, or mlx5's parameters [default: on].
        #[arg(long, value_name = "SETTINGS", value_parser = congestion_settings)]
        cc: Option<String>,
        /// As the tools' --busy-poll: microseconds each engine polls after packets moved, 0
        /// for none [default: 50 with hybrid and inline progress when the program may run on
        /// more than one CPU, 0 otherwise].
        #[arg(long, value_name = "USEC", value_parser = busy_poll_us)]
        busy_poll: Option<u64>,
        /// As the tools' --trains-per-qp: cut segmentation trains per QP, for a softroce peer
        /// of several engines.
        #[arg(long)]
        trains_per_qp: bool,
        /// Keep the host's /dev as it is: do not give the program a /dev/infiniband of its
        /// own (which UCX needs to find the device).
        #[arg(long)]
        host_dev: bool,
        /// The program and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<std::ffi::OsString>,
    },
}

const RUN_NOTES: &str = "\
The program loads softroce's libibverbs.so.1 and librdmacm.so.1 (beside this executable, in
rdma/) instead of rdma-core's, through LD_LIBRARY_PATH; SOFTROCE_ADDR names its addresses. The
same works without this command:
  LD_LIBRARY_PATH=target/release/rdma SOFTROCE_ADDR=127.0.0.2 ib_write_bw -x 0 127.0.0.1
The program also gets /dev/infiniband/uverbsN and rdma_cm (each /dev/null, in a mount namespace
of its own; nothing changes outside it), which UCX looks for; --host-dev turns this off.

Example, perftest's ib_write_bw, server and client on one host:
  softroce run --addr 127.0.0.1 -- ib_write_bw -x 0
  softroce run --addr 127.0.0.2 -- ib_write_bw -x 0 127.0.0.1";

const DAEMON_NOTES: &str = "\
Each accepted connection is a session with its own PD, CQs, QPs and buffer on the one device;
a session ends when its test does, when its client fails or goes silent (--idle-timeout), and
its resources go with it. The log goes to standard error (RUST_LOG filters it, default info),
the tools' result lines included, tagged by session. SIGUSR1 prints the counters (sessions,
live QPs, CQs and regions, packets, errors) to standard output; SIGINT and SIGTERM end every
session, print them and exit 0.

RDMA-CM services come by connection requests on the device, not TCP: 'rping -s -p PORT' and the
perftest tools with -R (whose data connections, on the same port, go to their client's session).

Example, a host serving rdma-core's, perftest's and librdmacm's clients on 192.0.2.10:
  softroce daemon --bind 192.0.2.10 --serve 'rc-pingpong -p 18515' \\
      --serve 'write-bw -p 18516' --serve 'read-lat -p 18517 -s 64' \\
      --serve 'rping -s -p 7174' --serve 'write-bw -R -p 18518'";

const RPING_NOTES: &str = "\
Protocol, output lines and exit statuses are rping's (rdma-core 44): the client SENDs its source
buffer's address and rkey, the server READs it and SENDs a go ahead, the client SENDs its sink's,
the server WRITEs and SENDs another go ahead; -v prints the data, -V checks it. The connection is
made by RDMA-CM (REQ, REP and RTU on QP1, service ID 0x0106 and the port) and ended by the
client's DREQ. A CM failure prints rping's line (e.g. \"cma event RDMA_CM_EVENT_REJECTED, error
8\" when no one listens on the port) and exits with 255.

softroce's own: a device is an IP address (UDP port 4791 on it). The server's is -a, which must
name an address (rping's default wildcard names no device here); the client's is -I, --bind, or
the source address of the route to the server. The path MTU is negotiated by no one: the
client's REQ names it (the port's, as the kernel names its netdev's, or --mtu) and the server
takes it; a softroce server rejects one above its port's (REJ 26). With links of different MTUs,
give the client the smaller one with --mtu. Accepted for compatibility: -q (softroce's CM always
moves the QP).

Example, against rping -s -a 192.0.2.20 -v on a host with a ConnectX NIC or kernel rxe:
  softroce rping -c -a 192.0.2.20 -C 10 -v";

const CM_TOOL_NOTES: &str = "\
Protocol and output lines are rdma-core 44's (librdmacm/examples/cmatose.c and udaddy.c), so
either side may be softroce or the stock tool on kernel rxe or a ConnectX NIC. A CM failure
prints the tool's event line (e.g. \"cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8\").

softroce's own: a device is an IP address (UDP port 4791 on it): -b names it, which a server
needs; a client without -b takes the source address of the route to the server. A ucmatose
client's REQs name the path MTU (the port's, as the kernel names its netdev's, or --mtu) and
the server takes it: with links of different MTUs, give the client the smaller. Accepted for
compatibility and ignored: -f (addresses are IP addresses), -t (RoCEv2 over UDP has no service
level to map a TOS to). ucmatose's -P takes tcp only, udaddy's -P udp only, and udaddy's -p
only the UDP port space's number, 0x0111; udaddy serves one client (-c 1).";

const PINGPONG_NOTES: &str = "\
Output, exchange (TCP, 52-byte \"LID:QPN:PSN:GID\" messages) and behaviour are rdma-core's, so
either side may be softroce or ibv_*_pingpong (e.g. ibv_rc_pingpong -g 1 on kernel rxe).

softroce's own: a device is an IP address (UDP port 4791 on it) and its one GID is that address,
::ffff:a.b.c.d for IPv4 (rxe's GID index 1 holds the same). --bind picks it; by default it is
the local address of the TCP connection to the peer, known once the exchange connects (a server
without --bind prints its local address line only then). Two devices on one host need two
addresses, e.g. --bind 127.0.0.1 and --bind 127.0.0.2.

Accepted for compatibility: -g (any index means the device's address, which is sent even
without -g, where rdma-core would send a zero GID), -l (RoCEv2 over UDP carries no service
level; rxe ignores it too), -d (ignored, with a note: --bind chooses the device), -i (must be 1).
Usage errors exit with status 2, rdma-core's with 1; every other failure exits with 1.";

/// The options ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong share, and softroce's.
/// The fields named with a leading underscore are parsed, so that rdma-core's command lines
/// work unchanged, and never read.
#[derive(Args)]
struct PingpongArgs {
    #[command(flatten)]
    peer: PeerArgs,
    /// Size of message to exchange [default: 4096; ud-pingpong: 1024]
    #[arg(short, long, value_parser = c_number::<usize>)]
    size: Option<usize>,
    /// Number of receives to post at a time.
    #[arg(short, long = "rx-depth", value_name = "DEP", default_value_t = 500, value_parser = c_number::<usize>)]
    rx_depth: usize,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = c_number::<u32>)]
    iters: u32,
    /// Service level: accepted and ignored (RoCEv2 over UDP has none; rxe ignores it too).
    #[arg(short = 'l', long = "sl", value_name = "SL", value_parser = c_number::<u8>)]
    _sl: Option<u8>,
    /// Sleep on CQ events (the completion channel) instead of polling.
    #[arg(short, long)]
    events: bool,
    /// Local port GID index: accepted; every index means the device's one address.
    #[arg(short, long = "gid-idx", value_name = "GID_INDEX", value_parser = c_number::<u32>)]
    _gid_idx: Option<u32>,
    /// Validate received buffer: the client marks each 4 KiB page, the server checks the marks.
    #[arg(short, long)]
    chk: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProgressArg {
    Thread,
    Inline,
    Hybrid,
}

/// The role and the device options that rdma-core's and perftest's tools share. The field
/// named with a leading underscore is parsed, so that their command lines work unchanged, and
/// never read.
#[derive(Args)]
struct PeerArgs {
    /// The server to connect to; without it, start a server and wait for a connection.
    host: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short, long, default_value_t = softroce::tools::oob::DEFAULT_PORT, value_parser = c_number::<u16>)]
    port: u16,
    /// Accepted and ignored (with a note): softroce's device is the address --bind gives.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
    /// The device port: softroce devices have one, port 1.
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", default_value = "1", value_parser = only_port_one)]
    _ib_port: u8,
}

impl PeerArgs {
    /// `-d` names an RDMA device, which softroce does not have: say so once.
    fn note_ignored(&self, tool: &str) {
        if let Some(dev) = &self.ib_dev {
            eprintln!("softroce {tool}: -d {dev} ignored: the device is the address --bind gives");
        }
    }
}

/// The daemon's own options.
#[derive(Debug, clap::Args)]
struct DaemonArgs {
    /// A service: a tool's command line, its server side, on a TCP port of its own (-p),
    /// e.g. "rc-pingpong -p 18515 -n 1000" or "write-bw -p 18516 -s 65536". Clients must
    /// run with the options the tool's server would need (-s, -n, -q, -a, ...). Repeatable.
    #[arg(long = "serve", value_name = "TOOL OPTIONS", required = true)]
    serve: Vec<String>,
    /// A session that hears nothing from its client for this long fails, and its QPs are
    /// destroyed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    idle_timeout: u64,
    /// Sessions at once; a connection beyond them is closed at once.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_sessions: usize,
    /// The most memory one session may register for its buffer (K, M or G: binary units). A
    /// client whose test would need more is refused, and the log says which cap refused it.
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = byte_count)]
    max_session_memory: u64,
    /// The most memory all sessions together may register.
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = byte_count)]
    max_memory: u64,
}

/// A number of bytes, with an optional binary unit: 65536, 64K, 256M, 2G.
fn byte_count(s: &str) -> Result<u64, String> {
    let units = [('K', 10), ('M', 20), ('G', 30)];
    let (number, shift) = units
        .iter()
        .find_map(|&(unit, shift)| s.strip_suffix(unit).map(|n| (n, shift)))
        .unwrap_or((s, 0));
    c_number::<u64>(number)?
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s}: more bytes than 64 bits count"))
}

/// rping's flags (`rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]`, `rping -c
/// [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]`), and softroce's device options.
#[derive(Args)]
struct RpingArgs {
    /// Server side.
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Client side.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's to listen on, the client's to connect to.
    #[arg(short = 'a', value_name = "ADDR")]
    addr: Option<IpAddr>,
    /// Source address to bind to for client.
    #[arg(short = 'I', value_name = "ADDR")]
    source: Option<IpAddr>,
    /// Port.
    #[arg(short = 'p', value_name = "PORT", default_value_t = softroce::tools::rping::DEFAULT_PORT, value_parser = c_number::<u16>)]
    port: u16,
    /// Ping data size.
    #[arg(short = 'S', value_name = "SIZE", default_value_t = softroce::tools::rping::DEFAULT_SIZE, value_parser = c_number::<usize>)]
    size: usize,
    /// Ping count times (0: for ever).
    #[arg(short = 'C', value_name = "COUNT", default_value_t = 0, value_parser = c_number::<u32>)]
    count: u32,
    /// Display ping data to stdout.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate ping data.
    #[arg(short = 'V')]
    validate: bool,
    /// Debug printfs.
    #[arg(short = 'd')]
    debug: bool,
    /// Persistent server mode allowing multiple connections (one after another).
    #[arg(short = 'P')]
    persistent: bool,
    /// Use self-created, self-modified QP: accepted; softroce's CM always moves the QP.
    #[arg(short = 'q')]
    _self_qp: bool,
    /// softroce: the path MTU a client asks for in its REQ, at most the port's (256, 512,
    /// 1024, 2048 or 4096) [default: the port's active MTU, as the kernel takes its netdev's]
    #[arg(long, value_name = "SIZE", value_parser = path_mtu)]
    mtu: Option<PathMtu>,
    #[command(flatten)]
    device: DeviceArgs,
}

/// ucmatose's flags, and softroce's device options.
#[derive(Args)]
struct UcmatoseArgs {
    /// The server to connect to; without it, be the server.
    #[arg(short = 's', value_name = "SERVER_ADDRESS")]
    server: Option<IpAddr>,
    /// The address to bind: the device's.
    #[arg(short = 'b', value_name = "BIND_ADDRESS")]
    bind_address: Option<IpAddr>,
    /// Address format: accepted and ignored.
    #[arg(short = 'f', value_name = "FORMAT")]
    _format: Option<String>,
    /// Port space: tcp (the only one softroce's ucmatose takes).
    #[arg(short = 'P', value_name = "PORT_SPACE", default_value = "tcp", value_parser = ["tcp"])]
    _port_space: String,
    /// Number of connections.
    #[arg(short = 'c', value_name = "CONNECTIONS", default_value_t = 1, value_parser = c_number::<usize>)]
    connections: usize,
    /// Messages each way on each connection.
    #[arg(short = 'C', value_name = "MESSAGE_COUNT", default_value_t = 10, value_parser = c_number::<usize>)]
    messages: usize,
    /// Message size.
    #[arg(short = 'S', value_name = "MESSAGE_SIZE", default_value_t = 100, value_parser = c_number::<usize>)]
    size: usize,
    /// Type of service: accepted and ignored.
    #[arg(short = 't', value_name = "TOS")]
    _tos: Option<String>,
    /// Port.
    #[arg(short = 'p', value_name = "PORT", default_value_t = softroce::tools::ucmatose::DEFAULT_PORT, value_parser = c_number::<u16>)]
    port: u16,
    /// softroce: the path MTU a client asks for in its REQs, at most the port's [default: the
    /// port's active MTU, as the kernel takes its netdev's]
    #[arg(long, value_name = "SIZE", value_parser = path_mtu)]
    mtu: Option<PathMtu>,
    #[command(flatten)]
    device: DeviceArgs,
}

/// udaddy's flags, and softroce's device options.
#[derive(Args)]
struct UdaddyArgs {
    /// The server to resolve; without it, be the server.
    #[arg(short = 's', value_name = "SERVER_ADDRESS")]
    server: Option<IpAddr>,
    /// The address to bind: the device's.
    #[arg(short = 'b', value_name = "BIND_ADDRESS")]
    bind_address: Option<IpAddr>,
    /// Number of connections: 1.
    #[arg(short = 'c', value_name = "CONNECTIONS", default_value_t = 1, value_parser = one_connection)]
    _connections: usize,
    /// Datagrams each way.
    #[arg(short = 'C', value_name = "MESSAGE_COUNT", default_value_t = 10, value_parser = c_number::<usize>)]
    messages: usize,
    /// Datagram size, at most the port MTU.
    #[arg(short = 'S', value_name = "MESSAGE_SIZE", default_value_t = 100, value_parser = c_number::<usize>)]
    size: usize,
    /// Type of service: accepted and ignored.
    #[arg(short = 't', value_name = "TOS")]
    _tos: Option<String>,
    /// Port space, as a number (udaddy's port is 7174, fixed): the UDP port space's, 0x0111.
    #[arg(short = 'p', value_name = "PORT_SPACE", value_parser = udp_port_space)]
    _port_space: Option<u16>,
    /// Port space: udp.
    #[arg(short = 'P', value_name = "PORT_SPACE", default_value = "udp", value_parser = ["udp"])]
    _port_space_name: String,
    /// Address format: accepted and ignored.
    #[arg(short = 'f', value_name = "FORMAT")]
    _format: Option<String>,
    #[command(flatten)]
    device: DeviceArgs,
}

fn one_connection(s: &str) -> Result<usize, String> {
    match c_number::<usize>(s)? {
        1 => Ok(1),
        _ => Err("softroce's udaddy serves one connection".into()),
    }
}

fn udp_port_space(s: &str) -> Result<u16, String> {
    match c_number::<u16>(s)? {
        0x0111 => Ok(0x0111),
        _ => {
            Err("the UDP port space, 0x0111 (273), is the only one softroce's udaddy takes".into())
        }
    }
}

/// softroce's own options for the device, which every tool and the daemon take.
#[derive(Args)]
struct DeviceArgs {
    /// softroce: the device's IP address, whose UDP port 4791 it binds and which is its GID
    /// [default: the local address of the TCP connection to the peer]
    #[arg(long, value_name = "ADDRESS")]
    bind: Option<IpAddr>,
    /// softroce: udp (a UDP socket, no privileges) or raw (a raw IPv4 socket that verifies
    /// every ICRC in full; needs CAP_NET_RAW).
    #[arg(long, value_enum, default_value_t = BackendArg::Udp)]
    backend: BackendArg,
    /// softroce: send one UDP datagram per packet instead of segmentation offload trains (a
    /// train's packets carry IPv4 IDs 0, 1, 2, ..., which its ICRCs are sealed for).
    #[arg(long)]
    no_segmentation: bool,
    /// softroce: cut segmentation trains where the destination QP changes, for a softroce peer
    /// of several engines (--engines), which otherwise hands datagrams between its engines and
    /// may see a QP's packets reordered (RC retransmits them); the price is a send call per QP
    /// where many QPs have little in flight. Trains mix QPs by default, which rxe and NICs
    /// take as they come.
    #[arg(long)]
    trains_per_qp: bool,
    /// softroce: write every RoCE packet sent and received to this pcap file, for Wireshark
    /// or `softroce decode`.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// softroce: engine threads, 1 to 64, each with a UDP socket of its own on the one address;
    /// the device's QPs are spread over them (UDP backend, no --pcap). Its softroce peers of
    /// one engine may pass --trains-per-qp (see it).
    #[arg(long, value_name = "N", default_value_t = 1)]
    engines: usize,
    /// softroce: congestion control, on by default as on ConnectX: ECT(0) on every packet,
    /// CNPs for CE marks, DCQCN for CNPs. `off` (none of it, as kernel rxe), `on`, and
    /// mlx5's parameter names, comma-separated, e.g. `rp_time_reset=55,rp_ai_rate=40` or
    /// `dcqcn=off` (also `ecn=off`, `np=off`); see docs/congestion-control.md.
    #[arg(long, value_name = "SETTINGS", default_value = "on")]
    cc: CongestionConfig,
    /// softroce: who runs the engine. `hybrid`: the tool's own CQ polls and waits while it
    /// keeps calling (no thread hand-off per message), and a thread of its own as soon as it
    /// sleeps elsewhere or stops calling. `thread`: a thread of its own throughout.
    /// `inline` (the pingpong tools only, which poll their CQ throughout): the tool's calls
    /// alone. With --engines above 1, hybrid runs each engine on its thread.
    #[arg(long, value_enum, default_value = "hybrid")]
    progress: ProgressArg,
    /// softroce: how long, in microseconds, the engine keeps polling its socket after packets
    /// moved, rather than sleep in it; 0 turns it off [default: 50 with hybrid or inline
    /// progress and one engine on more than one CPU, 0 otherwise].
    #[arg(long, value_name = "USEC", value_parser = busy_poll_us)]
    busy_poll: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Udp,
    Raw,
}

impl DeviceArgs {
    /// The device's options; `polls_throughout` if the tool keeps calling its CQ for as long
    /// as its peer needs answers, which inline progress requires.
    fn options(&self, polls_throughout: bool) -> Result<DeviceOptions, String> {
        let progress = match self.progress {
            ProgressArg::Thread => Progress::Thread,
            ProgressArg::Hybrid => Progress::Hybrid,
            ProgressArg::Inline if polls_throughout => Progress::Inline,
            ProgressArg::Inline => {
                return Err(
                    "--progress inline is for the pingpong tools: this one leaves \
                            its device alone between calls, when its peer would go unanswered \
                            (hybrid, the default, runs the engine in its calls too)"
                        .into(),
                )
            }
        };
        let backend = match self.backend {
            BackendArg::Udp => BackendKind::Udp {
                segmentation: !self.no_segmentation,
                trains_per_qp: self.trains_per_qp,
            },
            BackendArg::Raw if self.no_segmentation => {
                return Err("--no-segmentation is for the UDP backend".into())
            }
            BackendArg::Raw if self.trains_per_qp => {
                return Err("--trains-per-qp is for the UDP backend".into())
            }
            BackendArg::Raw => BackendKind::Raw,
        };
        Ok(DeviceOptions {
            bind: self.bind,
            backend,
            pcap: self.pcap.clone(),
            progress,
            engines: self.engines,
            congestion: self.cc,
            busy_poll: self.busy_poll.map(Duration::from_micros),
        })
    }
}

const PERFTEST_NOTES: &str = "\
Output, exchange (TCP: version, page and cache line sizes, MTU, then rounds of 108-byte
\"LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN\" keys, the client's report and \"done\") and
behaviour are perftest 4.5's (version 6.06), so either side may be softroce or perftest's
ib_*_bw and ib_*_lat (e.g. ib_write_bw -x 1 on kernel rxe). With -R the same rounds run as
SENDs on an RDMA-CM connection (the keys as 56-byte struct pingpong_dest), and every QP is
connected by RDMA-CM on the same port; a softroce server then needs --bind, and its client
retries a connection the server rejects for want of a listener, as perftest's does.

softroce's own: a device is an IP address (UDP port 4791 on it) and its one GID is that address,
::ffff:a.b.c.d for IPv4. --bind picks it; by default it is the local address of the TCP
connection to the peer. Two devices on one host need two addresses, e.g. --bind 127.0.0.1 and
--bind 127.0.0.2. --json prints one JSON document, with the keys of perftest's --out_json file,
instead of the text.

Accepted for compatibility: -x (every index means the device's address; the header shows the
index given), -F (softroce times with the monotonic clock, not CPU cycles), -d (ignored, with a
note: --bind chooses the device), -i (must be 1). The path MTU defaults to the port's active
MTU, which follows the MTU of the link under the device's address as rxe's does (1024 on a
1500-byte Ethernet link, 4096 on jumbo frames or loopback); a larger -m is lowered to it, with
perftest's message. Command-line errors exit with status 2; what
perftest refuses once its options are read (e.g. -s with atomic-bw, -q with a latency test) and
every other failure exit with 1.";

/// The options perftest's tools share that softroce takes, and softroce's own. The fields named
/// with a leading underscore are parsed, so that perftest's command lines work unchanged, and
/// never read.
#[derive(Args)]
struct PerftestArgs {
    #[command(flatten)]
    peer: PeerArgs,
    /// Size of message to exchange, with an optional K or M suffix [default: 65536 for the bw
    /// tests, 2 for the lat tests, 8 for atomic-bw (which takes no other)]
    #[arg(short, long, value_parser = message_size)]
    size: Option<u64>,
    /// Number of exchanges, at least 5 [default: 5000 for write-bw, 1000 for the others]
    #[arg(short = 'n', long, value_parser = iterations)]
    iters: Option<u64>,
    /// Run for this many seconds instead of -n exchanges, timing the middle half.
    #[arg(short = 'D', long, value_name = "SECONDS", value_parser = duration)]
    duration: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096, at most the port's; the two sides use the
    /// smaller of theirs [default: the port's active MTU]
    #[arg(short, long, value_name = "SIZE", value_parser = path_mtu)]
    mtu: Option<PathMtu>,
    /// Number of QPs (bw tests only).
    #[arg(short, long = "qp", value_name = "NUM", default_value_t = 1, value_parser = qp_count)]
    qp: usize,
    /// GID index: accepted; every index means the device's one address.
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX", default_value_t = 0, value_parser = gid_index)]
    gid_index: u32,
    /// Accepted: perftest's switch for its CPU-frequency warning (softroce has none).
    #[arg(short = 'F', long = "CPU-freq")]
    _cpu_freq: bool,
    /// Run every message size from 2 bytes to 8 MiB.
    #[arg(short, long)]
    all: bool,
    /// Report bandwidth in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Skip the peak bandwidth's calculation (bw tests; it prints 0.00), as after 20000
    /// iterations or with -D.
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    #[command(flatten)]
    device: DeviceArgs,
    /// softroce: print one JSON document instead of perftest's text.
    #[arg(long)]
    json: bool,
    /// softroce, between two softroce sides, bw tests: fill the buffers with a known pattern,
    /// and check on the side the data lands on that every byte landed in its place as sent.
    #[arg(long = "check-data")]
    check_data: bool,
    /// Connect QPs with rdma_cm and run the test on those QPs: the exchange too runs on an
    /// RDMA-CM connection, on the -p port, with no TCP at all.
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
}

/// `-s`: perftest's `strtol(s, NULL, 0)`, times 1024 with a K suffix or 2^20 with M, from 1 to
/// `UINT_MAX / 2`.
fn message_size(s: &str) -> Result<u64, String> {
    let (number, factor) = match s.strip_suffix('K') {
        Some(number) => (number, 1 << 10),
        None => s
            .strip_suffix('M')
            .map_or((s, 1), |number| (number, 1 << 20)),
    };
    c_number::<u64>(number)?
        .checked_mul(factor)
        .filter(|size| (1..=u64::from(u32::MAX / 2)).contains(size))
        .ok_or_else(|| format!("Message Size should be between 1 and {}", u32::MAX / 2))
}

fn iterations(s: &str) -> Result<u64, String> {
    let range = perftest::ITERS_RANGE;
    c_number(s)
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "Iteration num should be between {} and {}",
                range.start(),
                range.end()
            )
        })
}

fn duration(s: &str) -> Result<u32, String> {
    c_number(s)
        .ok()
        .filter(|&seconds| seconds > 0)
        .ok_or_else(|| "Duration period must be positive".into())
}

fn qp_count(s: &str) -> Result<usize, String> {
    let range = perftest::QPS_RANGE;
    c_number(s)
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "num of Qps should be between {} and {}",
                range.start(),
                range.end()
            )
        })
}

fn gid_index(s: &str) -> Result<u32, String> {
    c_number(s)
        .ok()
        .filter(|&index| index <= 64)
        .ok_or_else(|| "Gid index should be between 0 and 64".into())
}

fn atomic_type(s: &str) -> Result<AtomicOp, String> {
    [AtomicOp::CompareSwap, AtomicOp::FetchAdd]
        .into_iter()
        .find(|op| op.name() == s)
        .ok_or_else(|| {
            "Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}".into()
        })
}

/// `-m`, which ibv_rc_pingpong and ibv_uc_pingpong take and ibv_ud_pingpong does not.
#[derive(Args)]
struct PathMtuArg {
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short, long, value_name = "SIZE", default_value = "1024", value_parser = path_mtu)]
    mtu: PathMtu,
}

/// A number as rdma-core's `strtoul(s, NULL, 0)` reads it: decimal, 0x hexadecimal or 0 octal.
fn c_number<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let parsed = if let Some(hex) = s.strip_prefix("0x").or(s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8)
    } else {
        s.parse()
    };
    parsed
        .ok()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is not a number in range"))
}

fn path_mtu(s: &str) -> Result<PathMtu, String> {
    pingpong::path_mtu(c_number(s)?).ok_or_else(|| "256, 512, 1024, 2048 or 4096".into())
}

/// Checks `softroce run --cc`'s settings here, so that a mistake is this command's error
/// rather than the program's.
fn congestion_settings(s: &str) -> Result<String, String> {
    s.parse::<CongestionConfig>().map(|_| s.to_string())
}

/// `--busy-poll`: microseconds, up to softroce's bound.
fn busy_poll_us(s: &str) -> Result<u64, String> {
    let max = softroce::verbs::MAX_BUSY_POLL.as_micros() as u64;
    s.parse::<u64>()
        .ok()
        .filter(|&micros| micros <= max)
        .ok_or_else(|| format!("microseconds, 0 (off) to {max}"))
}

fn only_port_one(s: &str) -> Result<u8, String> {
    match c_number(s)? {
        1 => Ok(1),
        _ => Err("a softroce device has one port, port 1".into()),
    }
}

fn decode(file: &PathBuf, json: bool) -> ExitCode {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("softroce decode: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut write_error: Option<std::io::Error> = None;
    let result = decode_capture(&bytes, |item| {
        if write_error.is_some() {
            return;
        }
        let line = match item {
            Item::Roce(d) if json => serde_json::to_string(d).expect("plain data serialises"),
            Item::Roce(d) => d.summary(),
            Item::Unparsed(u) if json => serde_json::to_string(u).expect("plain data serialises"),
            Item::Unparsed(u) => u.summary(),
            Item::Malformed { frame, error } if json => {
                serde_json::json!({ "frame": frame, "malformed": error.to_string() }).to_string()
            }
            Item::Malformed { frame, error } => format!("{frame:>5} malformed RoCE: {error}"),
            Item::NotRoce => return,
        };
        write_error = writeln!(out, "{line}").err();
    });
    let outcome = match &result {
        // The counts go after the packets, or to standard error beside JSON lines.
        Ok(summary) if json => {
            eprint!("{}", summary.render());
            Ok(())
        }
        Ok(summary) => write!(out, "{}", summary.render()),
        Err(_) => Ok(()),
    };
    let write_error = write_error.or(outcome.err()).or(out.flush().err());
    match write_error {
        // A reader that stops early (`| head`) is not an error.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("softroce decode: writing the output: {e}");
            return ExitCode::FAILURE;
        }
        None => {}
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce decode: {}: {e}", file.display());
            ExitCode::FAILURE
        }
    }
}

fn demo(mib: u64, message_kib: usize) -> ExitCode {
    let config = DemoConfig {
        total: mib << 20,
        message: (message_kib << 10).clamp(1, 32 << 20),
        ..DemoConfig::default()
    };
    eprintln!(
        "softroce demo: {} MiB by RDMA WRITE {} -> {}, then back by RDMA READ, {} KiB messages, MTU 4096",
        mib, config.addresses[0], config.addresses[1], config.message >> 10
    );
    let (report, devices) = match softroce::demo::run(config) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("softroce demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rate = |t: std::time::Duration| report.bytes as f64 / t.as_secs_f64().max(1e-9) / 1e6;
    println!(
        "RDMA WRITE: {} MiB in {:.2} s = {:.0} MB/s",
        report.bytes >> 20,
        report.write_time.as_secs_f64(),
        rate(report.write_time)
    );
    println!(
        "RDMA READ:  {} MiB in {:.2} s = {:.0} MB/s",
        report.bytes >> 20,
        report.read_time.as_secs_f64(),
        rate(report.read_time)
    );
    for device in &devices {
        if let Ok((core, io)) = device.counters() {
            println!("\ncounters of {}:\n{core}io: {io:?}", device.address());
        }
    }
    if report.mismatches == 0 {
        println!("\nverified: every byte read back matches what was written");
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: {} bytes differ", report.mismatches);
        ExitCode::FAILURE
    }
}

/// The options of rc-, uc- or ud-pingpong. `mtu`: the `-m` of rc- and uc-pingpong;
/// ud-pingpong has none.
fn pingpong_options(
    transport: Transport,
    args: &PingpongArgs,
    mtu: Option<PathMtu>,
) -> Result<pingpong::Options, String> {
    args.peer.note_ignored(transport.tool_name());
    let defaults = pingpong::Options::new(transport);
    Ok(pingpong::Options {
        server: args.peer.host.clone(),
        port: args.peer.port,
        size: args.size.unwrap_or(defaults.size),
        mtu: mtu.unwrap_or(defaults.mtu),
        rx_depth: args.rx_depth,
        iters: args.iters,
        events: args.events,
        validate: args.chk,
        device: args.device.options(true)?,
        ..defaults
    })
}

fn perftest_options(
    test: Test,
    args: &PerftestArgs,
    atomic: AtomicOp,
) -> Result<perftest::Options, String> {
    args.peer.note_ignored(test.name());
    Ok(perftest::Options {
        server: args.peer.host.clone(),
        port: args.peer.port,
        size: args.size,
        iters: args.iters,
        duration: args.duration,
        mtu: args.mtu,
        qps: args.qp,
        all_sizes: args.all,
        report_gbits: args.report_gbits,
        no_peak: args.no_peak,
        gid_index: args.gid_index,
        atomic,
        device: args.device.options(false)?,
        json: args.json,
        check_data: args.check_data,
        rdma_cm: args.rdma_cm,
        ..perftest::Options::new(test)
    })
}

/// A tool subcommand as the daemon serves it, or as it runs from the command line.
fn service(command: &Command) -> Option<Result<Service, String>> {
    let pingpong =
        |transport, args, mtu| Some(pingpong_options(transport, args, mtu).map(Service::Pingpong));
    let perftest =
        |test, args, atomic| Some(perftest_options(test, args, atomic).map(Service::Perftest));
    match command {
        Command::Decode { .. }
        | Command::Demo { .. }
        | Command::Run { .. }
        | Command::Daemon { .. }
        | Command::Ucmatose { .. }
        | Command::Udaddy { .. } => None,
        Command::Rping { args } => Some(rping_options(args).map(Service::Rping)),
        Command::RcPingpong { common, path } => pingpong(Transport::Rc, common, Some(path.mtu)),
        Command::UcPingpong { common, path } => pingpong(Transport::Uc, common, Some(path.mtu)),
        Command::UdPingpong { common } => pingpong(Transport::Ud, common, None),
        Command::WriteBw { common } => perftest(Test::WriteBw, common, AtomicOp::FetchAdd),
        Command::ReadBw { common } => perftest(Test::ReadBw, common, AtomicOp::FetchAdd),
        Command::SendBw { common } => perftest(Test::SendBw, common, AtomicOp::FetchAdd),
        Command::AtomicBw { common, atomic } => perftest(Test::AtomicBw, common, *atomic),
        Command::WriteLat { common } => perftest(Test::WriteLat, common, AtomicOp::FetchAdd),
        Command::ReadLat { common } => perftest(Test::ReadLat, common, AtomicOp::FetchAdd),
        Command::SendLat { common } => perftest(Test::SendLat, common, AtomicOp::FetchAdd),
    }
}

/// The log, on standard error: `RUST_LOG` filters it, `default` where it is unset. The daemon
/// logs its sessions; a tool logs only the library's warnings (e.g. a port MTU it had to guess).
fn init_log(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Runs a tool to the end, as one side of a test.
fn tool(service: Result<Service, String>) -> ExitCode {
    let service = match service {
        Ok(service) => service,
        Err(why) => {
            eprintln!("softroce: {why}");
            return ExitCode::from(2);
        }
    };
    init_log("warn");
    let outcome = match &service {
        Service::Pingpong(o) => pingpong::run(o, &mut std::io::stdout()).map(drop),
        Service::Perftest(o) => perftest::run(o, &mut std::io::stdout()),
        Service::Rping(o) => rping::run(o, &mut std::io::stdout(), &mut std::io::stderr()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce {}: {e}", service.name());
            ExitCode::FAILURE
        }
    }
}

/// `--serve "rc-pingpong -p 18515 -n 500"`: the tool's own command line, server side.
fn parse_service(spec: &str) -> Result<Service, String> {
    let words = spec.split_whitespace();
    let cli = Cli::try_parse_from(std::iter::once("softroce").chain(words))
        .map_err(|e| format!("--serve {spec:?}: {}", e.render().to_string().trim_end()))?;
    let service = service(&cli.command)
        .ok_or_else(|| format!("--serve {spec:?}: not a pingpong, perftest or rping tool"))??;
    let (client, device) = match &service {
        Service::Pingpong(o) => (o.server.is_some(), &o.device),
        Service::Perftest(o) => (o.server.is_some(), &o.device),
        Service::Rping(o) => (!o.server || o.addr.is_some(), &o.device),
    };
    if client {
        return Err(format!(
            "--serve {spec:?}: a service is a tool's server side, on the daemon's device: \
             it takes no HOST, and rping's takes -s and no -a"
        ));
    }
    if *device != DeviceOptions::default() {
        return Err(format!(
            "--serve {spec:?}: the device options (--bind, --backend, --no-segmentation, \
             --trains-per-qp, --pcap, --engines, --cc, --progress, --busy-poll) are the \
             daemon's own, for all its services"
        ));
    }
    Ok(service)
}

fn daemon(device: &DeviceArgs, args: &DaemonArgs) -> ExitCode {
    let options = device.options(false).and_then(|device| {
        Ok(daemon::Options {
            device,
            services: args
                .serve
                .iter()
                .map(|spec| parse_service(spec))
                .collect::<Result<_, _>>()?,
            idle: Duration::from_secs(args.idle_timeout),
            max_sessions: args.max_sessions,
            max_session_memory: args.max_session_memory,
            max_memory: args.max_memory,
        })
    });
    let options = match options {
        Ok(options) => options,
        Err(why) => {
            eprintln!("softroce daemon: {why}");
            return ExitCode::from(2);
        }
    };
    init_log("info");
    match daemon::run(&options) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "the daemon stops");
            ExitCode::FAILURE
        }
    }
}

fn rping_options(args: &RpingArgs) -> Result<rping::Options, String> {
    Ok(rping::Options {
        server: args.server,
        addr: args.addr,
        source: args.source,
        port: args.port,
        size: args.size,
        count: args.count,
        verbose: args.verbose,
        validate: args.validate,
        debug: args.debug,
        persistent: args.persistent,
        mtu: args.mtu,
        device: args.device.options(false)?,
    })
}

fn rping(args: &RpingArgs) -> ExitCode {
    let o = match rping_options(args) {
        Ok(o) => o,
        Err(why) => {
            eprintln!("softroce rping: {why}");
            return ExitCode::from(2);
        }
    };
    init_log("warn");
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    match rping::run(&o, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        // rping's exit(-1) from its CM event handler.
        Err(
            e @ tools::Error::Device {
                error: softroce::verbs::Error::ConnectFailed { .. },
                ..
            },
        ) => {
            eprintln!("rping client failed: {e}");
            ExitCode::from(255)
        }
        Err(tools::Error::Usage(why)) => {
            eprintln!("{why}");
            ExitCode::from(2)
        }
        Err(e) => {
            let side = if o.server { "server" } else { "client" };
            eprintln!("rping {side} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The device options of a CM tool, or the exit status of a usage error.
fn cm_tool_device(tool: &str, device: &DeviceArgs) -> Result<tools::DeviceOptions, ExitCode> {
    device.options(false).map_err(|why| {
        eprintln!("softroce {tool}: {why}");
        ExitCode::from(2)
    })
}

/// ucmatose's and udaddy's end: they print their own "return status" line; a failure is
/// also said on standard error.
fn cm_tool_end(tool: &str, outcome: tools::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(tools::Error::Usage(why)) => {
            eprintln!("{why}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("softroce {tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ucmatose(args: &UcmatoseArgs) -> ExitCode {
    let device = match cm_tool_device("ucmatose", &args.device) {
        Ok(device) => device,
        Err(code) => return code,
    };
    let o = ucmatose::Options {
        server: args.server,
        bind: args.bind_address,
        port: args.port,
        connections: args.connections,
        messages: args.messages,
        size: args.size,
        mtu: args.mtu,
        device,
    };
    init_log("warn");
    cm_tool_end("ucmatose", ucmatose::run(&o, &mut std::io::stdout()))
}

fn udaddy(args: &UdaddyArgs) -> ExitCode {
    let device = match cm_tool_device("udaddy", &args.device) {
        Ok(device) => device,
        Err(code) => return code,
    };
    let o = udaddy::Options {
        server: args.server,
        bind: args.bind_address,
        messages: args.messages,
        size: args.size,
        device,
    };
    init_log("warn");
    cm_tool_end("udaddy", udaddy::run(&o, &mut std::io::stdout()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode { file, json } => decode(file, *json),
        Command::Demo { mib, message_kib } => demo(*mib, *message_kib),
        Command::Daemon {
            device,
            daemon: args,
        } => daemon(device, args),
        Command::Rping { args } => rping(args),
        Command::Ucmatose { args } => ucmatose(args),
        Command::Udaddy { args } => udaddy(args),
        Command::Run {
            addrs,
            progress,
            mtu,
            cc,
            busy_poll,
            trains_per_qp,
            host_dev,
            program,
        } => {
            let options = softroce::tools::run::RunOptions {
                addrs,
                progress: progress.as_deref(),
                mtu: *mtu,
                congestion: cc.as_deref(),
                busy_poll_us: *busy_poll,
                trains_per_qp: *trains_per_qp,
                device_nodes: !*host_dev,
            };
            let why = softroce::tools::run::exec(&options, &program[0], &program[1..]);
            eprintln!("softroce run: {why}");
            ExitCode::FAILURE
        }
        command => tool(service(command).expect("every other subcommand is a tool")),
    }
}
