//! `softroce rc-pingpong`, `uc-pingpong` and `ud-pingpong`: a softroce server and a softroce
//! client on loopback, each with an address of its own, and the server's answers to a broken
//! exchange. The lab (tests/interop/cases/5*.sh) runs the same tools against rdma-core's.

mod tool;

use std::io::{Read, Write};
use std::net::TcpStream;

use tool::{Ended, Tool};

/// A server started with `--bind`: it listens before it prints its local address line, so once
/// that line is out a client may connect.
fn start_server(tool: &str, address: &str, port: u16, args: &[&str]) -> Tool {
    let port = port.to_string();
    let mut all = vec![tool, "--bind", address, "-p", &port];
    all.extend_from_slice(args);
    let mut server = Tool::start(&all);
    if server
        .wait_for_match(|l| l.starts_with("  local address:"))
        .is_none()
    {
        let ended = server.end();
        panic!(
            "the server did not start: {}\n{}",
            ended.stdout.join("\n"),
            ended.stderr
        );
    }
    server
}

/// `line` is `PREFIX<seconds> seconds = <value> SUFFIX` with two decimals each, as rdma-core's
/// "%.2f" prints them.
fn is_result_line(line: &str, prefix: &str, suffix: &str) -> bool {
    let two_decimals = |s: &str| {
        s.split_once('.')
            .is_some_and(|(int, frac)| int.parse::<u64>().is_ok() && frac.len() == 2)
    };
    line.strip_prefix(prefix)
        .and_then(|l| l.strip_suffix(suffix))
        .and_then(|l| l.split_once(" seconds = "))
        .is_some_and(|(seconds, value)| two_decimals(seconds) && two_decimals(value))
}

