//! The middleware people build on, unmodified from Debian 12, over softroce's libraries as a
//! user runs it (`softroce run`, two processes on two loopback addresses): UCX (`ucx_info`,
//! `ucx_perftest` over RC and UD), Open MPI over UCX, qperf's RC tests, libfabric's verbs
//! provider, and pyverbs. Each test says what the program needed that it did not find before.
//!
//! The tests run one at a time: each is two busy processes, and this machine has two CPUs.

mod common;

use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use common::{compile_c_by, finish, mpirun_over_softroce, own_dir, succeeded, wait_listening};

/// `program args...` through `softroce run` with a device on `addr`.
fn softroce_run(addr: &str, program: &str, args: &[&str]) -> Command {
    common::softroce_run(&[addr], program, args)
}

/// How long one program of these tests may take (UCX's wire-up alone takes a second or two).
const LIMIT: Duration = Duration::from_secs(120);

/// One middleware test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Kills a server that serves until it is killed (qperf's) when the test ends, however it ends.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `server`, waits until it listens on TCP `port`, runs `client` to the end; both must
/// succeed. Returns both outputs (the server's after it exits by itself).
fn server_and_client(
    name: &str,
    server: &mut Command,
    port: u16,
    client: &mut Command,
) -> (String, String) {
    let server = server.spawn().unwrap();
    wait_listening(port, LIMIT);
    let client = finish(&format!("{name} (client)"), client.spawn().unwrap(), LIMIT);
    let server = finish(&format!("{name} (server)"), server, LIMIT);
    (
        succeeded(&format!("{name} (server)"), &server),
        succeeded(&format!("{name} (client)"), &client),
    )
}

fn output_of(name: &str, command: &mut Command) -> String {
    let output: Output = finish(name, command.spawn().unwrap(), LIMIT);
    succeeded(name, &output)
}

