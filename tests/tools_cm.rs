//! The RDMA-CM tools, `softroce rping`, `ucmatose` and `udaddy`: a softroce server and client
//! on loopback, each with an address of its own, checked line by line against the output of
//! rdma-core's tools; a REJ for a port no one listens on; a persistent rping server. The lab
//! (tests/interop/cases/8*.sh) runs the same tools against rdma-core's on kernel rxe.

mod tool;

use tool::{Ended, Tool};

use softroce::tools::rping::ping_text;

/// A server on `address`, started with `-d` so that its "rdma_listen" line says when a client
/// may connect.
fn server(address: &str, port: u16, args: &[&str]) -> Tool {
    let port = port.to_string();
    let mut all = vec!["rping", "-s", "-a", address, "-p", &port, "-d"];
    all.extend_from_slice(args);
    let mut server = Tool::start(&all);
    assert!(server.wait_for("rdma_listen"), "the server did not start");
    server
}

fn client(server: &str, source: &str, port: u16, args: &[&str]) -> Ended {
    let port = port.to_string();
    let mut all = vec!["rping", "-c", "-a", server, "-I", source, "-p", &port];
    all.extend_from_slice(args);
    Tool::start(&all).end()
}

/// rping's text for each ping, as `-v` prints it: up to the NUL.
fn expected(pings: u32, size: usize) -> Vec<String> {
    let mut start = b'A';
    (0..pings)
        .map(|ping| {
            let text = ping_text(ping, start, size);
            start = if start >= b'z' { b'A' } else { start + 1 };
            String::from_utf8(text[..size - 1].to_vec()).unwrap()
        })
        .collect()
}

fn ok(side: &Ended, who: &str) {
    assert!(
        side.status.success(),
        "{who} failed ({}):\n{}\n{}",
        side.status,
        side.stdout.join("\n"),
        side.stderr
    );
}

#[test]
fn pings_land_and_both_sides_print_rpings_lines() {
    let server = server("127.0.0.81", 7174, &["-v"]);
    let client = client("127.0.0.81", "127.0.0.82", 7174, &["-C", "12", "-v", "-V"]);
    let server = server.end();
    ok(&client, "client");
    ok(&server, "server");
    let texts = expected(12, 64);
    let pings: Vec<String> = texts.iter().map(|t| format!("ping data: {t}")).collect();
    assert_eq!(client.stdout, pings);
    assert!(client.stderr.is_empty(), "{}", client.stderr);
    let served: Vec<String> = texts
        .iter()
        .map(|t| format!("server ping data: {t}"))
        .collect();
    let printed: Vec<&String> = server
        .stdout
        .iter()
        .filter(|l| l.starts_with("server"))
        .collect();
    assert_eq!(printed, served.iter().collect::<Vec<_>>());
    assert_eq!(
        server.stderr,
        "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n"
    );
}

/// The smallest size rping takes and the largest: a READ and a WRITE of 16 packets.
#[test]
fn the_smallest_and_largest_sizes_are_checked() {
    for (size, port) in [(23, 7180), (65535, 7181)] {
        let size_arg = size.to_string();
        let server = server("127.0.0.87", port, &["-S", &size_arg]);
        let client = client(
            "127.0.0.87",
            "127.0.0.88",
            port,
            &["-S", &size_arg, "-C", "3", "-V"],
        );
        ok(&client, "client");
        ok(&server.end(), "server");
    }
}

/// cm.c answers a REQ for a service with no listener with REJ 8; rping prints the event and
/// exits with 255.
#[test]
fn a_port_no_one_listens_on_is_rejected_with_rpings_line() {
    let server = server("127.0.0.83", 7174, &[]);
    let client = client("127.0.0.83", "127.0.0.84", 7175, &["-C", "1"]);
    assert_eq!(client.status.code(), Some(255), "{}", client.stderr);
    assert!(
        client
            .stderr
            .starts_with("cma event RDMA_CM_EVENT_REJECTED, error 8\n"),
        "{}",
        client.stderr
    );
    server.signal("KILL");
    server.end();
}

