//! `softroce daemon`: 100 clients, some killed mid-transfer, several at once, with its memory and
//! its live objects level; SIGUSR1, SIGINT and SIGTERM; refused service specs. Every client is
//! the softroce tool in a process of its own, as rdma-core's or perftest's would be.

mod tool;

use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use softroce::tools::perftest_keys::Keys;
use softroce::tools::perftest_oob::{Exchange, Link};
use softroce::transport::PathMtu;
use softroce::wire::{Psn, Qpn, RKey};
use tool::Tool;

/// Where one test's daemon and clients are: the tests run at once, and each device binds UDP
/// port 4791 on its own address.
struct Setup {
    daemon: &'static str,
    clients: [&'static str; 4],
    pingpong_port: u16,
    write_bw_port: u16,
    ud_port: u16,
}

const HUNDRED: Setup = Setup {
    daemon: "127.0.0.70",
    clients: ["127.0.0.71", "127.0.0.72", "127.0.0.73", "127.0.0.74"],
    pingpong_port: 19701,
    write_bw_port: 19702,
    ud_port: 19705,
};
const SIGINT: Setup = Setup {
    daemon: "127.0.0.75",
    clients: ["127.0.0.76", "127.0.0.77", "127.0.0.78", "127.0.0.79"],
    pingpong_port: 19703,
    write_bw_port: 19704,
    ud_port: 19706,
};

/// The three services: RC SENDs, RDMA WRITEs under perftest's exchange, and UD SENDs through
/// an address handle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Service {
    RcPingpong,
    WriteBw,
    UdPingpong,
}

impl Service {
    const ALL: [Service; 3] = [Service::RcPingpong, Service::WriteBw, Service::UdPingpong];

    /// The tool, its port, and the options both sides run with. Each transfer takes tens of
    /// milliseconds: a client killed once it has connected must still be mid-transfer when
    /// the signal lands (with 300 round trips of 4 KiB, about 6 ms on loopback, a session
    /// now and then finished first and counted as a success).
    fn command(self, setup: &Setup) -> (&'static str, u16, [&'static str; 4]) {
        match self {
            Service::RcPingpong => (
                "rc-pingpong",
                setup.pingpong_port,
                ["-s", "4096", "-n", "3000"],
            ),
            Service::WriteBw => (
                "write-bw",
                setup.write_bw_port,
                ["-s", "65536", "-n", "2000"],
            ),
            Service::UdPingpong => ("ud-pingpong", setup.ud_port, ["-s", "1024", "-n", "3000"]),
        }
    }
}

/// A daemon serving the three services, idle timeout 2 s, once it has logged "ready".
fn daemon(setup: &Setup) -> Tool {
    let specs: Vec<String> = Service::ALL
        .iter()
        .map(|service| {
            let (tool, port, options) = service.command(setup);
            format!("{tool} -p {port} {}", options.join(" "))
        })
        .collect();
    let mut args = vec!["daemon", "--bind", setup.daemon, "--idle-timeout", "2"];
    for spec in &specs {
        args.extend(["--serve", spec.as_str()]);
    }
    let mut daemon = Tool::start(&args);
    assert!(
        daemon.wait_for_match(|l| l.ends_with(" ready")).is_some(),
        "the daemon never became ready"
    );
    daemon
}

/// A client of one of the daemon's services, on `address`.
fn client(setup: &Setup, address: &str, service: Service) -> Tool {
    let (tool, port, options) = service.command(setup);
    let port = port.to_string();
    let mut args = vec![tool, "--bind", address, "-p", &port];
    args.extend(options);
    args.push(setup.daemon);
    Tool::start(&args)
}

/// Once the client has connected its QP (its remote address line is out, so the daemon's
/// session has connected too), kills it: a peer that vanishes mid-transfer.
fn kill_mid_transfer(mut client: Tool) {
    assert!(client
        .wait_for_match(|l| l.trim_start().starts_with("remote address"))
        .is_some());
    client.child.kill().unwrap();
    client.child.wait().unwrap();
}

/// Asks for the counters (SIGUSR1) and returns the lines from "sessions:" to "resources:".
fn counters(daemon: &mut Tool) -> (String, String) {
    daemon.signal("USR1");
    let sessions = daemon
        .wait_for_match(|l| l.starts_with("sessions: "))
        .expect("a sessions line");
    let resources = daemon
        .wait_for_match(|l| l.starts_with("resources: "))
        .expect("a resources line");
    (sessions, resources)
}

