//! The calls rdma-core 44 has beyond the first verbs (issue 50, item 2), through softroce's
//! library as a program meets them (`c/newer_verbs.c`): what a softroce device can do is done
//! as rdma-core does it, and what it cannot is answered as rdma-core answers for a device
//! without the feature.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{finish, program, run_c_expecting, succeeded, C_LIMIT};

const SOURCE: &str = include_str!("c/newer_verbs.c");
const LIBS: [&str; 2] = ["-lrdmacm", "-libverbs"];

/// `newer_verbs MODE`, run over Debian's library (`ours` false, with neither
/// `LD_LIBRARY_PATH` nor `LD_PRELOAD`, so that it cannot be softroce's) or softroce's, with
/// `SYSFS_PATH` as given: what it printed.
fn run_over(path: &std::path::Path, mode: &str, ours: bool, sysfs: Option<&str>) -> String {
    let mut command = Command::new(path);
    command
        .arg(mode)
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD");
    if ours {
        command.env("LD_LIBRARY_PATH", common::lib_dir());
    } else {
        command.env_remove("LD_LIBRARY_PATH");
    }
    match sysfs {
        Some(dir) => command.env("SYSFS_PATH", dir),
        None => command.env_remove("SYSFS_PATH"),
    };
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Asserts `debian`'s lines and `softroce`'s are the same, one by one.
fn same_lines(debian: &str, softroce: &str) {
    for (a, b) in debian.lines().zip(softroce.lines()) {
        assert_eq!(a, b, "Debian's library, then softroce's");
    }
    assert_eq!(debian.lines().count(), softroce.lines().count());
}

/// The rate conversions and the sysfs path, as Debian's libibverbs answers them, value for
/// value: the same program runs over both libraries, with and without `SYSFS_PATH`.
#[test]
fn rates_and_the_sysfs_path_are_rdma_cores() {
    let path = common::compile_c_with_common("newer_verbs_rates", SOURCE, &LIBS);
    for sysfs in [None, Some("/tmp/sysfs//"), Some("/")] {
        let debian = run_over(&path, "rates", false, sysfs);
        assert!(debian.contains("rate 17: mult -1, mbps 206250"), "{debian}");
        same_lines(&debian, &run_over(&path, "rates", true, sysfs));
    }
}

/// The kernel ABI's copy helpers (`ibv_copy_*_kern`) write what Debian's libibverbs writes,
/// byte for byte, and leave what it leaves.
#[test]
fn the_kernel_abi_copies_are_rdma_cores() {
    let path = common::compile_c_with_common("newer_verbs_marshall", SOURCE, &LIBS);
    let debian = run_over(&path, "marshall", false, None);
    assert_eq!(debian.lines().count(), 9, "{debian}");
    same_lines(&debian, &run_over(&path, "marshall", true, None));
}

/// rsockets has no protocol behind it yet: `rsocket` fails with `EOPNOTSUPP`, a call on any
/// other descriptor with `EBADF`, and `rselect` and `rpoll` are select(2) and poll(2).
#[test]
fn rsockets_cannot_be_made_and_poll_and_select_are_the_systems() {
    run_c_expecting(
        "newer_verbs_rsockets",
        SOURCE,
        &LIBS,
        "127.0.50.11",
        &["rsockets"],
        &[
            "rsocket: 1",
            "not an rsocket: 1",
            "rselect: 1, rpoll: 1",
            "done",
        ],
    );
}

/// The GID table (one RoCE v2 GID on `lo`, as `ibv_query_gid` and `ibv_query_gid_ex` give it),
/// and the features a softroce device lacks, each `EOPNOTSUPP` as for rxe: dma-buf regions,
/// imports, ECE on a QP; no promise of in-order data; the connection unharmed after.
#[test]
fn the_gid_table_and_the_features_a_device_lacks() {
    run_c_expecting(
        "newer_verbs_device",
        SOURCE,
        &LIBS,
        "127.0.50.4,127.0.50.5",
        &["device"],
        &[
            "gid table: 1, entry: 1",
            "gid entry: 1",
            "table too small: 1, flags: 1",
            "dmabuf: 1",
            "imports: 1",
            "pd after unimport: 1",
            "ece: 1 1",
            "data in order: 0",
            "write: 1",
            "done",
        ],
    );
}

/// `rdma_create_srq` gives the ID an SRQ on its PD (or the one given), which takes receives and
/// which `rdma_create_qp` gives the ID's QP; `rdma_destroy_srq` takes it away. A PD the
/// program freed after its QP went is never the one an SRQ made without a PD takes. ECE on an ID is
/// checked as librdmacm checks it; no peer's offer is reported (softroce's CM carries none).
#[test]
fn an_ids_srq_serves_its_qp() {
    run_c_expecting(
        "newer_verbs_srq",
        SOURCE,
        &LIBS,
        "127.0.50.6",
        &["srq", "127.0.50.6"],
        &[
            "ece: no vendor refused 1, offered 1, remote none 1",
            "srq_ex without a type: 1",
            "xrc srq: 1",
            "srq: 1, on the id's pd: 1",
            "a second srq: 1",
            "srq takes receives: 1",
            "qp on the srq: 1",
            "ece with a qp: 1",
            "srq gone: 1",
            "srq on a given pd: 1, pd freed after: 1",
            "a freed pd: taken 1, freed 1, not the id's 1, srq_ex on the id's 1",
            "multicast: 1",
            "done",
        ],
    );
}

/// `rdma_reject_ece` rejects with reason 35 (vendor option not supported), where
/// `rdma_reject` sends 28: the peer learns which, with the private data.
#[test]
fn rdma_reject_ece_rejects_for_an_unsupported_option() {
    use softroce::cm::Failure;
    use softroce::verbs::{Connection, Device, DeviceConfig, Error};
    use softroce::wire::cm::RejReason;

    let path = common::compile_c_with_common("newer_verbs_reject", SOURCE, &LIBS);
    let server = "127.0.50.7";
    let mut child = program(server, path.to_str().unwrap(), &["reject", server, "7301"])
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "listening");
    let client = Device::open(DeviceConfig::udp("127.0.50.8".parse().unwrap())).unwrap();
    let (pd, cq) = (client.alloc_pd().unwrap(), client.create_cq(8).unwrap());
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = SocketAddr::new(server.parse().unwrap(), 7301);
    let options = softroce::transport::ConnectOptions::default();
    let refused = Connection::connect_timeout(qp, to, &options, &[], Duration::from_secs(20));
    match refused {
        Err(Error::ConnectFailed {
            failure:
                Failure::Rejected {
                    reason,
                    private_data,
                },
            ..
        }) => {
            assert_eq!(reason, RejReason::VENDOR_OPTION_NOT_SUPPORTED);
            assert_eq!(&private_data[..2], b"no");
        }
        other => panic!("{:?}", other.map(|_| "connected")),
    }
    child.stdout = Some(out.into_inner());
    let output = finish("newer_verbs_reject", child, C_LIMIT);
    let printed = succeeded("newer_verbs_reject", &output);
    assert!(
        printed.contains("request's ece none: 1, rejected: 1"),
        "{printed}"
    );
}

