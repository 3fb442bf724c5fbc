//! The wire layer's costs on one core: parse plus ICRC check of a 4 KiB RDMA WRITE_MIDDLE frame,
//! emit plus ICRC of the same frame, and the ICRC alone over 4 KiB. Each is reported in bytes/s
//! and in packets/s.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use softroce::wire::frame::{EthernetRepr, UdpRepr};
use softroce::wire::icrc::icrc_ipv4;
use softroce::wire::{
    BthRepr, ExtHeaders, Frame, FrameRepr, IcrcStatus, IpRepr, Opcode, PacketRepr, Psn, Qpn,
    UdpChecksum,
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
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