/// Waits until no session runs, asking every 200 ms: a killed client's session ends at the
/// idle timeout or when its RC retries run out.
fn settle(daemon: &mut Tool) -> (String, String) {
    for _ in 0..100 {
        let (sessions, resources) = counters(daemon);
        if sessions.ends_with("running 0") {
            return (sessions, resources);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("sessions still running after 20 s");
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The acceptance: 100 connections in a row, some killed mid-transfer, four at a time,
/// and afterwards the daemon still serves, holds no QP, CQ or region, and its resident memory
/// has not grown with the sessions.
#[test]
fn serves_a_hundred_clients_some_killed_and_stays_level() {
    let setup = &HUNDRED;
    let mut daemon = daemon(setup);
    let pid = daemon.child.id();
    let (mut killed, mut finished) = (0, 0);
    let mut baseline = None;
    for round in 0..25 {
        // One client in five vanishes once connected; it is killed first, mid-transfer.
        let (doomed, others): (Vec<_>, Vec<_>) = setup
            .clients
            .iter()
            .enumerate()
            .map(|(k, address)| {
                let service = Service::ALL[(round + k) % Service::ALL.len()];
                (k, client(setup, address, service))
            })
            .partition(|(k, _)| (round * setup.clients.len() + k) % 5 == 4);
        for (_, client) in doomed {
            kill_mid_transfer(client);
            killed += 1;
        }
        for (_, client) in others {
            let ended = client.end();
            assert!(ended.status.success(), "client: {}", ended.stderr);
            finished += 1;
        }
        // The first rounds warm the allocator and the engine's pools.
        if round == 4 {
            settle(&mut daemon);
            baseline = Some(resident_kib(pid));
        }
    }
    let (sessions, resources) = settle(&mut daemon);
    assert_eq!(
        sessions,
        format!("sessions: accepted 100 succeeded {finished} failed {killed} refused 0, running 0")
    );
    assert_eq!(
        resources,
        "resources: qps 0 cqs 0 regions 0 windows 0 srqs 0 address_handles 0"
    );
    let (before, after) = (baseline.unwrap(), resident_kib(pid));
    eprintln!(
        "the daemon's resident memory: {before} KiB after 20 sessions, {after} KiB after 100"
    );
    // Each session holds a few hundred KiB while it runs (write-bw's buffer and queues); 80
    // sessions leaking even a tenth of that would pass 2 MiB.
    assert!(
        after <= before + 2048,
        "resident memory grew from {before} KiB to {after} KiB"
    );
    // Still serving after all that.
    let last = client(setup, setup.clients[0], Service::RcPingpong).end();
    assert!(last.status.success(), "{}", last.stderr);

    daemon.signal("TERM");
    let ended = daemon.end();
    assert!(ended.status.success(), "{}", ended.stderr);
    assert!(ended.stderr.contains("stopping signal=\"SIGTERM\""));
    assert!(ended
        .stdout
        .iter()
        .any(|l| l.starts_with("softroce daemon counters at exit")));
    assert!(ended.stdout.iter().any(|l| *l
        == format!(
            "sessions: accepted 101 succeeded {} failed {killed} refused 0, running 0",
            finished + 1
        )));
}

/// SIGINT ends a session in the middle of its test: its waits stop, its QP is destroyed, and
/// the daemon exits 0 with its counters.
#[test]
fn sigint_ends_running_sessions_and_exits_cleanly() {
    let setup = &SIGINT;
    let daemon = daemon(setup);
    let mut long = client(setup, setup.clients[0], Service::RcPingpong);
    assert!(long
        .wait_for_match(|l| l.trim_start().starts_with("remote address"))
        .is_some());
    daemon.signal("INT");
    let ended = daemon.end();
    assert!(ended.status.success(), "{}", ended.stderr);
    assert!(ended.stderr.contains("stopping signal=\"SIGINT\""));
    assert!(ended
        .stdout
        .iter()
        .any(|l| l.starts_with("resources: qps 0 cqs 0 regions 0")));
    long.child.kill().unwrap();
    long.child.wait().unwrap();
}

/// A service is a tool's server side, and the device options are the daemon's.
#[test]
fn refuses_services_it_cannot_serve() {
    for (spec, why) in [
        ("rc-pingpong 10.0.0.1", "takes no HOST"),
        ("write-bw --bind 127.0.0.9", "are the daemon's own"),
        ("decode x.pcap", "not a pingpong, perftest or rping tool"),
        ("rping -c -a 127.0.0.2", "takes -s and no -a"),
        ("rc-pingpong --no-such-flag", "--no-such-flag"),
    ] {
        let ended = Tool::start(&["daemon", "--bind", "127.0.0.1", "--serve", spec]).end();
        assert_eq!(ended.status.code(), Some(2), "{spec}");
        assert!(ended.stderr.contains(why), "{spec}: {}", ended.stderr);
    }
}

/// The CPU time, user and system, the process `pid` has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses: utime and stime are the
    // 12th and 13th of them.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A send-bw session whose client is killed mid-transfer waits for the idle limit with nothing
/// to read on its TCP connection, polling its receive CQ: past the gaps of a running test it
/// naps instead of spinning, so a vanished client does not cost the daemon a core.
#[test]
fn a_vanished_clients_session_does_not_spin() {
    let (daemon_at, client_at) = ("127.0.0.90", "127.0.0.91");
    let mut daemon = Tool::start(&[
        "daemon",
        "--bind",
        daemon_at,
        "--idle-timeout",
        "30",
        "--serve",
        "send-bw -p 19707 -s 4096 -n 100000",
    ]);
    assert!(daemon.wait_for_match(|l| l.ends_with(" ready")).is_some());
    let mut client = Tool::start(&[
        "send-bw", "--bind", client_at, "-p", "19707", "-s", "4096", "-n", "100000", daemon_at,
    ]);
    // Killed once the SENDs flow: by then the server has passed the exchange's last round
    // before the test, and reads nothing more from the connection until the test's end.
    assert!(client
        .wait_for_match(|l| l.trim_start().starts_with("remote address"))
        .is_some());
    std::thread::sleep(Duration::from_secs(1));
    client.child.kill().unwrap();
    client.child.wait().unwrap();
    // The session's spin phase is over within milliseconds; then two seconds of waiting.
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(daemon.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(daemon.child.id()) - before;
    // A spinning session takes about 200 ticks (two seconds at 100 Hz) of these two seconds.
    assert!(
        used < 50,
        "the daemon used {used} ticks while its session waited"
    );
    daemon.signal("TERM");
    assert!(daemon.end().status.success());
}

/// `--engines 2`: the daemon's one device runs two engine threads, and a session's data QPs
/// are spread over them; a client of one engine writes to it as to any other.
#[test]
fn a_daemon_of_two_engines_serves_a_client() {
    let (daemon_at, client_at) = ("127.0.0.136", "127.0.0.137");
    let mut daemon = Tool::start(&[
        "daemon",
        "--bind",
        daemon_at,
        "--engines",
        "2",
        "--serve",
        "write-bw -p 19708 -q 4 -s 65536 -n 100",
    ]);
    assert!(daemon.wait_for_match(|l| l.ends_with(" ready")).is_some());
    let client = Tool::start(&[
        "write-bw", "--bind", client_at, "-p", "19708", "-q", "4", "-s", "65536", "-n", "100",
        daemon_at,
    ])
    .end();
    assert!(client.status.success(), "{}", client.stderr);
    assert_eq!(client.rows().len(), 1, "{:?}", client.stdout);
    daemon.signal("TERM");
    assert!(daemon.end().status.success());
}

/// A perftest client as the network sees it: softroce's side of perftest's exchange, driven by
/// hand so that it can lie, or stop talking, wherever a hostile client would.
fn perftest_client(daemon_at: &str, port: u16) -> Exchange {
    let stream = TcpStream::connect((daemon_at, port)).expect("the daemon listens");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    Exchange::new(Link::Tcp(stream), true)
}

/// Keys a client at `address` could send for one QP.
fn keys(address: &str) -> Keys {
    Keys {
        lid: 0,
        out_reads: 1,
        qpn: Qpn::new(0x123),
        psn: Psn::new(0x456),
        rkey: RKey(0x789),
        vaddr: 0x1000,
        gid: address.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped(),
        srqn: 0,
    }
}

/// Waits for the daemon's log line about the session that failed with `why`.
fn session_failed(daemon: &mut Tool, why: &str) -> String {
    daemon
        .wait_for_match(|l| l.contains("session failed") && l.contains(why))
        .unwrap_or_else(|| panic!("no session failed with {why:?}"))
}

/// Clients that abuse the exchange cost their own session and nothing more: one claiming a
/// 2 GiB page (the daemon allocated and filled 4 GiB for it, or aborted under a memory limit),
/// one that never speaks, one that finishes the handshake and then never speaks (perftest's
/// server read on without a timeout: sixteen of them held every session for ever), and one
/// that the total memory cap refuses while another holds the memory. Afterwards a real client
/// is served and the daemon's memory is where it was.
#[test]
fn abusive_clients_cost_only_their_own_sessions() {
    let (daemon_at, client_at, port) = ("127.0.8.1", "127.0.8.2", 19710);
    let mut daemon = Tool::start(&[
        "daemon",
        "--bind",
        daemon_at,
        "--idle-timeout",
        "2",
        "--max-session-memory",
        "4M",
        "--max-memory",
        "5M",
        "--serve",
        "write-bw -p 19710 -s 2M -n 20",
    ]);
    assert!(daemon.wait_for_match(|l| l.ends_with(" ready")).is_some());
    let real_client = || {
        Tool::start(&[
            "write-bw", "--bind", client_at, "-p", "19710", "-s", "2M", "-n", "20", daemon_at,
        ])
    };
    let first = real_client().end();
    assert!(first.status.success(), "{}", first.stderr);
    let abuse = |daemon: &mut Tool| {
        // Page and cache-line sizes the exchange refuses, each before anything is allocated.
        for (page, cache_line, what) in [
            (1u32 << 31, 64, "page size 2147483648"),
            (4096, 0, "cache line size 0"),
            (12288, 64, "page size 12288"),
            (4096, 8192, "cache line size 8192"),
        ] {
            let mut liar = perftest_client(daemon_at, port);
            liar.versions().unwrap();
            // The server answers each round before it looks at the client's value.
            let _ = liar.sys_data(page, cache_line);
            session_failed(daemon, what);
        }

        // Silent from the start: the handshake's reads time out at the idle limit.
        let silent = TcpStream::connect((daemon_at, port)).unwrap();
        session_failed(daemon, "nothing from the peer for 2 s");
        drop(silent);

        // Silent once the handshake is over, while holding its 4 MiB buffer: a second client
        // meanwhile does not fit the 5 MiB total, and says so.
        let mut quiet = perftest_client(daemon_at, port);
        quiet.versions().unwrap();
        quiet.sys_data(4096, 64).unwrap();
        quiet.mtu(PathMtu::Mtu1024).unwrap();
        let mine = keys(client_at);
        for _ in 0..2 {
            quiet.keys(|_| mine).unwrap();
        }
        quiet.sync(&mine).unwrap();
        let refused = real_client().end();
        assert!(!refused.status.success());
        session_failed(daemon, "total memory cap of 5.0 MiB (--max-memory)");
        session_failed(daemon, "nothing from the peer for 2 s");
        drop(quiet);
    };
    // Rounds, each ending with a real client. The first warms the allocator. Then the memory
    // must not grow round after round: a leak grows every round. It may step up now and
    // then: a session's engine turns run in its own thread as well as the engine's (hybrid
    // progress), glibc gives threads up to 8 arenas a core, and a 4 MiB buffer freed in one
    // arena is not the one the next session's thread allocates from (seen: one step of
    // 4 MiB in four rounds, at any round).
    let round = |daemon: &mut Tool| {
        abuse(daemon);
        // Still serving, with nothing left over.
        let last = real_client().end();
        assert!(last.status.success(), "{}", last.stderr);
        settle(daemon)
    };
    round(&mut daemon);
    const MEASURED: usize = 4;
    let mut resident = vec![resident_kib(daemon.child.id())];
    let mut last = round(&mut daemon);
    resident.push(resident_kib(daemon.child.id()));
    for _ in 1..MEASURED {
        last = round(&mut daemon);
        resident.push(resident_kib(daemon.child.id()));
    }
    let (sessions, resources) = last;
    let rounds = 1 + MEASURED;
    assert_eq!(
        sessions,
        format!(
            "sessions: accepted {} succeeded {} failed {} refused 0, running 0",
            1 + 8 * rounds,
            1 + rounds,
            7 * rounds
        )
    );
    assert_eq!(
        resources,
        "resources: qps 0 cqs 0 regions 0 windows 0 srqs 0 address_handles 0"
    );
    eprintln!("the daemon's resident memory after each round, KiB: {resident:?}");
    let growth: Vec<u64> = resident
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    assert!(
        growth.iter().any(|&g| g <= 2048),
        "the daemon's memory grew every round: {resident:?} KiB"
    );
    let total = resident[MEASURED].saturating_sub(resident[0]);
    assert!(
        total <= 2 * 4096 + 2048,
        "more than two 4 MiB steps: {resident:?} KiB"
    );
    daemon.signal("TERM");
    assert!(daemon.end().status.success());
}

/// A service whose every session would break the per-session cap is refused at start, with
/// the cap's flag named, rather than failing each client.
#[test]
fn a_service_over_the_memory_cap_is_refused_at_start() {
    let ended = Tool::start(&[
        "daemon",
        "--bind",
        "127.0.8.5",
        "--max-session-memory",
        "64K",
        "--serve",
        "write-bw -p 19711 -s 65536",
    ])
    .end();
    assert!(!ended.status.success());
    assert!(
        ended.stderr.contains("--max-session-memory"),
        "{}",
        ended.stderr
    );
}

/// A ud-pingpong client claiming the GID `::ffff:255.255.255.255`: the daemon's answer failed
/// with EACCES, which ended the device's engine and every session on it. Now the GID is
/// refused at the exchange, that session alone fails saying why, and the next client is served.
#[test]
fn a_broadcast_gid_costs_one_session() {
    use softroce::tools::oob::{client_exchange, Dest};

    let (daemon_at, client_at) = ("127.0.8.6", "127.0.8.7");
    let mut daemon = Tool::start(&[
        "daemon",
        "--bind",
        daemon_at,
        "--serve",
        "ud-pingpong -p 19712 -s 1024 -n 50",
    ]);
    assert!(daemon.wait_for_match(|l| l.ends_with(" ready")).is_some());
    for gid in ["::ffff:255.255.255.255", "ff02::1", "::"] {
        let mut stream = TcpStream::connect((daemon_at, 19712)).unwrap();
        let liar = Dest {
            lid: 0,
            qpn: Qpn::new(0x77),
            psn: Psn::new(1),
            gid: gid.parse().unwrap(),
        };
        let _ = client_exchange(&mut stream, &liar);
        session_failed(&mut daemon, "is no address to send to");
    }
    let honest = Tool::start(&[
        "ud-pingpong",
        "--bind",
        client_at,
        "-p",
        "19712",
        "-s",
        "1024",
        "-n",
        "50",
        daemon_at,
    ])
    .end();
    assert!(honest.status.success(), "{}", honest.stderr);
    daemon.signal("TERM");
    assert!(daemon.end().status.success());
}

/// RDMA-CM services: rping and write-bw -R, whose clients arrive as connection requests, the
/// latter's data connections routed to the session that expects them; two clients of each,
/// one after another, and a third rping client at once with a write-bw -R one. Each must end
/// well, and the daemon hold nothing afterwards.
#[test]
fn serves_rping_and_perftest_rdma_cm_clients() {
    let at = "127.0.0.64";
    let clients = ["127.0.0.65", "127.0.0.66"];
    let mut daemon = Tool::start(&[
        "daemon",
        "--bind",
        at,
        "--idle-timeout",
        "5",
        "--serve",
        "rping -s -p 7174 -S 4096",
        "--serve",
        "write-bw -R -p 19720 -s 16384 -n 100 -q 2",
    ]);
    assert!(daemon.wait_for_match(|l| l.ends_with(" ready")).is_some());
    let rping = |from: &str| {
        Tool::start(&[
            "rping", "-c", "-a", at, "-I", from, "-p", "7174", "-S", "4096", "-C", "10", "-V",
        ])
    };
    let write_bw = |from: &str| {
        Tool::start(&[
            "write-bw", "-R", "--bind", from, "-p", "19720", "-s", "16384", "-n", "100", "-q", "2",
            at,
        ])
    };
    for from in clients {
        let ended = rping(from).end();
        assert!(ended.status.success(), "rping: {}", ended.stderr);
        let ended = write_bw(from).end();
        assert!(ended.status.success(), "write-bw -R: {}", ended.stderr);
    }
    let (a, b) = (rping(clients[0]), write_bw(clients[1]));
    let (a, b) = (a.end(), b.end());
    assert!(
        a.status.success() && b.status.success(),
        "{}\n{}",
        a.stderr,
        b.stderr
    );
    let (sessions, resources) = settle(&mut daemon);
    assert_eq!(
        sessions,
        "sessions: accepted 6 succeeded 6 failed 0 refused 0, running 0"
    );
    assert_eq!(
        resources,
        "resources: qps 0 cqs 0 regions 0 windows 0 srqs 0 address_handles 0"
    );
    daemon.signal("TERM");
    assert!(daemon.end().status.success());
}