/// A datagram's receive completion says, in `sl`, which header the GRH area holds, as ConnectX
/// says it (the PRM's packet type: 8 for a UDP header, plus 2 for IPv4), where UCX 1.13 reads
/// it to find the destination GID; kernel rxe says 0 there, and UCX then drops every datagram.
#[test]
fn a_datagrams_completion_says_its_header_as_connectx_does() {
    run_c_expecting(
        "newer_verbs_ud",
        SOURCE,
        &LIBS,
        "127.0.50.9,127.0.50.10",
        &["ud"],
        &[
            "sl: 10, grh: 1, ipv4 header: 1, destination: 1, data: 1",
            "reply address: 1",
            "done",
        ],
    );
}

/// The extended verbs, as rxe's provider has them (`c/extended.c`): before, `ibv_create_cq_ex`
/// and `ibv_create_qp_ex` with `send_ops_flags` answered `EOPNOTSUPP` and `ibv_qp_to_qp_ex`
/// null, so a program written against `ibv_wr_*` (pyverbs' `QPEx`, rdma-core's tests) could not
/// run.
#[test]
fn the_extended_cq_and_qp_post_and_poll_every_operation() {
    run_c_expecting(
        "extended",
        include_str!("c/extended.c"),
        &["-lrdmacm", "-libverbs", "-lpthread"],
        "127.0.50.12,127.0.50.13",
        &[],
        &[
            "write posted: 0",
            "write completed: 1",
            "write landed: 1",
            "write with immediate posted: 0",
            "immediate received: 1",
            "inline landed: 1",
            "batch posted: 0",
            "batch completed: 1",
            "send received: 1",
            "read returned: 1",
            "fetch and add: 1",
            "compare and swap: 1",
            "setter before an operation: 1",
            "inline beyond the limit: 1",
            "inline READ: 1",
            "a batch beyond the queue: 1",
            "nothing posted: 1",
            "ibv_poll_cq on it: 1",
            "plain QP has no qp_ex: 1",
            "ibv_query_device_ex: 1",
            "timestamps refused: 1",
            "UD WRITE refused: 1",
            "two threads' batches: 0 refused",
            "UD send without an address: 1",
            "UD send posted: 0",
            "UD received: 1",
            "UD sl says IPv4: 1",
            "UD send completed: 1",
            "rdma_create_qp_ex has qp_ex: 1",
            "done",
        ],
    );
}

/// librdmacm's address calls as the kernel and rdma-core answer them, which libfabric's verbs
/// provider relies on (`c/cm_addresses.c`): before, `rdma_getaddrinfo` with the addresses only
/// in the hints failed with EINVAL, a bind to `localhost` with EADDRNOTAVAIL, port 0 stayed 0
/// (so a listener named itself with port 0), and two IDs could bind one port.
#[test]
fn rdma_cm_addresses_as_the_kernel_gives_them() {
    run_c_expecting(
        "cm_addresses",
        include_str!("c/cm_addresses.c"),
        &["-lrdmacm", "-libverbs"],
        "127.0.50.14",
        &["127.0.50.14"],
        &[
            "addresses from the hints: 1",
            "no addresses at all: 1",
            "localhost binds the device: 1",
            "port 0 is an ephemeral port: 1",
            "it listens there: 1",
            "a bound ID binds once: 1",
            "a port held: 1",
            "free again: 1",
            "done",
        ],
    );
}
