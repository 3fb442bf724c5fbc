//! What a device does when the network or its socket fails, over real sockets on loopback
//! (127.0.7.0/24). One packet the kernel refuses costs that packet, and a destination nothing
//! can reach costs the QPs connected to it; only a dead socket stops the device, and then every
//! call says why. Each test is a way the device used to die, or a poll loop used to spin.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softroce::io::{Backend, IoCounters, UdpBackend};
use softroce::memory::Access;
use softroce::transport::{
    Datagram, Payload, QpEndpoint, RecvWr, SendOp, SendWr, UdDest, WcStatus, WorkCompletion,
};
use softroce::verbs::{
    CompletionQueue, ConnectOptions, Device, DeviceConfig, EnginePanicked, Error, MemoryRegion,
    Progress, QueuePair,
};
use softroce::wire::{QKey, Qpn};

fn ip(last: u8) -> IpAddr {
    format!("127.0.7.{last}").parse().unwrap()
}

/// Healthy, for a [`Breakable`]'s `fault`.
const HEALTHY: u8 = 0;
/// Every call fails as on a closed descriptor (EBADF).
const EBADF: u8 = 1;
/// Every call panics, as a bug in a backend or the engine would.
const PANIC: u8 = 2;

/// A UDP backend whose socket can be made to fail as a closed descriptor does (EBADF), or to
/// panic.
struct Breakable {
    inner: UdpBackend,
    fault: Arc<AtomicU8>,
}

impl Breakable {
    fn check(&self) -> io::Result<()> {
        match self.fault.load(Ordering::Relaxed) {
            EBADF => Err(io::Error::from_raw_os_error(nix::libc::EBADF)),
            PANIC => panic!("a bug in the backend, for the test"),
            _ => Ok(()),
        }
    }
}

/// A device on a [`Breakable`] backend at `ip(last)`, and the switch that breaks it.
fn breakable(last: u8, progress: Progress) -> (End, Arc<AtomicU8>) {
    let fault = Arc::new(AtomicU8::new(HEALTHY));
    let backend = Breakable {
        inner: UdpBackend::bind(ip(last)).unwrap(),
        fault: fault.clone(),
    };
    let config = DeviceConfig {
        progress,
        ..DeviceConfig::udp(ip(last))
    };
    (
        end_on(Device::with_backend(backend, &config).unwrap()),
        fault,
    )
}

impl Backend for Breakable {
    fn local_addr(&self) -> IpAddr {
        self.inner.local_addr()
    }
    fn room(&mut self) -> io::Result<&mut [u8]> {
        self.check()?;
        self.inner.room()
    }
    fn commit(&mut self, dst: IpAddr, len: usize) -> io::Result<&[u8]> {
        self.check()?;
        self.inner.commit(dst, len)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.check()?;
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
        self.check()?;
        self.inner.receive(budget, deliver)
    }
    fn source(&mut self) -> &mut dyn mio::event::Source {
        self.inner.source()
    }
    fn counters(&self) -> IoCounters {
        self.inner.counters()
    }
}

/// A device's RC QP with its CQ and a 64 KiB region.
struct End {
    device: Device,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

fn end_on(device: Device) -> End {
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(64).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.register(64 * 1024, all).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    End { device, cq, mr, qp }
}

fn open(address: IpAddr) -> End {
    end_on(Device::open(DeviceConfig::udp(address)).unwrap())
}

/// Connects `a`'s QP to `peer`, with a short ACK timeout.
fn connect_to(a: &End, peer: &QpEndpoint) {
    let options = ConnectOptions {
        timeout: 10,
        ..Default::default()
    };
    a.qp.connect(peer, &options).unwrap();
}

fn connect(a: &End, b: &End) {
    connect_to(a, &b.qp.endpoint());
    connect_to(b, &a.qp.endpoint());
}

fn write(a: &End, b: &End, wr_id: u64) -> SendWr {
    let op = SendOp::Write {
        remote_addr: b.mr.iova(),
        rkey: b.mr.rkey(),
    };
    SendWr::new(wr_id, op, Payload::Sges([a.mr.sge(0, 64).unwrap()].into()))
}

fn next(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Duration::from_secs(10))
        .unwrap()
        .expect("a completion within 10 s")
}

