//! Devices of several engines on loopback (`DeviceConfig::engines`): QPs spread over the
//! engines, one memory table with the same keys on each, CQs fed by several engines, SRQs and
//! their QPs on one engine, address handles that every engine knows, and the CM on the first
//! engine moving QPs of the others. Each test binds its own addresses.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use softroce::memory::Access;
use softroce::memory::MemoryRegion;
use softroce::transport::{
    ConnectOptions, Payload, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};
use softroce::verbs::{
    BackendKind, CompletionQueue, Connection, Device, DeviceConfig, Progress, ProtectionDomain,
    QueuePair,
};
use softroce::wire::QKey;

const WAIT: Duration = Duration::from_secs(10);

fn engines(address: &str, engines: usize) -> DeviceConfig {
    DeviceConfig {
        engines,
        ..DeviceConfig::udp(address.parse().unwrap())
    }
}

/// `n` completions from `cq`, each a success.
fn completions(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    (0..n)
        .map(|i| {
            let wc = cq.wait(WAIT).unwrap();
            let wc = wc.unwrap_or_else(|| panic!("completion {i} of {n} never came"));
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            wc
        })
        .collect()
}

/// QPs each side of the RC tests.
const QPS: usize = 4;

/// The engine of a device of two that holds `qp` (`Lane::owner`, QPs above 1).
fn lane(qp: &QueuePair) -> u32 {
    qp.qpn().value() % 2
}

/// `device`'s PD, CQ, a 1 MiB region for local and remote access, and `QPS` RC QPs on the CQ.
fn rc_side(
    device: &Device,
) -> (
    ProtectionDomain,
    CompletionQueue,
    MemoryRegion,
    Vec<QueuePair>,
) {
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(64).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.register(1 << 20, access).unwrap();
    let qps: Vec<_> = (0..QPS)
        .map(|_| pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap())
        .collect();
    (pd, cq, mr, qps)
}

/// Eight rounds of a 64-byte SEND on each of `from`'s connected QPs in turn, so that an
/// engine's turn sends several QPs' at once (and the peer's turn their ACKs), into receives
/// posted in the second half of `to`'s region; every one completes.
fn interleaved_sends(
    (from_qps, from_cq, from_mr): (&[QueuePair], &CompletionQueue, &MemoryRegion),
    (to_qps, to_cq, to_mr): (&[QueuePair], &CompletionQueue, &MemoryRegion),
) {
    const ROUNDS: usize = 8;
    for (i, qp) in to_qps.iter().enumerate() {
        for r in 0..ROUNDS {
            let sge = to_mr.sge((512 << 10) + (r * QPS + i) * 64, 64).unwrap();
            qp.post_recv(RecvWr::new(i as u64, sge)).unwrap();
        }
    }
    for r in 0..ROUNDS {
        for qp in from_qps {
            let sge = from_mr.sge(r * 64, 64).unwrap();
            let send = SendWr::new(r as u64, SendOp::Send, Payload::Sges([sge].into()));
            qp.post_send(send).unwrap();
        }
    }
    completions(from_cq, ROUNDS * QPS);
    completions(to_cq, ROUNDS * QPS);
}

