//! rdma-core's own verbs programs, as Debian ships them, unmodified, over softroce's
//! libibverbs.so.1: two processes on loopback, each with an address of its own.

mod common;

use std::time::Duration;

use common::{finish, pair, program, succeeded};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_and_ibv_devinfo_describe_the_device() {
    let out = program("127.0.3.9", "ibv_devices", &[]).output().unwrap();
    let listed = succeeded("ibv_devices", &out);
    assert!(listed.contains("softroce0"), "{listed}");
    assert!(
        listed.contains("02007ffffe000309"),
        "the GUID from the address: {listed}"
    );

    let out = program("127.0.3.9", "ibv_devinfo", &["-v"])
        .output()
        .unwrap();
    let info = succeeded("ibv_devinfo", &out);
    for expected in [
        "hca_id:\tsoftroce0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.3.9, RoCE v2",
        "max_qp_rd_atom:\t\t\t128",
    ] {
        assert!(info.contains(expected), "{expected:?} in:\n{info}");
    }
}

/// Each pingpong of rdma-core: RC, UC, UD and SRQ, validating every buffer received (`-c`).
#[test]
fn the_pingpongs_run_between_two_processes() {
    for (n, name) in [
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18700 + n).to_string();
        let common = ["-g", "0", "-c", "-n", "200", "-p", &port];
        let client: Vec<&str> = common.iter().copied().chain(["127.0.0.1"]).collect();
        let (server, client) = pair(
            name,
            ("127.0.3.1", "127.0.3.2"),
            &common,
            &client,
            18700 + n as u16,
            LIMIT,
        );
        for out in [server, client] {
            assert!(out.contains("200 iters in"), "{name}: {out}");
        }
    }
}

/// The client sleeps on its completion channel (`-e`): ibv_req_notify_cq, poll(2) on the
/// channel's descriptor inside ibv_get_cq_event, ibv_ack_cq_events.
#[test]
fn rc_pingpong_with_completion_events() {
    let args = ["-g", "0", "-c", "-e", "-n", "200", "-p", "18710"];
    let client: Vec<&str> = args.iter().copied().chain(["127.0.0.1"]).collect();
    pair(
        "ibv_rc_pingpong",
        ("127.0.3.3", "127.0.3.4"),
        &args,
        &client,
        18710,
        LIMIT,
    );
}

/// A second process on an address another one holds: the device does not open, and the
/// program's standard error says why and what to do.
#[test]
fn a_taken_address_is_refused_with_what_to_do() {
    let server = program("127.0.3.5", "ibv_rc_pingpong", &["-g", "0", "-p", "18711"])
        .spawn()
        .unwrap();
    common::wait_listening(18711, LIMIT);
    let second = program("127.0.3.5", "ibv_devinfo", &[]).output().unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        said.contains("127.0.3.5:4791 is taken") && said.contains("SOFTROCE_ADDR="),
        "{said}"
    );
    let mut server = server;
    let _ = server.kill();
    let _ = finish("ibv_rc_pingpong (server)", server, LIMIT);
}
