//! The Rust API's exchange types and connection defaults: what two programs hand each other
//! out of band, and what `connect` picks when told nothing.

use std::time::Duration;

use softroce::prelude::*;

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
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let end = |host: u8| {
        let device = Device::open(DeviceConfig::udp([127, 0, 0, host].into())).unwrap();
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
