//! The engine on real UDP sockets over loopback, with and without loss injected in the io layer.

mod common;

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use softroce::io::{Backend, IoCounters, UdpBackend};
use softroce::memory::{Access, MemoryRegion, MwType, RemoteRegion};
use softroce::transport::{Datagram, Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcStatus};
use softroce::verbs::{
    CompletionQueue, ConnectOptions, Device, DeviceConfig, Progress, ProtectionDomain, QueuePair,
};

/// A test hook: a UDP backend that may drop sent packets and may log what the engine's turns
/// do.
///
/// - `loss`: drops each sent packet with probability 1/`every`, drawn from a seeded
///   generator (xorshift64 state). Not every `every`th: go-back-N's answer to a retry can be a
///   multiple of that many packets long, and then the one packet awaited is dropped every time,
///   until the retries run out (tests/transport_sim.rs,
///   periodic_loss_in_step_with_go_back_n_exhausts_the_retries).
/// - `log`: logs each packet received and sent, and each turn's end (every turn ends with one
///   flush) with whether the application's thread (`app`) ran it.
struct Hooked {
    inner: UdpBackend,
    loss: Option<(u64, u64)>,
    log: Option<(Log, std::thread::ThreadId)>,
}

type Log = std::sync::Arc<std::sync::Mutex<Vec<Seen>>>;

/// A packet's BTH opcode and PSN.
fn opcode_and_psn(packet: &[u8]) -> (u8, u32) {
    let psn = u32::from_be_bytes(packet[8..12].try_into().unwrap()) & 0x00ff_ffff;
    (packet[0], psn)
}

impl Backend for Hooked {
    fn local_addr(&self) -> IpAddr {
        self.inner.local_addr()
    }
    fn room(&mut self) -> io::Result<&mut [u8]> {
        self.inner.room()
    }
    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]> {
        if let Some((every, state)) = &mut self.loss {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            if *state % *every == 0 {
                return Ok(&[]);
            }
        }
        let sealed = self.inner.commit(dst, len)?;
        if let (false, Some((log, _))) = (sealed.is_empty(), &self.log) {
            let (opcode, psn) = opcode_and_psn(sealed);
            log.lock().unwrap().push(Seen::Sent { opcode, psn });
        }
        Ok(sealed)
    }
    fn flush(&mut self) -> io::Result<()> {
        if let Some((log, app)) = &self.log {
            let by_app = std::thread::current().id() == *app;
            log.lock().unwrap().push(Seen::TurnEnd { by_app });
        }
        self.inner.flush()
    }
    fn drain_unreachable(&mut self, each: &mut dyn FnMut(IpAddr)) {
        self.inner.drain_unreachable(each)
    }
    fn receive(
        &mut self,
        budget: usize,
        deliver: &mut dyn FnMut(Datagram<'_>),
    ) -> io::Result<usize> {
        let Some((log, _)) = &self.log else {
            return self.inner.receive(budget, deliver);
        };
        self.inner.receive(budget, &mut |datagram| {
            let (opcode, psn) = opcode_and_psn(datagram.packet);
            log.lock().unwrap().push(Seen::Received { opcode, psn });
            deliver(datagram)
        })
    }
    fn source(&mut self) -> &mut dyn mio::event::Source {
        self.inner.source()
    }
    fn counters(&self) -> IoCounters {
        self.inner.counters()
    }
}

