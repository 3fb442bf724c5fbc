//! The RDMA-CM verbs on two devices on loopback: what the sans-IO tests (`src/cm/tests.rs`)
//! cannot show, the device's own waits.
use std::time::{Duration, Instant};

mod tool;

use softroce::cm::{ib_timeout, CmConfig};
use softroce::transport::ConnectOptions;
use softroce::verbs::{Connection, ConnectionEvent, Device, DeviceConfig, Error};

const WAIT: Duration = Duration::from_secs(10);

/// A device at `address` whose REQs announce a response time of 4.096 µs × 2^18, 1.07 s.
fn device(address: &str) -> Device {
    let mut config = DeviceConfig::udp(address.parse().unwrap());
    config.cm = CmConfig {
        response_timeout: 18,
        ..CmConfig::default()
    };
    Device::open(config).unwrap()
}

fn connection(device: &Device) -> Result<Connection, Error> {
    let pd = device.alloc_pd()?;
    let cq = device.create_cq(4)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    Connection::connect(
        qp,
        "127.0.0.71:7174".parse().unwrap(),
        &ConnectOptions::default(),
        &[],
    )
}

/// The side that answers a DREQ cannot know its DREP arrived; the peer sends its DREQ again
/// after the response time the REQ announced (cm.c `cm_req_handler`). `Device::linger` waits
/// that long, and an eighth more, so that a process that exits next does not leave the peer
/// retrying; the side whose DREQ was answered has nothing to wait for.
#[test]
fn linger_waits_out_the_peers_dreq_period_after_answering_its_dreq() {
    let server = device("127.0.0.71");
    let listener = server.listen(7174).unwrap();
    let accepted = std::thread::spawn(move || {
        let request = listener.next_request(WAIT).unwrap().expect("a request");
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(4).unwrap();
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
        let conn = request.accept(qp, &ConnectOptions::default(), &[]).unwrap();
        (server, conn)
    });
    let client = device("127.0.0.72");
    let conn = connection(&client).unwrap();
    let (server, server_conn) = accepted.join().unwrap();
    assert!(client.linger(WAIT).unwrap(), "nothing is in flight yet");

    // Before the DREQ, so that the time measured is no more than the client's linger.
    let asked = Instant::now();
    server_conn.disconnect().unwrap();
    assert_eq!(
        conn.wait_event(WAIT).unwrap(),
        Some(ConnectionEvent::Disconnected)
    );
    assert!(
        !client.linger(Duration::from_millis(1)).unwrap(),
        "the server could still send its DREQ again"
    );
    assert!(
        server.linger(WAIT).unwrap(),
        "the server's DREQ was answered"
    );
    assert!(client.linger(WAIT).unwrap());
    let period = ib_timeout(18);
    assert!(
        asked.elapsed() >= period + period / 8,
        "the client lingered {:?}, less than its peer's DREQ period",
        asked.elapsed()
    );
    let (counters, _) = client.cm_counters().unwrap();
    assert_eq!(counters.unknown_dreqs_answered, 0);
}

/// A connection closed and its device dropped at once still ends at the peer: the close
/// queues the DREQ, and the engine sends what is queued before it stops (which it also does
/// when the close and the shutdown reach it in one batch, a race this test cannot force). And
/// `Device::flush` returns once what is queued is in the socket, as a process that exits next
/// needs (softroce's C library calls it at exit, since nothing drops its devices then).
#[test]
fn a_dropped_device_still_sends_the_dreq_it_queued_and_flush_says_when() {
    let server = device("127.0.0.73");
    let listener = server.listen(7175).unwrap();
    let accepted = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..2 {
            let request = listener.next_request(WAIT).unwrap().expect("a request");
            let pd = server.alloc_pd().unwrap();
            let cq = server.create_cq(4).unwrap();
            let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
            conns.push(request.accept(qp, &ConnectOptions::default(), &[]).unwrap());
        }
        (server, conns)
    });
    let connect = |client: &Device| {
        let pd = client.alloc_pd().unwrap();
        let cq = client.create_cq(4).unwrap();
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
        let to = "127.0.0.73:7175".parse().unwrap();
        Connection::connect(qp, to, &ConnectOptions::default(), &[]).unwrap()
    };
    let dropped = device("127.0.0.74");
    let conn = connect(&dropped);
    conn.close();
    drop(conn);
    drop(dropped);
    let flushed = device("127.0.0.75");
    let conn = connect(&flushed);
    let (_server, conns) = accepted.join().unwrap();
    conn.close();
    assert!(flushed.flush(WAIT).unwrap());
    for server_conn in &conns {
        assert_eq!(
            server_conn.wait_event(WAIT).unwrap(),
            Some(ConnectionEvent::Disconnected)
        );
    }
}

