//! `softroce write-bw`, `read-bw`, `send-bw`, `atomic-bw`, `write-lat`, `read-lat` and
//! `send-lat`: a softroce server and a softroce client on loopback, each with an address of its
//! own, and the server's answers to a broken exchange. The lab (tests/interop/cases/6*.sh) runs
//! the same tools against perftest's.

mod tool;

use std::io::{Read, Write};
use std::net::TcpStream;

use tool::{Ended, Tool};
/// The server's banner line that says it listens.
const WAITING: &str = "* Waiting for client to connect... *";
const BW_COLUMNS: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
const LAT_COLUMNS: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]";

/// A server on `addresses[0]` and a client on `addresses[1]`, with the same options.
fn run_pair(test: &str, addresses: [&str; 2], port: u16, args: &[&str]) -> (Ended, Ended) {
    let port = port.to_string();
    let with = |address| {
        let mut all = vec![test, "--bind", address, "-p", &port];
        all.extend_from_slice(args);
        all
    };
    let mut server = Tool::start(&with(addresses[0]));
    if !server.wait_for(WAITING) {
        let server = server.end();
        panic!(
            "{test} server did not start: {:?} {}",
            server.stdout, server.stderr
        );
    }
    let mut client = with(addresses[1]);
    client.push(addresses[0]);
    let client = Tool::start(&client).end();
    (server.end(), client)
}

/// `address`'s GID line: perftest prints the bytes of `::ffff:a.b.c.d` in decimal.
fn gid_line(address: &str) -> String {
    let bytes: Vec<String> = address
        .split('.')
        .map(|b| format!("{:02}", b.parse::<u8>().unwrap()))
        .collect();
    format!(
        " GID: 00:00:00:00:00:00:00:00:00:00:255:255:{}",
        bytes.join(":")
    )
}

/// Both sides exited 0 with nothing on standard error, printed `title`, and each printed the
/// other's GID as the remote one.
fn check_pair(title: &str, (server, client): (&Ended, &Ended), addresses: [&str; 2]) {
    for (who, side, peer) in [
        ("server", server, addresses[1]),
        ("client", client, addresses[0]),
    ] {
        assert!(
            side.status.success(),
            "{title} {who} failed ({}):\n{}\n{}",
            side.status,
            side.stdout.join("\n"),
            side.stderr
        );
        assert!(side.stderr.is_empty(), "{title} {who}: {}", side.stderr);
        assert!(
            side.has(&format!("                    {title}")),
            "{title} {who}:\n{}",
            side.stdout.join("\n")
        );
        assert_eq!(side.remote_gid(), gid_line(peer), "{title} {who}");
    }
}