/// Four RC connections between two devices of two engines each: the QPs land on both engines,
/// every WRITE goes to the one region (one key, every engine), and every completion to the
/// one CQ of each side, from whichever engine made it. A softroce peer of several engines cuts
/// its trains per QP, so the kernel steers every datagram to its engine: nothing is handed
/// over.
#[test]
fn rc_qps_on_two_engines_share_one_region_and_one_cq() {
    let a = Device::open(engines("127.0.0.123", 2)).unwrap();
    let b = Device::open(engines("127.0.0.124", 2)).unwrap();
    assert_eq!((a.engines(), b.engines()), (2, 2));
    let (_a_pd, a_cq, a_mr, a_qps) = rc_side(&a);
    let (_b_pd, b_cq, b_mr, b_qps) = rc_side(&b);
    let lanes: std::collections::BTreeSet<u32> = a_qps.iter().map(lane).collect();
    assert_eq!(lanes.len(), 2, "the QPs are spread over both engines");
    // `a_qps[i]` talks to `b_qps[PEER[i]]`: the two QPs of each engine of `a` have their peers
    // on different engines of `b`.
    const PEER: [usize; QPS] = [0, 2, 1, 3];
    for i in 0..QPS {
        for j in (i + 1)..QPS {
            if lane(&a_qps[i]) == lane(&a_qps[j]) {
                assert_ne!(lane(&b_qps[PEER[i]]), lane(&b_qps[PEER[j]]), "{i} {j}");
            }
        }
    }
    let options = ConnectOptions::default();
    for (i, qa) in a_qps.iter().enumerate() {
        let qb = &b_qps[PEER[i]];
        qa.connect(&qb.endpoint(), &options).unwrap();
        qb.connect(&qa.endpoint(), &options).unwrap();
    }

    let block = 64 << 10;
    let data: Vec<u8> = (0..QPS * block).map(|i| (i * 7 + i / 251) as u8).collect();
    a_mr.write(0, &data).unwrap();
    for (i, qb) in b_qps.iter().enumerate() {
        let sge = b_mr.sge((QPS * block) + i * 64, 64).unwrap();
        qb.post_recv(RecvWr::new(i as u64, sge)).unwrap();
    }
    for (i, qa) in a_qps.iter().enumerate() {
        let remote_addr = b_mr.iova() + (i * block) as u64;
        let write = SendOp::Write {
            remote_addr,
            rkey: b_mr.rkey(),
        };
        let sge = a_mr.sge(i * block, block).unwrap();
        qa.post_send(SendWr::new(i as u64, write, Payload::Sges([sge].into())))
            .unwrap();
        let sge = a_mr.sge(i * 64, 64).unwrap();
        let send = SendWr::new(100 + i as u64, SendOp::Send, Payload::Sges([sge].into()));
        qa.post_send(send).unwrap();
    }
    let sent = completions(&a_cq, 2 * QPS);
    let mut ids: Vec<u64> = sent.iter().map(|wc| wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3, 100, 101, 102, 103]);
    let received = completions(&b_cq, QPS);
    for wc in &received {
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.qp_num, b_qps[wc.wr_id as usize].qpn(), "{wc:?}");
    }
    let mut landed = vec![0; QPS * block + QPS * 64];
    b_mr.read(0, &mut landed).unwrap();
    assert_eq!(landed[..QPS * block], data[..], "every WRITE landed");
    for i in 0..QPS {
        let at = QPS * block + i * 64;
        let sent = PEER.iter().position(|&peer| peer == i).unwrap();
        assert_eq!(
            landed[at..at + 64],
            data[sent * 64..sent * 64 + 64],
            "SEND {i}"
        );
    }

    // Then equal SENDs, the QPs interleaved: a device of several engines cuts its trains per
    // QP (`UdpConfig::trains_per_qp`), or a train of two QPs would reach one of the peer's
    // engines whole, which would hand the other QP's datagrams over.
    interleaved_sends((&a_qps, &a_cq, &a_mr), (&b_qps, &b_cq, &b_mr));

    let (transport, io) = b.counters().unwrap();
    assert_eq!(io.handed_over, 0, "{io:?}");
    let (_, a_io) = a.counters().unwrap();
    assert_eq!(a_io.handed_over, 0, "{a_io:?}");
    assert_eq!(transport.rkey_violations, 0);
    assert_eq!(b.resources().unwrap().qps, QPS);
}