struct End {
    device: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

/// The configuration of a device at `address` whose keys come from `seed`.
fn seeded(address: IpAddr, seed: u64) -> DeviceConfig {
    DeviceConfig {
        seed: Some(seed),
        ..DeviceConfig::udp(address)
    }
}

fn open(address: &str, loss_every: Option<u64>) -> End {
    let backend = UdpBackend::bind(address.parse().unwrap()).unwrap();
    let backend_address = backend.local_addr();
    let device = match loss_every {
        Some(every) => Device::with_backend(
            Hooked {
                inner: backend,
                loss: Some((every, 0x9e37_79b9_7f4a_7c15)),
                log: None,
            },
            &seeded(backend_address, 1),
        ),
        None => Device::with_backend(backend, &seeded(backend_address, 2)),
    }
    .unwrap();
    end_on(device)
}

/// An 8 MiB region, a CQ and an RC QP on `device`.
fn end_on(device: Device) -> End {
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(1024).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::MW_BIND;
    let mr = pd.register(8 << 20, access).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    End {
        device,
        pd,
        cq,
        mr,
        qp,
    }
}

fn connect(a: &End, b: &End) {
    // 16 ms: long enough that a debug build's engine is not retransmitting READs it is still
    // answering (a retransmitted READ is answered again in full), short enough to recover fast.
    let options = ConnectOptions {
        timeout: 12,
        ..Default::default()
    };
    a.qp.connect(&b.qp.endpoint(), &options).unwrap();
    b.qp.connect(&a.qp.endpoint(), &options).unwrap();
}

/// Writes 8 MiB from `a` to `b` in 256 KiB messages, reads it back, and checks every byte.
fn round_trip(a: &End, b: &End) {
    let data = pattern(8 << 20, 0);
    a.mr.write(0, &data).unwrap();
    let message = 256 << 10;
    let post = |op: fn(u64, softroce::wire::RKey) -> SendOp| {
        for (i, at) in (0..data.len()).step_by(message).enumerate() {
            let op = op(b.mr.iova() + at as u64, b.mr.rkey());
            let wr = SendWr::new(
                i as u64,
                op,
                Payload::Sges([a.mr.sge(at, message).unwrap()].into()),
            );
            a.qp.post_send(wr).unwrap();
        }
        for _ in 0..data.len() / message {
            let Some(wc) = a.cq.wait(Duration::from_secs(5)).unwrap() else {
                panic!(
                    "stalled:\n{:?}\n{:?}",
                    a.device.counters(),
                    b.device.counters()
                );
            };
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
    };
    post(|remote_addr, rkey| SendOp::Write { remote_addr, rkey });
    assert_eq!(
        b.mr.to_vec()[..data.len()],
        data[..],
        "every written byte landed"
    );
    a.mr.write(0, &vec![0; data.len()]).unwrap();
    post(|remote_addr, rkey| SendOp::Read { remote_addr, rkey });
    assert_eq!(
        a.mr.to_vec()[..data.len()],
        data[..],
        "every byte read back"
    );
}

#[test]
fn rc_over_udp_on_loopback() {
    let (a, b) = (open("127.0.0.21", None), open("127.0.0.22", None));
    connect(&a, &b);
    round_trip(&a, &b);
}

#[test]
fn rc_recovers_from_loss_injected_in_the_io_layer() {
    // Both directions lose one packet in 50, at random: requests, ACKs and READ responses.
    let (a, b) = (open("127.0.0.23", Some(50)), open("127.0.0.24", Some(50)));
    connect(&a, &b);
    round_trip(&a, &b);
    let (core, _) = a.device.counters().unwrap();
    assert!(
        core.retransmitted_packets > 0,
        "the loss was recovered by retransmission"
    );
}

#[test]
fn shutdown_closes_the_socket() {
    // Dropping every handle stops the engine and closes its socket: the address binds again.
    let a = open("127.0.0.25", None);
    drop(a);
    let again = UdpBackend::bind("127.0.0.25".parse().unwrap());
    assert!(again.is_ok(), "{again:?}");
}

/// Posts a UD SEND of `sge` to `dest`.
fn post_ud_send(qp: &QueuePair, wr_id: u64, sge: Sge, dest: UdDest) {
    let mut wr = SendWr::new(wr_id, SendOp::Send, Payload::Sges([sge].into()));
    wr.ud = Some(dest);
    qp.post_send(wr).unwrap();
}

/// A device's port MTU is its link's by rxe's rule unless its configuration sets one, and it
/// bounds UD messages: a UD send over it fails locally (LOC_LEN_ERR, IBTA C10-93.1.1).
#[test]
fn the_port_mtu_follows_the_link_unless_configured() {
    use softroce::io::link_of;
    use softroce::transport::{PathMtu, QpType};
    use softroce::wire::QKey;

    let address = "127.0.0.32".parse().unwrap();
    let lo = link_of(address).unwrap();
    let device = Device::open(DeviceConfig::udp(address)).unwrap();
    assert_eq!(device.port_mtu(), PathMtu::of_link(lo.mtu));
    drop(device);

    let device = Device::open(DeviceConfig {
        port_mtu: Some(PathMtu::Mtu1024),
        ..DeviceConfig::udp("127.0.0.33".parse().unwrap())
    })
    .unwrap();
    assert_eq!(device.port_mtu(), PathMtu::Mtu1024);
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(4).unwrap();
    let mr = pd.register(2048, Access::LOCAL_WRITE).unwrap();
    let qp = pd
        .create_qp()
        .qp_type(QpType::Ud)
        .send_cq(&cq)
        .recv_cq(&cq)
        .qkey(QKey(0x1111_1111))
        .build()
        .unwrap();
    qp.ready_datagram().unwrap();
    // To itself: it has no receive posted, so the message that fits is sent and then dropped.
    let ah = pd.create_ah(device.address()).unwrap();
    let to_itself = UdDest {
        ah,
        remote_qpn: qp.qpn(),
        remote_qkey: QKey(0x1111_1111),
    };
    for (wr_id, len, status) in [(1, 1024, WcStatus::Success), (2, 1025, WcStatus::LocLenErr)] {
        post_ud_send(&qp, wr_id, mr.sge(0, len).unwrap(), to_itself);
        let done = cq
            .wait(Duration::from_secs(5))
            .unwrap()
            .expect("completion");
        assert_eq!((done.wr_id, done.status), (wr_id, status), "{len} bytes");
    }
}

#[test]
fn ud_and_a_shared_receive_queue_over_real_sockets() {
    use softroce::transport::{QpType, RecvWr, SrqModify, GRH_LEN};
    use softroce::wire::QKey;

    let qkey = QKey(0x1111_1111);
    let open_ud = |address: &str| {
        let address = address.parse().unwrap();
        let backend = UdpBackend::bind(address).unwrap();
        let device = Device::with_backend(backend, &DeviceConfig::udp(address)).unwrap();
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(64).unwrap();
        let mr = pd.register(1 << 16, Access::LOCAL_WRITE).unwrap();
        let srq = pd.create_srq(16, 0).unwrap();
        let qp = pd
            .create_qp()
            .qp_type(QpType::Ud)
            .send_cq(&cq)
            .recv_cq(&cq)
            .srq(&srq)
            .qkey(qkey)
            .build()
            .unwrap();
        qp.ready_datagram().unwrap();
        (device, pd, cq, mr, srq, qp)
    };
    let (a_dev, a_pd, a_cq, a_mr, a_srq, a_qp) = open_ud("127.0.0.26");
    let (b_dev, _b_pd, b_cq, b_mr, b_srq, b_qp) = open_ud("127.0.0.27");
    // The receiver's buffer starts with the 40 bytes verbs reserve for the GRH.
    let recv = RecvWr {
        wr_id: 7,
        sges: [b_mr.sge(0, 1024).unwrap()].into(),
    };
    b_srq.post_recv(recv).unwrap();
    assert!(
        b_qp.post_recv(RecvWr {
            wr_id: 8,
            sges: [].into()
        })
        .is_err(),
        "its SRQ takes receives"
    );

    a_mr.write(0, b"a datagram over a real socket").unwrap();
    let ah = a_pd.create_ah(b_dev.address()).unwrap();
    let to_b = UdDest {
        ah,
        remote_qpn: b_qp.qpn(),
        remote_qkey: qkey,
    };
    post_ud_send(&a_qp, 1, a_mr.sge(0, 29).unwrap(), to_b);

    let sent = a_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("send completion");
    assert_eq!(sent.status, WcStatus::Success);
    let got = b_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("receive completion");
    assert_eq!((got.wr_id, got.status), (7, WcStatus::Success));
    assert_eq!(got.byte_len as usize, GRH_LEN + 29);
    assert_eq!(got.src_qp, Some(a_qp.qpn()));
    assert_eq!(got.src_addr, Some(a_dev.address()));
    let mut body = vec![0; 29];
    b_mr.read(GRH_LEN, &mut body).unwrap();
    assert_eq!(body, b"a datagram over a real socket");
    // Over IPv4 the IPv4 header sits in the last 20 of the 40 bytes, with the sender's address.
    let mut grh = vec![0; GRH_LEN];
    b_mr.read(0, &mut grh).unwrap();
    assert_eq!(grh[20] >> 4, 4);
    assert_eq!(grh[32..36], [127, 0, 0, 26]);

    // An SRQ's posts go through its posting queue, without a round trip to the engine, and
    // are held to its depth at the call: `max_wr` posted and not yet taken by a QP is full.
    // A QP taking one frees a place; a resize below what is posted is refused, one to it
    // holds, and a post beyond it is refused.
    let post = |wr_id| {
        let sges = [b_mr.sge(0, 1024).unwrap()];
        b_srq.post_recv(RecvWr::new(wr_id, sges))
    };
    for wr_id in 100..116 {
        post(wr_id).unwrap();
    }
    assert!(matches!(
        post(116),
        Err(softroce::verbs::Error::QueueFull { .. })
    ));
    post_ud_send(&a_qp, 2, a_mr.sge(0, 29).unwrap(), to_b);
    let got = b_cq
        .wait(Duration::from_secs(5))
        .unwrap()
        .expect("receive completion");
    assert_eq!((got.wr_id, got.status), (100, WcStatus::Success));
    post(116).unwrap();
    let shrink = |max_wr| SrqModify {
        max_wr: Some(max_wr),
        srq_limit: None,
    };
    assert!(b_srq.modify(shrink(15)).is_err(), "16 are posted");
    b_srq.modify(shrink(16)).unwrap();
    assert!(matches!(
        post(117),
        Err(softroce::verbs::Error::QueueFull { .. })
    ));
    b_srq.modify(shrink(17)).unwrap();
    post(117).unwrap();
    assert!(matches!(
        post(118),
        Err(softroce::verbs::Error::QueueFull { .. })
    ));
    // Below the size it was created with: the posts are held to the new size.
    a_srq.modify(shrink(2)).unwrap();
    for wr_id in 0..2 {
        a_srq
            .post_recv(RecvWr::new(wr_id, [a_mr.sge(0, 64).unwrap()]))
            .unwrap();
    }
    let third = a_srq.post_recv(RecvWr::new(2, [a_mr.sge(0, 64).unwrap()]));
    assert!(matches!(
        third,
        Err(softroce::verbs::Error::QueueFull { .. })
    ));
}

#[test]
fn a_pcap_records_every_packet_with_a_good_icrc() {
    let path = std::env::temp_dir().join(format!("softroce-{}-record.pcap", std::process::id()));
    let config = DeviceConfig {
        pcap: Some(path.clone()),
        ..DeviceConfig::udp("127.0.0.28".parse().unwrap())
    };
    let recorded = Device::open(config).unwrap();
    let a = end_on(recorded);
    let b = open("127.0.0.29", None);
    connect(&a, &b);
    // A multi-packet WRITE (segmented on the wire: IPv4 IDs 0, 1, 2, ... per run) and a READ.
    let write = SendOp::Write {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    let read = SendOp::Read {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    for (id, op) in [(1, write), (2, read)] {
        let sge = a.mr.sge(0, 256 << 10).unwrap();
        a.qp.post_send(SendWr::new(id, op, Payload::Sges([sge].into())))
            .unwrap();
        let wc =
            a.cq.wait(Duration::from_secs(10))
                .unwrap()
                .expect("a completion");
        assert_eq!(wc.status, WcStatus::Success);
    }
    let (_, io) = a.device.counters().unwrap();
    drop(a);
    drop(b);

    let frames = common::recorded_source_ports(&path).len();
    assert_eq!(
        frames as u64,
        io.sent + io.received,
        "every packet sent and received"
    );
    assert!(frames > 128, "the transfer took {frames} packets");
}

/// With inline progress there is no engine thread: each side's own calls (posting, waiting on
/// its CQ) run its engine, so both must keep calling. A 1 MiB WRITE and three 4 KiB SENDs at
/// MTU 4096 arrive whole, and a wait with nothing to come returns when its time is up.
#[test]
fn inline_progress_moves_data_with_no_engine_thread() {
    use softroce::transport::RecvWr;

    let inline = |address: &str| {
        let config = DeviceConfig {
            progress: Progress::Inline,
            ..DeviceConfig::udp(address.parse().unwrap())
        };
        end_on(Device::open(config).unwrap())
    };
    let (a, b) = (inline("127.0.0.30"), inline("127.0.0.31"));
    connect(&a, &b);
    let written = pattern(1 << 20, 7);
    let sent = pattern(3 << 12, 11);
    a.mr.write(0, &written).unwrap();
    a.mr.write(2 << 20, &sent).unwrap();
    let wait_for = |end: &End, n: usize| {
        for _ in 0..n {
            let wc = end.cq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(wc.expect("a completion").status, WcStatus::Success);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 0..3 {
                let sge = b.mr.sge((4 << 20) + k * 4096, 4096).unwrap();
                b.qp.post_recv(RecvWr::new(k as u64, sge)).unwrap();
            }
            wait_for(&b, 3);
        });
        let write = SendOp::Write {
            remote_addr: b.mr.iova(),
            rkey: b.mr.rkey(),
        };
        let sge = a.mr.sge(0, 1 << 20).unwrap();
        a.qp.post_send(SendWr::new(0, write, Payload::Sges([sge].into())))
            .unwrap();
        for k in 0..3 {
            let sge = a.mr.sge((2 << 20) + k * 4096, 4096).unwrap();
            let wr = SendWr::new(1 + k as u64, SendOp::Send, Payload::Sges([sge].into()));
            a.qp.post_send(wr).unwrap();
        }
        wait_for(&a, 4);
    });
    let landed = b.mr.to_vec();
    assert_eq!(landed[..1 << 20], written[..], "the WRITE landed whole");
    assert_eq!(
        landed[4 << 20..(4 << 20) + (3 << 12)],
        sent[..],
        "the SENDs arrived whole"
    );
    let started = std::time::Instant::now();
    assert!(a.cq.wait(Duration::from_millis(50)).unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(50));
}

/// A poll that hands the application a completion holds back the ACK its turn queued, so that
/// what the application posts in answer leaves ahead of it, in the same train
/// (`Endpoint::hold_acks`); but only on a hybrid engine, whose thread sends the ACK if the
/// application calls nothing more (within about a millisecond, long before the peer's retry
/// timer, 268 ms here). An inline engine, which nothing else runs, holds nothing. Each side
/// answers a SEND three times, then takes one and calls nothing; its recording says in what
/// order its answers and ACKs left.
#[test]
fn a_poll_holds_its_ack_for_the_answer_only_beside_a_thread() {
    use softroce::capture::Capture;
    use softroce::wire::{IpRepr, Opcode};

    let cases = [
        (Progress::Inline, "127.0.0.142", "127.0.0.143"),
        (Progress::Hybrid, "127.0.0.144", "127.0.0.145"),
    ];
    for (progress, polling, sending) in cases {
        let path = std::env::temp_dir().join(format!(
            "softroce-{}-{progress:?}-held.pcap",
            std::process::id()
        ));
        let config = DeviceConfig {
            progress,
            pcap: Some(path.clone()),
            ..DeviceConfig::udp(polling.parse().unwrap())
        };
        let b = end_on(Device::open(config).unwrap());
        let a = open(sending, None);
        let options = ConnectOptions {
            timeout: 16,
            ..Default::default()
        };
        a.qp.connect(&b.qp.endpoint(), &options).unwrap();
        b.qp.connect(&a.qp.endpoint(), &options).unwrap();
        let send = |end: &End, k: u64| {
            let sge = end.mr.sge(64, 8).unwrap();
            end.qp
                .post_send(SendWr::new(k, SendOp::Send, Payload::Sges([sge].into())))
                .unwrap();
        };
        let polled = |end: &End| {
            let mut wcs = Vec::new();
            while end.cq.poll(&mut wcs, 1).unwrap() == 0 {}
            assert_eq!(wcs[0].status, WcStatus::Success, "{progress:?}: {wcs:?}");
        };
        let waited = |end: &End| {
            let wc = end.cq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(wc.expect("a completion").status, WcStatus::Success);
        };
        for k in 0..4 {
            b.qp.post_recv(RecvWr::new(k, b.mr.sge(0, 64).unwrap()))
                .unwrap();
            a.qp.post_recv(RecvWr::new(k, a.mr.sge(0, 64).unwrap()))
                .unwrap();
            send(&a, k);
            polled(&b);
            if k < 3 {
                send(&b, k);
                polled(&b);
                // `a`'s SEND, and `b`'s answer.
                waited(&a);
                waited(&a);
            }
        }
        // `b`'s application calls nothing from here.
        waited(&a);
        let (counters, _) = a.device.counters().unwrap();
        assert_eq!(
            counters.retransmitted_packets, 0,
            "{progress:?}: a SEND went again: {counters:?}"
        );
        drop(b);
        // What `b` sent, in order: answers (SENDs) and ACKs.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let b_address: std::net::Ipv4Addr = polling.parse().unwrap();
        let sent: Vec<Opcode> = Capture::new(&bytes)
            .unwrap()
            .filter_map(|record| {
                let record = record.unwrap();
                let frame = record.frame().unwrap();
                let from_b = matches!(frame.repr.ip, IpRepr::V4 { src, .. } if src == b_address);
                from_b.then(|| frame.packet.bth().opcode())
            })
            .collect();
        // The k-th answer went ahead of the k-th ACK (of `a`'s k-th SEND): it was held.
        let at =
            |opcode| -> Vec<usize> { (0..sent.len()).filter(|&i| sent[i] == opcode).collect() };
        let (answers, acks) = (at(Opcode::RcSendOnly), at(Opcode::RcAck));
        let answer_then_ack = answers.iter().zip(&acks).filter(|(s, a)| s < a).count();
        if progress == Progress::Inline {
            assert_eq!(answer_then_ack, 0, "inline: an ACK was held: {sent:?}");
        } else {
            // The thread may look in between a poll and the answer now and then.
            assert!(answer_then_ack > 0, "hybrid: no ACK was held: {sent:?}");
        }
    }
}

/// What a [`Hooked`] backend's log holds, in order: each turn's end (its flush), each packet received
/// and each one sent, with the thread that ran the turn; and the test's own marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A turn ended: `by_app` if one of the application's calls ran it.
    TurnEnd {
        by_app: bool,
    },
    Received {
        opcode: u8,
        psn: u32,
    },
    Sent {
        opcode: u8,
        psn: u32,
    },
    /// The test is about to call [`Device::flush`].
    FlushCalled,
}

/// A device of `progress` at `address` whose backend logs into the returned log, the calling
/// thread being the application's, connected to a device with its engine thread at `peer`.
fn logged_beside_thread(address: &str, peer: &str, progress: Progress) -> (End, End, Log) {
    let log = std::sync::Arc::default();
    let backend = Hooked {
        inner: UdpBackend::bind(address.parse().unwrap()).unwrap(),
        loss: None,
        log: Some((std::sync::Arc::clone(&log), std::thread::current().id())),
    };
    let config = DeviceConfig {
        progress,
        ..DeviceConfig::udp(address.parse().unwrap())
    };
    let logged = end_on(Device::with_backend(backend, &config).unwrap());
    let peer = open(peer, None);
    connect(&logged, &peer);
    (logged, peer, log)
}

/// The turns of a log, each with what it received and sent (and the test's marks made before
/// it began), and whether the application ran it.
fn turns(log: &[Seen]) -> Vec<(bool, Vec<Seen>)> {
    let mut turns = Vec::new();
    let mut this = Vec::new();
    for &seen in log {
        match seen {
            Seen::TurnEnd { by_app } => turns.push((by_app, std::mem::take(&mut this))),
            packet => this.push(packet),
        }
    }
    turns
}

/// The application's turns hold a plain ACK back for two turns at the most
/// (`engine::HOLD_ACKS_TURNS`): a turn that receives a SEND and hands the application its
/// completion holds the ACK, the next holds it still, and the one after sends it, whether or
/// not the application posted anything. An application that polls on without answering (as
/// perftest polls its send CQ, then its receive CQ) must not keep its peer waiting for the
/// ACK until its own thread takes over. Each SEND here waits for the last one's ACK; the
/// receiving application polls without pause and posts nothing once the SENDs begin. Where the
/// engine thread ran a turn in between, the case tells nothing: it is left out (its looks hold
/// ACKs for a time, `engine::HOLD_ACKS_FOR`; see
/// `an_application_that_never_answers_still_has_its_acks_sent`).
#[test]
fn an_ack_held_for_the_answer_goes_out_in_the_second_turn_after_without_one() {
    use softroce::wire::Opcode;

    let (polling, sending, log) =
        logged_beside_thread("127.0.0.146", "127.0.0.147", Progress::Hybrid);
    let sends = 40u64;
    for k in 0..sends {
        polling
            .qp
            .post_recv(RecvWr::new(k, polling.mr.sge(0, 64).unwrap()))
            .unwrap();
    }
    // A turn that takes posts holds nothing: let one take these before any SEND can come.
    assert!(polling.device.flush(Duration::from_secs(5)).unwrap());
    let poller = std::thread::scope(|s| {
        s.spawn(|| {
            for k in 0..sends {
                sending
                    .qp
                    .post_send(SendWr::send(k, sending.mr.sge(0, 8).unwrap()))
                    .unwrap();
                let wc = sending.cq.wait(Duration::from_secs(10)).unwrap();
                assert_eq!(wc.expect("the SEND completes").status, WcStatus::Success);
            }
        });
        // The polling application: its calls run the turns, and it posts nothing.
        let mut received = 0;
        let mut wcs = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while received < sends && std::time::Instant::now() < deadline {
            wcs.clear();
            received += polling.cq.poll(&mut wcs, 4).unwrap() as u64;
        }
        // A few turns more, for the last ACK.
        for _ in 0..8 {
            polling.cq.poll(&mut wcs, 4).unwrap();
        }
        received
    });
    assert_eq!(poller, sends, "every SEND was received");
    let turns = turns(&log.lock().unwrap());
    let (send_only, ack) = (Opcode::RcSendOnly.value(), Opcode::RcAck.value());
    let mut checked = 0;
    for (i, (by_app, seen)) in turns.iter().enumerate() {
        for &packet in seen {
            let Seen::Received { opcode, psn } = packet else {
                continue;
            };
            if opcode != send_only || !by_app {
                continue;
            }
            // The turn that first sent an ACK of this PSN or a later one.
            let acked_in = turns[i..].iter().position(|(_, seen)| {
                seen.iter().any(|&p| {
                    matches!(p, Seen::Sent { opcode, psn: acked } if opcode == ack && acked >= psn)
                })
            });
            let Some(acked_in) = acked_in else {
                panic!("the SEND of PSN {psn} was never acknowledged: {turns:?}");
            };
            // The engine thread's looks in hold ACKs too, for a time
            // (`engine::HOLD_ACKS_FOR`): only turns the application ran alone tell the count.
            let by_app_alone = turns[i..].iter().take(3).all(|(by_app, _)| *by_app);
            if turns.len() > i + 2 && by_app_alone {
                assert_eq!(
                    acked_in,
                    2,
                    "the ACK of PSN {psn} went {acked_in} turns after the SEND: {:?}",
                    &turns[i..(i + 4).min(turns.len())]
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no SEND was received and acknowledged by the application's turns alone"
    );
}

/// [`Device::flush`] waits for everything queued, held ACKs too: the turn that takes the
/// flush sends an ACK the poll's turn just before it held for the answer, rather than hold it
/// a turn more, so that a program that flushes and exits leaves its peer nothing to retry.
/// Where the engine thread ran either turn, the case tells nothing: it is left out.
#[test]
fn a_flush_sends_the_acks_a_poll_held_in_its_first_turn() {
    use softroce::wire::Opcode;

    let (polling, sending, log) =
        logged_beside_thread("127.0.0.148", "127.0.0.149", Progress::Hybrid);
    for k in 0..40u64 {
        polling
            .qp
            .post_recv(RecvWr::new(k, polling.mr.sge(0, 64).unwrap()))
            .unwrap();
        sending
            .qp
            .post_send(SendWr::send(k, sending.mr.sge(0, 8).unwrap()))
            .unwrap();
        let mut wcs = Vec::new();
        while polling.cq.poll(&mut wcs, 1).unwrap() == 0 {}
        assert_eq!(wcs[0].status, WcStatus::Success);
        log.lock().unwrap().push(Seen::FlushCalled);
        assert!(polling.device.flush(Duration::from_secs(10)).unwrap());
        let wc = sending.cq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(wc.expect("the SEND completes").status, WcStatus::Success);
    }
    let turns = turns(&log.lock().unwrap());
    let (send_only, ack) = (Opcode::RcSendOnly.value(), Opcode::RcAck.value());
    let mut checked = 0;
    for (j, (by_app, seen)) in turns.iter().enumerate().skip(1) {
        if !seen.contains(&Seen::FlushCalled) || !by_app {
            continue;
        }
        let (polled_by_app, polled) = &turns[j - 1];
        let received = polled.iter().find_map(|&p| match p {
            Seen::Received { opcode, psn } if opcode == send_only => Some(psn),
            _ => None,
        });
        let Some(psn) = received.filter(|_| *polled_by_app) else {
            continue;
        };
        let acks = |turn: &[Seen]| {
            turn.iter().any(
                |&p| matches!(p, Seen::Sent { opcode, psn: acked } if opcode == ack && acked >= psn),
            )
        };
        // A poll whose turn took posts (the next receive) held nothing.
        if acks(polled) {
            continue;
        }
        assert!(
            acks(seen),
            "the flush's turn did not acknowledge PSN {psn}: {:?}",
            &turns[j - 1..(j + 2).min(turns.len())]
        );
        checked += 1;
    }
    assert!(
        checked > 0,
        "no flush came right after the application's turn that took its SEND"
    );
}

/// Pins the calling thread, and the threads it starts from then on (a device's engine
/// thread), to `cpu`, so that `std::thread::available_parallelism` says 1 there, as in the
/// lab's guests of one CPU each.
fn pin_to(cpu: usize) {
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    rustix::thread::sched_setaffinity(None, &one).unwrap();
}

/// Two CPUs this process may run on (the same one twice if it has only one).
fn two_cpus() -> (usize, usize) {
    let allowed = rustix::thread::sched_getaffinity(None).unwrap();
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| allowed.is_set(cpu))
        .take(2)
        .collect();
    (cpus[0], *cpus.last().unwrap())
}

/// How long a test's thread waits for another's word before it gives up.
const MEETING: Duration = Duration::from_secs(60);

/// Two test threads' meeting point that cannot hang: each says it is there and waits for the
/// other's word, which the other's panic (dropping its end) ends as well.
fn meet(say: &std::sync::mpsc::Sender<()>, hear: &std::sync::mpsc::Receiver<()>) {
    // The other side may have gone already: its panic is the failure to report.
    let _ = say.send(());
    hear.recv_timeout(MEETING)
        .expect("the other side of the test did not come");
}

/// One side of `ib_write_lat`'s loop, `rounds` times: waits until the count at offset 0 of its
/// region is the peer's next (not before its first WRITE if it `starts`), WRITEs its own next
/// count there in the peer's region, and polls its CQ for that WRITE's completion; then
/// waits for the peer's last WRITE. Between the count's arrival and its answer it calls
/// nothing, as perftest spins on its memory.
fn write_latency_side(end: &End, peer: RemoteRegion, rounds: u32, starts: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let count = || {
        let mut bytes = [0; 4];
        end.mr.read(0, &mut bytes).unwrap();
        u32::from_le_bytes(bytes)
    };
    for k in 1..=rounds {
        let awaited = if starts { k - 1 } else { k };
        while count() != awaited {
            assert!(
                std::time::Instant::now() < deadline,
                "round {k}: no WRITE came"
            );
            std::hint::spin_loop();
        }
        end.mr.write(64, &k.to_le_bytes()).unwrap();
        let write = SendOp::Write {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        };
        let sge = end.mr.sge(64, 4).unwrap();
        end.qp
            .post_send(SendWr::new(k.into(), write, Payload::Sges([sge].into())))
            .unwrap();
        let mut wcs = Vec::new();
        while end.cq.poll(&mut wcs, 1).unwrap() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {k}: no completion"
            );
        }
        assert_eq!(wcs[0].status, WcStatus::Success, "round {k}");
    }
    // The peer's last WRITE, which the starting side's last round did not wait for.
    while count() != rounds {
        assert!(
            std::time::Instant::now() < deadline,
            "the last WRITE did not come"
        );
        std::hint::spin_loop();
    }
}

/// On one CPU a side, as in the lab's guests: two applications that answer each other's
/// WRITEs as `ib_write_lat` does. Each side's ACK of the peer's WRITE waits for its answer and
/// leaves in the same send (the application's turns hold it, and so do its engine thread's
/// turns beside it, `Runner::Aside`), so the application polling for its WRITE's completion
/// takes the peer's next WRITE in the same receive as the ACK, in its own call. Once under
/// way, then, the logged side's application runs the turns that receive most of its peer's
/// WRITEs (a tenth at least, where a loaded machine keeps it off its CPU). Before, its engine thread sent each ACK alone, the peer's application spun on its
/// memory for the WRITE that came after, and the thread took over for that spinner: every
/// WRITE cost two wake-ups of a thread that shares the application's CPU (`ib_write_lat`
/// 23 µs on loopback, against 8 now; about 530 µs in the lab's guests, against 400).
#[test]
fn on_one_cpu_each_the_answers_of_write_latency_leave_with_the_acks() {
    use softroce::wire::Opcode;

    let (cpu_logged, cpu_peer) = two_cpus();
    let rounds = 600;
    // A retry timer of 268 ms, which a held ACK never nears, but a loaded machine's
    // scheduling might.
    let options = ConnectOptions {
        timeout: 16,
        ..Default::default()
    };
    let (to_peer, from_logged) = std::sync::mpsc::channel();
    let (to_logged, from_peer) = std::sync::mpsc::channel();
    let (logged_says, peer_hears) = std::sync::mpsc::channel();
    let (peer_says, logged_hears) = std::sync::mpsc::channel();
    let options = &options;
    let (log, retransmitted) = std::thread::scope(|s| {
        let logged = s.spawn(move || {
            pin_to(cpu_logged);
            let log: Log = std::sync::Arc::default();
            let backend = Hooked {
                inner: UdpBackend::bind("127.0.0.151".parse().unwrap()).unwrap(),
                loss: None,
                log: Some((std::sync::Arc::clone(&log), std::thread::current().id())),
            };
            let config = DeviceConfig::udp("127.0.0.151".parse().unwrap());
            let end = end_on(Device::with_backend(backend, &config).unwrap());
            to_peer.send((end.qp.endpoint(), end.mr.remote())).unwrap();
            let (endpoint, region) = from_peer.recv_timeout(MEETING).unwrap();
            end.qp.connect(&endpoint, options).unwrap();
            meet(&logged_says, &logged_hears);
            write_latency_side(&end, region, rounds, true);
            // Until the peer's last WRITE has its ACK.
            meet(&logged_says, &logged_hears);
            let retransmitted = end.device.counters().unwrap().0.retransmitted_packets;
            (log, retransmitted)
        });
        let peer = s.spawn(move || {
            pin_to(cpu_peer);
            let end = open("127.0.0.150", None);
            to_logged
                .send((end.qp.endpoint(), end.mr.remote()))
                .unwrap();
            let (endpoint, region) = from_logged.recv_timeout(MEETING).unwrap();
            end.qp.connect(&endpoint, options).unwrap();
            meet(&peer_says, &peer_hears);
            write_latency_side(&end, region, rounds, false);
            meet(&peer_says, &peer_hears);
            end.device.counters().unwrap().0.retransmitted_packets
        });
        let (log, logged_retransmitted) = logged.join().unwrap();
        (log, logged_retransmitted + peer.join().unwrap())
    });
    assert_eq!(
        retransmitted, 0,
        "a WRITE went again: an ACK was held too long"
    );
    let turns = turns(&log.lock().unwrap());
    let write_only = Opcode::RcWriteOnly.value();
    let receiving: Vec<bool> = turns
        .iter()
        .filter(|(_, seen)| {
            seen.iter()
                .any(|&p| matches!(p, Seen::Received { opcode, .. } if opcode == write_only))
        })
        .map(|&(by_app, _)| by_app)
        .collect();
    // Under way: the second half of the rounds.
    let later = &receiving[receiving.len() / 2..];
    let by_app = later.iter().filter(|&&by_app| by_app).count();
    // Most, on a quiet machine (265 to 283 of 300 in four runs of a debug build); under two
    // busy loops beside the tests, 68 to 188. Before, none (300 of 300 by the thread).
    assert!(
        10 * by_app >= later.len(),
        "the engine thread received {} of the last {} WRITEs",
        later.len() - by_app,
        later.len()
    );
}

/// A poll that finds completions waiting, with nothing posted since the last turn, hands them
/// out without a turn of its own (`EngineHandle::help_poll`), three polls in a row at the
/// most: perftest's latency tests take a SEND's completion and a receive's in two polls, both
/// delivered by the first one's turn, and the second poll's turn was a `recvmsg` that found
/// nothing, on the exchange's critical path. Inline progress, so that every turn is one of
/// the application's calls and is logged as such.
#[test]
fn polls_that_find_completions_waiting_run_no_turn_three_times_in_a_row() {
    let (polling, sending, log) =
        logged_beside_thread("127.0.0.150", "127.0.0.151", Progress::Inline);
    for k in 0..8u64 {
        let sge = polling.mr.sge(64 * k as usize, 64).unwrap();
        polling.qp.post_recv(RecvWr::new(k, sge)).unwrap();
    }
    for k in 0..8u64 {
        let sge = sending.mr.sge(0, 8).unwrap();
        sending.qp.post_send(SendWr::send(k, sge)).unwrap();
    }
    // The eight SENDs wait in the polling device's socket: it runs only in its calls.
    std::thread::sleep(Duration::from_millis(200));
    let turns = || {
        let log = log.lock().unwrap();
        log.iter()
            .filter(|seen| matches!(seen, Seen::TurnEnd { .. }))
            .count()
    };
    let mut wcs = Vec::new();
    let mut poll = || {
        wcs.clear();
        let polled = polling.cq.poll(&mut wcs, 1).unwrap();
        assert_eq!(
            wcs.iter().map(|wc| wc.status).collect::<Vec<_>>(),
            [WcStatus::Success]
        );
        polled
    };
    let first = turns();
    // The CQ is empty: the poll runs a turn, which takes the eight SENDs.
    assert_eq!(poll(), 1);
    assert_eq!(turns(), first + 1, "the first poll ran one turn");
    for n in 0..3 {
        assert_eq!(poll(), 1);
        assert_eq!(turns(), first + 1, "poll {n} after it ran a turn");
    }
    // Three in a row went without: this one runs a turn, though completions wait.
    assert_eq!(poll(), 1);
    assert_eq!(turns(), first + 2, "the fifth poll ran no turn");
    for _ in 0..3 {
        assert_eq!(poll(), 1);
    }
    assert_eq!(turns(), first + 2);
}

/// `len` bytes that differ from one offset to the next and from one seed to another.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed as u8)
        .collect()
}

