//! The Rust API's exchange types and connection defaults: what two programs hand each other
//! out of band, and what `connect` picks when told nothing.

use std::time::{Duration, Instant};

use softroce::prelude::*;
use softroce::verbs::{Driving, MAX_CQ_CAPACITY};

#[cfg(feature = "serde")]
fn endpoint() -> QpEndpoint {
    QpEndpoint {
        addr: "192.0.2.7".parse().unwrap(),
        qpn: Qpn::new(0x12_3456),
        psn: Psn::new(0xab_cdef),
        mtu: PathMtu::Mtu1024,
        qkey: QKey(0x1111_1111),
    }
}

#[cfg(feature = "serde")]
#[test]
fn exchange_types_round_trip_through_serde_and_refuse_what_does_not_fit() {
    let json = serde_json::to_string(&endpoint()).unwrap();
    assert_eq!(
        json,
        r#"{"addr":"192.0.2.7","qpn":1193046,"psn":11259375,"mtu":1024,"qkey":286331153}"#
    );
    assert_eq!(
        serde_json::from_str::<QpEndpoint>(&json).unwrap(),
        endpoint()
    );
    // A QPN of 25 bits and an MTU that is no IB MTU are refused, not truncated.
    let wide = json.replace("1193046", "16777216");
    assert!(serde_json::from_str::<QpEndpoint>(&wide).is_err());
    let odd = json.replace(r#""mtu":1024"#, r#""mtu":1500"#);
    assert!(serde_json::from_str::<QpEndpoint>(&odd).is_err());

    let region = RemoteRegion {
        addr: 0x7f00_0000_1000,
        len: 4096,
        rkey: RKey(0x42),
    };
    let json = serde_json::to_string(&region).unwrap();
    assert_eq!(json, r#"{"addr":139637976731648,"len":4096,"rkey":66}"#);
    assert_eq!(serde_json::from_str::<RemoteRegion>(&json).unwrap(), region);
}

/// librdmacm and perftest start each QP from a random PSN (`lrand48() & 0xffffff`), so that a
/// stale packet of an earlier connection seldom lands in the new one's window; softroce's
/// `connect` does the same unless the builder names a PSN.
#[test]
fn each_qp_sends_from_its_own_random_psn_unless_told() {
    let device = Device::open(DeviceConfig::udp("127.0.0.36".parse().unwrap())).unwrap();
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(4).unwrap();
    let build = || pd.create_qp().send_cq(&cq).recv_cq(&cq);
    let psns: Vec<Psn> = (0..4)
        .map(|_| build().build().unwrap().endpoint().psn)
        .collect();
    assert!(
        psns.windows(2).any(|w| w[0] != w[1]),
        "four QPs all started from {psns:?}"
    );
    let told = build().sq_psn(Psn::new(77)).build().unwrap().endpoint();
    assert_eq!(told.psn, Psn::new(77));
    assert_eq!(told.addr, device.address());
    assert_eq!(told.mtu, device.port_mtu(), "the port's MTU is offered");
}

/// Two connected RC QPs on two devices (addresses 127.0.0.`a` and 127.0.0.`b`), with a region
/// each.
struct Pair {
    ends: [(Device, CompletionQueue, MemoryRegion, QueuePair); 2],
}

fn pair(a: u8, b: u8) -> Pair {
    pair_with(a, b, DeviceConfig::udp)
}

/// [`pair`], each device opened with the configuration `config` gives for its address.
fn pair_with(a: u8, b: u8, config: impl Fn(std::net::IpAddr) -> DeviceConfig) -> Pair {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let end = |host: u8| {
        let device = Device::open(config([127, 0, 0, host].into())).unwrap();
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(64).unwrap();
        let mr = pd.register(1 << 16, access).unwrap();
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
        (device, cq, mr, qp)
    };
    let ends = [end(a), end(b)];
    let options = ConnectOptions::default();
    ends[0].3.connect(&ends[1].3.endpoint(), &options).unwrap();
    ends[1].3.connect(&ends[0].3.endpoint(), &options).unwrap();
    Pair { ends }
}

/// The SE bit of a SEND's last packet reaches the receive completion (IBTA 9.2.2): what a CQ
/// armed for solicited completions waits for.
#[test]
fn a_solicited_send_says_so_in_its_receive_completion() {
    let Pair { ends: [a, b] } = pair(37, 38);
    for wr_id in 0..2 {
        let sge = b.2.sge(wr_id as usize * 64, 64).unwrap();
        b.3.post_recv(RecvWr::new(wr_id, sge)).unwrap();
    }
    let send = |wr: SendWr| {
        a.3.post_send(wr).unwrap();
        let sent =
            a.1.wait(Duration::from_secs(5))
                .unwrap()
                .expect("a send completion");
        assert_eq!(sent.status, WcStatus::Success);
        b.1.wait(Duration::from_secs(5))
            .unwrap()
            .expect("a receive completion")
    };
    let plain = send(SendWr::send(1, a.2.sge(0, 8).unwrap()));
    let solicited = send(SendWr::send(2, a.2.sge(0, 8).unwrap()).solicited());
    assert_eq!((plain.wr_id, plain.solicited), (0, false));
    assert_eq!((solicited.wr_id, solicited.solicited), (1, true));
}

/// Whether `cq`'s descriptor becomes readable within `ms` milliseconds, by poll(2).
fn readable(cq: &CompletionQueue, ms: u16) -> bool {
    use nix::poll::{poll, PollFd, PollFlags};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(cq.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, ms).unwrap() == 1
}

/// A CQ's descriptor is what a completion channel is to libibverbs: armed with `req_notify`,
/// it becomes readable when the WRITE completes, and `take_events` makes it quiet again.
/// Then the future of `next_completion` resolves to the next completion, on tokio.
#[tokio::test]
async fn a_cq_can_be_awaited_by_its_descriptor_and_by_its_future() {
    let Pair { ends: [a, b] } = pair(39, 40);
    let write = |wr_id| SendWr::write(wr_id, a.2.sge(0, 64).unwrap(), b.2.remote());
    assert!(!readable(&a.1, 0), "quiet before anything is armed");
    a.1.req_notify(false);
    a.3.post_send(write(1)).unwrap();
    assert!(readable(&a.1, 10_000), "readable once the WRITE completed");
    assert_eq!(a.1.take_events(), 1);
    assert!(!readable(&a.1, 0), "quiet again once the event is taken");
    let within = Duration::from_secs(10);
    let mut polled = Vec::new();
    a.1.poll(&mut polled, 4).unwrap();
    assert_eq!(polled.len(), 1);
    assert_eq!((polled[0].wr_id, polled[0].status), (1, WcStatus::Success));

    a.3.post_send(write(2)).unwrap();
    let wc = tokio::time::timeout(within, a.1.next_completion())
        .await
        .expect("the future resolved")
        .unwrap();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert_eq!(a.1.take_events(), 0, "not armed again: no event");
}

/// A thread may wait for a CQ's descriptor running the device's engine itself
/// (`Device::drive_wait`, as the C library's `ibv_get_cq_event` does): armed with
/// `req_notify_driving`, the descriptor becomes readable when the WRITE's ACK comes, in a turn
/// of the waiting thread or of the one it took the engine from, never missed between the look
/// and the sleep.
#[test]
fn a_wait_can_run_the_engine_until_its_cq_has_its_event() {
    let Pair { ends: [a, b] } = pair(57, 58);
    assert!(a.0.waits_run_engine(), "hybrid progress, one engine");
    for wr_id in 1..=100 {
        a.1.req_notify_driving(false);
        let write = SendWr::write(wr_id, a.2.sge(0, 64).unwrap(), b.2.remote());
        a.3.post_send(write).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !readable(&a.1, 0) {
            assert!(Instant::now() < deadline, "no event for WRITE {wr_id}");
            let driving =
                a.0.drive_wait(Duration::from_secs(1), &|| readable(&a.1, 0), None);
            // Only another application thread sleeping on the socket would keep it.
            assert_eq!(driving.unwrap(), Driving::Ran);
        }
        assert_eq!(a.1.take_events(), 1);
        let mut polled = Vec::new();
        a.1.poll(&mut polled, 4).unwrap();
        assert_eq!(polled.len(), 1);
        assert_eq!(
            (polled[0].wr_id, polled[0].status),
            (wr_id, WcStatus::Success)
        );
    }
}

/// A turn run by the application holds the ACKs it has to send for the application's answer,
/// but not through a sleep (the ACKs held keep the next turns from sleeping, and go after two):
/// a thread that waits on its CQ for something else (here, for seconds) runs the engine in
/// that wait, and the ACKs of the peer's WRITEs go at once, not when the wait ends (by then
/// the peer would have sent each again, and given up).
#[test]
fn a_wait_that_runs_the_engine_does_not_sit_on_its_acks() {
    // No busy polling (as on one CPU), whose turns that do not sleep would let the ACKs go.
    let unpolled = |addr| DeviceConfig {
        busy_poll: Some(Duration::ZERO),
        ..DeviceConfig::udp(addr)
    };
    let Pair { ends: [a, b] } = pair_with(59, 60, unpolled);
    let target = b.2.remote();
    let wait = Duration::from_secs(5);
    let waiting = std::thread::spawn(move || {
        let nothing = b.1.wait(wait).unwrap();
        assert!(nothing.is_none(), "nothing comes to the passive side's CQ");
        b
    });
    // The wait is under way, sleeping on the socket.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    for wr_id in 1..=10 {
        let write = SendWr::write(wr_id, a.2.sge(0, 64).unwrap(), target);
        a.3.post_send(write).unwrap();
        let done = a.1.wait(wait).unwrap().expect("the WRITE's completion");
        assert_eq!((done.wr_id, done.status), (wr_id, WcStatus::Success));
    }
    assert!(
        started.elapsed() < wait / 2,
        "the ACKs came only with the end of the peer's wait"
    );
    let (counters, _) = a.0.counters().unwrap();
    assert_eq!(
        (counters.retry_timeouts, counters.retransmitted_packets),
        (0, 0),
        "no WRITE waited for its ACK until it was sent again"
    );
    drop(waiting.join().unwrap());
}

/// What a request can be refused for is refused at the call, with the reason, not later as a
/// LOC_QP_OP_ERR completion: a QP not ready to send (rxe_verbs.c `rxe_post_send`), an
/// operation its type does not carry (IBTA 9.2, table 38), a UD send without a destination.
#[test]
fn requests_that_cannot_go_are_refused_at_the_call() {
    let device = Device::open(DeviceConfig::udp("127.0.0.44".parse().unwrap())).unwrap();
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(16).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let target = mr.remote();
    let qp = |qp_type| {
        let qp = pd.create_qp().qp_type(qp_type).send_cq(&cq).recv_cq(&cq);
        qp.build().unwrap()
    };
    let refusal = |result: Result<(), Error>| match result {
        Err(Error::Verbs(refused)) => refused.to_string(),
        other => panic!("not refused at the call: {other:?}"),
    };

    let rc = qp(QpType::Rc);
    let write = || SendWr::write(1, mr.sge(0, 8).unwrap(), target);
    // What to do, not only what is wrong.
    let refused = refusal(rc.post_send(write()));
    assert!(
        refused.contains("in RESET") && refused.contains("connect it"),
        "{refused}"
    );
    let refused = refusal(rc.post_recv(RecvWr::new(1, mr.sge(0, 8).unwrap())));
    assert!(
        refused.contains("in RESET") && refused.contains("INIT"),
        "{refused}"
    );

    let uc = qp(QpType::Uc);
    uc.connect(&rc.endpoint(), &ConnectOptions::default())
        .unwrap();
    let read = SendWr::read(2, mr.sge(0, 8).unwrap(), target);
    assert!(refusal(uc.post_send(read)).contains("UC carries"));
    uc.post_send(write()).unwrap();

    let ud = qp(QpType::Ud);
    ud.ready_datagram().unwrap();
    let send = SendWr::send(3, mr.sge(0, 8).unwrap());
    assert!(refusal(ud.post_send(send)).contains("destination"));
    assert_eq!(
        cq.wait(Duration::from_secs(5)).unwrap().map(|wc| wc.wr_id),
        Some(1)
    );
    assert!(
        cq.wait(Duration::from_millis(50)).unwrap().is_none(),
        "nothing else completes"
    );
}

/// A CQ is a ring per engine of its capacity, reserved at creation: past the limit the device
/// reports (`ibv_query_device`'s `max_cqe`), creation is refused with the limit, not
/// attempted.
#[test]
fn a_cq_past_the_devices_limit_is_refused_at_creation() {
    let device = Device::open(DeviceConfig::udp("127.0.0.51".parse().unwrap())).unwrap();
    for capacity in [MAX_CQ_CAPACITY + 1, usize::MAX] {
        match device.create_cq(capacity) {
            Err(Error::Verbs(refused)) => {
                assert!(refused.to_string().contains("MAX_CQ_CAPACITY"), "{refused}")
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    device
        .create_cq(MAX_CQ_CAPACITY)
        .expect("the limit itself is allowed");
}

/// `max_send_wr` and `max_recv_wr` are exact: the QP holds that many outstanding requests and
/// refuses the next at the call, however far the device has got in taking them in; a slot
/// comes back when its request completes.
#[test]
fn queue_depths_are_exact() {
    let devices = ["127.0.0.45", "127.0.0.46"]
        .map(|a| Device::open(DeviceConfig::udp(a.parse().unwrap())).unwrap());
    let ends = devices.each_ref().map(|device| {
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(64).unwrap();
        let mr = pd
            .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let qp = pd
            .create_qp()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(4)
            .max_recv_wr(4)
            .build()
            .unwrap();
        (pd, cq, mr, qp)
    });
    let [(_, a_cq, a_mr, a), (_, b_cq, b_mr, b)] = &ends;
    // a to RTS towards b, whose QP stays in RESET for now: nothing a sends is acknowledged.
    a.connect(&b.endpoint(), &ConnectOptions::default())
        .unwrap();
    let write = |wr_id| SendWr::write(wr_id, a_mr.sge(0, 8).unwrap(), b_mr.remote());
    for wr_id in 0..4 {
        a.post_send(write(wr_id)).unwrap();
    }
    assert!(matches!(
        a.post_send(write(4)),
        Err(Error::QueueFull { .. })
    ));
    let batch = a.post_send_batch((5..7).map(write)).unwrap_err();
    assert_eq!(batch.posted, 0);
    assert!(matches!(batch.error, Error::QueueFull { .. }));

    b.init(Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    for wr_id in 0..4 {
        b.post_recv(RecvWr::new(wr_id, b_mr.sge(0, 64).unwrap()))
            .unwrap();
    }
    let recv = RecvWr::new(4, b_mr.sge(0, 64).unwrap());
    assert!(matches!(
        b.post_recv(recv.clone()),
        Err(Error::QueueFull { .. })
    ));

    // b connects: a's WRITEs are acknowledged (the retry timer resends them), their slots
    // come back, and a SEND consumes one of b's receives, whose slot comes back too.
    b.connect(&a.endpoint(), &ConnectOptions::default())
        .unwrap();
    for _ in 0..4 {
        let wc = a_cq
            .wait(Duration::from_secs(10))
            .unwrap()
            .expect("a WRITE completed");
        assert_eq!(wc.status, WcStatus::Success);
    }
    assert_eq!(a.post_send_batch((10..13).map(write)).unwrap(), 3);
    a.post_send(SendWr::send(13, a_mr.sge(0, 8).unwrap()))
        .unwrap();
    let received = b_cq
        .wait(Duration::from_secs(10))
        .unwrap()
        .expect("a receive completed");
    assert_eq!((received.wr_id, received.status), (0, WcStatus::Success));
    b.post_recv(recv).unwrap();
}

/// The application's own buffer is the region: no copy at registration, a peer's WRITE lands
/// in it, and it comes back whole only once deregistered (before that, the handle comes back).
#[test]
fn an_application_buffer_is_registered_without_a_copy_and_handed_back() {
    let Pair { ends: [a, b] } = pair(47, 48);
    // A boxed slice, as some applications hold their buffers: the same allocation as a Vec.
    let mut buffer = Vec::with_capacity(1000);
    buffer.resize(1000, 0xee);
    let buffer: Box<[u8]> = buffer.into_boxed_slice();
    let allocation = buffer.as_ptr();
    // b's own PD and QP: the region must share a PD with the QP the WRITE arrives on.
    let pd = b.0.alloc_pd().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let region = pd.register_buffer(buffer, access).unwrap();
    assert_eq!(region.len(), 1000);
    let qp = pd.create_qp().send_cq(&b.1).recv_cq(&b.1).build().unwrap();
    let pd_a = a.0.alloc_pd().unwrap();
    let a_qp = pd_a
        .create_qp()
        .send_cq(&a.1)
        .recv_cq(&a.1)
        .build()
        .unwrap();
    qp.connect(&a_qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    a_qp.connect(&qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    let source = pd_a.register(8, Access::LOCAL_WRITE).unwrap();
    source.write(0, b"landed").unwrap();
    let target = region.remote().at(994).unwrap();
    a_qp.post_send(SendWr::write(1, source.sge(0, 6).unwrap(), target))
        .unwrap();
    let wc =
        a.1.wait(Duration::from_secs(5))
            .unwrap()
            .expect("a completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let region = region.into_buffer().expect_err("still registered");
    pd.deregister(&region).unwrap();
    let back = region
        .into_buffer()
        .expect("deregistered, and the last handle");
    assert_eq!((back.as_ptr(), back.len()), (allocation, 1000));
    assert_eq!(&back[994..], b"landed");
    assert!(back[..994].iter().all(|&b| b == 0xee));
}

/// Dropping a region's last handle deregisters it then, not at the device's next registration:
/// its keys stop working and the device stops counting it. A clone keeps it, and a region
/// deregistered by hand and dropped later is no trouble.
#[test]
fn a_region_goes_when_its_last_handle_does() {
    let device = Device::open(DeviceConfig::udp("127.0.0.49".parse().unwrap())).unwrap();
    let pd = device.alloc_pd().unwrap();
    let before = device.resources().unwrap().regions;
    let region = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let clone = region.clone();
    drop(region);
    assert_eq!(
        device.resources().unwrap().regions,
        before + 1,
        "a clone holds it"
    );
    drop(clone);
    assert_eq!(
        device.resources().unwrap().regions,
        before,
        "gone with its last handle"
    );
    let by_hand = pd.register(64, Access::LOCAL_WRITE).unwrap();
    pd.deregister(&by_hand).unwrap();
    drop(by_hand);
    let kept = pd.register(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(device.resources().unwrap().regions, before + 1);
    drop(kept);
}

/// A receive that completes in error gives its slot back too: a SEND longer than the receive
/// (LOC_LEN_ERR, the QP to ERROR) leaves a QP of depth 1 that still takes a receive, flushed at
/// once, instead of one that refuses every receive for good; and a send, flushed too.
#[test]
fn a_receive_that_fails_gives_its_slot_back() {
    let devices = ["127.0.0.53", "127.0.0.54"]
        .map(|a| Device::open(DeviceConfig::udp(a.parse().unwrap())).unwrap());
    let ends = devices.each_ref().map(|device| {
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(8).unwrap();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let qp = pd
            .create_qp()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_recv_wr(1)
            .build()
            .unwrap();
        (pd, cq, mr, qp)
    });
    let [(_, a_cq, a_mr, a), (_, b_cq, b_mr, b)] = &ends;
    let options = ConnectOptions {
        retry_cnt: 1,
        timeout: 10,
        ..ConnectOptions::default()
    };
    a.connect(&b.endpoint(), &options).unwrap();
    b.connect(&a.endpoint(), &options).unwrap();
    b.post_recv(RecvWr::new(1, b_mr.sge(0, 16).unwrap()))
        .unwrap();
    a.post_send(SendWr::send(2, a_mr.sge(0, 100).unwrap()))
        .unwrap();
    let failed = b_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("a receive completion");
    assert_eq!((failed.wr_id, failed.status), (1, WcStatus::LocLenErr));
    let _ = a_cq.wait(Duration::from_secs(5));
    b.post_recv(RecvWr::new(3, b_mr.sge(0, 16).unwrap()))
        .expect("the failed receive's slot came back");
    let flushed = b_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("a flushed receive");
    assert_eq!((flushed.wr_id, flushed.status), (3, WcStatus::WrFlushErr));
    // A send on the QP in ERROR is taken too and flushed, as rdma-core's providers do
    // (`QueuePair::post_send`'s docs).
    b.post_send(SendWr::send(4, b_mr.sge(0, 16).unwrap()))
        .expect("a QP in ERROR takes a send");
    let flushed = b_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("a flushed send");
    assert_eq!((flushed.wr_id, flushed.status), (4, WcStatus::WrFlushErr));
}
