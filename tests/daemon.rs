//! `softroce daemon`: 100 clients, some killed mid-transfer, several at once, with its memory and
//! its live objects level; SIGUSR1, SIGINT and SIGTERM; refused service specs. Every client is
//! the softroce tool in a process of its own, as rdma-core's or perftest's would be.

mod tool;

use std::time::Duration;

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

    /// The tool, its port, and the options both sides run with.
    fn command(self, setup: &Setup) -> (&'static str, u16, [&'static str; 4]) {
        match self {
            Service::RcPingpong => (
                "rc-pingpong",
                setup.pingpong_port,
                ["-s", "4096", "-n", "300"],
            ),
            Service::WriteBw => (
                "write-bw",
                setup.write_bw_port,
                ["-s", "65536", "-n", "200"],
            ),
            Service::UdPingpong => ("ud-pingpong", setup.ud_port, ["-s", "1024", "-n", "300"]),
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
        ("decode x.pcap", "not a pingpong or perftest tool"),
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