/// A device of one engine mixes QPs in its trains unless its UDP backend is told to cut them
/// per QP (`BackendKind::Udp`'s `trains_per_qp`, `--trains-per-qp`), as it should be toward a
/// peer of several engines: told, nothing it sends there is handed between that peer's engines.
#[test]
fn a_one_engine_device_told_to_cut_its_trains_per_qp_reaches_every_engine_directly() {
    let a = Device::open(DeviceConfig {
        // An engine thread of its own, which takes the posts of several QPs in one turn.
        progress: Progress::Thread,
        backend: BackendKind::Udp {
            segmentation: true,
            trains_per_qp: true,
        },
        ..DeviceConfig::udp("127.0.0.140".parse().unwrap())
    })
    .unwrap();
    let b = Device::open(engines("127.0.0.141", 2)).unwrap();
    let (_a_pd, a_cq, a_mr, a_qps) = rc_side(&a);
    let (_b_pd, b_cq, b_mr, b_qps) = rc_side(&b);
    let lanes: std::collections::BTreeSet<u32> = b_qps.iter().map(lane).collect();
    assert_eq!(lanes.len(), 2, "the peer's QPs are on both its engines");
    let options = ConnectOptions::default();
    for (qa, qb) in a_qps.iter().zip(&b_qps) {
        qa.connect(&qb.endpoint(), &options).unwrap();
        qb.connect(&qa.endpoint(), &options).unwrap();
    }
    // Whether a turn of `a`'s takes several QPs' posts is up to its thread; ignoring the
    // setting, 16 datagrams were handed over in each of 5 runs.
    interleaved_sends((&a_qps, &a_cq, &a_mr), (&b_qps, &b_cq, &b_mr));
    let (_, io) = b.counters().unwrap();
    assert_eq!(io.handed_over, 0, "{io:?}");
}

/// A UD QP on each engine sends through an address handle created once: every engine holds it
/// at the same number. The receiving SRQ and the QP built with it share an engine.
#[test]
fn ud_sends_from_every_engine_with_one_address_handle() {
    let qkey = QKey(0x2222_2222);
    let a = Device::open(engines("127.0.0.125", 2)).unwrap();
    let b = Device::open(engines("127.0.0.126", 2)).unwrap();
    let (a_pd, b_pd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (a_cq, b_cq) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let a_mr = a_pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let b_mr = b_pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let ud = |pd: &softroce::verbs::ProtectionDomain, cq, srq: Option<_>| {
        let mut builder = pd.create_qp().qp_type(QpType::Ud).send_cq(cq).recv_cq(cq);
        if let Some(srq) = srq {
            builder = builder.srq(srq);
        }
        let qp = builder.qkey(qkey).build().unwrap();
        qp.ready_datagram().unwrap();
        qp
    };
    let senders = [ud(&a_pd, &a_cq, None), ud(&a_pd, &a_cq, None)];
    assert_ne!(senders[0].qpn().value() % 2, senders[1].qpn().value() % 2);
    // Two SRQs, one per engine: the second is on the engine the first is not.
    let _other = b_pd.create_srq(4, 0).unwrap();
    let srq = b_pd.create_srq(4, 0).unwrap();
    let receiver = ud(&b_pd, &b_cq, Some(&srq));
    for k in 0..2 {
        let sge = b_mr.sge(k * 1024, 1024).unwrap();
        srq.post_recv(RecvWr::new(k as u64, sge)).unwrap();
    }
    let ah = a_pd.create_ah(b.address()).unwrap();
    a_mr.write(0, b"from engine zero and engine one").unwrap();
    for (k, qp) in senders.iter().enumerate() {
        let sge = a_mr.sge(0, 31).unwrap();
        let mut wr = SendWr::new(k as u64, SendOp::Send, Payload::Sges([sge].into()));
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: receiver.qpn(),
            remote_qkey: qkey,
        });
        qp.post_send(wr).unwrap();
    }
    completions(&a_cq, 2);
    let got = completions(&b_cq, 2);
    let mut from: Vec<u32> = got.iter().map(|wc| wc.src_qp.unwrap().value()).collect();
    from.sort_unstable();
    let mut expected: Vec<u32> = senders.iter().map(|qp| qp.qpn().value()).collect();
    expected.sort_unstable();
    assert_eq!(from, expected);
    for k in 0..2 {
        let mut body = [0; 31];
        b_mr.read(k * 1024 + GRH_LEN, &mut body).unwrap();
        assert_eq!(&body, b"from engine zero and engine one");
    }
    a_pd.destroy_ah(ah).unwrap();
    assert!(a_pd.destroy_ah(ah).is_err(), "destroyed on every engine");
}