/// A socket error that is not about one packet ended the engine thread with `?`, and the
/// application saw only `DeviceClosed`: its outstanding work never completed and `poll`
/// returned 0 for ever. Now the work is flushed, and every call, `poll` included once the
/// flushed completions are taken, returns the socket's error.
#[test]
fn a_dead_socket_flushes_the_work_and_every_call_says_why() {
    let (a, fault) = breakable(1, Progress::Thread);
    let b = open(ip(2));
    connect(&a, &b);
    // SENDs that B has no receives for: they wait in RNR retries, outstanding.
    for wr_id in 1..=3 {
        let sge = a.mr.sge(0, 8).unwrap();
        let wr = SendWr::new(wr_id, SendOp::Send, Payload::Sges([sge].into()));
        a.qp.post_send(wr).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    fault.store(EBADF, Ordering::Relaxed);

    let mut flushed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let error = loop {
        assert!(Instant::now() < deadline, "poll never reported the failure");
        match a.cq.poll(&mut flushed, 16) {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(error) => break error,
        }
    };
    let statuses: Vec<_> = flushed.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(statuses, [1, 2, 3].map(|id| (id, WcStatus::WrFlushErr)));
    let is_ebadf = |e: &Error| match e {
        Error::DeviceFailed(io) => io.raw_os_error() == Some(nix::libc::EBADF),
        _ => false,
    };
    assert!(is_ebadf(&error), "{error}");
    assert!(error.to_string().contains("socket failed"), "{error}");
    assert!(is_ebadf(&a.qp.post_send(write(&a, &b, 9)).unwrap_err()));
    assert!(is_ebadf(&a.cq.wait(Duration::from_millis(10)).unwrap_err()));
    assert!(is_ebadf(&a.device.counters().unwrap_err()));
    assert!(is_ebadf(&a.device.alloc_pd().unwrap_err()));
}

/// `Device::fail`, for an application whose own part of the device died (the C library's
/// threads): each progress stops as a dead socket does, with the error given. The work is
/// flushed, the CQ says it is stopped, a thread waiting for asynchronous events learns it,
/// and every call says why.
#[test]
fn a_device_failed_by_the_application_stops_as_a_dead_socket_does() {
    for (last, progress) in [(31, Progress::Thread), (32, Progress::Hybrid)] {
        let config = DeviceConfig {
            progress,
            ..DeviceConfig::udp(ip(last))
        };
        let a = end_on(Device::open(config).unwrap());
        let b = open(ip(last + 10));
        connect(&a, &b);
        let sge = a.mr.sge(0, 8).unwrap();
        let send = SendWr::new(1, SendOp::Send, Payload::Sges([sge].into()));
        a.qp.post_send(send).unwrap();
        let events = a.device.events();
        assert!(!a.cq.is_stopped() && !a.device.is_stopped());
        assert!(a.device.failure().is_none());
        a.device
            .fail(io::Error::other("a thread of the application's died"));
        assert_eq!(events.wait(), None, "the waiting thread learns the stop");
        let mut flushed = Vec::new();
        let error = loop {
            match a.cq.poll(&mut flushed, 16) {
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(error) => break error,
            }
        };
        assert!(a.cq.is_stopped() && a.device.is_stopped());
        assert!(a
            .device
            .failure()
            .is_some_and(|e| e.to_string().contains("died")));
        assert_eq!(
            flushed
                .iter()
                .map(|wc| (wc.wr_id, wc.status))
                .collect::<Vec<_>>(),
            [(1, WcStatus::WrFlushErr)]
        );
        let said = |e: &Error| e.to_string().contains("a thread of the application's died");
        assert!(said(&error), "{error}");
        assert!(said(&a.device.alloc_pd().unwrap_err()));
    }
}

/// An SRQ's post after its device failed is refused with the failure, not queued where no
/// engine will take it: with hybrid progress the stopped engine stays in memory as long as
/// the device's handles, and with it, until it lets go of them, the SRQs' posting queues.
#[test]
fn an_srq_post_after_the_device_failed_is_refused() {
    let (a, fault) = breakable(21, Progress::Hybrid);
    let srq = a.device.alloc_pd().unwrap().create_srq(4, 0).unwrap();
    srq.post_recv(RecvWr::new(1, [a.mr.sge(0, 8).unwrap()]))
        .unwrap();
    fault.store(EBADF, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.cq.poll(&mut Vec::new(), 16).is_ok() {
        assert!(Instant::now() < deadline, "poll never reported the failure");
        std::thread::sleep(Duration::from_millis(1));
    }
    let post = srq.post_recv(RecvWr::new(2, [a.mr.sge(0, 8).unwrap()]));
    assert!(matches!(post, Err(Error::DeviceFailed(_))), "{post:?}");
}

/// A device of two engines stops as a whole when one engine's socket dies or its turn panics:
/// the other engine flushes its QPs too, and every call says why. Before, the other engine
/// kept running, so the QPs on it kept their work outstanding, and the CQ, which both engines
/// feed, never reported the failure.
#[test]
fn one_engine_failing_stops_every_engine_of_its_device() {
    use softroce::io::UdpConfig;

    for (last, fault) in [(21, EBADF), (23, PANIC)] {
        let switches = [(); 2].map(|()| Arc::new(AtomicU8::new(HEALTHY)));
        let config = UdpConfig {
            reuse_port: true,
            trains_per_qp: true,
            ..UdpConfig::new(ip(last))
        };
        let backends: Vec<Breakable> = (switches.iter())
            .map(|fault| Breakable {
                inner: UdpBackend::with_config(config).unwrap(),
                fault: fault.clone(),
            })
            .collect();
        backends[0].inner.steer_by_dest_qp(2).unwrap();
        let device = Device::with_backends(backends, &DeviceConfig::udp(ip(last))).unwrap();
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(16).unwrap();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let qps: Vec<QueuePair> = (0..2)
            .map(|_| pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap())
            .collect();
        let lanes: Vec<u32> = qps.iter().map(|qp| qp.qpn().value() % 2).collect();
        assert_ne!(lanes[0], lanes[1]);
        let b = open(ip(last + 1));
        let b_qps: Vec<QueuePair> = (0..2)
            .map(|_| {
                let pd = b.device.alloc_pd().unwrap();
                pd.create_qp()
                    .send_cq(&b.cq)
                    .recv_cq(&b.cq)
                    .build()
                    .unwrap()
            })
            .collect();
        let options = ConnectOptions {
            timeout: 10,
            ..Default::default()
        };
        for (qp, peer) in qps.iter().zip(&b_qps) {
            qp.connect(&peer.endpoint(), &options).unwrap();
            peer.connect(&qp.endpoint(), &options).unwrap();
            // A SEND the peer has no receive for: it waits in RNR retries, outstanding.
            let sge = mr.sge(0, 8).unwrap();
            let wr_id = u64::from(qp.qpn().value() % 2);
            let wr = SendWr::new(wr_id, SendOp::Send, Payload::Sges([sge].into()));
            qp.post_send(wr).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        // Engine 1 breaks; engine 0 is healthy.
        switches[1].store(fault, Ordering::Relaxed);

        let mut flushed = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let error = loop {
            assert!(
                Instant::now() < deadline,
                "the device never reported the failure"
            );
            match cq.poll(&mut flushed, 16) {
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(error) => break error,
            }
        };
        let mut statuses: Vec<_> = flushed.iter().map(|wc| (wc.wr_id, wc.status)).collect();
        statuses.sort_unstable_by_key(|&(wr_id, _)| wr_id);
        // A dead socket's engine flushes its QPs; a panicked engine's state is not trusted, so
        // only the healthy engine's QP is flushed.
        let expected: &[(u64, WcStatus)] = match fault {
            EBADF => &[(0, WcStatus::WrFlushErr), (1, WcStatus::WrFlushErr)],
            _ => &[(0, WcStatus::WrFlushErr)],
        };
        assert_eq!(statuses, expected, "fault {fault}");
        let Error::DeviceFailed(io) = &error else {
            panic!("{error}")
        };
        match fault {
            EBADF => assert_eq!(io.raw_os_error(), Some(nix::libc::EBADF)),
            _ => assert!(
                io.get_ref().is_some_and(|e| e.is::<EnginePanicked>()),
                "{io}"
            ),
        }
        let post = qps[0].post_send(SendWr::new(9, SendOp::Send, Payload::Sges([].into())));
        assert!(matches!(post, Err(Error::DeviceFailed(_))), "{post:?}");
    }
}

/// A task awaiting a CQ whose device dies is woken: it gets the flushed completions, then the
/// reason, instead of waiting for ever on a channel nobody will write to. The second task
/// awaits a CQ that nothing completes into: only the device's end can wake it.
#[test]
fn a_task_awaiting_a_cq_learns_that_its_device_died() {
    let [busy, idle] = awaiting_tasks_when_the_device_breaks(11, Progress::Thread, EBADF);
    assert_eq!(busy.0, [(1, WcStatus::WrFlushErr)]);
    for (_, error) in [&busy, &idle] {
        assert!(matches!(error, Error::DeviceFailed(_)), "{error}");
    }
    assert_eq!(idle.0, []);
}

/// A panic in the engine (a bug; here the backend's) ended the engine thread and left the
/// tasks awaiting its CQs waiting for ever. Now the engine is abandoned: nothing is flushed, as
/// its state is not trusted, but every waiting task is woken, and every call says the engine
/// panicked. With the engine thread alone and with hybrid progress, whose thread holds the
/// engine behind a lock when it panics.
#[test]
fn a_task_awaiting_a_cq_learns_that_its_engine_panicked() {
    for (last, progress) in [(13, Progress::Thread), (15, Progress::Hybrid)] {
        for (flushed, error) in awaiting_tasks_when_the_device_breaks(last, progress, PANIC) {
            assert_eq!(flushed, [], "{progress:?}");
            let panicked = match &error {
                Error::DeviceFailed(io) => io.get_ref().is_some_and(|e| e.is::<EnginePanicked>()),
                _ => false,
            };
            assert!(panicked, "{progress:?}: {error}");
            assert!(error.to_string().contains("engine panicked"), "{error}");
        }
    }
}

/// Two tasks await CQs of a device at `ip(last)` (its peer at `ip(last + 1)`) when `fault`
/// breaks it ([`awaiting_tasks_when`]).
fn awaiting_tasks_when_the_device_breaks(
    last: u8,
    progress: Progress,
    fault: u8,
) -> [(Vec<(u64, WcStatus)>, Error); 2] {
    let (a, switch) = breakable(last, progress);
    awaiting_tasks_when(&a, last + 1, || switch.store(fault, Ordering::Relaxed))
}

/// Two tasks await CQs of `a` (its peer at `ip(peer)`) when `end` ends its device: one CQ
/// with a SEND outstanding, one that nothing completes into. What each got: the completions,
/// then the error that ended its wait.
fn awaiting_tasks_when(
    a: &End,
    peer: u8,
    end: impl FnOnce(),
) -> [(Vec<(u64, WcStatus)>, Error); 2] {
    let idle = a.device.create_cq(4).unwrap();
    let b = open(ip(peer));
    connect(a, &b);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let drain = |cq: CompletionQueue| async move {
        let mut flushed = Vec::new();
        loop {
            match cq.next_completion().await {
                Ok(wc) => flushed.push((wc.wr_id, wc.status)),
                Err(error) => return (flushed, error),
            }
        }
    };
    let killing = async {
        // A SEND that B has no receive for waits in RNR retries, outstanding.
        a.qp.post_send(SendWr::send(1, a.mr.sge(0, 8).unwrap()))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        end();
    };
    // Tasks of their own, so that one being woken does not poll the other.
    let all = async {
        let busy = tokio::spawn(drain(a.cq.clone()));
        let idle = tokio::spawn(drain(idle));
        killing.await;
        [busy.await.unwrap(), idle.await.unwrap()]
    };
    let ended = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), all).await })
        .expect("both awaiting tasks were woken");
    // And a call that is not a wait says the same.
    let error = a.device.alloc_pd().unwrap_err();
    assert_eq!(error.to_string(), ended[1].1.to_string());
    ended
}