/// Memory windows through the verbs API, over real sockets: a type 2 window bound by a work
/// request serves the peer of its QP within its range and rights, until the peer's SEND with
/// Invalidate frees it; a type 1 window bound with `bind_mw` serves READs; dropped, each is
/// deallocated.
#[test]
fn memory_windows_over_real_sockets() {
    let (a, b) = (open("127.0.0.110", None), open("127.0.0.111", None));
    connect(&a, &b);
    // One more window, in a PD of its own, to count.
    let pd = b.device.alloc_pd().unwrap();
    let other = pd.alloc_mw(MwType::Type2).unwrap();
    let b_pd = &b.pd;
    let next = |end: &End| {
        end.cq
            .wait(Duration::from_secs(5))
            .unwrap()
            .expect("a completion")
    };

    let window = b_pd.alloc_mw(MwType::Type2).unwrap();
    let bind = window.bind_request(&b.mr, 4096, 4096, Access::REMOTE_WRITE);
    let wr = SendWr::new(1, SendOp::BindMw(bind), Payload::Sges(Default::default()));
    b.qp.post_send(wr).unwrap();
    let bound = next(&b);
    assert_eq!((bound.wr_id, bound.status), (1, WcStatus::Success));

    let write = |at: u64, rkey| {
        let op = SendOp::Write {
            remote_addr: b.mr.iova() + at,
            rkey,
        };
        SendWr::new(2, op, Payload::Sges([a.mr.sge(0, 16).unwrap()].into()))
    };
    a.mr.write(0, b"through a window").unwrap();
    a.qp.post_send(write(4096 + 100, window.rkey())).unwrap();
    assert_eq!(next(&a).status, WcStatus::Success);
    assert_eq!(&b.mr.to_vec()[4196..4212], b"through a window");

    // The type 1 window, bound for READs through the same QP.
    let reader = b_pd.alloc_mw(MwType::Type1).unwrap();
    b.qp.bind_mw(3, &reader, &b.mr, (0, 8192), Access::REMOTE_READ)
        .unwrap();
    assert_eq!(next(&b).status, WcStatus::Success);
    let read = SendOp::Read {
        remote_addr: b.mr.iova() + 4196,
        rkey: reader.rkey(),
    };
    let wr = SendWr::new(
        4,
        read,
        Payload::Sges([a.mr.sge(1 << 20, 16).unwrap()].into()),
    );
    a.qp.post_send(wr).unwrap();
    assert_eq!(next(&a).status, WcStatus::Success);
    assert_eq!(&a.mr.to_vec()[1 << 20..(1 << 20) + 16], b"through a window");
    assert_eq!(b.device.resources().unwrap().windows, 3);

    // The peer frees the type 2 window; from then on its rkey reaches nothing.
    let recv = RecvWr {
        wr_id: 5,
        sges: [b.mr.sge(0, 64).unwrap()].into(),
    };
    b.qp.post_recv(recv).unwrap();
    let inv = SendOp::SendWithInv {
        rkey: window.rkey(),
    };
    let wr = SendWr::new(6, inv, Payload::Sges([a.mr.sge(0, 8).unwrap()].into()));
    a.qp.post_send(wr).unwrap();
    assert_eq!(next(&a).status, WcStatus::Success);
    assert_eq!(next(&b).invalidated_rkey, Some(window.rkey()));
    a.qp.post_send(write(4096, window.rkey())).unwrap();
    assert_eq!(next(&a).status, WcStatus::RemAccessErr);

    drop((window, reader, other, pd));
    assert_eq!(b.device.resources().unwrap().windows, 0);
}