/// RDMA-CM runs on the first engine; the QPs it connects may be on any. Each side connects
/// two QPs, which land on different engines, and moves data on both.
#[test]
fn the_cm_connects_qps_on_every_engine() {
    let server = Device::open(engines("127.0.0.127", 2)).unwrap();
    let client = Device::open(engines("127.0.0.128", 2)).unwrap();
    let listener = server.listen(7175).unwrap();
    let accepting = std::thread::spawn(move || {
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(16).unwrap();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let mut conns = Vec::new();
        for k in 0..2 {
            let request = listener.next_request(WAIT).unwrap().expect("a request");
            let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
            // In INIT, as rdma_create_qp leaves it, so that the receive is posted first.
            qp.init(Access::LOCAL_WRITE).unwrap();
            qp.post_recv(RecvWr::new(k, mr.sge(k as usize * 64, 64).unwrap()))
                .unwrap();
            conns.push(request.accept(qp, &ConnectOptions::default(), &[]).unwrap());
        }
        let got = completions(&cq, 2);
        let mut lanes: Vec<u32> = conns.iter().map(|c| c.qp().qpn().value() % 2).collect();
        lanes.sort_unstable();
        let mut bytes = [0; 128];
        mr.read(0, &mut bytes).unwrap();
        (server, got.len(), lanes, bytes)
    });
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let mr = pd.register(4096, Access::NONE).unwrap();
    mr.write(0, &[0x5a; 64]).unwrap();
    let to: std::net::SocketAddr = "127.0.0.127:7175".parse().unwrap();
    let conns: Vec<Connection> = (0..2)
        .map(|_| {
            let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
            Connection::connect(qp, to, &ConnectOptions::default(), &[]).unwrap()
        })
        .collect();
    assert_ne!(
        conns[0].qp().qpn().value() % 2,
        conns[1].qp().qpn().value() % 2,
        "one connection per engine"
    );
    for (k, conn) in conns.iter().enumerate() {
        let sge = mr.sge(0, 64).unwrap();
        let send = SendWr::new(k as u64, SendOp::Send, Payload::Sges([sge].into()));
        conn.qp().post_send(send).unwrap();
    }
    completions(&cq, 2);
    let (_server, received, lanes, bytes) = accepting.join().unwrap();
    assert_eq!(received, 2);
    assert_eq!(lanes, [0, 1], "the server's QPs are on both engines");
    assert_eq!(bytes, [0x5a; 128]);
}

/// A coalesced train that mixes QPs (as GRO merges one flow from a peer that sends every QP
/// from one port, or a peer that does not cut its trains per QP) reaches the engine of its
/// first datagram's QP, which hands the rest to theirs: every datagram still arrives.
#[test]
fn a_train_that_mixes_engines_qps_is_handed_over() {
    use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
    use softroce::wire::{BthRepr, DethRepr, ExtHeaders, KernelFraming, Opcode, PacketRepr, Psn};

    let qkey = QKey(0x3333_3333);
    let device = Device::open(engines("127.0.0.132", 2)).unwrap();
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(16).unwrap();
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let qps: Vec<_> = (0..2)
        .map(|k| {
            let qp = (pd.create_qp().qp_type(QpType::Ud).send_cq(&cq).recv_cq(&cq))
                .qkey(qkey)
                .build()
                .unwrap();
            qp.ready_datagram().unwrap();
            let sge = mr.sge(k * 1024, 1024).unwrap();
            qp.post_recv(RecvWr::new(k as u64, sge)).unwrap();
            qp
        })
        .collect();
    assert_ne!(qps[0].qpn().value() % 2, qps[1].qpn().value() % 2);

    let peer = UdpSocket::bind("127.0.0.133:0").unwrap();
    let std::net::SocketAddr::V4(src) = peer.local_addr().unwrap() else {
        unreachable!()
    };
    let dst = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 132), 4791);
    let framing = KernelFraming::V4 { src, dst };
    let mut train = Vec::new();
    for (k, qp) in qps.iter().enumerate() {
        let repr = PacketRepr::new(
            BthRepr::new(Opcode::UdSendOnly, qp.qpn(), Psn::new(k as u32)),
            ExtHeaders {
                deth: Some(DethRepr {
                    qkey,
                    src_qp: softroce::wire::Qpn::new(0x77),
                }),
                ..ExtHeaders::default()
            },
            64,
        );
        let mut packet = vec![0; repr.buffer_len()];
        repr.emit_with_payload(&mut packet, &[k as u8 + 1; 64])
            .unwrap();
        framing.seal_with_ipv4_id(&mut packet, k as u16);
        train.extend_from_slice(&packet);
    }
    let segment = (train.len() / 2) as u16;
    let gso = [ControlMessage::UdpGsoSegments(&segment)];
    let to = SockaddrIn::from(dst);
    let iov = [std::io::IoSlice::new(&train)];
    sendmsg(peer.as_raw_fd(), &iov, &gso, MsgFlags::empty(), Some(&to)).unwrap();

    let got = completions(&cq, 2);
    let mut ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1]);
    for k in 0..2 {
        let mut body = [0; 64];
        mr.read(k * 1024 + GRH_LEN, &mut body).unwrap();
        assert_eq!(body, [k as u8 + 1; 64], "QP {k}");
    }
    let (_, io) = device.counters().unwrap();
    assert_eq!((io.handed_over, io.handover_dropped), (1, 0), "{io:?}");
}