/// A device whose handle a waiting task holds (through the CQ it awaits) could not be ended:
/// the task waited for ever, and the device's thread and address stayed taken for the rest of
/// the process (the next `Device::open` there got EADDRINUSE). `Device::close` ends it
/// whatever is held: the outstanding work is flushed, every waiting task is woken with
/// `DeviceClosed`, and the address is free at once, with each kind of progress.
#[test]
fn closing_a_device_ends_every_wait_and_frees_its_address() {
    for (last, progress) in [
        (31, Progress::Thread),
        (33, Progress::Hybrid),
        (35, Progress::Inline),
    ] {
        let config = DeviceConfig {
            progress,
            ..DeviceConfig::udp(ip(last))
        };
        let a = end_on(Device::open(config).unwrap());
        let [busy, idle] = awaiting_tasks_when(&a, last + 1, || a.device.close());
        assert_eq!(busy.0, [(1, WcStatus::WrFlushErr)], "{progress:?}");
        for (_, error) in [&busy, &idle] {
            assert!(
                matches!(error, Error::DeviceClosed),
                "{progress:?}: {error}"
            );
        }
        // Every handle of `a` is still held.
        let again = Device::open(DeviceConfig::udp(ip(last)));
        assert!(again.is_ok(), "{progress:?}: {:?}", again.err());
        a.device.close();
    }
}

