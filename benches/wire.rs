//! The wire layer's costs on one core: parse plus ICRC check of a 4 KiB RDMA WRITE_MIDDLE frame,
//! emit plus ICRC of the same frame, and the ICRC alone over 4 KiB. Each is reported in bytes/s
//! and in packets/s. Then a UDP receiver's check of the same packet, with the IPv4 ID known and
//! with it solved for, and the solve for a 20-byte ACK (`icrc_ack`), where the multiplication
//! modulo P is most of the cost.

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use softroce::wire::frame::{EthernetRepr, UdpRepr};
use softroce::wire::icrc::icrc_ipv4;
use softroce::wire::{
    solve_ipv4_id, BthRepr, ExtHeaders, Frame, FrameRepr, IcrcStatus, IpRepr, KernelFraming,
    Opcode, PacketRepr, Psn, Qpn, UdpChecksum,
};

const PAYLOAD: usize = 4096;

fn write_middle() -> (FrameRepr, PacketRepr, Vec<u8>) {
    let bth = BthRepr::new(Opcode::RcWriteMiddle, Qpn::new(0x11), Psn::new(1000));
    let frame = FrameRepr {
        ethernet: Some(EthernetRepr {
            src: [2, 0, 0, 0, 0, 1],
            dst: [2, 0, 0, 0, 0, 2],
            vlan: None,
        }),
        ip: IpRepr::V4 {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            dscp: 0,
            ecn: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        },
        udp: UdpRepr {
            src_port: 0xc000,
            dst_port: 4791,
            checksum: UdpChecksum::Zero,
        },
    };
    let payload = (0..PAYLOAD).map(|i| i as u8).collect();
    (
        frame,
        PacketRepr::new(bth, ExtHeaders::default(), PAYLOAD),
        payload,
    )
}

fn bench(c: &mut Criterion) {
    let (frame, packet, payload) = write_middle();
    let mut wire = vec![0u8; frame.buffer_len(&packet)];
    frame.emit(&packet, &payload, &mut wire).unwrap();
    let frame_len = wire.len() as u64;

    for (unit, throughput) in [
        ("bytes", Throughput::Bytes(frame_len)),
        ("packets", Throughput::Elements(1)),
    ] {
        let mut group = c.benchmark_group(format!("wire_4k_write_middle_{unit}"));
        group.throughput(throughput);
        group.bench_function("parse_and_verify", |b| {
            b.iter(|| {
                let parsed = Frame::parse_ethernet(black_box(&wire)).unwrap();
                assert_eq!(parsed.icrc_status(), IcrcStatus::Ok);
                PacketRepr::parse(&parsed.packet).unwrap()
            })
        });
        let mut out = vec![0u8; wire.len()];
        group.bench_function("emit_with_icrc", |b| {
            b.iter(|| {
                frame
                    .emit(black_box(&packet), black_box(&payload), &mut out)
                    .unwrap()
            })
        });
        group.finish();
    }

    let mut group = c.benchmark_group("icrc");
    group.throughput(Throughput::Bytes(PAYLOAD as u64));
    let ip = &wire[14..34];
    let udp: [u8; 8] = wire[34..42].try_into().unwrap();
    let covered = &wire[42..42 + PAYLOAD];
    group.bench_function("icrc_4k", |b| {
        b.iter(|| icrc_ipv4(black_box(ip), udp, black_box(covered)))
    });
    // What a UDP socket receiver pays: the plain check when the IPv4 ID is known (0), and the
    // check that solves for it (one more pass of nothing, two multiplications mod P).
    let (src, dst) = (
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xc000),
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4791),
    );
    let framing = KernelFraming::V4 { src, dst };
    let mut id_zero = wire[42..].to_vec();
    framing.seal(&mut id_zero);
    group.bench_function("verify_4k_id_known", |b| {
        b.iter(|| assert_eq!(framing.verify(black_box(&id_zero)), IcrcStatus::Ok))
    });
    let mut id_unknown = id_zero.clone();
    framing.seal_with_ipv4_id(&mut id_unknown, 0x1234);
    group.bench_function("verify_4k_id_solved", |b| {
        b.iter(|| {
            assert_eq!(
                solve_ipv4_id(src, dst, black_box(&id_unknown)),
                Some(0x1234)
            )
        })
    });
    group.finish();

    // An ACK (BTH, AETH, ICRC: 20 bytes), where the CRC pass is short and the multiplication
    // mod P that the solve adds is most of what it costs over the plain check.
    let mut group = c.benchmark_group("icrc_ack");
    let mut ack = vec![0u8; 20];
    ack[0] = 0x11;
    framing.seal_with_ipv4_id(&mut ack, 0x1234);
    group.bench_function("verify_ack_id_solved", |b| {
        b.iter(|| assert_eq!(solve_ipv4_id(src, dst, black_box(&ack)), Some(0x1234)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