/// Both sides exited 0 and printed their address lines, each other's QPN, PSN and GID, both
/// result lines, and then nothing but `server_after` on the server. With `-c` (rdma-core's
/// buffer check, which every test here but one uses) a server whose buffer did not hold the
/// client's marks would print "invalid data in page N": the data landed.
fn check_run(
    tool: &str,
    (server, client): (&Ended, &Ended),
    (size, iters): (u64, u64),
    server_after: &[&str],
) {
    for (who, side, after) in [("server", server, server_after), ("client", client, &[])] {
        let printed = side.stdout.join("\n");
        assert!(
            side.status.success(),
            "{tool} {who} failed ({}):\n{printed}\n{}",
            side.status,
            side.stderr
        );
        assert!(side.stderr.is_empty(), "{tool} {who}: {}", side.stderr);
        let lines = &side.stdout;
        assert_eq!(lines.len(), 4 + after.len(), "{tool} {who}:\n{printed}");
        assert_eq!(lines[4..], *after, "{tool} {who}");
        assert!(lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"));
        assert!(lines[1].starts_with("  remote address: LID 0x0000, QPN 0x"));
        let bytes = format!("{} bytes in ", size * iters * 2);
        assert!(
            is_result_line(&lines[2], &bytes, " Mbit/sec"),
            "{tool} {who}: {}",
            lines[2]
        );
        let iters = format!("{iters} iters in ");
        assert!(
            is_result_line(&lines[3], &iters, " usec/iter"),
            "{tool} {who}: {}",
            lines[3]
        );
    }
    // Each side's remote line is the other's local line; ibv_ud_pingpong's local line has a
    // colon before the GID.
    let address = |line: &str| line.split_once("LID").unwrap().1.replace(": GID", ", GID");
    assert_eq!(address(&client.stdout[1]), address(&server.stdout[0]));
    assert_eq!(address(&server.stdout[1]), address(&client.stdout[0]));
}

/// A server on `addresses[0]` and a client on `addresses[1]`, with the same options.
fn run_pair(tool: &str, addresses: [&str; 2], port: u16, args: &[&str]) -> (Ended, Ended) {
    let server = start_server(tool, addresses[0], port, args);
    let port = port.to_string();
    let mut all = vec![tool, "--bind", addresses[1], "-p", &port];
    all.extend_from_slice(args);
    all.push(addresses[0]);
    let client = Tool::start(&all).end();
    (server.end(), client)
}

#[test]
fn rc_pingpong_multi_packet_messages_checked() {
    // 4 KiB at MTU 1024: every message is FIRST, MIDDLE, MIDDLE, LAST.
    let args = ["-s", "4096", "-m", "1024", "-n", "200", "-c"];
    let (server, client) = run_pair("rc-pingpong", ["127.0.0.71", "127.0.0.72"], 28701, &args);
    check_run("rc-pingpong", (&server, &client), (4096, 200), &[]);
    assert!(server.stdout[1].ends_with("GID ::ffff:127.0.0.72"));
    assert!(client.stdout[1].ends_with("GID ::ffff:127.0.0.71"));
}

#[test]
fn rc_pingpong_on_completion_events() {
    // --trains-per-qp is taken (with one QP it changes no train).
    let args = ["-s", "100", "-n", "200", "-e", "--trains-per-qp", "-c"];
    let (server, client) = run_pair("rc-pingpong", ["127.0.0.73", "127.0.0.74"], 28702, &args);
    check_run("rc-pingpong", (&server, &client), (100, 200), &[]);
}

#[test]
fn uc_pingpong() {
    // One datagram per packet: every packet leaves with IP ID 0.
    let args = [
        "-s",
        "3000",
        "-m",
        "1024",
        "-n",
        "200",
        "--no-segmentation",
        "-c",
    ];
    let (server, client) = run_pair("uc-pingpong", ["127.0.0.75", "127.0.0.76"], 28703, &args);
    check_run("uc-pingpong", (&server, &client), (3000, 200), &[]);
}

#[test]
fn ud_pingpong() {
    // The largest UD message, with the 40-byte GRH area in front of it in every receive: the
    // port MTU, 4096 on loopback (lo's MTU is 65536).
    let args = ["-s", "4096", "-n", "200", "-c"];
    let (server, client) = run_pair("ud-pingpong", ["127.0.0.77", "127.0.0.78"], 28704, &args);
    check_run("ud-pingpong", (&server, &client), (4096, 200), &[]);
    assert!(client.stdout[0].contains(": GID ::ffff:127.0.0.78"));
}

#[test]
fn chk_reports_pages_the_client_did_not_mark() {
    // Only the server checks, as in rdma-core, and only reports: it still exits 0.
    let server = start_server(
        "rc-pingpong",
        "127.0.0.79",
        28705,
        &["-s", "8192", "-n", "3", "-c"],
    );
    let client = Tool::start(&[
        "rc-pingpong",
        "--bind",
        "127.0.0.80",
        "-p",
        "28705",
        "-s",
        "8192",
        "-n",
        "3",
        "127.0.0.79",
    ])
    .end();
    let server = server.end();
    let unmarked = ["invalid data in page 0", "invalid data in page 1"];
    check_run("rc-pingpong", (&server, &client), (8192, 3), &unmarked);
}

#[test]
fn server_rejects_a_malformed_exchange() {
    let server = start_server("rc-pingpong", "127.0.0.81", 28706, &[]);
    let mut stream = TcpStream::connect(("127.0.0.81", 28706)).unwrap();
    let mut message = b"hello, this is not an address".to_vec();
    message.resize(52, 0);
    stream.write_all(&message).unwrap();
    let server = server.end();
    assert_eq!(server.status.code(), Some(1), "{}", server.stderr);
    assert!(
        server.stderr.contains(
            "the client's address message \"hello, this is not an address\" is not LID:QPN:PSN:GID"
        ),
        "{}",
        server.stderr
    );
    // The server answered nothing: the client sees the connection close.
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    assert!(answer.is_empty());
}

#[test]
fn server_rejects_a_short_exchange() {
    let server = start_server("uc-pingpong", "127.0.0.82", 28707, &[]);
    let mut stream = TcpStream::connect(("127.0.0.82", 28707)).unwrap();
    stream.write_all(b"0000:000011").unwrap();
    drop(stream);
    let server = server.end();
    assert_eq!(server.status.code(), Some(1), "{}", server.stderr);
    assert!(
        server
            .stderr
            .contains("11/52: Couldn't read remote address: the peer closed the connection"),
        "{}",
        server.stderr
    );
}

#[test]
fn ud_refuses_messages_over_the_port_mtu() {
    // No port carries more than 4096 bytes: refused at once, before the server listens, as
    // ibv_ud_pingpong refuses it once it has queried its port. The device's own port MTU is
    // checked when it opens: ud_sizes_over_the_devices_port_mtu_are_refused in pingpong.rs.
    let tool = Tool::start(&["ud-pingpong", "-s", "4097"]).end();
    assert_eq!(tool.status.code(), Some(1));
    assert_eq!(
        tool.stderr,
        "softroce ud-pingpong: Requested size larger than port MTU (4096)\n"
    );
}
