//! RDMA-CM awaited: the listener's requests, accept and connect as futures, a connection's
//! end as a future, and a disconnect that does not wait for the peer. Devices on loopback,
//! on a current-thread tokio runtime, so that nothing but the futures waits.
use std::time::Duration;

use softroce::cm::CmConfig;
use softroce::transport::ConnectOptions;
use softroce::verbs::{
    Connection, ConnectionEvent, Device, DeviceConfig, Listener, Progress, QueuePair,
};

const LIMIT: Duration = Duration::from_secs(30);

/// A device at `address` with `cm`'s timers.
fn device(address: &str, progress: Progress, cm: CmConfig) -> Device {
    let mut config = DeviceConfig::udp(address.parse().unwrap());
    config.progress = progress;
    config.cm = cm;
    Device::open(config).unwrap()
}

/// CM timers that give up on a silent peer within a tenth of a second: two retries, 16.8 ms
/// apart.
fn quick() -> CmConfig {
    CmConfig {
        response_timeout: 12,
        max_retries: 2,
        packet_life_time: 0,
        ..CmConfig::default()
    }
}

fn qp(device: &Device) -> QueuePair {
    let (pd, cq) = (device.alloc_pd().unwrap(), device.create_cq(4).unwrap());
    pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap()
}

/// The server's side of one connection: the next request, accepted.
async fn accept_one(listener: &Listener, server: &Device) -> Connection {
    let request = listener.next().await.unwrap();
    assert_eq!(&request.private_data()[..5], b"hello");
    request
        .accept_async(qp(server), &ConnectOptions::default(), b"welcome")
        .await
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Both sides on one task each of one thread, connected, then the client's disconnect and
/// both ends reported as futures; the server's `ended` resolves on the DREQ, the client's on
/// the DREP. Then the same with the client's engine run only by its calls
/// (`Progress::Inline`): the futures run it as they are polled.
#[test]
fn listen_accept_connect_and_the_end_are_awaited() {
    for (n, progress) in [Progress::Thread, Progress::Inline].into_iter().enumerate() {
        let address = format!("127.0.6.{}", 11 + 2 * n);
        let server = device(&address, Progress::Thread, CmConfig::default());
        let client = device(
            &format!("127.0.6.{}", 12 + 2 * n),
            progress,
            CmConfig::default(),
        );
        let listener = server.listen(7190).unwrap();
        let to = format!("{address}:7190").parse().unwrap();
        runtime().block_on(async {
            let connecting =
                Connection::connect_async(qp(&client), to, &ConnectOptions::default(), b"hello");
            let (accepted, connected) = tokio::time::timeout(LIMIT, async {
                tokio::join!(accept_one(&listener, &server), connecting)
            })
            .await
            .expect("connected in time");
            let connected = connected.unwrap();
            assert_eq!(&connected.private_data()[..7], b"welcome");
            connected.disconnect().unwrap();
            let (server_end, client_end) = tokio::time::timeout(LIMIT, async {
                tokio::join!(accepted.ended(), connected.ended())
            })
            .await
            .expect("ended in time");
            assert_eq!(
                server_end.unwrap(),
                ConnectionEvent::Disconnected,
                "{progress:?}"
            );
            assert_eq!(
                client_end.unwrap(),
                ConnectionEvent::Disconnected,
                "{progress:?}"
            );
        });
    }
}

/// librdmacm's `rdma_disconnect` sends the DREQ and returns; the end comes later as an event.
/// A peer that answers nothing (here a server whose engine runs only in its calls, and which
/// makes none once connected): `disconnect` returns with the DREQ queued and the connection
/// not yet ended, and `ended` resolves once the CM's retries run out (two, 16.8 ms apart),
/// with `Disconnected`, as cm.c reports a DREQ's timeout (`cm_dreq_handler`'s absence:
/// `IB_CM_DREQ_ERROR` becomes `RDMA_CM_EVENT_DISCONNECTED`).
#[test]
fn disconnect_from_a_silent_peer_returns_at_once_and_the_end_comes_later() {
    let server = device("127.0.6.21", Progress::Inline, quick());
    let client = device("127.0.6.22", Progress::Thread, quick());
    let listener = server.listen(7191).unwrap();
    let to = "127.0.6.21:7191".parse().unwrap();
    runtime().block_on(async {
        let connecting =
            Connection::connect_async(qp(&client), to, &ConnectOptions::default(), b"hello");
        let (accepted, connected) = tokio::join!(accept_one(&listener, &server), connecting);
        let connected = connected.unwrap();
        connected.disconnect().unwrap();
        assert_eq!(
            connected.wait_event(Duration::ZERO).unwrap(),
            None,
            "disconnect waited for the end"
        );
        let end = tokio::time::timeout(LIMIT, connected.ended())
            .await
            .expect("ended in time");
        assert_eq!(end.unwrap(), ConnectionEvent::Disconnected);
        drop(accepted);
    });
}
