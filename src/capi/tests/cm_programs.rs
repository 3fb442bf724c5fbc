//! librdmacm's own example programs, as Debian ships them, unmodified, over softroce's
//! librdmacm.so.1: connections made by softroce's CM between two processes on loopback.

mod common;

use std::time::Duration;

use common::{program, until_served};

const LIMIT: Duration = Duration::from_secs(60);

/// The Rust API's side of a test against a C program: the next REQ on `listener`, accepted
/// with a fresh RC QP on `pd` and `cq`, with default options and no private data.
fn accept_next(
    listener: &softroce::verbs::Listener,
    pd: &softroce::verbs::ProtectionDomain,
    cq: &softroce::verbs::CompletionQueue,
) -> softroce::verbs::Connection {
    let request = listener
        .next_request(Duration::from_secs(30))
        .unwrap()
        .expect("the program's REQ");
    let qp = pd.create_qp().send_cq(cq).recv_cq(cq).build().unwrap();
    let options = softroce::transport::ConnectOptions::default();
    request.accept(qp, &options, &[]).unwrap()
}

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

/// Synchronous IDs' `id->event`, which librdmacm sets to the event each synchronous call
/// waited for (cma.c `ucma_complete`, `rdma_get_request`): programs read the peer's private
/// data there. softroce's synchronous calls took their event and dropped it, and `id->event`
/// stayed null. Each side's QP is in RTS once its call returns, as the event says.
#[test]
fn a_synchronous_ids_event_is_the_one_its_call_waited_for() {
    let bin = common::compile_c("sync_events", include_str!("sync_events.c"), &["-lrdmacm"]);
    let bin = bin.to_str().unwrap();
    let (server, client) = until_served(
        "sync_events",
        program("127.0.3.66", bin, &["server", "127.0.3.66", "7499"]),
        || program("127.0.3.67", bin, &["client", "127.0.3.66", "7499"]),
        |out| out.contains("client done"),
        LIMIT,
    );
    for (out, line) in [
        (
            &client,
            "client's event before connecting: RDMA_CM_EVENT_ROUTE_RESOLVED",
        ),
        (&client, "established event carries the server's data: 1"),
        (&client, "client's qp state: 3"),
        (&server, "request's event carries the client's data: 1"),
        (&server, "server's event: RDMA_CM_EVENT_ESTABLISHED"),
        (&server, "server's qp state: 3"),
        (&server, "server done"),
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// A program that connects and exits without disconnecting: `rdma_destroy_ep` leaves the
/// connection, whose DREQ (IBTA 12.9.8.5; cma.c destroys a connected ID with
/// `ib_send_cm_dreq`) must reach the peer although the process exits right after. The
/// client's engine runs only inside its own calls (`SOFTROCE_PROGRESS=inline`): the DREQ goes
/// out only if the destroy itself hands it to the CM, not if a thread of the ID's would,
/// later. The peer is softroce's Rust API, which reports the end.
#[test]
fn a_program_that_exits_connected_still_sends_its_dreq() {
    use softroce::verbs::{ConnectionEvent, Device, DeviceConfig};

    let server = Device::open(DeviceConfig::udp("127.0.3.50".parse().unwrap())).unwrap();
    let (pd, cq) = (server.alloc_pd().unwrap(), server.create_cq(8).unwrap());
    let listener = server.listen(7195).unwrap();
    let client = common::compile_c(
        "exit_connected",
        r#"#include <stdio.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
int main(void) {
    struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
    struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
        .max_send_sge = 1, .max_recv_sge = 1 }, .sq_sig_all = 1 };
    struct rdma_cm_id *id;
    if (rdma_getaddrinfo("127.0.3.50", "7195", &hints, &res)) { perror("rdma_getaddrinfo"); return 1; }
    if (rdma_create_ep(&id, res, NULL, &attr)) { perror("rdma_create_ep"); return 1; }
    if (rdma_connect(id, NULL)) { perror("rdma_connect"); return 1; }
    printf("connected\n");
    rdma_destroy_ep(id);
    return 0;
}
"#,
        &["-lrdmacm", "-libverbs"],
    );
    let accepted = std::thread::spawn(move || accept_next(&listener, &pd, &cq));
    let mut run = program("127.0.3.51", client.to_str().unwrap(), &[]);
    run.env("SOFTROCE_PROGRESS", "inline");
    let output = common::finish("the client", run.spawn().unwrap(), LIMIT);
    assert!(
        common::succeeded("the client", &output).contains("connected"),
        "{output:?}"
    );
    let connection = accepted.join().unwrap();
    // The DREQ's one trip on loopback; without it the connection would stand until the QP's
    // first send timed out, and there is none.
    let ended = connection.wait_event(Duration::from_secs(5)).unwrap();
    assert_eq!(ended, Some(ConnectionEvent::Disconnected));
}

