//! Many processes on one address (issue 51), as with kernel rxe: Debian's programs through
//! `softroce run`, several processes at once with their devices on the same loopback address,
//! each with its own QPs and RDMA-CM ports. Two perftest servers and an rping server on one
//! address, their clients on another; one of those servers killed mid-run while the others go
//! on, and its TCP port and its address taken again at once by a new process; RDMA-CM ports of
//! one address held by different processes (a port another process holds gives EADDRINUSE, a
//! killed process's port is free at once); Open MPI with four ranks, two per address, in an
//! all-to-all. Before, the second process on an address failed to open its device (EADDRINUSE
//! on UDP 4791).
//!
//! The tests run one at a time: each is several busy processes, and CI has two CPUs.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{compile_c_by, has_result_line, mpirun_over_softroce, succeeded};

/// How long one program of these tests may take (each takes a few seconds).
const LIMIT: Duration = Duration::from_secs(60);

/// One test of this file at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A program started with its output read as it comes, so that a test can wait for a line of
/// it (a server's ready line) while it runs. Killed when dropped, however the test ends, so
/// that no server outlives its test holding a port.
struct Running {
    name: String,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// A thread that appends what `from` gives to `into`, line by line, until its end.
fn reader(from: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut from = BufReader::new(from);
        let mut line = Vec::new();
        while from.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&line));
            line.clear();
        }
    })
}

impl Running {
    fn start(name: &str, mut command: Command) -> Running {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {command:?}: {e}"));
        let stdout: Arc<Mutex<String>> = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let readers = vec![
            reader(child.stdout.take().unwrap(), Arc::clone(&stdout)),
            reader(child.stderr.take().unwrap(), Arc::clone(&stderr)),
        ];
        Running {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            readers,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// What it printed so far, for a panic's message.
    fn said(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout(),
            self.stderr.lock().unwrap()
        )
    }

    /// Waits until `ready` holds, at most `limit`; panics, with what it printed, if it exits
    /// before (a server that could not open its device, or bind its port).
    fn wait_until(&mut self, what: &str, limit: Duration, ready: impl Fn(&Running) -> bool) {
        let start = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                self.join_readers();
                assert!(
                    ready(self),
                    "{} exited ({status}) before {what}\n{}",
                    self.name,
                    self.said()
                );
                return;
            }
            assert!(
                start.elapsed() < limit,
                "{}: not {what} within {limit:?}\n{}",
                self.name,
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until it prints `line` (a whole line).
    fn wait_for_line(&mut self, line: &str, limit: Duration) {
        self.wait_until(&format!("it printed {line:?}"), limit, |r| {
            r.stdout().lines().any(|l| l.trim_end() == line)
        });
    }

    /// Waits until something listens on TCP `port` (a perftest server's exchange).
    fn wait_listening(&mut self, port: u16, limit: Duration) {
        self.wait_until(
            &format!("something listened on TCP port {port}"),
            limit,
            |_| tcp_listening(port),
        );
    }

    /// Kills it with SIGKILL, mid-run: it must still be running. Returns once it is reaped, so
    /// that everything it held (descriptors, sockets) is released.
    fn kill_now(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            self.join_readers();
            panic!(
                "{} ended ({status}) before it was to be killed\n{}",
                self.name,
                self.said()
            );
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Panics, with what it printed, unless it is still running.
    fn assert_running(&mut self, when: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            self.join_readers();
            panic!(
                "{} ended ({status}) before it should have: {when}\n{}",
                self.name,
                self.said()
            );
        }
    }

    /// Waits for it to end, at most `limit` (past that it is killed, and this panics with
    /// what it printed). Returns its status and output.
    fn finish(mut self, limit: Duration) -> Output {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.join_readers();
                panic!(
                    "{} did not finish within {limit:?}\n{}",
                    self.name,
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.join_readers();
        Output {
            status,
            stdout: self.stdout().into_bytes(),
            stderr: self.stderr.lock().unwrap().clone().into_bytes(),
        }
    }

    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something listens on TCP `port`, from /proc/net/tcp and tcp6 (as
/// `common::wait_listening` reads them: no connection spent on finding out).
fn tcp_listening(port: u16) -> bool {
    let wanted = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && format!("{} ", fields[1]).contains(&wanted) && fields[3] == "0A"
            })
        })
    })
}

