//! Two transport endpoints joined in memory, no I/O: RDMA WRITEs and READs of 1 MiB at MTU 4096,
//! with every packet sealed and checked with the ICRC as the io layer will do. Reports payload
//! bytes/s with both ends on one core. The WRITE is the baseline of the READ: a READ response
//! looks its rkey up again as it is built, which a WRITE's packet does as it lands.
//!
//! And 64 signalled WRITEs of 64 bytes posted together, in messages/s: the transport's share of
//! a small message's cost (building, sealing, checking, landing, ACKing and completing it),
//! which the end-to-end bench's 64-byte rows pay beside the sockets' share.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softroce::memory::{Access, MemoryRegion};
use softroce::transport::{
    connect_steps, ConnectOptions, CqId, Endpoint, EndpointConfig, Lane, PathMtu, Payload,
    QpEndpoint, QpInit, QpType, SendOp, SendWr, Sge, WcStatus, MAX_PACKET_LEN,
};
use softroce::wire::{KernelFraming, Psn, QKey, Qpn, RnrTimer, ROCEV2_UDP_PORT};

const MSG: usize = 1 << 20;
/// The small messages' size, and how many are posted together.
const SMALL: usize = 64;
const SMALL_BATCH: usize = 64;

struct Pair {
    ends: [Endpoint; 2],
    qpn: [Qpn; 2],
    cq: CqId,
    src: MemoryRegion,
    dst: MemoryRegion,
    framing: [KernelFraming; 2],
    now: Duration,
    /// Where each packet is built, as the io layer's train would be.
    buffer: Vec<u8>,
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n + 1)
}

fn pair() -> Pair {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut ends = [0u8, 1].map(|n| {
        Endpoint::new(EndpointConfig {
            local_addr: IpAddr::V4(ip(n)),
            seed: n.into(),
            lane: Lane::SOLE,
            congestion: Default::default(),
        })
    });
    let mut qpn = [Qpn::new(0); 2];
    let mut cqs = [CqId(0); 2];
    let mut mrs = Vec::new();
    for n in 0..2 {
        let pd = ends[n].alloc_pd();
        cqs[n] = ends[n].create_cq(1 << 16);
        mrs.push(ends[n].reg_mr(pd, 0x1000_0000, MSG, all).unwrap());
        qpn[n] = ends[n]
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cqs[n],
                recv_cq: cqs[n],
                max_send_wr: 64,
                max_recv_wr: 64,
            })
            .unwrap();
    }
    for n in 0..2 {
        let remote = QpEndpoint {
            addr: IpAddr::V4(ip(1 - n as u8)),
            qpn: qpn[1 - n],
            psn: Psn::new(0),
            mtu: PathMtu::Mtu4096,
            qkey: QKey(0),
        };
        let options = ConnectOptions {
            access: all,
            min_rnr_timer: RnrTimer::new(1),
            ..ConnectOptions::default()
        };
        let attrs = connect_steps(QpType::Rc, &remote, Psn::new(0), &options);
        for attr in &attrs {
            ends[n].modify_qp(Duration::ZERO, qpn[n], attr).unwrap();
        }
    }
    let sock = |n: u8| SocketAddrV4::new(ip(n), ROCEV2_UDP_PORT);
    let dst = mrs.pop().unwrap();
    let src = mrs.pop().unwrap();
    Pair {
        ends,
        qpn,
        cq: cqs[0],
        src,
        dst,
        framing: [
            KernelFraming::V4 {
                src: sock(0),
                dst: sock(1),
            },
            KernelFraming::V4 {
                src: sock(1),
                dst: sock(0),
            },
        ],
        now: Duration::ZERO,
        buffer: vec![0; MAX_PACKET_LEN],
    }
}

impl Pair {
    /// One WRITE of 1 MiB, or a READ of the same memory back, moved packet by packet until
    /// its completion.
    fn transfer(&mut self, id: u64, read: bool) {
        let (remote_addr, rkey) = (0x1000_0000, self.dst.rkey());
        let op = match read {
            false => SendOp::Write { remote_addr, rkey },
            true => SendOp::Read { remote_addr, rkey },
        };
        self.post(SendWr::new(
            id,
            op,
            Payload::Sges([self.sge(0, MSG)].into()),
        ));
        self.complete(1);
    }

    /// `SMALL_BATCH` signalled WRITEs of `SMALL` bytes, each to its own place, posted
    /// together and moved until all have completed.
    fn small_writes(&mut self, id: u64) {
        for i in 0..SMALL_BATCH {
            let at = i * SMALL;
            let op = SendOp::Write {
                remote_addr: 0x1000_0000 + at as u64,
                rkey: self.dst.rkey(),
            };
            let sge = self.sge(at, SMALL);
            self.post(SendWr::new(id, op, Payload::Sges([sge].into())));
        }
        self.complete(SMALL_BATCH);
    }

    fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            addr: 0x1000_0000 + at as u64,
            len: len as u32,
            lkey: self.src.lkey(),
        }
    }

    fn post(&mut self, wr: SendWr) {
        self.ends[0].post_send(self.now, self.qpn[0], wr).unwrap();
    }

    /// Moves packets both ways until `count` requests have completed, successfully.
    fn complete(&mut self, mut count: usize) {
        loop {
            let mut moved = false;
            for from in 0..2 {
                while let Some((_, len)) = self.ends[from].poll_transmit_into(&mut self.buffer) {
                    let packet = &mut self.buffer[..len];
                    self.framing[from].seal(packet);
                    let status = self.framing[from].verify(packet);
                    let src = IpAddr::V4(ip(from as u8));
                    self.ends[1 - from].handle_datagram(self.now, src, status, black_box(packet));
                    moved = true;
                }
            }
            while let Some(wc) = self.ends[0].poll_cq(self.cq) {
                assert_eq!(wc.status, WcStatus::Success);
                count -= 1;
                if count == 0 {
                    return;
                }
            }
            assert!(moved, "the transfer stalled");
            self.now += Duration::from_micros(1);
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut pair = pair();
    let mut group = c.benchmark_group("transport_in_memory");
    group.throughput(Throughput::Bytes(MSG as u64));
    let mut id = 0;
    // Each bench sets its memory up and checks what it moved itself, so that any one of them
    // can run alone (a filter, a profile).
    group.bench_function("rc_write_1mib_mtu4096", |b| {
        pair.src.write(0, &vec![0xa5; MSG]).unwrap();
        pair.dst.write(0, &vec![0; MSG]).unwrap();
        b.iter(|| {
            id += 1;
            pair.transfer(id, false)
        });
        assert_eq!(pair.dst.to_vec(), vec![0xa5; MSG], "the data arrived");
    });
    group.bench_function("rc_read_1mib_mtu4096", |b| {
        pair.src.write(0, &vec![0; MSG]).unwrap();
        pair.dst.write(0, &vec![0xa5; MSG]).unwrap();
        b.iter(|| {
            id += 1;
            pair.transfer(id, true)
        });
        assert_eq!(pair.src.to_vec(), vec![0xa5; MSG], "the data came back");
    });
    group.throughput(Throughput::Elements(SMALL_BATCH as u64));
    group.bench_function("rc_write_64b_x64", |b| {
        let moved = SMALL * SMALL_BATCH;
        let pattern: Vec<u8> = (0..moved).map(|i| i as u8).collect();
        pair.src.write(0, &pattern).unwrap();
        pair.dst.write(0, &vec![0; moved]).unwrap();
        b.iter(|| {
            id += 1;
            pair.small_writes(id)
        });
        assert_eq!(pair.dst.to_vec()[..moved], pattern, "the data arrived");
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