/// A thread blocked in `CompletionQueue::wait` when its device closes gets the flushed
/// completion of its outstanding work, then the device's end, with each kind of progress:
/// with hybrid and inline progress the wait ran the stopped engine first, failed, and lost
/// the completion (only `poll` returned it).
#[test]
fn a_thread_waiting_on_a_cq_gets_the_work_flushed_by_a_close() {
    for (last, progress) in [
        (41, Progress::Thread),
        (43, Progress::Hybrid),
        (45, Progress::Inline),
    ] {
        let config = DeviceConfig {
            progress,
            ..DeviceConfig::udp(ip(last))
        };
        let a = end_on(Device::open(config).unwrap());
        let b = open(ip(last + 1));
        connect(&a, &b);
        // B has no receive: the SEND waits in RNR retries.
        a.qp.post_send(SendWr::send(1, a.mr.sge(0, 8).unwrap()))
            .unwrap();
        let cq = a.cq.clone();
        let waiter = std::thread::spawn(move || (cq.wait(Duration::from_secs(10)), cq));
        std::thread::sleep(Duration::from_millis(50));
        a.device.close();
        let (first, cq) = waiter.join().unwrap();
        let wc = first.unwrap().expect("the flushed SEND");
        assert_eq!(
            (wc.wr_id, wc.status),
            (1, WcStatus::WrFlushErr),
            "{progress:?}"
        );
        let after = cq.wait(Duration::from_secs(1));
        assert!(
            matches!(after, Err(Error::DeviceClosed)),
            "{progress:?}: {after:?}"
        );
    }
}