/// Requests posted while the core's send queue is full wait in the QP's channel. The engine
/// turn whose ACKs make room takes them, with no further post to wake it: once everything in
/// flight is acknowledged no timer is armed, and a turn that slept on them would sleep for
/// ever (engine::Doorbell).
#[test]
fn requests_posted_to_a_full_queue_go_out_without_another_post() {
    let (a, b) = (open("127.0.0.34", None), open("127.0.0.35", None));
    let qp =
        a.pd.create_qp()
            .send_cq(&a.cq)
            .recv_cq(&a.cq)
            .max_send_wr(2)
            .build()
            .unwrap();
    let options = ConnectOptions {
        timeout: 12,
        ..Default::default()
    };
    qp.connect(&b.qp.endpoint(), &options).unwrap();
    // b's QP is still in RESET: it drops the WRITEs, and nothing is acknowledged until the
    // queue and the channel behind it are full.
    let write = |i: u64| {
        let op = SendOp::Write {
            remote_addr: b.mr.iova() + 64 * i,
            rkey: b.mr.rkey(),
        };
        SendWr::new(i, op, Payload::Sges([a.mr.sge(0, 64).unwrap()].into()))
    };
    let mut posted = 0;
    loop {
        match qp.post_send(write(posted)) {
            Ok(()) => posted += 1,
            Err(softroce::verbs::Error::QueueFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(posted < 64, "the queue never filled");
    }
    b.qp.connect(&qp.endpoint(), &options).unwrap();
    for _ in 0..posted {
        let wc = a.cq.wait(Duration::from_secs(5)).unwrap();
        let wc = wc.unwrap_or_else(|| panic!("stalled: {:?}", a.device.counters()));
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
}

/// A device at `address` with hybrid progress.
fn hybrid_device(address: &str) -> Device {
    let config = DeviceConfig {
        progress: Progress::Hybrid,
        ..DeviceConfig::udp(address.parse().unwrap())
    };
    Device::open(config).unwrap()
}

/// A device with hybrid progress at `hybrid`, connected to one with its engine thread at
/// `thread`.
fn hybrid_beside_thread(hybrid: &str, thread: &str) -> (End, End) {
    let (a, b) = (end_on(hybrid_device(hybrid)), open(thread, None));
    connect(&a, &b);
    (a, b)
}

/// Hybrid progress: while the application keeps calling, its calls run the engine; once it
/// stops, the engine's own thread takes over within about a millisecond (engine `drive`). A
/// ping-pong runs on the application's calls; then, with the application calling nothing, a
/// WRITE it posted just before goes out, and the peer's READ of 1 MiB is answered.
#[test]
fn hybrid_progress_answers_the_peer_while_the_application_calls_nothing() {
    let (a, b) = hybrid_beside_thread("127.0.0.115", "127.0.0.116");
    let completes = |end: &End| {
        let wc = end.cq.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(wc.expect("a completion").status, WcStatus::Success);
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 0..50u64 {
                b.qp.post_recv(RecvWr::new(k, b.mr.sge(0, 64).unwrap()))
                    .unwrap();
                completes(&b);
                let wr = SendWr::new(
                    k,
                    SendOp::Send,
                    Payload::Sges([b.mr.sge(64, 8).unwrap()].into()),
                );
                b.qp.post_send(wr).unwrap();
                completes(&b);
            }
        });
        for k in 0..50u64 {
            a.qp.post_recv(RecvWr::new(k, a.mr.sge(0, 64).unwrap()))
                .unwrap();
            let wr = SendWr::new(
                k,
                SendOp::Send,
                Payload::Sges([a.mr.sge(64, 8).unwrap()].into()),
            );
            a.qp.post_send(wr).unwrap();
            // The SEND's completion and the peer's answer, in either order.
            completes(&a);
            completes(&a);
        }
    });
    let written = pattern(1 << 20, 3);
    a.mr.write(1 << 20, &written).unwrap();
    let write = SendOp::Write {
        remote_addr: b.mr.iova() + (2 << 20),
        rkey: b.mr.rkey(),
    };
    let sge = a.mr.sge(1 << 20, 1 << 20).unwrap();
    a.qp.post_send(SendWr::new(7, write, Payload::Sges([sge].into())))
        .unwrap();
    // From here `a`'s application calls nothing until the peer is done.
    let read = SendOp::Read {
        remote_addr: a.mr.iova() + (1 << 20),
        rkey: a.mr.rkey(),
    };
    let sge = b.mr.sge(4 << 20, 1 << 20).unwrap();
    b.qp.post_send(SendWr::new(8, read, Payload::Sges([sge].into())))
        .unwrap();
    completes(&b);
    let landed = b.mr.to_vec();
    assert_eq!(
        landed[4 << 20..5 << 20],
        written[..],
        "the READ was answered"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while landed_at(&b, 2 << 20) != written && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(landed_at(&b, 2 << 20), written, "the posted WRITE went out");
    completes(&a);
}

fn landed_at(end: &End, offset: usize) -> Vec<u8> {
    end.mr.to_vec()[offset..offset + (1 << 20)].to_vec()
}

/// A command (here, registering a region) on a hybrid device whose application has paused
/// long enough for the engine thread to take over and sleep on the socket: the command
/// interrupts that sleep and runs. Before the hand-over queued such callers, the engine thread
/// could take the engine back from under one and sleep with its interruption spent: a hang.
#[test]
fn hybrid_commands_after_pauses_never_wait_on_a_sleeping_engine() {
    let device = hybrid_device("127.0.0.117");
    let (done, finished) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let pd = device.alloc_pd().unwrap();
        for i in 0..600u64 {
            // A large region takes the engine long enough for its thread to look in.
            let len = if i % 7 == 0 { 16 << 20 } else { 4096 };
            drop(pd.register(len, Access::LOCAL_WRITE).unwrap());
            if i % 3 == 0 {
                std::thread::sleep(Duration::from_micros(900 + (i % 5) * 100));
            }
        }
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("every registration returned");
}

/// Dropping a QP flushes every request the application posted to it, those the engine had
/// not taken from the posting channel yet included: they used to vanish without a completion.
/// Under hybrid progress a post runs no turn, and the drop's command runs before the posts of
/// the same turn, so the requests posted just before the drop are still in the channel.
#[test]
fn dropping_a_qp_flushes_the_requests_still_on_their_way_to_it() {
    let (a, b) = hybrid_beside_thread("127.0.0.118", "127.0.0.119");
    let End { qp, cq, mr, .. } = a;
    // A turn of the application's: the engine thread stands aside for a while.
    cq.poll(&mut Vec::new(), 1).unwrap();
    for k in 0..8u64 {
        qp.post_recv(RecvWr::new(100 + k, mr.sge(0, 64).unwrap()))
            .unwrap();
        let sge = mr.sge(4096, 64).unwrap();
        let write = SendOp::Write {
            remote_addr: b.mr.iova(),
            rkey: b.mr.rkey(),
        };
        qp.post_send(SendWr::new(k, write, Payload::Sges([sge].into())))
            .unwrap();
    }
    drop(qp);
    let mut completed: Vec<u64> = (0..16)
        .map(|_| {
            let wc = cq.wait(Duration::from_secs(10)).unwrap();
            let wc = wc.expect("every request completes");
            assert!(
                matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr),
                "{wc:?}"
            );
            wc.wr_id
        })
        .collect();
    completed.sort_unstable();
    let posted: Vec<u64> = (0..8).chain(100..108).collect();
    assert_eq!(completed, posted);
    assert!(cq.wait(Duration::from_millis(20)).unwrap().is_none());
}