/// A connect has a timeout of its own, shorter than the CM's retries: toward a peer that
/// answers nothing (a device whose engine runs only in its calls, and which makes none), it
/// fails with `TimedOut` when the time is up.
#[test]
fn a_connect_to_a_silent_peer_gives_up_at_its_timeout() {
    let mut config = DeviceConfig::udp("127.0.6.31".parse().unwrap());
    config.progress = softroce::verbs::Progress::Inline;
    let silent = Device::open(config).unwrap();
    let _listener = silent.listen(7178).unwrap();
    let client = device("127.0.6.32");
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = "127.0.6.31:7178".parse().unwrap();
    let tried = Connection::connect_timeout(
        qp,
        to,
        &ConnectOptions::default(),
        &[],
        Duration::from_millis(300),
    );
    assert!(
        matches!(
            tried,
            Err(Error::ConnectFailed {
                failure: softroce::cm::Failure::TimedOut,
                ..
            })
        ),
        "{tried:?}"
    );
}

/// The CM's timers run while nothing arrives: an idle engine does not look at its
/// connections' timers every turn, only at the deadline its last look found, so a REQ to a
/// peer that answers nothing must still be sent again at each request period. The client's
/// application waits in its connect meanwhile, and its engine's thread sleeps until that
/// deadline. A request period of about 100 ms (a response time of 4.096 µs × 2^14 and twice a
/// packet life time of 2^12) in a wait of 450 ms: two, and no more than the time passed allows.
#[test]
fn an_unanswered_req_is_sent_again_at_each_request_period_with_no_traffic() {
    let mut silent_config = DeviceConfig::udp("127.0.6.35".parse().unwrap());
    silent_config.progress = softroce::verbs::Progress::Inline;
    let silent = Device::open(silent_config).unwrap();
    let _listener = silent.listen(7179).unwrap();
    let mut config = DeviceConfig::udp("127.0.6.36".parse().unwrap());
    config.cm = CmConfig {
        response_timeout: 14,
        packet_life_time: 12,
        ..CmConfig::default()
    };
    let period = config.cm.request_period();
    let client = Device::open(config).unwrap();
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let waited = Duration::from_millis(450);
    let began = Instant::now();
    let tried = Connection::connect_timeout(
        qp,
        "127.0.6.35:7179".parse().unwrap(),
        &ConnectOptions::default(),
        &[],
        waited,
    );
    assert!(tried.is_err(), "the silent peer answered: {tried:?}");
    let (counters, _) = client.cm_counters().unwrap();
    // Bounded by the time that really passed: a loaded machine may end the wait late.
    let expected = (began.elapsed().as_millis() / period.as_millis()) as u64;
    assert!(
        (2..=expected).contains(&counters.retransmissions),
        "{} retransmissions of the REQ in {waited:?}, a period of {period:?}",
        counters.retransmissions
    );
}

/// A connect to an address where no RoCE device listens fails fast: the kernel answers the REQ
/// with an ICMP port unreachable (on loopback at once), which ends the attempt with
/// `Unreachable` while its REQ is unanswered, as it ends a TCP connect, instead of after a
/// minute of retries. The report is counted by the io layer and by the CM.
#[test]
fn a_connect_to_an_address_with_no_device_fails_with_unreachable() {
    let client = device("127.0.6.33");
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let nobody = "127.0.6.34:7174".parse().unwrap();
    let tried = Connection::connect_timeout(qp, nobody, &ConnectOptions::default(), &[], WAIT);
    assert!(
        matches!(
            tried,
            Err(Error::ConnectFailed {
                failure: softroce::cm::Failure::Unreachable,
                ..
            })
        ),
        "{tried:?}"
    );
    // In a user's words, with the address.
    assert_eq!(
        tried.err().unwrap().to_string(),
        "no RoCE device at 127.0.6.34 (UDP 4791 unreachable)"
    );
    let (_, io) = client.counters().unwrap();
    assert!(io.icmp_unreachable >= 1, "{io:?}");
    let (cm, _) = client.cm_counters().unwrap();
    assert_eq!(cm.icmp_accepted, 1);
}

/// A connect to a device with no listener on the port is rejected at once (REJ 8, invalid
/// service ID), and says so in a user's words, with the address and port.
#[test]
fn a_connect_to_a_port_with_no_listener_says_so() {
    let _server = device("127.0.6.40");
    let client = device("127.0.6.41");
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = "127.0.6.40:7175".parse().unwrap();
    let tried = Connection::connect_timeout(qp, to, &ConnectOptions::default(), &[], WAIT);
    let Err(error) = tried else {
        panic!("no listener, and the connect succeeded");
    };
    assert_eq!(
        error.to_string(),
        "no listener on 127.0.6.40:7175 (REJ 8, invalid service ID)"
    );
    // The REJ's zero-padded private data stays out of Debug.
    assert!(!format!("{error:?}").contains("private_data"), "{error:?}");
}

/// How `conn` ended, awaited (`Connection::ended`) for up to [`WAIT`].
fn ended_within(conn: &Connection) -> ConnectionEvent {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(async { tokio::time::timeout(WAIT, conn.ended()).await })
        .expect("the connection ended in time")
        .unwrap()
}

