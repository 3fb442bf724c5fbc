//! perftest's programs, as Debian ships them, unmodified, over softroce's libibverbs.so.1 and
//! librdmacm.so.1: every test, with perftest's own exchange and with RDMA-CM (`-R`), on 4 QPs,
//! and against softroce's own perftest tools.

mod common;

use std::time::Duration;

use common::{has_result_line, program, softroce, until_served};

const LIMIT: Duration = Duration::from_secs(90);

const TESTS: [(&str, &str); 7] = [
    ("ib_write_bw", "write-bw"),
    ("ib_read_bw", "read-bw"),
    ("ib_send_bw", "send-bw"),
    ("ib_atomic_bw", "atomic-bw"),
    ("ib_write_lat", "write-lat"),
    ("ib_read_lat", "read-lat"),
    ("ib_send_lat", "send-lat"),
];

/// Runs `test` with `extra` flags between two processes, server on `addrs.0`; both must
/// succeed and the client print its result line.
fn both_over_softroce(test: &str, extra: &[&str], addrs: (&str, &str), port: u16) {
    let port = port.to_string();
    let mut args = vec!["-x", "0", "-n", "100", "-p", &port];
    args.extend_from_slice(extra);
    let client_args: Vec<&str> = args.iter().copied().chain([addrs.0]).collect();
    let (_, client) = until_served(
        test,
        program(addrs.0, test, &args),
        || program(addrs.1, test, &client_args),
        has_result_line,
        LIMIT,
    );
    assert!(
        has_result_line(&client),
        "{test} {extra:?}: no result line:\n{client}"
    );
}

#[test]
fn every_perftest_program_over_softroce() {
    for (n, (test, _)) in TESTS.iter().enumerate() {
        both_over_softroce(test, &[], ("127.0.3.40", "127.0.3.41"), 18800 + n as u16);
    }
}

#[test]
fn every_perftest_program_with_rdma_cm() {
    for (n, (test, _)) in TESTS.iter().enumerate() {
        both_over_softroce(
            test,
            &["-R"],
            ("127.0.3.42", "127.0.3.43"),
            18810 + n as u16,
        );
    }
}

#[test]
fn the_bandwidth_programs_on_four_qps() {
    for (n, (test, _)) in TESTS.iter().take(4).enumerate() {
        both_over_softroce(
            test,
            &["-q", "4"],
            ("127.0.3.44", "127.0.3.45"),
            18820 + n as u16,
        );
    }
}

/// perftest's program on one side, softroce's own tool on the other, each way round, with
/// perftest's exchange and with RDMA-CM.
#[test]
fn perftest_against_softroces_own_tools() {
    let (server_addr, client_addr) = ("127.0.3.46", "127.0.3.47");
    let mut port = 18830;
    for (test, ours) in [TESTS[0], TESTS[1], TESTS[6]] {
        for cm in [false, true] {
            for perftest_serves in [true, false] {
                port += 1;
                let p = port.to_string();
                let mut args = vec!["-x", "0", "-n", "100", "-p", p.as_str()];
                if cm {
                    args.push("-R");
                }
                let tool: Vec<&str> = std::iter::once(ours).chain(args.iter().copied()).collect();
                let mut tool_client = tool.clone();
                tool_client.push(server_addr);
                let mut perftest_client = args.clone();
                perftest_client.push(server_addr);
                let (_, client) = if perftest_serves {
                    until_served(
                        test,
                        program(server_addr, test, &args),
                        || softroce(client_addr, &tool_client),
                        has_result_line,
                        LIMIT,
                    )
                } else {
                    until_served(
                        test,
                        softroce(server_addr, &tool),
                        || program(client_addr, test, &perftest_client),
                        has_result_line,
                        LIMIT,
                    )
                };
                assert!(
                    has_result_line(&client),
                    "{test} and {ours}, -R {cm}, perftest serving {perftest_serves}: {client}"
                );
            }
        }
    }
}