/// A command and a CQ wait that come together while a hybrid engine's thread sleeps on the
/// socket each interrupt that sleep; the two interruptions can merge into one, which the
/// thread spends. If the waiter then got the engine and slept on the socket, the command
/// stayed blocked until the wait ended. Here the wait is for the completion of a SEND that the
/// other thread posts only after its command returns, so that would be a deadlock, broken
/// only by the wait's 5 s timeout.
#[test]
fn hybrid_a_command_beside_a_waiting_thread_is_not_held_up_by_the_wait() {
    let (a, b) = hybrid_beside_thread("127.0.0.121", "127.0.0.122");
    let rounds = 40;
    for k in 0..rounds {
        b.qp.post_recv(RecvWr::new(k, b.mr.sge(0, 64).unwrap()))
            .unwrap();
    }
    let together = std::sync::Barrier::new(2);
    let waited = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            (0..rounds)
                .map(|_| {
                    // Quiet long enough for the engine thread to take over and sleep.
                    std::thread::sleep(Duration::from_millis(3));
                    together.wait();
                    let wc = a.cq.wait(Duration::from_secs(5)).unwrap();
                    wc.map(|wc| (wc.wr_id, wc.status))
                })
                .collect::<Vec<_>>()
        });
        for k in 0..rounds {
            std::thread::sleep(Duration::from_millis(3));
            together.wait();
            drop(a.pd.register(4096, Access::LOCAL_WRITE).unwrap());
            a.qp.post_send(SendWr::send(k, a.mr.sge(0, 8).unwrap()))
                .unwrap();
        }
        waiter.join().unwrap()
    });
    let held_up = waited.iter().filter(|wc| wc.is_none()).count();
    assert_eq!(held_up, 0, "rounds whose wait ran out: {waited:?}");
    assert!(waited
        .iter()
        .flatten()
        .all(|(_, status)| *status == WcStatus::Success));
}

