//! The price of sound memory regions: copying 4 KiB into and out of a region of atomic words
//! (`MemoryRegion::write` / `read`), against a plain `copy_from_slice` of the same bytes, which is
//! what an unsound `&mut [u8]` region would cost. Read the ratio, not the absolute figures.
//! The same over a C program's memory registered in place (`ForeignMemory`), whose accesses are
//! the fault-guarded copy loop rather than the atomic words' 16-byte moves. Then a region read
//! and the CRC over it, in two passes and fused in chunks. Last, what a registration (and its
//! deregistration) costs in an empty table and in one that holds a million regions: the same.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softroce::memory::{Access, ForeignMemory, MemoryTable};

const LEN: usize = 4096;

fn bench(c: &mut Criterion) {
    let mut table = MemoryTable::new(1);
    let pd = table.alloc_pd();
    let region = table.register(pd, 0, 1 << 20, Access::LOCAL_WRITE).unwrap();
    let data = vec![0x5au8; LEN];
    let mut plain = vec![0u8; 1 << 20];
    let mut out = vec![0u8; LEN];
    let mut lent = vec![0u64; (1 << 20) / 8];
    // SAFETY: `lent` outlives the region (dropped after the benches), and is reached only
    // through it meanwhile.
    let memory = unsafe { ForeignMemory::new(lent.as_mut_ptr().cast(), 1 << 20) }.unwrap();
    let addr = memory.addr() as u64;
    let foreign = table
        .register_foreign(pd, addr, memory, Access::LOCAL_WRITE)
        .unwrap();

    let mut group = c.benchmark_group("copy_4k");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.bench_function("baseline_memcpy_in", |b| {
        b.iter(|| plain[4096..4096 + LEN].copy_from_slice(black_box(&data)))
    });
    group.bench_function("region_write_aligned", |b| {
        b.iter(|| region.write(4096, black_box(&data)).unwrap())
    });
    group.bench_function("region_write_unaligned", |b| {
        b.iter(|| region.write(4099, black_box(&data)).unwrap())
    });
    group.bench_function("baseline_memcpy_out", |b| {
        b.iter(|| out.copy_from_slice(black_box(&plain[4096..4096 + LEN])))
    });
    group.bench_function("region_read_aligned", |b| {
        b.iter(|| region.read(4096, black_box(&mut out)).unwrap())
    });
    group.bench_function("foreign_write_aligned", |b| {
        b.iter(|| foreign.write(4096, black_box(&data)).unwrap())
    });
    group.bench_function("foreign_write_unaligned", |b| {
        b.iter(|| foreign.write(4099, black_box(&data)).unwrap())
    });
    group.bench_function("foreign_read_aligned", |b| {
        b.iter(|| foreign.read(4096, black_box(&mut out)).unwrap())
    });
    group.finish();

    // Issue 13 asks for one pass over the payload (gather from the region while computing the
    // ICRC) or a bench showing that two passes are as fast. Two passes: the whole 4 KiB out of
    // the region, then the CRC over it; fused: the same in chunks, each CRC'd while it is in
    // L1. The ICRC's header part is the same either way, so only the payload is here.
    let mut group = c.benchmark_group("gather_icrc_4k");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.bench_function("two_passes", |b| {
        b.iter(|| {
            region.read(4096, &mut out).unwrap();
            let mut crc = crc32fast::Hasher::new();
            crc.update(&out);
            black_box(crc.finalize())
        })
    });
    for chunk in [256, 1024] {
        group.bench_function(format!("fused_{chunk}"), |b| {
            b.iter(|| {
                let mut crc = crc32fast::Hasher::new();
                for (i, part) in out.chunks_mut(chunk).enumerate() {
                    region.read(4096 + i * chunk, part).unwrap();
                    crc.update(part);
                }
                black_box(crc.finalize())
            })
        });
    }
    group.finish();
    // The region and the table that holds it let go of the program's memory before it goes.
    drop(foreign);
    drop(table);
    drop(lent);

    let mut group = c.benchmark_group("register_deregister");
    for held in [0, 1_000_000] {
        let mut table = MemoryTable::new(3);
        let pd = table.alloc_pd();
        let kept: Vec<_> = (0..held)
            .map(|i| table.register(pd, i * 8, 8, Access::NONE).unwrap())
            .collect();
        group.bench_function(format!("beside_{held}_regions"), |b| {
            b.iter(|| {
                let region = table.register(pd, 0, 64, Access::LOCAL_WRITE).unwrap();
                table.deregister(region.lkey()).unwrap();
                black_box(region)
            })
        });
        drop(kept);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
