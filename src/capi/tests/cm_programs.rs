//! librdmacm's own example programs, as Debian ships them, unmodified, over softroce's
//! librdmacm.so.1: connections made by softroce's CM between two processes on loopback.

mod common;

use std::time::Duration;

use common::{program, until_served};

const LIMIT: Duration = Duration::from_secs(60);

/// rping: RDMA READs and WRITEs over a connection from `rdma_connect`, each verified (`-V`);
/// the client disconnects, and both sides must see it through their flushed work.
#[test]
fn rping_pings_and_verifies() {
    let (server, client) = until_served(
        "rping",
        program(
            "127.0.3.30",
            "rping",
            &[
                "-s",
                "-a",
                "127.0.3.30",
                "-p",
                "7190",
                "-C",
                "10",
                "-V",
                "-v",
            ],
        ),
        || {
            program(
                "127.0.3.31",
                "rping",
                &[
                    "-c",
                    "-a",
                    "127.0.3.30",
                    "-p",
                    "7190",
                    "-C",
                    "10",
                    "-V",
                    "-v",
                ],
            )
        },
        |out| out.contains("rdma-ping-9"),
        LIMIT,
    );
    assert_eq!(
        client.matches("ping data: rdma-ping-").count(),
        10,
        "{client}"
    );
    assert_eq!(
        server.matches("server ping data: rdma-ping-").count(),
        10,
        "{server}"
    );
}

/// ucmatose: SENDs both ways on RC connections, ended by the server's `rdma_disconnect`.
#[test]
fn ucmatose_connects_sends_and_disconnects() {
    let (server, client) = until_served(
        "ucmatose",
        program(
            "127.0.3.32",
            "ucmatose",
            &["-b", "127.0.3.32", "-p", "7491"],
        ),
        || {
            program(
                "127.0.3.33",
                "ucmatose",
                &["-s", "127.0.3.32", "-b", "127.0.3.33", "-p", "7491"],
            )
        },
        |out| out.contains("return status 0"),
        LIMIT,
    );
    for out in [server, client] {
        assert!(out.contains("return status 0"), "{out}");
    }
}

/// udaddy: UD service resolution (SIDR), an address handle from the event's `param.ud`, and
/// datagrams both ways (the server's reply address from `ibv_create_ah_from_wc`).
#[test]
fn udaddy_resolves_and_exchanges_datagrams() {
    let (server, client) = until_served(
        "udaddy",
        program("127.0.3.34", "udaddy", &["-b", "127.0.3.34"]),
        || {
            program(
                "127.0.3.35",
                "udaddy",
                &["-s", "127.0.3.34", "-b", "127.0.3.35"],
            )
        },
        |out| out.contains("return status 0"),
        LIMIT,
    );
    for out in [server, client] {
        assert!(out.contains("return status 0"), "{out}");
    }
}

/// rdma_server and rdma_client: synchronous IDs (`rdma_create_ep`, `rdma_get_request`), the
/// CQs and completion channels librdmacm makes for them, and a blocking `rdma_disconnect`.
#[test]
fn rdma_server_and_rdma_client_use_synchronous_ids() {
    let (server, client) = until_served(
        "rdma_server",
        program(
            "127.0.3.36",
            "rdma_server",
            &["-s", "127.0.3.36", "-p", "7492"],
        ),
        || {
            program(
                "127.0.3.37",
                "rdma_client",
                &["-s", "127.0.3.36", "-p", "7492"],
            )
        },
        |out| out.contains("rdma_client: end 0"),
        LIMIT,
    );
    assert!(server.contains("rdma_server: end 0"), "{server}");
    assert!(client.contains("rdma_client: end 0"), "{client}");
}