/// The CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    Duration::from(clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap())
}

/// `DeviceConfig::busy_poll`: after packets move, a CQ wait's turns poll the socket for that
/// long, then sleep in it; with none, the wait sleeps at once. Inline progress runs every turn
/// on the waiting thread, so the thread's CPU time tells polling from sleeping. Ten rounds of
/// an 8-byte WRITE, then a 15 ms wait with nothing to come, then a 30 ms one: polling for the
/// longest allowed (10 ms) uses about 100 ms of CPU in the first waits and next to none in the
/// second (nothing moved since the first began); with none, the first waits use next to none.
#[test]
fn an_engine_polls_for_busy_poll_after_packets_move_then_sleeps() {
    use softroce::verbs::MAX_BUSY_POLL;

    // The CPU time of the first and of the second quiet waits, summed over the rounds.
    let cpu_of_quiet_waits = |busy_poll: Duration, addresses: [&str; 2]| {
        let a = end_on(
            Device::open(DeviceConfig {
                progress: Progress::Inline,
                busy_poll: Some(busy_poll),
                ..DeviceConfig::udp(addresses[0].parse().unwrap())
            })
            .unwrap(),
        );
        let b = end_on(
            Device::open(DeviceConfig {
                busy_poll: Some(Duration::ZERO),
                ..DeviceConfig::udp(addresses[1].parse().unwrap())
            })
            .unwrap(),
        );
        connect(&a, &b);
        let quiet_wait = |ms| {
            let before = thread_cpu_time();
            assert!(a.cq.wait(Duration::from_millis(ms)).unwrap().is_none());
            thread_cpu_time() - before
        };
        let (mut first, mut second) = (Duration::ZERO, Duration::ZERO);
        for round in 0..10 {
            let write = SendOp::Write {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
            };
            let sge = a.mr.sge(0, 8).unwrap();
            a.qp.post_send(SendWr::new(round, write, Payload::Sges([sge].into())))
                .unwrap();
            let wc = a.cq.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(
                wc.expect("the WRITE's completion").status,
                WcStatus::Success
            );
            first += quiet_wait(15);
            second += quiet_wait(30);
        }
        (first, second)
    };
    let (polling, after) = cpu_of_quiet_waits(MAX_BUSY_POLL, ["127.0.0.36", "127.0.0.37"]);
    let (sleeping, _) = cpu_of_quiet_waits(Duration::ZERO, ["127.0.0.38", "127.0.0.39"]);
    // Floors and ceilings far from the expected figures: the other tests share the CPUs.
    assert!(
        polling >= Duration::from_millis(20),
        "the waits polled for 10 ms after each WRITE: {polling:?} of CPU"
    );
    assert!(
        after < Duration::from_millis(15),
        "10 ms after the last packet the waits slept: {after:?} of CPU"
    );
    assert!(
        sleeping < Duration::from_millis(15),
        "with no busy polling the waits slept: {sleeping:?} of CPU"
    );
}