/// UCX keeps an IB device only if `/dev/infiniband/<dev_name>` is a character device it may
/// open ("network device 'softroce0:1' is not available" before): `softroce run` gives the
/// program one. UCX then lists both verbs transports on the device, and RDMA-CM.
#[test]
fn ucx_finds_the_device() {
    let _one = one_at_a_time();
    let out = output_of(
        "ucx_info",
        &mut softroce_run("127.0.76.1", "ucx_info", &["-d"]),
    );
    for line in [
        "Memory domain: softroce0",
        "Transport: rc_verbs",
        "Transport: ud_verbs",
        "Device: softroce0:1",
        "Connection manager: rdmacm",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// `ucx_perftest` between two processes: the tag-matching latency and bandwidth, a put and a get
/// over `UCX_TLS=rc` (RC for data, UD for wire-up), and the latency over UD alone. UD's wire-up
/// needed `wc.sl` to say what the GRH area holds, as ConnectX does (UCX 1.13 dropped every
/// datagram otherwise); UCX's registrations of user buffers needed `ibv_reg_mr` not to fail
/// with ENOMEM near a power of two of regions.
#[test]
fn ucx_perftest_over_rc_and_ud() {
    let _one = one_at_a_time();
    let cases: [(&str, &[&str]); 5] = [
        ("rc", &["-t", "tag_lat", "-s", "8", "-n", "1000"]),
        ("rc", &["-t", "tag_bw", "-s", "1048576", "-n", "20"]),
        ("rc", &["-t", "ucp_put_bw", "-s", "1048576", "-n", "20"]),
        ("rc", &["-t", "ucp_get", "-s", "65536", "-n", "100"]),
        ("ud_v", &["-t", "tag_lat", "-s", "8", "-n", "1000"]),
    ];
    for (i, (transports, test)) in cases.iter().enumerate() {
        let port = 19850 + i as u16;
        let port_arg = port.to_string();
        let name = format!("ucx_perftest {transports} {}", test[1]);
        let mut server = softroce_run("127.0.76.2", "ucx_perftest", &["-p", &port_arg]);
        let mut client_args = vec!["127.0.76.2", "-p", &port_arg];
        client_args.extend_from_slice(test);
        let mut client = softroce_run("127.0.76.3", "ucx_perftest", &client_args);
        for side in [&mut server, &mut client] {
            side.env("UCX_TLS", transports);
        }
        let (_, out) = server_and_client(&name, &mut server, port, &mut client);
        assert!(out.contains("Final:"), "{name}: no result in:\n{out}");
    }
}

/// Open MPI 4.1 with two ranks, each through `softroce run` on an address of its own, over UCX
/// (`--mca pml ucx`, `UCX_TLS=rc,self`: no shared memory between the ranks): a ping-pong, then a
/// window of sixteen 1 MiB nonblocking sends each way, every byte checked (`c/mpi_exchange.c`).
/// The window aborted in three runs of four before, for `ibv_reg_mr`'s ENOMEM.
#[test]
fn open_mpi_over_ucx() {
    let _one = one_at_a_time();
    let program = compile_c_by(
        "mpicc",
        "mpi_exchange",
        include_str!("c/mpi_exchange.c"),
        &["-O2"],
    );
    // Each rank's device address from its rank: 127.0.76.4 and .5.
    let address = "127.0.76.$((OMPI_COMM_WORLD_RANK + 4))";
    let mut mpirun = mpirun_over_softroce(2, address, &program);
    mpirun
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = output_of("mpirun", &mut mpirun);
    assert!(out.contains("data checked"), "{out}");
}

/// qperf 0.4.11's RC tests with RDMA-CM (`-cm1`): latency, bandwidth, RDMA READ and WRITE, and
/// both atomics. qperf ends each test's last wait with an alarm, which must end a wait in
/// `ibv_get_cq_event` with EINTR (one run in two hung before).
#[test]
fn qperf_rc_tests_over_rdma_cm() {
    let _one = one_at_a_time();
    let port = 19860u16;
    let port_arg = port.to_string();
    let server = softroce_run("127.0.76.6", "qperf", &["-lp", &port_arg])
        .spawn()
        .unwrap();
    let _server = Serving(server);
    wait_listening(port, LIMIT);
    let tests = [
        "rc_lat",
        "rc_bw",
        "rc_rdma_write_lat",
        "rc_rdma_write_bw",
        "rc_rdma_read_lat",
        "rc_rdma_read_bw",
        "rc_compare_swap_mr",
        "rc_fetch_add_mr",
    ];
    let mut args = vec!["-lp", &port_arg, "-cm1", "-t", "1", "127.0.76.6"];
    args.extend_from_slice(&tests);
    let out = output_of("qperf", &mut softroce_run("127.0.76.7", "qperf", &args));
    for test in tests {
        assert!(out.contains(&format!("{test}:")), "no {test} in:\n{out}");
    }
    assert!(!out.contains("failed"), "{out}");
    assert_eq!(out.matches("latency").count(), 3, "{out}");
}

/// libfabric 1.17's verbs provider: `fi_info` lists the device (every libfabric program died at
/// load before, for `ibv_reg_dmabuf_mr@IBVERBS_1.12`), and `fi_pingpong` over its datagram
/// endpoint moves every size with its data checked. (Its connected endpoints find devices by
/// the addresses of non-loopback interfaces: not on loopback yet.)
#[test]
fn libfabric_verbs_datagrams() {
    let _one = one_at_a_time();
    let out = output_of(
        "fi_info",
        &mut softroce_run("127.0.76.8", "fi_info", &["-p", "verbs"]),
    );
    assert!(
        out.contains("domain: softroce0-dgram") && out.contains("FI_EP_DGRAM"),
        "{out}"
    );
    let port = 19861u16;
    let port_arg = port.to_string();
    let common = ["-p", "verbs", "-e", "dgram", "-I", "100", "-c"];
    let mut server_args = vec!["-B", &port_arg];
    server_args.extend_from_slice(&common);
    let mut client_args = vec!["-P", &port_arg];
    client_args.extend_from_slice(&common);
    client_args.push("127.0.76.8");
    let (_, out) = server_and_client(
        "fi_pingpong",
        &mut softroce_run("127.0.76.8", "fi_pingpong", &server_args),
        port,
        &mut softroce_run("127.0.76.9", "fi_pingpong", &client_args),
    );
    // A line per size, 64 B to 4 KiB (the datagram MTU), none with an error.
    assert!(out.contains("\n4k "), "{out}");
    assert!(!out.contains("Error"), "{out}");
}

/// A network namespace of the test's own, removed when dropped: `lo`, and a veth pair whose
/// `v0` has `addrs` (libfabric's verbs provider finds devices only on the addresses of
/// interfaces that are not loopback).
struct Namespace(String);

impl Namespace {
    fn new(addrs: &[&str]) -> Namespace {
        let namespace = Namespace(format!("softroce-mw-{}", std::process::id()));
        let ip = |args: &[&str]| {
            let status = Command::new("ip")
                .args(args)
                .status()
                .expect("iproute2's ip");
            assert!(status.success(), "ip {args:?}");
        };
        ip(&["netns", "add", &namespace.0]);
        let n = namespace.0.as_str();
        ip(&["-n", n, "link", "set", "lo", "up"]);
        ip(&[
            "-n", n, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
        ]);
        ip(&["-n", n, "link", "set", "v0", "up"]);
        ip(&["-n", n, "link", "set", "v1", "up"]);
        for addr in addrs {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", "v0"]);
        }
        namespace
    }

    /// `softroce run --addr addr -- program args...` in the namespace, with libfabric's
    /// verbs provider looking for devices on `v0`.
    fn softroce_run(&self, addr: &str, program: &str, args: &[&str]) -> Command {
        let run = softroce_run(addr, program, args);
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.0])
            .arg(run.get_program())
            .args(run.get_args())
            .env("FI_VERBS_IFACE", "v0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// libfabric's connected endpoints, over the verbs provider (`msg`) and over `ofi_rxm` on it
/// (`rdm`), between two processes on two addresses of a non-loopback interface, every size
/// with its data checked. Before: the server's lookup of `localhost` failed (`rdma_bind_addr`
/// of a loopback address no device has: EADDRNOTAVAIL, where the kernel binds it to its first
/// device), `rdma_getaddrinfo` with the addresses only in the hints failed with EINVAL, and
/// `ofi_rxm` refused its peer's name, a listener bound with port 0 that kept port 0 (the
/// kernel picks an ephemeral port at the bind). Needs root for the namespace.
#[test]
#[ignore = "needs root for a network namespace: .ci/run runs it"]
fn libfabric_verbs_connected_endpoints() {
    let _one = one_at_a_time();
    let namespace = Namespace::new(&["10.78.0.1", "10.78.0.2"]);
    for (i, (provider, endpoint)) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")]
        .into_iter()
        .enumerate()
    {
        let port = (19862 + i as u16).to_string();
        let common = ["-p", provider, "-e", endpoint, "-I", "100", "-c"];
        let mut server_args = vec!["-B", &port];
        server_args.extend_from_slice(&common);
        let mut client_args = vec!["-P", &port];
        client_args.extend_from_slice(&common);
        client_args.push("10.78.0.1");
        let name = format!("fi_pingpong -p {provider} -e {endpoint}");
        let server = namespace
            .softroce_run("10.78.0.1", "fi_pingpong", &server_args)
            .spawn()
            .unwrap();
        // The server's control port is in the namespace, out of this test's sight: the
        // client retries its connection until the server listens.
        let start = std::time::Instant::now();
        let out = loop {
            let client = namespace.softroce_run("10.78.0.2", "fi_pingpong", &client_args);
            let output = finish(&name, { client }.spawn().unwrap(), LIMIT);
            let said = String::from_utf8_lossy(&output.stderr).into_owned();
            if output.status.success() || start.elapsed() > LIMIT {
                break succeeded(&format!("{name} (client)"), &output);
            }
            // Only a refused control connection is the server not listening yet.
            assert!(said.contains("Connection refused"), "{name}: {said}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let server = finish(&format!("{name} (server)"), server, LIMIT);
        succeeded(&format!("{name} (server)"), &server);
        // A line per size, up to 1 MiB, none with an error.
        assert!(out.contains("\n1m "), "{name}: {out}");
        assert!(!out.contains("Error"), "{name}: {out}");
    }
}

/// pyverbs, rdma-core 44's Python binding (whose modules need version nodes up to
/// IBVERBS_1.14 and RDMACM_1.3: `import pyverbs` failed before): two devices of one process, an
/// RC QP on each connected by GID, an RDMA WRITE of 4 KiB with its bytes checked, posted with
/// `ibv_post_send`, then with the extended QP's `ibv_wr_*` calls and polled on an extended CQ
/// (`QPEx`, `CQEX`: `EOPNOTSUPP` before) (`py/rc_write.py`).
#[test]
fn pyverbs_rc_write() {
    let _one = one_at_a_time();
    let script = own_dir().join("rc_write.py");
    std::fs::write(&script, include_str!("py/rc_write.py")).unwrap();
    // Debian's python3, which has the python3-pyverbs package, whatever else is on PATH.
    let mut command = common::softroce_run(
        &["127.0.76.10", "127.0.76.11"],
        "/usr/bin/python3",
        &[script.to_str().unwrap()],
    );
    let out = output_of("pyverbs", &mut command);
    for line in [
        "devices: softroce0 softroce1",
        "plain write completion: True",
        "plain data checked: True",
        "extended write completion: True",
        "extended data checked: True",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}