/// `program args...` through `softroce run --addr addr`, its standard output line-buffered
/// (`stdbuf -oL`, as the lab runs servers), so that a test sees a ready line as it is printed.
fn line_buffered(addr: &str, program: &str, args: &[&str]) -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()));
    assert!(
        found,
        "{program} is not installed: apt-get install perftest rdmacm-utils"
    );
    let mut all = vec!["-oL", program];
    all.extend_from_slice(args);
    common::softroce_run(&[addr], "stdbuf", &all)
}

/// perftest's `ib_write_bw` on a device on `addr` with its exchange on TCP `port`: a server,
/// or with `server` a client of the server there; `extra` sets its size (`-n`, `-D`).
fn write_bw(addr: &str, port: u16, extra: &[&str], server: Option<&str>) -> Command {
    let port = port.to_string();
    let mut args = vec!["-x", "0", "-p", &port];
    args.extend_from_slice(extra);
    args.extend(server);
    line_buffered(addr, "ib_write_bw", &args)
}

/// librdmacm's `rping` on a device on `addr`, `role` `-s` (listening on `server_addr`, with
/// `-d`, whose "rdma_listen" line says it listens) or `-c`: `count` pings on RDMA-CM port
/// `port`, verified (`-V`) and printed (`-v`).
fn rping(addr: &str, role: &str, server_addr: &str, port: u16, count: u32) -> Command {
    let (port, count) = (port.to_string(), count.to_string());
    let mut args = vec![
        role,
        "-a",
        server_addr,
        "-p",
        &port,
        "-C",
        &count,
        "-V",
        "-v",
    ];
    if role == "-s" {
        args.push("-d");
    }
    line_buffered(addr, "rping", &args)
}

/// A perftest side succeeded and printed its result line; returns its output.
fn perftest_passed(name: &str, output: &Output) -> String {
    let out = succeeded(name, output);
    assert!(has_result_line(&out), "{name}: no result line:\n{out}");
    out
}

/// An rping pair succeeded with `count` pings each way, every one verified (`-V`), as
/// `cm_programs.rs` checks rping.
fn rping_passed(name: &str, client: &Output, server: &Output, count: usize) {
    let client = succeeded(&format!("{name} (client)"), client);
    assert_eq!(
        client
            .lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        count,
        "{name} (client):\n{client}"
    );
    let server = succeeded(&format!("{name} (server)"), server);
    assert_eq!(
        server.matches("server ping data: rdma-ping-").count(),
        count,
        "{name} (server):\n{server}"
    );
}

/// The QPN of perftest's "local address" line.
fn local_qpn(name: &str, out: &str) -> u32 {
    out.lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix("local address:")?;
            let qpn = rest.split_whitespace().skip_while(|w| *w != "QPN").nth(1)?;
            u32::from_str_radix(qpn.trim_start_matches("0x"), 16).ok()
        })
        .unwrap_or_else(|| panic!("{name}: no local address line:\n{out}"))
}

/// Two `ib_write_bw` servers on two TCP ports and an `rping` server, three processes with their
/// devices on 127.0.11.1, all started at once; then their three clients, three processes on
/// 127.0.11.2, at once. Every side must succeed: the WRITEs of each perftest pair reach the
/// process of their QP, and rping's REQ the process listening on its RDMA-CM port. Processes on
/// one address have QPNs of their own.
#[test]
fn two_perftest_servers_and_an_rping_server_share_an_address() {
    let _one = one_at_a_time();
    let (at, from) = ("127.0.11.1", "127.0.11.2");
    let (port_a, port_b, cm_port) = (19940, 19941, 7940);
    let (iters, pings) = (["-n", "300"], 50);
    let mut server_a = Running::start("ib_write_bw server A", write_bw(at, port_a, &iters, None));
    let mut server_b = Running::start("ib_write_bw server B", write_bw(at, port_b, &iters, None));
    let mut rping_server = Running::start("rping server", rping(at, "-s", at, cm_port, pings));
    server_a.wait_listening(port_a, LIMIT);
    server_b.wait_listening(port_b, LIMIT);
    rping_server.wait_for_line("rdma_listen", LIMIT);

    let client_a = Running::start(
        "ib_write_bw client A",
        write_bw(from, port_a, &iters, Some(at)),
    );
    let client_b = Running::start(
        "ib_write_bw client B",
        write_bw(from, port_b, &iters, Some(at)),
    );
    let rping_client = Running::start("rping client", rping(from, "-c", at, cm_port, pings));
    // The clients first: a client that failed is the failure to report, not its server that
    // then waits for ever.
    let client_a = client_a.finish(LIMIT);
    let client_b = client_b.finish(LIMIT);
    let rping_client = rping_client.finish(LIMIT);
    let out_client_a = perftest_passed("ib_write_bw client A", &client_a);
    let out_client_b = perftest_passed("ib_write_bw client B", &client_b);
    let out_server_a = perftest_passed("ib_write_bw server A", &server_a.finish(LIMIT));
    let out_server_b = perftest_passed("ib_write_bw server B", &server_b.finish(LIMIT));
    rping_passed(
        "rping",
        &rping_client,
        &rping_server.finish(LIMIT),
        pings as usize,
    );

    let (qpn_a, qpn_b) = (
        local_qpn("server A", &out_server_a),
        local_qpn("server B", &out_server_b),
    );
    // Each QP number ends in its process's place in the address's group, which the kernel
    // steers by: two processes on one address, two places.
    assert_ne!(
        qpn_a & 0xff,
        qpn_b & 0xff,
        "two processes on {at} in one place"
    );
    let (qpn_a, qpn_b) = (
        local_qpn("client A", &out_client_a),
        local_qpn("client B", &out_client_b),
    );
    assert_ne!(
        qpn_a & 0xff,
        qpn_b & 0xff,
        "two processes on {from} in one place"
    );
}