/// What a device of several engines cannot do is refused when it opens, with why.
#[test]
fn several_engines_refuse_what_they_cannot_do() {
    let address: IpAddr = "127.0.0.129".parse().unwrap();
    let refused = |config: DeviceConfig| Device::open(config).unwrap_err().to_string();
    let too_many = refused(DeviceConfig {
        engines: 65,
        ..DeviceConfig::udp(address)
    });
    assert!(too_many.contains("1 to 64 engines"), "{too_many}");
    let inline = refused(DeviceConfig {
        engines: 2,
        progress: Progress::Inline,
        ..DeviceConfig::udp(address)
    });
    assert!(inline.contains("not Progress::Inline"), "{inline}");
    let pcap = refused(DeviceConfig {
        engines: 2,
        pcap: Some(std::env::temp_dir().join("softroce-engines.pcap")),
        ..DeviceConfig::udp(address)
    });
    assert!(pcap.contains("one engine"), "{pcap}");
    // None of them kept the address; the default progress (hybrid) runs each engine on its
    // thread.
    let device = Device::open(engines("127.0.0.129", 2)).unwrap();
    // A second device of several engines does not join the first's sockets, and says whose
    // they are.
    let again = refused(engines("127.0.0.129", 2));
    assert!(
        again.contains("127.0.0.129:4791 is bound already")
            && again.contains("held by process ")
            && again
                .split(|c: char| !c.is_ascii_digit())
                .any(|n| n == std::process::id().to_string()),
        "{again}"
    );
    assert!(Device::open(DeviceConfig::udp(address)).is_err());
    drop(device);
    assert!(Device::open(DeviceConfig::udp(address)).is_ok());
}

/// The endpoints of a device's engines share one memory table behind a lock. Counting the
/// device's resources took its read side twice in one statement: a write by another engine
/// between the two waited for the first, and the second waited behind the write, for ever.
#[test]
fn counting_resources_beside_another_engines_changes_never_deadlocks() {
    use softroce::memory::{DeviceMemory, MwType};
    use softroce::transport::{Endpoint, EndpointConfig, Lane};

    let endpoints: Vec<Endpoint> = DeviceMemory::shared_by(2, 7)
        .into_iter()
        .enumerate()
        .map(|(index, memory)| {
            let config = EndpointConfig {
                local_addr: "127.0.0.1".parse().unwrap(),
                seed: index as u64,
                lane: Lane::new(index as u32, 2).unwrap(),
                congestion: Default::default(),
            };
            Endpoint::with_memory(config, memory)
        })
        .collect();
    let [counting, changing]: [Endpoint; 2] = endpoints.try_into().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let counter = {
        let done = done.clone();
        std::thread::spawn(move || {
            while std::time::Instant::now() < until {
                for _ in 0..1000 {
                    std::hint::black_box(counting.resources());
                }
            }
            done.send(()).unwrap();
        })
    };
    let changer = std::thread::spawn(move || {
        let mut changing = changing;
        let pd = changing.alloc_pd();
        while std::time::Instant::now() < until {
            for _ in 0..1000 {
                let rkey = changing.alloc_mw(pd, MwType::Type1).unwrap();
                changing.dealloc_mw(rkey).unwrap();
            }
        }
        done.send(()).unwrap();
    });
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the two engines' endpoints deadlocked on the memory table");
    }
    counter.join().unwrap();
    changer.join().unwrap();
}

