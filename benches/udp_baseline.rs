//! What batching buys RoCE-sized datagrams on loopback, the evidence behind `io::udp`'s choice.
//!
//! One core sends a round of `ROUND` datagrams of 4,112 bytes (a 4 KiB RDMA WRITE_MIDDLE: BTH,
//! payload, ICRC) from one UDP socket to another on 127.0.0.1 and then receives them all. A
//! round fits in the receive buffer, so nothing is dropped, and the figure is the kernel's whole
//! cost per packet, send plus receive, on one core. Four ways:
//!
//! - `per_packet`: `sendto` and `recvfrom`, one syscall per datagram, as `UdpBackend` was first;
//! - `mmsg`: `sendmmsg` and `recvmmsg`, one syscall per batch of up to `ROUND`;
//! - `gso_gro`: UDP segmentation offload: one `send` of up to 15 datagrams (`UDP_SEGMENT`),
//!   received coalesced (`UDP_GRO`) and split by length;
//! - `backend`: `UdpBackend` itself (sealing the ICRC, solving the IPv4 ID), 127.0.0.201 to
//!   127.0.0.202 on port 4791.

use std::array;
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nix::sys::socket::{
    recvmmsg, sendmmsg, setsockopt, sockopt, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn,
};

use softroce::io::{Backend, UdpBackend};
use softroce::wire::{BthRepr, ExtHeaders, IcrcStatus, Opcode, PacketRepr, Psn, Qpn};

const PACKET: usize = 12 + 4096 + 4;
const ROUND: usize = 32;
/// As many 4,112-byte datagrams as one UDP_SEGMENT send may carry (64 KiB less the headers).
const GSO_SEGMENTS: usize = 15;
const RECV_BUFFER: usize = 4 << 20;

fn pair() -> (UdpSocket, UdpSocket, SocketAddr) {
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    setsockopt(&rx, sockopt::RcvBuf, &RECV_BUFFER).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let dst = rx.local_addr().unwrap();
    (tx, rx, dst)
}

fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => unreachable!("the bench binds IPv4"),
    }
}

fn per_packet(tx: &UdpSocket, rx: &UdpSocket, dst: SocketAddr, packet: &[u8], buf: &mut [u8]) {
    for _ in 0..ROUND {
        tx.send_to(packet, dst).unwrap();
    }
    for _ in 0..ROUND {
        rx.recv_from(buf).unwrap();
    }
}

/// Preallocated mmsghdr arrays for both directions.
struct Mmsg {
    send: MultiHeaders<SockaddrIn>,
    recv: MultiHeaders<SockaddrIn>,
    slots: Vec<u8>,
}

fn mmsg(tx: &UdpSocket, rx: &UdpSocket, dst: SocketAddr, packet: &[u8], state: &mut Mmsg) {
    let addrs = [Some(SockaddrIn::from(v4(dst))); ROUND];
    let iovs = [[IoSlice::new(packet)]; ROUND];
    let mut sent = 0;
    while sent < ROUND {
        let no_cmsgs: [ControlMessage; 0] = [];
        sent += sendmmsg(
            tx.as_raw_fd(),
            &mut state.send,
            &iovs[sent..],
            &addrs[sent..],
            no_cmsgs,
            MsgFlags::empty(),
        )
        .unwrap()
        .count();
    }
    let mut received = 0;
    while received < ROUND {
        let mut slots = state.slots.chunks_exact_mut(PACKET);
        let mut iovs: [[IoSliceMut; 1]; ROUND] =
            array::from_fn(|_| [IoSliceMut::new(slots.next().unwrap())]);
        let got = recvmmsg(
            rx.as_raw_fd(),
            &mut state.recv,
            iovs[..ROUND - received].iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        )
        .unwrap();
        for msg in got {
            assert_eq!(msg.bytes, PACKET);
            received += 1;
        }
    }
}

fn gso_gro(tx: &UdpSocket, rx: &UdpSocket, dst: SocketAddr, train: &[u8], buf: &mut [u8]) {
    let mut sent = 0;
    while sent < ROUND {
        let n = GSO_SEGMENTS.min(ROUND - sent);
        tx.send_to(&train[..n * PACKET], dst).unwrap();
        sent += n;
    }
    let mut received = 0;
    while received < ROUND {
        let (len, _) = rx.recv_from(buf).unwrap();
        received += len.div_ceil(PACKET);
    }
}

fn write_middle() -> Vec<u8> {
    let bth = BthRepr::new(Opcode::RcWriteMiddle, Qpn::new(0x11), Psn::new(1000));
    let repr = PacketRepr::new(bth, ExtHeaders::default(), 4096);
    let mut packet = vec![0u8; repr.buffer_len()];
    let payload: Vec<u8> = (0..4096).map(|i| i as u8).collect();
    repr.emit_with_payload(&mut packet, &payload).unwrap();
    assert_eq!(packet.len(), PACKET);
    packet
}

fn timed(iters: u64, mut round: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        round();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let packet = write_middle();
    let mut group = c.benchmark_group("udp_loopback_4k_send_and_receive");
    group.throughput(Throughput::Elements(ROUND as u64));

    let (tx, rx, dst) = pair();
    let mut buf = vec![0u8; 1 << 16];
    group.bench_function("per_packet", |b| {
        b.iter_custom(|iters| timed(iters, || per_packet(&tx, &rx, dst, &packet, &mut buf)))
    });

    let mut state = Mmsg {
        send: MultiHeaders::preallocate(ROUND, None),
        recv: MultiHeaders::preallocate(ROUND, None),
        slots: vec![0u8; ROUND * PACKET],
    };
    group.bench_function("mmsg", |b| {
        b.iter_custom(|iters| timed(iters, || mmsg(&tx, &rx, dst, &packet, &mut state)))
    });

    let (gso_tx, gro_rx, gro_dst) = pair();
    setsockopt(&gso_tx, sockopt::UdpGsoSegment, &(PACKET as i32)).unwrap();
    setsockopt(&gro_rx, sockopt::UdpGroSegment, &true).unwrap();
    let train = packet.repeat(GSO_SEGMENTS);
    group.bench_function("gso_gro", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                gso_gro(&gso_tx, &gro_rx, gro_dst, &train, &mut buf)
            })
        })
    });

    let mut a = UdpBackend::bind(Ipv4Addr::new(127, 0, 0, 201).into()).unwrap();
    let mut z = UdpBackend::bind(Ipv4Addr::new(127, 0, 0, 202).into()).unwrap();
    let to = z.local_addr();
    let mut out = packet.clone();
    group.bench_function("backend", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                for _ in 0..ROUND {
                    out.copy_from_slice(&packet);
                    a.send(to, &mut out).unwrap();
                }
                a.flush().unwrap();
                let mut received = 0;
                while received < ROUND {
                    received += z
                        .receive(ROUND, &mut |d| assert_eq!(d.icrc, IcrcStatus::Ok))
                        .unwrap();
                }
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