/// The same three servers on 127.0.11.3 and their clients on 127.0.11.4, the perftest pairs by
/// duration (`-D`). About a second into its WRITEs, one `ib_write_bw` server is killed
/// (SIGKILL) while the other perftest pair runs. The other pair and the rping pair must still
/// succeed. At once after the kill, new processes on both addresses: an `ib_write_bw` server on
/// the killed one's TCP port and its client, and another rping pair (rping's 500 pings may be
/// over before the kill); both must succeed while the other pair runs and while the stray
/// WRITEs of the killed server's client, for a QP that is gone, reach none of them. That client
/// must notice its peer is gone (its retries run out) and fail, not hang.
#[test]
fn a_server_killed_mid_run_leaves_the_others_passing() {
    let _one = one_at_a_time();
    let (at, from) = ("127.0.11.3", "127.0.11.4");
    let (victim_port, other_port, cm_port, new_cm_port) = (19942, 19943, 7941, 7944);
    let (victim_time, other_time, pings) = (["-D", "8"], ["-D", "4"], 500);
    let mut victim = Running::start(
        "the killed ib_write_bw server",
        write_bw(at, victim_port, &victim_time, None),
    );
    let mut other = Running::start(
        "the other ib_write_bw server",
        write_bw(at, other_port, &other_time, None),
    );
    let mut rping_server = Running::start("rping server", rping(at, "-s", at, cm_port, pings));
    victim.wait_listening(victim_port, LIMIT);
    other.wait_listening(other_port, LIMIT);
    rping_server.wait_for_line("rdma_listen", LIMIT);

    let mut victim_client = Running::start(
        "the killed server's ib_write_bw client",
        write_bw(from, victim_port, &victim_time, Some(at)),
    );
    let mut other_client = Running::start(
        "the other ib_write_bw client",
        write_bw(from, other_port, &other_time, Some(at)),
    );
    let rping_client = Running::start("rping client", rping(from, "-c", at, cm_port, pings));
    // perftest prints its table's header once the exchange is done, as its WRITEs start.
    victim_client.wait_until("its WRITEs started", LIMIT, |r| {
        r.stdout().contains("#bytes")
    });
    std::thread::sleep(Duration::from_secs(1));
    other_client.assert_running("when the victim is killed");
    victim.kill_now();

    // The killed server's TCP port, and a device on its address, taken again at once.
    let new_iters = ["-n", "300"];
    let mut new_server = Running::start(
        "the new ib_write_bw server",
        write_bw(at, victim_port, &new_iters, None),
    );
    new_server.wait_listening(victim_port, LIMIT);
    let new_client = Running::start(
        "the new ib_write_bw client",
        write_bw(from, victim_port, &new_iters, Some(at)),
    );
    let mut new_rping_server = Running::start(
        "the new rping server",
        rping(at, "-s", at, new_cm_port, pings),
    );
    new_rping_server.wait_for_line("rdma_listen", LIMIT);
    let new_rping_client = Running::start(
        "the new rping client",
        rping(from, "-c", at, new_cm_port, pings),
    );

    let new_client = new_client.finish(LIMIT);
    let other_client = other_client.finish(LIMIT);
    let rping_client = rping_client.finish(LIMIT);
    let new_rping_client = new_rping_client.finish(LIMIT);
    perftest_passed("the new ib_write_bw client", &new_client);
    perftest_passed("the other ib_write_bw client", &other_client);
    perftest_passed("the new ib_write_bw server", &new_server.finish(LIMIT));
    perftest_passed("the other ib_write_bw server", &other.finish(LIMIT));
    rping_passed(
        "rping",
        &rping_client,
        &rping_server.finish(LIMIT),
        pings as usize,
    );
    rping_passed(
        "the new rping",
        &new_rping_client,
        &new_rping_server.finish(LIMIT),
        pings as usize,
    );

    let victim_client = victim_client.finish(LIMIT);
    assert!(
        !victim_client.status.success(),
        "the killed server's client succeeded without its server:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&victim_client.stdout),
        String::from_utf8_lossy(&victim_client.stderr)
    );
}