#[test]
fn a_persistent_server_serves_one_client_after_another() {
    let mut server = server("127.0.0.85", 7174, &["-P"]);
    for _ in 0..3 {
        ok(
            &client("127.0.0.85", "127.0.0.86", 7174, &["-C", "2", "-V"]),
            "client",
        );
        assert!(server.wait_for("wait for RDMA_READ_ADV state 10"));
    }
    server.signal("KILL");
    server.end();
}

#[test]
fn usage_errors_say_what_is_wrong() {
    let no_address = Tool::start(&["rping", "-s"]).end();
    assert_eq!(no_address.status.code(), Some(2));
    assert!(
        no_address.stderr.contains("-a ADDRESS"),
        "{}",
        no_address.stderr
    );
    let small = Tool::start(&["rping", "-c", "-a", "127.0.0.1", "-S", "5"]).end();
    assert_eq!(small.status.code(), Some(2));
    assert_eq!(
        small.stderr,
        "Invalid size 5 (valid range is 23 to 65536)\n"
    );
}

/// The lines rdma-core 44's ucmatose and udaddy print (cmatose.c, udaddy.c), by tool and side.
fn lines(tool: &str, server: bool) -> Vec<&'static str> {
    let mut lines = match (tool, server) {
        ("ucmatose", true) => vec![
            "cmatose: starting server",
            "initiating data transfers",
            "completing sends",
            "receiving data transfers",
            "data transfers complete",
            "cmatose: disconnecting",
            "disconnected",
        ],
        ("ucmatose", false) => vec![
            "cmatose: starting client",
            "cmatose: connecting",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
        ],
        ("udaddy", true) => vec![
            "udaddy: starting server",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
        ],
        _ => vec![
            "udaddy: starting client",
            "udaddy: connecting",
            "initiating data transfers",
            "receiving data transfers",
            "data transfers complete",
        ],
    };
    lines.extend(["test complete", "return status 0"]);
    lines
}

/// `tool`'s server on `addresses[0]` and its client on `addresses[1]`, both with `args`; both
/// must exit 0 and print exactly the stock tool's lines.
fn tool_pair(tool: &str, addresses: [&str; 2], args: &[&str]) {
    let mut server = Tool::start(&[&[tool, "-b", addresses[0]][..], args].concat());
    let ready = if tool == "ucmatose" { "cmatose" } else { tool };
    assert!(server.wait_for(&format!("{ready}: starting server")));
    let client_args = [tool, "-s", addresses[0], "-b", addresses[1]];
    let client = Tool::start(&[&client_args[..], args].concat()).end();
    let server = server.end();
    ok(&client, "client");
    ok(&server, "server");
    assert_eq!(client.stdout, lines(tool, false));
    assert_eq!(server.stdout, lines(tool, true));
}

/// Three RC connections at once, 50 SENDs of 4 KiB each way on each, ended by the server.
#[test]
fn ucmatose_connects_sends_both_ways_and_the_server_disconnects() {
    let args = ["-c", "3", "-C", "50", "-S", "4096"];
    tool_pair("ucmatose", ["127.0.0.89", "127.0.0.90"], &args);
}

/// SIDR, then 50 datagrams of 1000 bytes each way.
#[test]
fn udaddy_resolves_and_sends_datagrams_both_ways() {
    tool_pair(
        "udaddy",
        ["127.0.0.93", "127.0.0.94"],
        &["-C", "50", "-S", "1000"],
    );
}

/// No one serves the port: SIDR_REP status 1, which udaddy reports as UNREACHABLE, error 1.
#[test]
fn udaddy_against_no_server_reports_the_sidr_status() {
    let mut other = Tool::start(&["ucmatose", "-b", "127.0.0.95"]);
    assert!(other.wait_for("cmatose: starting server"));
    let client = Tool::start(&["udaddy", "-s", "127.0.0.95", "-b", "127.0.0.96"]).end();
    assert_eq!(client.status.code(), Some(1));
    assert!(
        client.has("udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1"),
        "{:?}",
        client.stdout
    );
    assert!(client.has("return status -1"));
    other.signal("KILL");
    other.end();
}