/// `--check-data`: the bytes the side the data landed on found in their places, as sent; the
/// other side prints no such line.
fn landed(receiver: &Ended, sender: &Ended) -> u64 {
    let line = |side: &Ended| {
        side.stdout
            .iter()
            .find(|l| l.starts_with("data check: "))
            .cloned()
    };
    assert_eq!(line(sender), None);
    let line = line(receiver).expect("a data check line");
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// One bandwidth row: size, iterations, and three numbers, the message rate positive. (The
/// average bandwidth of 2-byte messages can print as 0.00 MB/sec on a busy host: 1000 of them
/// in a quarter of a second are 0.008 MB/sec.)
fn check_bw_row(row: &[String], size: u64, iters: u64) {
    assert_eq!(row.len(), 5, "{row:?}");
    assert_eq!(row[0], size.to_string(), "{row:?}");
    assert_eq!(row[1], iters.to_string(), "{row:?}");
    let numbers: Vec<f64> = row[2..].iter().map(|n| n.parse().unwrap()).collect();
    assert!(numbers[1] >= 0.0 && numbers[2] > 0.0, "{row:?}");
}

/// One latency row: size, iterations, and seven numbers, t_min the smallest of the first four.
fn check_lat_row(row: &[String], size: u64, iters: u64) {
    assert_eq!(row.len(), 9, "{row:?}");
    assert_eq!(row[0], size.to_string(), "{row:?}");
    assert_eq!(row[1], iters.to_string(), "{row:?}");
    let numbers: Vec<f64> = row[2..].iter().map(|n| n.parse().unwrap()).collect();
    assert!(numbers[0] > 0.0, "{row:?}");
    assert!(numbers[..4].iter().all(|&t| t >= numbers[0]), "{row:?}");
}

#[test]
fn write_bw_on_several_qps() {
    // 4 KiB at MTU 1024 on three QPs: multi-packet WRITEs cycling through a page per QP.
    let addresses = ["127.0.0.91", "127.0.0.92"];
    let args = [
        "-q",
        "3",
        "-s",
        "4K",
        "-n",
        "300",
        "-m",
        "1024",
        "-F",
        "-x",
        "1",
        "--check-data",
    ];
    let (server, client) = run_pair("write-bw", addresses, 28901, &args);
    check_pair("RDMA_Write BW Test", (&server, &client), addresses);
    // A page per QP, every byte of it written, as sent.
    assert_eq!(landed(&server, &client), 3 * 4096);
    // The server prints the client's report, so the rows are the same.
    for side in [&server, &client] {
        assert!(side.has(BW_COLUMNS));
        assert_eq!(side.rows().len(), 1);
        check_bw_row(&side.rows()[0], 4096, 900);
    }
    assert_eq!(server.rows(), client.rows());
    assert!(client.has(" TX depth        : 128"));
    assert!(client.has(" CQ Moderation   : 100"));
    assert!(client.has(" Mtu             : 1024[B]"));
    assert!(!server.has(" TX depth        : 128"));
}

#[test]
fn read_bw_in_gigabits() {
    let addresses = ["127.0.0.93", "127.0.0.94"];
    let args = ["-n", "100", "-m", "4096", "--report_gbits", "--check-data"];
    let (server, client) = run_pair("read-bw", addresses, 28902, &args);
    check_pair("RDMA_Read BW Test", (&server, &client), addresses);
    // READ: the client's buffer holds what the server's held.
    assert_eq!(landed(&client, &server), 65536);
    for side in [&server, &client] {
        assert!(side.has(" Mtu             : 4096[B]"));
        assert!(side.has(" Outstand reads  : 128"));
        assert!(side.has(&BW_COLUMNS.replace("MB/sec", "Gb/sec")));
        check_bw_row(&side.rows()[0], 65536, 100);
        let remote = side
            .stdout
            .iter()
            .find(|l| l.starts_with(" remote address:"))
            .unwrap();
        assert!(remote.contains(" OUT 0x80 RKey 0x"), "{remote}");
    }
}

#[test]
fn send_bw_every_size() {
    // -a: 2 bytes to 8 MiB, with a round before and after each size; both sides measure.
    let addresses = ["127.0.0.95", "127.0.0.96"];
    let args = ["-a", "-n", "5", "--check-data"];
    let (server, client) = run_pair("send-bw", addresses, 28903, &args);
    check_pair("Send BW Test", (&server, &client), addresses);
    assert_eq!(landed(&server, &client), 1 << 23);
    for side in [&server, &client] {
        let rows = side.rows();
        assert_eq!(rows.len(), 23);
        for (power, row) in (1..24).zip(&rows) {
            check_bw_row(row, 1 << power, 5);
        }
    }
    assert!(server.has(" RX depth        : 5"));
    assert!(client.has(" TX depth        : 5"));
}

#[test]
fn atomic_bw_compare_and_swap() {
    let addresses = ["127.0.0.97", "127.0.0.98"];
    let args = ["-A", "CMP_AND_SWAP", "-n", "200"];
    let (server, client) = run_pair("atomic-bw", addresses, 28904, &args);
    check_pair("Atomic CMP_AND_SWAP BW Test", (&server, &client), addresses);
    for side in [&server, &client] {
        check_bw_row(&side.rows()[0], 8, 200);
    }
}

#[test]
fn write_bw_for_a_duration_in_json() {
    // -D 1: a second, all of it sampled (the margin is a quarter, rounded down to 0 s).
    let addresses = ["127.0.0.99", "127.0.0.100"];
    let args = ["-D", "1", "-s", "1024", "--json"];
    let (server, client) = run_pair("write-bw", addresses, 28905, &args);
    for (who, side, peer) in [
        ("server", &server, addresses[1]),
        ("client", &client, addresses[0]),
    ] {
        assert!(side.status.success(), "{who}: {}", side.stderr);
        // Standard output is the document alone; the server's banner went to standard error.
        assert_eq!(side.stdout.len(), 1, "{who}: {:?}", side.stdout);
        assert_eq!(side.stderr.contains(WAITING), who == "server", "{who}");
        let doc: serde_json::Value = serde_json::from_str(&side.stdout[0]).unwrap();
        assert_eq!(doc["test_info"]["test"], "RDMA_Write_BW_Test");
        assert_eq!(doc["remote"][0]["GID"], format!("::ffff:{peer}"));
        let result = &doc["results"][0];
        assert_eq!(result["MsgSize"], 1024);
        assert!(result["n_iterations"].as_u64().unwrap() > 0, "{result}");
        assert!(result["BW_average"].as_f64().unwrap() > 0.0, "{result}");
        // No peak with -D.
        assert_eq!(result["BW_peak"], 0.0);
    }
}

#[test]
fn write_lat() {
    let addresses = ["127.0.0.101", "127.0.0.102"];
    let args = ["-s", "64", "-n", "200"];
    let (server, client) = run_pair("write-lat", addresses, 28906, &args);
    check_pair("RDMA_Write Latency Test", (&server, &client), addresses);
    // Both sides time the round trips. Without -m, the path MTU is the port's: 4096 on lo.
    for side in [&server, &client] {
        assert!(side.has(" Mtu             : 4096[B]"));
        assert!(side.has_prefix(LAT_COLUMNS));
        check_lat_row(&side.rows()[0], 64, 200);
    }
}

/// Also the engine on a thread of its own (`--progress thread`): the other tests run the
/// default, hybrid progress.
#[test]
fn read_lat() {
    let addresses = ["127.0.0.103", "127.0.0.104"];
    let args = ["-s", "3000", "-n", "100", "--progress", "thread"];
    let (server, client) = run_pair("read-lat", addresses, 28907, &args);
    check_pair("RDMA_Read Latency Test", (&server, &client), addresses);
    // Only the client times; the server prints no table, as ib_read_lat's.
    check_lat_row(&client.rows()[0], 3000, 100);
    assert!(server.rows().is_empty());
    assert!(!server.has_prefix(LAT_COLUMNS));
}

#[test]
fn send_lat() {
    // An odd iteration count: the receive depth is made even, as perftest makes it.
    let addresses = ["127.0.0.105", "127.0.0.106"];
    let args = ["-s", "2048", "-n", "151"];
    let (server, client) = run_pair("send-lat", addresses, 28908, &args);
    check_pair("Send Latency Test", (&server, &client), addresses);
    for side in [&server, &client] {
        check_lat_row(&side.rows()[0], 2048, 151);
    }
    assert!(server.has(" RX depth        : 152"));
}

/// `-R`: the exchange on an RDMA-CM control connection and three data QPs connected by
/// RDMA-CM on the same port; every byte written lands as sent.
#[test]
fn rdma_cm_write_bw_on_several_qps() {
    let addresses = ["127.0.0.111", "127.0.0.112"];
    let args = [
        "-R",
        "-q",
        "3",
        "-s",
        "4K",
        "-n",
        "200",
        "-m",
        "1024",
        "--check-data",
    ];
    let (server, client) = run_pair("write-bw", addresses, 28911, &args);
    check_pair("RDMA_Write BW Test", (&server, &client), addresses);
    assert_eq!(landed(&server, &client), 3 * 4096);
    for side in [&server, &client] {
        assert!(side.has(" rdma_cm QPs\t : ON"));
        assert!(side.has(" Data ex. method : rdma_cm"));
        check_bw_row(&side.rows()[0], 4096, 600);
    }
    assert!(server.has(" Waiting for client rdma_cm QP to connect"));
    assert_eq!(server.rows(), client.rows());
}

/// `--engines 2` on both sides: four data QPs connected by RDMA-CM, spread over two engine
/// threads per device, the CM on the first engine moving those of the second; every byte
/// written lands as sent.
#[test]
fn rdma_cm_write_bw_on_two_engines() {
    let addresses = ["127.0.0.134", "127.0.0.135"];
    let args = [
        "--engines",
        "2",
        "-R",
        "-q",
        "4",
        "-s",
        "64K",
        "-n",
        "200",
        "--check-data",
    ];
    let (server, client) = run_pair("write-bw", addresses, 28921, &args);
    check_pair("RDMA_Write BW Test", (&server, &client), addresses);
    assert_eq!(landed(&server, &client), 4 * 65536);
    for side in [&server, &client] {
        check_bw_row(&side.rows()[0], 65536, 800);
    }
}

/// `-R` with the latency test whose exchange has the most rounds, and READs.
#[test]
fn rdma_cm_read_lat_and_send_lat() {
    let addresses = ["127.0.0.113", "127.0.0.114"];
    let (server, client) = run_pair(
        "read-lat",
        addresses,
        28912,
        &["-R", "-s", "3000", "-n", "100"],
    );
    check_pair("RDMA_Read Latency Test", (&server, &client), addresses);
    check_lat_row(&client.rows()[0], 3000, 100);
    let (server, client) = run_pair(
        "send-lat",
        addresses,
        28913,
        &["-R", "-s", "64", "-n", "100"],
    );
    check_pair("Send Latency Test", (&server, &client), addresses);
    for side in [&server, &client] {
        check_lat_row(&side.rows()[0], 64, 100);
    }
}

#[test]
fn server_refuses_an_old_perftest() {
    let mut server = Tool::start(&["send-bw", "--bind", "127.0.0.107", "-p", "28909"]);
    assert!(server.wait_for(WAITING));
    let mut stream = TcpStream::connect(("127.0.0.107", 28909)).unwrap();
    let mut version = b"5.60".to_vec();
    version.resize(16, 0);
    stream.write_all(&version).unwrap();
    let server = server.end();
    assert_eq!(server.status.code(), Some(1), "{}", server.stderr);
    assert!(
        server
            .stderr
            .contains("the client runs perftest version \"5.60\""),
        "{}",
        server.stderr
    );
}

#[test]
fn server_refuses_malformed_keys() {
    let mut server = Tool::start(&["write-lat", "--bind", "127.0.0.108", "-p", "28910"]);
    assert!(server.wait_for(WAITING));
    let mut stream = TcpStream::connect(("127.0.0.108", 28910)).unwrap();
    // The version, the page and cache-line sizes and the MTU, each answered; then keys that
    // are not keys.
    let mut version = b"6.06".to_vec();
    version.resize(16, 0);
    for message in [&version[..], &[0, 0, 16, 0], &[0, 0, 0, 64], b"3\0"] {
        stream.write_all(message).unwrap();
        let mut answer = vec![0; message.len()];
        stream.read_exact(&mut answer).unwrap();
    }
    let mut keys = b"these are not keys".to_vec();
    keys.resize(108, 0);
    stream.write_all(&keys).unwrap();
    let server = server.end();
    assert_eq!(server.status.code(), Some(1), "{}", server.stderr);
    assert!(
        server
            .stderr
            .contains("the client's keys \"these are not keys\" are not perftest's"),
        "{}",
        server.stderr
    );
}

#[test]
fn usage_errors_are_perftests() {
    let refused = |args: &[&str]| {
        let tool = Tool::start(args).end();
        (tool.status.code(), tool.stderr)
    };
    let (code, stderr) = refused(&["atomic-bw", "-s", "16"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "softroce atomic-bw: Message size cannot be changed for Atomic tests\n"
    );
    let (code, stderr) = refused(&["send-lat", "-q", "2"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("Multiple QPs only available on bw tests"));
    let (code, stderr) = refused(&["write-bw", "-D", "2", "-a"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("Duration mode currently doesn't support running on all sizes."));
    let (code, stderr) = refused(&["read-bw", "-n", "4"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("Iteration num should be between 5 and 100000000"));
    // A perftest server calls nothing while its client runs: inline progress would leave
    // the client unanswered.
    let (code, stderr) = refused(&["write-bw", "--progress", "inline"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--progress inline is for the pingpong tools"));
    let (code, stderr) = refused(&["write-bw", "--backend", "raw", "--trains-per-qp"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--trains-per-qp is for the UDP backend"),
        "{stderr}"
    );
}