/// A program that moves its own QP, as UCX does: IDs without a QP, the QP from
/// `ibv_create_qp` named by `conn_param.qp_num`, taken through INIT, RTR and RTS with
/// `rdma_init_qp_attr`, and the client's `rdma_establish` after `CONNECT_RESPONSE`
/// (rdma_establish(3)); the server's ESTABLISHED follows its RTU. A WRITE and a SEND then
/// land in the server's buffer, and the client's `rdma_disconnect` reaches the server.
#[test]
fn a_program_that_moves_its_own_qp_connects_with_init_qp_attr_and_establish() {
    let own_qp = common::compile_c_with_common(
        "own_qp",
        include_str!("own_qp.c"),
        &["-lrdmacm", "-libverbs"],
    );
    let own_qp = own_qp.to_str().unwrap();
    let args = |role| [role, "127.0.3.54", "7196"];
    let (server, client) = until_served(
        "own_qp",
        program("127.0.3.54", own_qp, &args("server")),
        || program("127.0.3.55", own_qp, &args("client")),
        |out| out.contains("client: wrote and sent"),
        LIMIT,
    );
    assert!(
        server.contains("server: received \"ping\" and \"written\""),
        "{server}"
    );
    assert!(client.contains("wrote and sent"), "{client}");
}

/// What rping's threads may do at a disconnection, made deterministic in one (`held_events.c`):
/// the QP freed with `ibv_destroy_qp` while the ID lives on, and a later QP at its address
/// left alone when the peer's DISCONNECTED is taken (softroce wrote that event's ERR into
/// `id->qp`, freed); the ID destroyed while its event is held, and still readable through the
/// event until the ack (librdmacm's `rdma_destroy_id` waits for the ack; softroce's freed the
/// ID at once). `MALLOC_PERTURB_` makes freed memory read as its byte. The CQs librdmacm
/// makes for a QP given none have the ID as their context, which rdma_verbs.h asserts. And
/// taking an asynchronous ID's event leaves `id->event` alone, as librdmacm (cma.c sets it only
/// in a synchronous ID's calls): softroce wrote it from the thread taking the event, while
/// another may be in a call that holds the ID as `&mut`.
#[test]
fn an_id_and_a_qp_freed_under_a_held_event_are_not_touched() {
    use softroce::verbs::{Device, DeviceConfig};

    let server = Device::open(DeviceConfig::udp("127.0.3.56".parse().unwrap())).unwrap();
    let (pd, cq) = (server.alloc_pd().unwrap(), server.create_cq(8).unwrap());
    let listener = server.listen(7197).unwrap();
    let client = common::compile_c(
        "held_events",
        include_str!("held_events.c"),
        &["-lrdmacm", "-libverbs"],
    );
    // Each run's server accepts, and disconnects once the connection is established.
    let served = std::thread::spawn(move || {
        for _ in 0..2 {
            let connection = accept_next(&listener, &pd, &cq);
            connection.established().unwrap();
            connection.disconnect().unwrap();
        }
    });
    let run = |tunables: &str| {
        let mut run = program(
            "127.0.3.57",
            client.to_str().unwrap(),
            &["127.0.3.56", "7197"],
        );
        run.env("MALLOC_PERTURB_", "165")
            .env("GLIBC_TUNABLES", tunables);
        let output = common::finish("held_events", run.spawn().unwrap(), LIMIT);
        common::succeeded("held_events", &output)
    };
    // With its per-thread cache, glibc gives the QP made next the freed QP's memory; without
    // it, glibc perturbs every freed chunk (it does not those it caches).
    let cached = run("");
    let perturbed = run("glibc.malloc.tcache_count=0");
    served.join().unwrap();
    for (out, line) in [
        (&cached, "cq context is the id: 1"),
        (&cached, "asynchronous id's event unset: 1"),
        // Else the next check would not test anything.
        (&cached, "fresh qp at the old one's address: 1"),
        // IBV_QPS_RESET, not IBV_QPS_ERR.
        (&cached, "fresh qp state: 0"),
        (&perturbed, "held event's id context intact: 1"),
        (&perturbed, "done"),
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// A synchronous server's accept loop, stopped by another thread: `rdma_get_request` blocked
/// on a listener that `rdma_destroy_ep` destroys ends at once with -1 and `EINVAL`, and reads
/// nothing of the freed listener (it waited out its 90 s, then read it).
#[test]
fn destroying_a_listener_ends_a_wait_for_its_requests() {
    let source = r#"#include <errno.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
static struct rdma_cm_id *listener;
static void *accept_loop(void *arg) {
    struct rdma_cm_id *id;
    announce_tid();
    int ret = rdma_get_request(listener, &id);
    printf("rdma_get_request returned %d, errno %s\n", ret,
           ret ? (errno == EINVAL ? "EINVAL" : strerror(errno)) : "none");
    return arg;
}
int main(void) {
    struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
    pthread_t thread;
    if (rdma_getaddrinfo("127.0.3.58", "7198", &hints, &res)) { perror("rdma_getaddrinfo"); return 1; }
    if (rdma_create_ep(&listener, res, NULL, NULL)) { perror("rdma_create_ep"); return 1; }
    if (rdma_listen(listener, 0)) { perror("rdma_listen"); return 1; }
    pthread_create(&thread, NULL, accept_loop, NULL);
    if (!wait_blocked()) { fprintf(stderr, "the accept loop never blocked\n"); return 1; }
    rdma_destroy_ep(listener);
    pthread_join(thread, NULL);
    rdma_freeaddrinfo(res);
    return 0;
}
"#;
    let server = common::compile_c(
        "stopped_accept",
        &common::with_blocked_waiter(source),
        &["-lrdmacm", "-libverbs", "-lpthread"],
    );
    let child = program("127.0.3.58", server.to_str().unwrap(), &[])
        .spawn()
        .unwrap();
    let out = common::succeeded(
        "stopped_accept",
        &common::finish("stopped_accept", child, LIMIT),
    );
    assert!(
        out.contains("rdma_get_request returned -1, errno EINVAL"),
        "{out}"
    );
}

/// `rdma_migrate_id` takes the ID's events not yet read along to the new channel, in order:
/// an ADDR_RESOLVED queued on the first channel is read from the second, and the first is
/// left with nothing that names the ID (which its destroy would then free under it).
#[test]
fn a_migrated_id_takes_its_waiting_events_along() {
    let source = r#"#include <poll.h>
#include <stdio.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
static int readable(struct rdma_event_channel *ch, int ms) {
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    return poll(&p, 1, ms) == 1;
}
int main(void) {
    struct rdma_event_channel *first = rdma_create_event_channel();
    struct rdma_event_channel *second = rdma_create_event_channel();
    struct rdma_cm_id *id;
    struct rdma_cm_event *event;
    struct addrinfo *dst;
    if (getaddrinfo("127.0.3.60", "7199", NULL, &dst)) { fprintf(stderr, "getaddrinfo\n"); return 1; }
    if (rdma_create_id(first, &id, NULL, RDMA_PS_TCP)) { perror("rdma_create_id"); return 1; }
    if (rdma_resolve_addr(id, NULL, dst->ai_addr, 2000)) { perror("rdma_resolve_addr"); return 1; }
    if (!readable(first, 10000)) { fprintf(stderr, "no event on the first channel\n"); return 1; }
    if (rdma_migrate_id(id, second)) { perror("rdma_migrate_id"); return 1; }
    printf("first channel readable after the move: %d\n", readable(first, 0));
    if (!readable(second, 0)) { fprintf(stderr, "the event stayed behind\n"); return 1; }
    if (rdma_get_cm_event(second, &event)) { perror("rdma_get_cm_event"); return 1; }
    printf("moved: %s, of the id: %d\n", rdma_event_str(event->event), event->id == id);
    rdma_ack_cm_event(event);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(first);
    rdma_destroy_event_channel(second);
    freeaddrinfo(dst);
    return 0;
}
"#;
    let mover = common::compile_c("migrate_events", source, &["-lrdmacm", "-libverbs"]);
    let child = program("127.0.3.59", mover.to_str().unwrap(), &[])
        .spawn()
        .unwrap();
    let out = common::succeeded(
        "migrate_events",
        &common::finish("migrate_events", child, LIMIT),
    );
    for line in [
        "first channel readable after the move: 0",
        "moved: RDMA_CM_EVENT_ADDR_RESOLVED, of the id: 1",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// `listener_moves.c` as `mode` on 127.0.3.`host`, port 7200, and a connection to it from
/// softroce's Rust API on 127.0.3.`host + 1` once it listens: what the program printed, and the
/// connection's outcome.
fn listener_moves(mode: &str, host: u8) -> (String, softroce::verbs::Result<()>) {
    use softroce::verbs::{Connection, Device, DeviceConfig};
    use std::io::{BufRead, BufReader};

    let source = include_str!("listener_moves.c");
    // A name of its own per test: tests run at once, each compiling into one directory.
    let name = format!("listener_moves_{mode}");
    let server = common::compile_c(&name, source, &["-lrdmacm", "-libverbs"]);
    let (server_ip, client_ip) = (format!("127.0.3.{host}"), format!("127.0.3.{}", host + 1));
    let mut child = program(
        &server_ip,
        server.to_str().unwrap(),
        &[mode, &server_ip, "7200"],
    )
    .spawn()
    .unwrap();
    // Its lines as they come, so that a program that hangs fails the test rather than hang it.
    let (lines, printed) = std::sync::mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        out.lines()
            .map_while(Result::ok)
            .try_for_each(|l| lines.send(l))
    });
    let first = printed.recv_timeout(LIMIT).unwrap_or_default();
    assert_eq!(first, "listening", "the program did not listen");
    let client = Device::open(DeviceConfig::udp(client_ip.parse().unwrap())).unwrap();
    let (pd, cq) = (client.alloc_pd().unwrap(), client.create_cq(8).unwrap());
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = std::net::SocketAddr::new(server_ip.parse().unwrap(), 7200);
    let options = softroce::transport::ConnectOptions::default();
    let connected = Connection::connect_timeout(qp, to, &options, &[], Duration::from_secs(20));
    let outcome = connected.map(|connection| {
        let _ = connection.wait_event(Duration::from_secs(5));
    });
    // Up to its last line ("done"), or ten seconds without a line.
    let mut seen = vec![first];
    while let Ok(line) = printed.recv_timeout(Duration::from_secs(10)) {
        let done = line == "done";
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    let _ = child.wait();
    (format!("{}\nstderr:\n{stderr}", seen.join("\n")), outcome)
}

/// A listener moved to another channel with a request unread (`rdma_migrate_id`): the request
/// and its ID come on the new channel, and so do that ID's events after (its ESTABLISHED stayed
/// on the old channel, where the program no longer looked).
#[test]
fn a_listener_moved_with_a_request_unread_takes_the_requests_id_along() {
    let (out, connected) = listener_moves("migrate", 61);
    assert!(connected.is_ok(), "{connected:?}\n{out}");
    for line in [
        "request on the second channel: 1, its id there: 1",
        "then on the second channel: RDMA_CM_EVENT_ESTABLISHED",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// A listener destroyed with a request unread refuses it: the peer hears a REJ at once
/// (it waited out its own timeout before, the request's ID leaked).
#[test]
fn a_listener_destroyed_with_a_request_unread_refuses_it() {
    use softroce::cm::Failure;
    use softroce::verbs::Error;
    use softroce::wire::cm::RejReason;

    let (out, connected) = listener_moves("destroy", 63);
    assert!(out.contains("destroyed, the request unread"), "{out}");
    // The REJ a request's ID sends when dropped unanswered (cm/teardown.rs), not some other
    // failure (an unreachable device: a program that died), and not the connect's timeout.
    match connected {
        Err(Error::ConnectFailed {
            failure: Failure::Rejected { reason, .. },
            ..
        }) if reason == RejReason::CONSUMER_DEFINED => {}
        other => panic!("{other:?}:\n{out}"),
    }
}

/// Memory windows from C: a type 1 window from `ibv_alloc_mw`, bound over 512 bytes of the
/// program's region by `ibv_bind_mw`, which leaves the new rkey in `mw->rkey` and completes
/// with `IBV_WC_BIND_MW`. A READ through it returns the program's bytes; one that runs past the
/// window's end is refused (remote access error), though the region goes on.
#[test]
fn a_window_bound_by_ibv_bind_mw_serves_reads_within_its_range() {
    use softroce::memory::Access;
    use softroce::transport::{Payload, RecvWr, SendOp, SendWr, WcStatus};
    use softroce::verbs::{Device, DeviceConfig};
    use softroce::wire::RKey;

    let server = Device::open(DeviceConfig::udp("127.0.3.70".parse().unwrap())).unwrap();
    let (pd, cq) = (server.alloc_pd().unwrap(), server.create_cq(8).unwrap());
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let listener = server.listen(7201).unwrap();
    let client = common::compile_c_with_common(
        "memory_windows",
        include_str!("memory_windows.c"),
        &["-lrdmacm", "-libverbs"],
    );
    let served = std::thread::spawn(move || {
        let connection = accept_next(&listener, &pd, &cq);
        // The program's SEND waits out RNR NAKs until this is posted (rnr_retry_count 7).
        connection
            .qp()
            .post_recv(RecvWr::new(1, mr.sge(0, 64).unwrap()))
            .unwrap();
        connection.established().unwrap();
        let next = || {
            cq.wait(Duration::from_secs(10))
                .unwrap()
                .expect("a completion")
        };
        let told = next();
        assert_eq!(
            (told.wr_id, told.status, told.byte_len),
            (1, WcStatus::Success, 12)
        );
        let mut window_at = [0u8; 12];
        mr.read(0, &mut window_at).unwrap();
        let addr = u64::from_ne_bytes(window_at[..8].try_into().unwrap());
        let rkey = RKey(u32::from_ne_bytes(window_at[8..].try_into().unwrap()));
        let read = |wr_id, remote_addr, len| {
            let op = SendOp::Read { remote_addr, rkey };
            let sge = mr.sge(1024, len).unwrap();
            connection
                .qp()
                .post_send(SendWr::new(wr_id, op, Payload::Sges([sge].into())))
                .unwrap();
            next()
        };
        let within = read(2, addr, 512);
        assert_eq!(within.status, WcStatus::Success, "{within:?}");
        let mut got = vec![0u8; 512];
        mr.read(1024, &mut got).unwrap();
        let expected: Vec<u8> = (1024..1536u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(got, expected, "the window's bytes");
        // The region goes on past the window; the window does not.
        let past = read(3, addr + 504, 16);
        assert_eq!(past.status, WcStatus::RemAccessErr, "{past:?}");
        connection.disconnect().unwrap();
    });
    let mut run = program(
        "127.0.3.71",
        client.to_str().unwrap(),
        &["127.0.3.70", "7201"],
    );
    let output = common::finish("memory_windows", run.spawn().unwrap(), LIMIT);
    served.join().unwrap();
    let out = common::succeeded("memory_windows", &output);
    for line in [
        "window type 1: 1",
        "rkey changed by the bind: 1",
        "bind completion: wr_id 7 status 0 opcode 1",
        "send completion: wr_id 8 status 0",
        "done",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}