/// A CQ or an SRQ names a queue on its own device's engines: a QP of another device cannot
/// use it, and is refused with why instead of completing into a queue of the same number.
#[test]
fn a_qp_is_refused_another_devices_cq_or_srq() {
    let one = Device::open(engines("127.0.0.138", 2)).unwrap();
    let other = Device::open(DeviceConfig::udp("127.0.0.139".parse().unwrap())).unwrap();
    let pd = one.alloc_pd().unwrap();
    let (ours, theirs) = (one.create_cq(4).unwrap(), other.create_cq(4).unwrap());
    let built = pd.create_qp().send_cq(&ours).recv_cq(&theirs).build();
    let error = built.unwrap_err().to_string();
    assert!(
        error.contains("the CQ belongs to another device"),
        "{error}"
    );
    let srq = other.alloc_pd().unwrap().create_srq(4, 0).unwrap();
    let built = (pd.create_qp().send_cq(&ours).recv_cq(&ours).srq(&srq)).build();
    let error = built.unwrap_err().to_string();
    assert!(
        error.contains("the SRQ belongs to another device"),
        "{error}"
    );
    assert!(pd.create_qp().send_cq(&ours).recv_cq(&ours).build().is_ok());
}

/// Busy polling as a device resolves it (`DeviceConfig::busy_poll`): left to softroce, a
/// device of several engines, whose hybrid progress runs each engine on its thread, polls not
/// at all, as an engine thread does not; one hybrid engine polls 50 µs where the process has
/// more than one CPU; what the application asks for it gets, and past the bound is refused.
#[test]
fn busy_polling_is_resolved_from_progress_and_engines() {
    use softroce::verbs::{DEFAULT_BUSY_POLL, MAX_BUSY_POLL};

    let two = Device::open(engines("127.0.9.1", 2)).unwrap();
    assert_eq!(
        two.busy_poll(),
        Duration::ZERO,
        "two hybrid engines run on threads"
    );
    let thread = Device::open(DeviceConfig {
        progress: Progress::Thread,
        ..engines("127.0.9.2", 1)
    })
    .unwrap();
    assert_eq!(thread.busy_poll(), Duration::ZERO, "an engine thread");
    let hybrid = Device::open(engines("127.0.9.3", 1)).unwrap();
    let several_cpus = std::thread::available_parallelism().unwrap().get() > 1;
    let expected = if several_cpus {
        DEFAULT_BUSY_POLL
    } else {
        Duration::ZERO
    };
    assert_eq!(hybrid.busy_poll(), expected, "one hybrid engine");
    let asked = Device::open(DeviceConfig {
        busy_poll: Some(Duration::from_micros(200)),
        ..engines("127.0.9.4", 2)
    })
    .unwrap();
    assert_eq!(asked.busy_poll(), Duration::from_micros(200));
    let refused = Device::open(DeviceConfig {
        busy_poll: Some(MAX_BUSY_POLL * 2),
        ..engines("127.0.9.5", 1)
    })
    .unwrap_err()
    .to_string();
    assert!(refused.contains("at most 10ms"), "{refused}");
}

/// Each engine's thread carries a name the kernel keeps whole (15 bytes): `top -H` and `perf`
/// tell the engines, and the devices, apart. Rust's name "softroce 127.0.9.6 1" would reach the
/// kernel as "softroce 127.0." for every engine of every device on 127.0.0.0/8.
#[test]
fn every_engine_thread_is_named_in_the_kernel_by_its_engine_and_address() {
    let thread_names = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|comm| comm.trim_end().to_string())
            .collect()
    };
    let two = Device::open(engines("127.0.9.6", 2)).unwrap();
    let one = Device::open(DeviceConfig {
        progress: Progress::Thread,
        ..DeviceConfig::udp("127.0.9.7".parse().unwrap())
    })
    .unwrap();
    // Each thread names itself as it starts, which may be after the device is open.
    let wanted = ["sr0 127.0.9.6", "sr1 127.0.9.6", "sr 127.0.9.7"];
    let deadline = std::time::Instant::now() + WAIT;
    let mut names = thread_names();
    while !wanted.iter().all(|name| names.iter().any(|n| n == name)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{wanted:?} in {names:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
        names = thread_names();
    }
    drop((two, one));
}
