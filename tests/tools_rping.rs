//! `softroce rping`: a softroce server and client on loopback, each with an address of its
//! own, checked line by line against rping's output; a REJ for a port no one listens on; a
//! persistent server. The lab (tests/interop/cases/8*-rping-*.sh) runs the same tool against
//! rdma-core's rping on kernel rxe.

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