/// Two threads closing a device at once: each returns once the device has stopped and its
/// address is free. The second used to return while the first still joined the engine's
/// thread, the socket still bound.
#[test]
fn concurrent_closes_both_return_once_the_address_is_free() {
    for round in 0..100 {
        let device = Device::open(DeviceConfig {
            progress: Progress::Thread,
            ..DeviceConfig::udp(ip(47))
        })
        .unwrap();
        let other = device.clone();
        let closing = std::thread::spawn(move || other.close());
        device.close();
        let again = Device::open(DeviceConfig::udp(ip(47)));
        assert!(again.is_ok(), "round {round}: {:?}", again.err());
        closing.join().unwrap();
    }
}

/// A destination the host cannot send to at all (here the kernel's EINVAL for a
/// non-loopback address from a loopback one; without a route, ENETUNREACH) killed the whole
/// device. Now the QP connected to it fails its work with LOC_QP_OP_ERR, as rxe fails a
/// request it cannot route, and the device's other QPs carry on.
#[test]
fn an_unreachable_peer_fails_only_the_qps_connected_to_it() {
    let a = open(ip(3));
    let b = open(ip(4));
    connect(&a, &b);
    let lost = end_on(a.device.clone());
    // TEST-NET-3 (RFC 5737): never assigned; unreachable from a loopback source.
    let nowhere = QpEndpoint {
        addr: "203.0.113.9".parse().unwrap(),
        qpn: Qpn::new(0x42),
        ..lost.qp.endpoint()
    };
    connect_to(&lost, &nowhere);

    lost.qp.post_send(write(&lost, &b, 1)).unwrap();
    let wc = next(&lost.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocQpOpErr));

    a.qp.post_send(write(&a, &b, 2)).unwrap();
    let wc = next(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let (core, io) = a.device.counters().unwrap();
    assert!(io.send_unreachable >= 1, "{io:?}");
    assert_eq!(core.unreachable_peers, 1, "{core}");
}