/// A QP that went to ERROR left its connection standing: after a WRITE with a bad rkey both
/// QPs were in ERROR, yet `is_connected()` stayed true on both sides and the server's `ended()`
/// never resolved, so a task per connection sat on a dead QP until the client left. Now each
/// QP's failure ends its connection, with the event that says why: the responder's access
/// error, the requester's fatal error (its request refused for good). The CM's connection
/// stands until it is disconnected, as librdmacm reports nothing for a QP's error
/// (`wait_cm_end`), and the disconnect ends it as before.
#[test]
fn a_qp_that_fails_ends_its_connection_on_both_sides() {
    use softroce::memory::Access;
    use softroce::transport::{AsyncEvent, Payload, SendOp, SendWr, WcStatus};

    let server = device("127.0.6.42");
    let listener = server.listen(7176).unwrap();
    let accepted = std::thread::spawn(move || {
        let request = listener.next_request(WAIT).unwrap().expect("a request");
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(4).unwrap();
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
        let options = ConnectOptions {
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..ConnectOptions::default()
        };
        let conn = request.accept(qp, &options, &[]).unwrap();
        (server, conn)
    });
    let client = device("127.0.6.43");
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = "127.0.6.42:7176".parse().unwrap();
    let conn = Connection::connect(qp, to, &ConnectOptions::default(), &[]).unwrap();
    let (_server, server_conn) = accepted.join().unwrap();
    assert!(conn.is_connected() && server_conn.is_connected());

    let op = SendOp::Write {
        remote_addr: 0x1000,
        rkey: softroce::wire::RKey(0xbad),
    };
    let write = SendWr::new(1, op, Payload::Sges([mr.sge(0, 8).unwrap()].into()));
    conn.post_send(write).unwrap();
    let wc = cq.wait(WAIT).unwrap().expect("the WRITE's completion");
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    let server_end = ended_within(&server_conn);
    let server_qpn = server_conn.qp().qpn();
    assert_eq!(
        server_end,
        ConnectionEvent::QpFailed(AsyncEvent::QpAccessError { qpn: server_qpn })
    );
    let client_qpn = conn.qp().qpn();
    assert_eq!(
        conn.wait_event(WAIT).unwrap(),
        Some(ConnectionEvent::QpFailed(AsyncEvent::QpFatal {
            qpn: client_qpn
        }))
    );
    assert!(!conn.is_connected() && !server_conn.is_connected());
    assert_eq!(server_conn.wait_cm_end(Duration::ZERO).unwrap(), None);

    conn.disconnect().unwrap();
    assert_eq!(
        server_conn.wait_cm_end(WAIT).unwrap(),
        Some(ConnectionEvent::Disconnected)
    );
    assert_eq!(
        conn.wait_cm_end(WAIT).unwrap(),
        Some(ConnectionEvent::Disconnected)
    );
}

/// A client whose last request was acknowledged and that now only waits for its peer (the
/// reply to a SEND, say) waited for ever when the peer's process was killed: no request of
/// its own could go unanswered, so no completion came and `ended()` never resolved. With
/// keepalive, on by default for a `Connection` (`DeviceConfig::keepalive`; 300 ms here, 30 s
/// by default), the idle QP probes a peer it has not heard from, and the connection ends
/// with `QpFailed(QpFatal)` once the probes go unanswered. The peer is `softroce rping`'s
/// server in a process of its own, killed with SIGKILL; alive, it answers every probe.
#[test]
fn a_peer_killed_with_sigkill_ends_an_idle_connection() {
    use softroce::transport::AsyncEvent;

    let mut server = tool::Tool::start(&["rping", "-s", "-a", "127.0.6.44", "-p", "7177", "-d"]);
    assert!(server.wait_for("rdma_listen"), "the server did not start");
    let client = device("127.0.6.45");
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(4).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let to = "127.0.6.44:7177".parse().unwrap();
    let conn = Connection::connect(qp, to, &ConnectOptions::default(), &[]).unwrap();
    let keepalive = Duration::from_millis(300);
    conn.set_keepalive(Some(keepalive)).unwrap();

    // Alive, the peer answers the probes: several intervals idle end nothing.
    assert_eq!(conn.wait_event(keepalive * 5).unwrap(), None);
    assert!(conn.is_connected());
    let probed = client.counters().unwrap().0.keepalive_probes;
    assert!(probed > 0, "an idle connection was not probed");

    server.signal("KILL");
    let killed = Instant::now();
    let ended = ended_within(&conn);
    let qpn = conn.qp().qpn();
    assert_eq!(
        ended,
        ConnectionEvent::QpFailed(AsyncEvent::QpFatal { qpn })
    );
    // Eight probes a quarter interval (75 ms) apart, after up to an interval and a sweep.
    assert!(killed.elapsed() >= keepalive * 2, "{:?}", killed.elapsed());
    assert!(!conn.is_connected());
    server.end();
}