/// The ACKs a hybrid engine holds for its application's answer go without one: here the
/// application polls its CQ and never posts, on one CPU with its engine's thread, while its
/// peer WRITEs into its memory one WRITE at a time, each waiting for the last's ACK. Its
/// polls' turns hold each ACK for two turns at the most, and its thread's turns, which find
/// the WRITEs the polls leave (a spinner's, to the thread), for `engine::HOLD_ACKS_FOR`:
/// every WRITE completes, and none is sent again (the peer's retry timer: 268 ms).
#[test]
fn an_application_that_never_answers_still_has_its_acks_sent() {
    let (cpu_polling, cpu_writer) = two_cpus();
    let options = ConnectOptions {
        timeout: 16,
        ..Default::default()
    };
    let writes = 300u64;
    let (to_writer, from_polling) = std::sync::mpsc::channel();
    let (to_polling, from_writer) = std::sync::mpsc::channel();
    // The polling side's word that its QP is ready (a WRITE before would be lost, and sent
    // again), and the writer's that it is done (or gone: its end dropped).
    let (polling_ready, writer_hears) = std::sync::mpsc::channel::<()>();
    let (writer_done, polling_hears) = std::sync::mpsc::channel::<()>();
    let options = &options;
    let retransmitted = std::thread::scope(|s| {
        s.spawn(move || {
            pin_to(cpu_polling);
            let end = open("127.0.0.152", None);
            to_writer
                .send((end.qp.endpoint(), end.mr.remote()))
                .unwrap();
            let endpoint = from_writer.recv_timeout(MEETING).unwrap();
            end.qp.connect(&endpoint, options).unwrap();
            polling_ready.send(()).unwrap();
            let mut wcs = Vec::new();
            while polling_hears.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
                assert_eq!(
                    end.cq.poll(&mut wcs, 4).unwrap(),
                    0,
                    "nothing completes here"
                );
            }
        });
        let writer = s.spawn(move || {
            pin_to(cpu_writer);
            let end = open("127.0.0.153", None);
            let (endpoint, region): (_, RemoteRegion) = from_polling.recv_timeout(MEETING).unwrap();
            end.qp.connect(&endpoint, options).unwrap();
            to_polling.send(end.qp.endpoint()).unwrap();
            writer_hears.recv_timeout(MEETING).unwrap();
            for k in 0..writes {
                let write = SendOp::Write {
                    remote_addr: region.addr,
                    rkey: region.rkey,
                };
                let sge = end.mr.sge(0, 8).unwrap();
                end.qp
                    .post_send(SendWr::new(k, write, Payload::Sges([sge].into())))
                    .unwrap();
                let wc = end.cq.wait(Duration::from_secs(10)).unwrap();
                assert_eq!(wc.expect("the WRITE completes").status, WcStatus::Success);
            }
            writer_done.send(()).unwrap();
            end.device.counters().unwrap().0.retransmitted_packets
        });
        writer.join().unwrap()
    });
    assert_eq!(
        retransmitted, 0,
        "a WRITE went again: its ACK was held too long"
    );
}