/// A UD send to an address the kernel refuses (EACCES for 127.255.255.255, the broadcast
/// address of lo's 127.0.0.0/8) killed the device, and with it every session of a daemon.
/// Now that datagram is counted and lost, as UD loses datagrams, and the next send goes.
#[test]
fn a_refused_ud_destination_costs_one_datagram() {
    let a = Device::open(DeviceConfig::udp(ip(5))).unwrap();
    let b = Device::open(DeviceConfig::udp(ip(6))).unwrap();
    let ud = |device: &Device| {
        let pd = device.alloc_pd().unwrap();
        let cq = device.create_cq(16).unwrap();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let qp = pd
            .create_qp()
            .qp_type(softroce::transport::QpType::Ud)
            .send_cq(&cq)
            .recv_cq(&cq)
            .qkey(QKey(0x1111))
            .build()
            .unwrap();
        qp.ready_datagram().unwrap();
        (pd, cq, mr, qp)
    };
    let (a_pd, a_cq, a_mr, a_qp) = ud(&a);
    let (_b_pd, b_cq, b_mr, b_qp) = ud(&b);
    let recv = softroce::transport::RecvWr {
        wr_id: 7,
        sges: [b_mr.sge(0, 4096).unwrap()].into(),
    };
    b_qp.post_recv(recv).unwrap();
    let send = |ah, wr_id| {
        let mut wr = SendWr::new(
            wr_id,
            SendOp::Send,
            Payload::Sges([a_mr.sge(0, 32).unwrap()].into()),
        );
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: b_qp.qpn(),
            remote_qkey: QKey(0x1111),
        });
        a_qp.post_send(wr).unwrap();
        next(&a_cq)
    };
    let refused = a_pd.create_ah("127.255.255.255".parse().unwrap()).unwrap();
    assert_eq!(
        send(refused, 1).status,
        WcStatus::Success,
        "UD: done when sent"
    );
    let good = a_pd.create_ah(b.address()).unwrap();
    assert_eq!(send(good, 2).status, WcStatus::Success);
    let got = next(&b_cq);
    assert_eq!((got.wr_id, got.status), (7, WcStatus::Success));
    let (_, io) = a.counters().unwrap();
    assert_eq!((io.send_unreachable, io.sent), (1, 1), "{io:?}");
}

/// Address handles for destinations no packet could reach are refused when they are made, with
/// the reason, as `ibv_create_ah` refuses a destination it cannot resolve.
#[test]
fn address_handles_that_could_reach_nothing_are_refused() {
    let a = Device::open(DeviceConfig::udp(ip(8))).unwrap();
    let pd = a.alloc_pd().unwrap();
    for (dest, why) in [
        ("255.255.255.255", "broadcast"),
        ("::ffff:255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("fd00::1", "families"),
    ] {
        let error = pd.create_ah(dest.parse().unwrap()).unwrap_err();
        assert!(error.to_string().contains(why), "{dest}: {error}");
    }
}

/// `register(1 << 46)` aborted the whole process ("memory allocation of 70368744177664 bytes
/// failed") on the engine thread. Now the host's refusal is the call's error, and the device
/// goes on.
#[test]
fn a_region_the_host_cannot_hold_is_an_error() {
    let device = Device::open(DeviceConfig::udp(ip(9))).unwrap();
    let pd = device.alloc_pd().unwrap();
    let error = pd.register(1 << 46, Access::LOCAL_WRITE).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Memory(softroce::memory::MemoryError::NoMemory { len }) if len == 1 << 46
        ),
        "{error}"
    );
    assert!(pd.register(4096, Access::LOCAL_WRITE).is_ok());
}