/// RDMA-CM ports of one address held by different processes: two rping servers on 127.0.11.1,
/// on ports A and B; a third process on the address cannot bind either (`rdma_bind_addr`:
/// EADDRINUSE, as the kernel answers). The server on B is killed (SIGKILL) while it listens,
/// and a new process binds B at once. Then both are served at once by clients on 127.0.11.2,
/// each REQ reaching the process listening on its port.
#[test]
fn rdma_cm_ports_of_one_address_are_held_per_process() {
    let _one = one_at_a_time();
    let (at, from) = ("127.0.11.1", "127.0.11.2");
    let (port_a, port_b, pings) = (7942, 7943, 20);
    let mut server_a = Running::start("rping server on A", rping(at, "-s", at, port_a, pings));
    let mut server_b = Running::start("rping server on B", rping(at, "-s", at, port_b, pings));
    server_a.wait_for_line("rdma_listen", LIMIT);
    server_b.wait_for_line("rdma_listen", LIMIT);

    for port in [port_a, port_b] {
        let name = format!("an rping server on port {port}, which another process holds");
        // It exits at once; one that listened would serve until killed here.
        let taken =
            Running::start(&name, rping(at, "-s", at, port, pings)).finish(Duration::from_secs(15));
        let stderr = String::from_utf8_lossy(&taken.stderr);
        assert!(
            !taken.status.success() && stderr.contains("rdma_bind_addr: Address already in use"),
            "{name}: {}\nstdout:\n{}\nstderr:\n{stderr}",
            taken.status,
            String::from_utf8_lossy(&taken.stdout)
        );
    }

    server_b.kill_now();
    let mut server_b = Running::start(
        "a new rping server on B",
        rping(at, "-s", at, port_b, pings),
    );
    server_b.wait_for_line("rdma_listen", LIMIT);

    let client_a = Running::start("rping client of A", rping(from, "-c", at, port_a, pings));
    let client_b = Running::start("rping client of B", rping(from, "-c", at, port_b, pings));
    let client_a = client_a.finish(LIMIT);
    let client_b = client_b.finish(LIMIT);
    rping_passed(
        "rping on A",
        &client_a,
        &server_a.finish(LIMIT),
        pings as usize,
    );
    rping_passed(
        "rping on B",
        &client_b,
        &server_b.finish(LIMIT),
        pings as usize,
    );
}

/// Open MPI 4.1 with four ranks over UCX (`--mca pml ucx`, `UCX_TLS=rc,self`: no shared memory
/// between the ranks), two per address: ranks 0 and 1 through `softroce run` on 127.0.11.5,
/// ranks 2 and 3 on 127.0.11.6. Eight rounds of `MPI_Alltoall` of 64 KiB per pair, every byte
/// checked (`c/mpi_alltoall.c`): each rank's RC QPs reach both ranks of the other address and
/// the other rank of its own.
#[test]
fn open_mpi_four_ranks_two_per_address_alltoall() {
    let _one = one_at_a_time();
    let program = compile_c_by(
        "mpicc",
        "mpi_alltoall",
        include_str!("c/mpi_alltoall.c"),
        &["-O2"],
    );
    // Each rank's device address from its rank: 0 and 1 on 127.0.11.5, 2 and 3 on 127.0.11.6.
    let address = "127.0.11.$((OMPI_COMM_WORLD_RANK / 2 + 5))";
    let mpirun = mpirun_over_softroce(4, address, &program);
    let output = Running::start("mpirun", mpirun).finish(Duration::from_secs(120));
    let out = succeeded("mpirun", &output);
    for line in [
        "rank 0 on 127.0.11.5",
        "rank 1 on 127.0.11.5",
        "rank 2 on 127.0.11.6",
        "rank 3 on 127.0.11.6",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert!(out.contains(": alltoall ok"), "{out}");
}
