//! End-to-end figures over real sockets on loopback, each beside its baseline from the same run,
//! reported as ratios, medians of `SOFTROCE_BENCH_RUNS` runs (default 5):
//!
//! - RC RDMA WRITE goodput (and message rate) at MTU 4096 for 64 B, 4 KiB, 64 KiB and 1 MiB
//!   messages, 1 and 8 QPs (and 8 QPs on devices of 2 engines; and for 64 B, 64 QPs with one
//!   message in flight each), against a UDP blast of the same datagrams between two threads
//!   (segmentation offload on send, GRO on receive: the cheapest way through the kernel, as
//!   `benches/udp_baseline.rs` measured), which is the limit of the path softroce rides on, and
//!   against a TCP stream;
//! - an 8-byte RC SEND ping-pong, half a round trip, against a UDP ping-pong;
//! - an 8-byte RC WRITE awaited on a tokio task, one in flight: by its own future
//!   (`CompletionRouter`) against the CQ's next completion (`next_completion`), what routing
//!   a completion to its request costs.
//!
//! Run with `cargo bench --bench e2e`; it prints a markdown table. `SOFTROCE_BENCH_ONLY` keeps
//! the rows whose name contains it (`write 64 B x1`, `write 1 MiB x8$`, `batches`, `idle`,
//! `engines`, `in flight`, `pingpong thread`, `pingpong inline`, `pingpong hybrid`, `awaited`),
//! for a
//! profile of one row: baselines are then not run. The WRITE rows run the default progress,
//! hybrid; `SOFTROCE_BENCH_PROGRESS=thread` runs them with the engine on a thread of its own
//! (inline progress cannot run them: the receiving device's application calls nothing).
//! `SOFTROCE_BENCH_BUSY_POLL` sets every device's busy polling in microseconds (0: none) in
//! place of softroce's choice (`DeviceConfig::busy_poll`). `SOFTROCE_BENCH_RESPONDER_ENGINES=N`
//! runs the WRITE rows' responding device on N engines, and `SOFTROCE_BENCH_TRAINS_PER_QP=1`
//! has every device cut its segmentation trains per QP (`BackendKind::Udp`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use softroce::memory::Access;
use softroce::transport::{Payload, RecvWr, SendOp, SendWr, WcStatus};
use softroce::verbs::{
    BackendKind, CompletionQueue, CompletionRouter, ConnectOptions, Device, DeviceConfig, Progress,
    QueuePair,
};

const SIZES: [usize; 4] = [64, 4096, 64 << 10, 1 << 20];
/// QPs that do nothing, on each device, in the row that measures what they cost.
const IDLE_QPS: usize = 1000;
/// Messages posted together, the last signalled, in the batch rows.
const BATCH: usize = 16;
const MTU: usize = 4096;
/// BTH and ICRC around a RoCE payload.
const ROCE_OVERHEAD: usize = 16;

fn runs() -> usize {
    std::env::var("SOFTROCE_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}

/// Whether the row `name` runs (`SOFTROCE_BENCH_ONLY`: a part of its name, or its whole name
/// followed by `$`).
fn selected(name: &str) -> bool {
    std::env::var("SOFTROCE_BENCH_ONLY").map_or(true, |only| match only.strip_suffix('$') {
        Some(whole) => name == whole,
        None => name.contains(&only),
    })
}

/// Who drives the engines of the WRITE rows: the default, or the engine thread with
/// `SOFTROCE_BENCH_PROGRESS=thread`.
fn write_progress() -> Progress {
    match std::env::var("SOFTROCE_BENCH_PROGRESS").as_deref() {
        Ok("thread") => Progress::Thread,
        _ => Progress::default(),
    }
}

/// The devices' busy polling: softroce's choice, or `SOFTROCE_BENCH_BUSY_POLL` microseconds
/// (0: none), to compare with and without it in one build.
fn busy_poll() -> Option<Duration> {
    let micros = std::env::var("SOFTROCE_BENCH_BUSY_POLL").ok()?;
    Some(Duration::from_micros(
        micros
            .parse()
            .expect("SOFTROCE_BENCH_BUSY_POLL: microseconds"),
    ))
}

/// How many engines the responding device of the WRITE rows runs: as the row says, or
/// `SOFTROCE_BENCH_RESPONDER_ENGINES`, for a requester of one engine against a responder of
/// several.
fn responder_engines(row: usize) -> usize {
    std::env::var("SOFTROCE_BENCH_RESPONDER_ENGINES").map_or(row, |n| {
        n.parse()
            .expect("SOFTROCE_BENCH_RESPONDER_ENGINES: a number of engines")
    })
}

/// The devices' UDP backend: trains across QPs, or cut per QP with
/// `SOFTROCE_BENCH_TRAINS_PER_QP=1` (a device of several engines cuts per QP either way).
fn backend() -> BackendKind {
    BackendKind::Udp {
        segmentation: true,
        trains_per_qp: std::env::var("SOFTROCE_BENCH_TRAINS_PER_QP").is_ok_and(|v| v == "1"),
    }
}

/// Baselines run only in a full run.
fn baselines() -> bool {
    std::env::var_os("SOFTROCE_BENCH_ONLY").is_none()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Two connected devices; the QPs, CQs and regions keep them open.
struct Pair {
    qps: Vec<(QueuePair, QueuePair)>,
    /// QPs that do nothing, on both devices: what a busy device's turns cost for them.
    _idle: Vec<QueuePair>,
    cqs: [CompletionQueue; 2],
    mrs: [softroce::memory::MemoryRegion; 2],
}

/// Two devices of `engines` engines (the first's, the second's) on fresh loopback addresses,
/// `n` connected RC QPs between them, and `idle` QPs more on each that are never connected.
fn pair(
    n: usize,
    (idle, engines): (usize, [usize; 2]),
    region: usize,
    id: u8,
    progress: Progress,
) -> Pair {
    let addr = |k: u8| -> std::net::IpAddr { Ipv4Addr::new(127, 0, 1 + id, 1 + k).into() };
    let devices = [0, 1].map(|k| {
        Device::open(DeviceConfig {
            progress,
            engines: engines[k as usize],
            backend: backend(),
            busy_poll: busy_poll(),
            ..DeviceConfig::udp(addr(k))
        })
        .unwrap()
    });
    let pds = [0, 1].map(|k| devices[k].alloc_pd().unwrap());
    let cqs = [0, 1].map(|k| devices[k].create_cq(8192).unwrap());
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mrs = [0, 1].map(|k| pds[k].register(region, access).unwrap());
    let options = ConnectOptions::default();
    let qps = (0..n)
        .map(|_| {
            let build = |k: usize| {
                pds[k]
                    .create_qp()
                    .send_cq(&cqs[k])
                    .recv_cq(&cqs[k])
                    .max_send_wr(512)
                    .build()
                    .unwrap()
            };
            let (a, b) = (build(0), build(1));
            a.connect(&b.endpoint(), &options).unwrap();
            b.connect(&a.endpoint(), &options).unwrap();
            (a, b)
        })
        .collect();
    let idle = (0..2 * idle)
        .map(|k| {
            pds[k % 2]
                .create_qp()
                .send_cq(&cqs[k % 2])
                .recv_cq(&cqs[k % 2])
                .build()
                .unwrap()
        })
        .collect();
    Pair {
        qps,
        _idle: idle,
        cqs,
        mrs,
    }
}

/// The shape of a WRITE row: how many QPs carry the messages, how many idle QPs each device
/// has besides, how many messages are posted together, the last of them signalled, how
/// many engines each device runs, and how many messages each QP keeps in flight (`None`: as
/// many as 4 MiB, from 4 to 256).
#[derive(Clone, Copy)]
struct Shape {
    qps: usize,
    idle: usize,
    batch: usize,
    engines: usize,
    in_flight: Option<usize>,
}

/// RC WRITE goodput in bytes/s: `count` messages of `size` spread over the QPs, `depth` in
/// flight on each, posted in batches whose last message alone is signalled.
fn softroce_write(size: usize, shape: Shape, id: u8) -> f64 {
    let Shape {
        qps,
        idle,
        batch,
        engines,
        in_flight,
    } = shape;
    // 1 GiB, or a million messages: 0.2 s or more a run on this VM. Runs of a quarter of the
    // bytes or a tenth of the messages (256 MiB, 100,000) spread 64 B x8 over ±5% around the
    // same median, ±3% now.
    let count = ((1usize << 30) / size).clamp(1024, 1_000_000) / batch * batch;
    let depth = in_flight.unwrap_or((((4usize << 20) / size).clamp(4, 256) / batch).max(1) * batch);
    let p = pair(
        qps,
        (idle, [engines, responder_engines(engines)]),
        size.max(4096) * depth.min(64),
        id,
        write_progress(),
    );
    let slot = |i: usize| (i % depth.min(64)) * size;
    // Message `i` goes on QP `q`; batches are runs of consecutive `i` on one QP.
    let post = |q: usize, i: usize| {
        let op = SendOp::Write {
            remote_addr: p.mrs[1].iova() + slot(i) as u64,
            rkey: p.mrs[1].rkey(),
        };
        let sge = (p.mrs[0]).sge(slot(i), size).unwrap();
        let mut wr = SendWr::new(q as u64, op, Payload::Sges([sge].into()));
        wr.signaled = i % batch == batch - 1;
        p.qps[q].0.post_send(wr).unwrap();
    };
    let start = Instant::now();
    let mut posted = 0;
    for q in 0..qps {
        for _ in 0..depth {
            if posted < count {
                post(q, posted);
                posted += 1;
            }
        }
    }
    let mut done = 0;
    let mut wcs = Vec::with_capacity(256);
    while done < count {
        wcs.clear();
        if p.cqs[0].poll(&mut wcs, 256).unwrap() == 0 {
            let wc = p.cqs[0]
                .wait(Duration::from_secs(30))
                .unwrap()
                .expect("a completion");
            wcs.push(wc);
        }
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success);
            done += batch;
            for _ in 0..batch {
                if posted < count {
                    post(wc.wr_id as usize, posted);
                    posted += 1;
                }
            }
        }
    }
    let elapsed = start.elapsed();
    drop(p);
    (count * size) as f64 / elapsed.as_secs_f64()
}

/// Half the round trip of an 8-byte SEND ping-pong, in seconds.
fn softroce_pingpong(id: u8, progress: Progress) -> f64 {
    let p = pair(1, (0, [1, 1]), 4096, id, progress);
    let (a, b) = &p.qps[0];
    let iters = 20_000;
    let recv = |qp: &QueuePair, mr: &softroce::memory::MemoryRegion| {
        qp.post_recv(RecvWr {
            wr_id: 0,
            sges: [mr.sge(0, 64).unwrap()].into(),
        })
        .unwrap();
    };
    let send = |qp: &QueuePair, mr: &softroce::memory::MemoryRegion| {
        let wr = SendWr::new(
            1,
            SendOp::Send,
            Payload::Sges([mr.sge(64, 8).unwrap()].into()),
        );
        qp.post_send(wr).unwrap();
    };
    // Block on the CQ's completion channel. Spinning, as perftest's latency tests do, starves
    // the engine threads on a 2-core machine (four threads for two cores): measured 160 µs.
    let wait_recv = |cq: &CompletionQueue| loop {
        let wc = cq
            .wait(Duration::from_secs(10))
            .unwrap()
            .expect("a completion");
        assert_eq!(wc.status, WcStatus::Success);
        if wc.wr_id == 0 {
            return;
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..iters {
                recv(b, &p.mrs[1]);
                wait_recv(&p.cqs[1]);
                send(b, &p.mrs[1]);
            }
        });
        let start = Instant::now();
        for _ in 0..iters {
            recv(a, &p.mrs[0]);
            send(a, &p.mrs[0]);
            wait_recv(&p.cqs[0]);
        }
        start.elapsed().as_secs_f64() / iters as f64 / 2.0
    })
}

/// The time of one 8-byte RC WRITE awaited on a tokio task, one in flight, in seconds: by its
/// own future (`routed`: a [`CompletionRouter`]) or the CQ's next completion.
fn softroce_awaited_write(id: u8, routed: bool) -> f64 {
    let p = pair(1, (0, [1, 1]), 4096, id, write_progress());
    let (a, _) = &p.qps[0];
    let (mr, remote) = (&p.mrs[0], p.mrs[1].remote());
    let router = CompletionRouter::new(p.cqs[0].clone());
    let iters = 20_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let wr = SendWr::write(1, [mr.sge(0, 8).unwrap()], remote);
            let wc = if routed {
                router.send(a, wr).unwrap().await.unwrap()
            } else {
                a.post_send(wr).unwrap();
                p.cqs[0].next_completion().await.unwrap()
            };
            assert_eq!(wc.status, WcStatus::Success);
        }
        start.elapsed().as_secs_f64() / iters as f64
    })
}

/// A UDP blast of `datagram`-byte datagrams from one thread to another: payload bytes/s, where
/// the payload is the datagram less the RoCE overhead, so the figure compares with goodput.
fn udp_blast(datagram: usize) -> f64 {
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    setsockopt(&rx, sockopt::RcvBuf, &(8usize << 20)).unwrap();
    setsockopt(&rx, sockopt::UdpGroSegment, &true).unwrap();
    setsockopt(&tx, sockopt::UdpGsoSegment, &(datagram as i32)).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let dst = rx.local_addr().unwrap();
    let per_send = ((60 << 10) / datagram).clamp(1, 64);
    let train = vec![0x5a; per_send * datagram];
    let total: usize = 256 << 20;
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let (mut got, mut first) = (0usize, None);
        while let Ok((len, _)) = rx.recv_from(&mut buf) {
            first.get_or_insert_with(Instant::now);
            got += len;
        }
        (got, first.map(|t| t.elapsed()))
    });
    let mut sent = 0;
    while sent < total {
        if tx.send_to(&train, dst).is_ok() {
            sent += train.len();
        }
    }
    let (got, elapsed) = receiver.join().unwrap();
    // The receiver stops 200 ms after the last datagram: that idle tail is not throughput.
    let busy = elapsed.unwrap().saturating_sub(Duration::from_millis(200));
    let payload = got / datagram * (datagram - ROCE_OVERHEAD).max(1);
    payload as f64 / busy.as_secs_f64()
}

/// A TCP stream over loopback: bytes/s.
fn tcp_stream() -> f64 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let total: usize = 512 << 20;
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            got += s.read(&mut buf).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let chunk = vec![0x5a; 1 << 20];
    let start = Instant::now();
    for _ in 0..total / chunk.len() {
        s.write_all(&chunk).unwrap();
    }
    reader.join().unwrap();
    total as f64 / start.elapsed().as_secs_f64()
}

/// Half a UDP ping-pong of 8-byte payloads (RoCE-sized datagrams), in seconds; both ends block
/// in `recv_from`, as the softroce side blocks on its CQ.
fn udp_pingpong() -> f64 {
    let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let b_addr = b.local_addr().unwrap();
    let iters = 20_000;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut buf = [0u8; 64];
            for _ in 0..iters {
                let (n, from) = b.recv_from(&mut buf).unwrap();
                b.send_to(&buf[..n], from).unwrap();
            }
        });
        let msg = [0u8; 8 + ROCE_OVERHEAD];
        let mut buf = [0u8; 64];
        let start = Instant::now();
        for _ in 0..iters {
            a.send_to(&msg, b_addr).unwrap();
            a.recv_from(&mut buf).unwrap();
        }
        start.elapsed().as_secs_f64() / iters as f64 / 2.0
    })
}

/// The process's resident set (VmRSS), in MiB: whether memory stays level as bytes move.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        });
    kib.map_or(f64::NAN, |kib| kib / 1024.0)
}

/// A message size as the table names it.
fn size_name(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

/// The median of `runs` runs of `f`, or NaN when there are no baselines in this run.
fn baseline(runs: usize, f: impl Fn() -> f64) -> f64 {
    if baselines() {
        median((0..runs).map(|_| f()).collect())
    } else {
        f64::NAN
    }
}

fn main() {
    let runs = runs();
    let mb = |x: f64| x / 1e6;
    println!("RC WRITE goodput, MTU 4096, loopback, median of {runs} runs\n");
    println!(
        "| message | QPs | softroce MB/s | messages/s | UDP blast MB/s | ratio | TCP stream MB/s | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let tcp = baseline(runs, tcp_stream);
    let mut id = 0u8;
    let mut rss_rows = Vec::new();
    for size in SIZES {
        let datagram = size.min(MTU) + ROCE_OVERHEAD;
        let udp = baseline(runs, || udp_blast(datagram));
        // The small messages again: posted in batches of 16 with one signalled, and (64 B)
        // with 1000 QPs more on each device that do nothing, what a turn of a busy engine
        // costs for a QP with no work.
        let one = |qps| Shape {
            qps,
            idle: 0,
            batch: 1,
            engines: 1,
            in_flight: None,
        };
        // 8 QPs again on devices of 2 engines each: what a second core per device gives.
        let two_engines = Shape {
            engines: 2,
            ..one(8)
        };
        let mut shapes = vec![one(1), one(8), two_engines];
        if size <= 4096 {
            shapes.push(Shape {
                batch: BATCH,
                ..one(1)
            });
        }
        if size == 64 {
            shapes.push(Shape {
                idle: IDLE_QPS,
                ..one(8)
            });
            // Many QPs with little in flight each: what trains that mix QPs are for.
            shapes.push(Shape {
                in_flight: Some(1),
                ..one(64)
            });
        }
        for shape in shapes {
            let name = match shape {
                Shape {
                    in_flight: Some(in_flight),
                    qps,
                    ..
                } => format!("{qps}, {in_flight} in flight"),
                Shape {
                    idle: 0,
                    batch: 1,
                    engines: 1,
                    qps,
                    ..
                } => format!("{qps}"),
                Shape {
                    idle: 0,
                    batch: 1,
                    engines,
                    qps,
                    ..
                } => format!("{qps} on {engines} engines"),
                Shape {
                    idle: 0,
                    batch,
                    qps,
                    ..
                } => format!("{qps}, batches of {batch}"),
                Shape { idle, qps, .. } => format!("{qps} (+{idle} idle)"),
            };
            if !selected(&format!("write {} x{name}", size_name(size))) {
                continue;
            }
            let mut rss = Vec::with_capacity(runs);
            let soft = median(
                (0..runs)
                    .map(|_| {
                        id = id.wrapping_add(1) % 200;
                        let rate = softroce_write(size, shape, id);
                        rss.push(rss_mib());
                        rate
                    })
                    .collect(),
            );
            if let (Some(first), Some(last)) = (rss.first(), rss.last()) {
                rss_rows.push(format!(
                    "| {} | {name} | {first:.0} | {last:.0} |",
                    size_name(size)
                ));
            }
            println!(
                "| {} | {name} | {:.0} | {:.0} k | {:.0} | {:.2} | {:.0} | {:.2} |",
                size_name(size),
                mb(soft),
                soft / size as f64 / 1e3,
                mb(udp),
                soft / udp,
                mb(tcp),
                soft / tcp
            );
        }
    }
    if !rss_rows.is_empty() {
        println!(
            "\nResident memory of the bench process after the first and the last run of each row\n"
        );
        println!("| message | QPs | RSS after run 1, MiB | after run {runs}, MiB |");
        println!("|---|---|---|---|");
        for row in &rss_rows {
            println!("{row}");
        }
    }
    let udp = baseline(runs, udp_pingpong);
    println!("\n8-byte ping-pong, half round trip, median of {runs} runs\n");
    println!("| engine progress | softroce RC SEND | UDP datagrams | ratio |");
    println!("|---|---|---|---|");
    for (progress, key, name) in [
        (
            Progress::Hybrid,
            "pingpong hybrid",
            "hybrid, the default (the application's calls, its own thread when they stop)",
        ),
        (Progress::Thread, "pingpong thread", "its own thread"),
        (
            Progress::Inline,
            "pingpong inline",
            "inline (the application's thread)",
        ),
    ] {
        if !selected(key) {
            continue;
        }
        let soft = median(
            (0..runs)
                .map(|_| {
                    id = id.wrapping_add(1) % 200;
                    softroce_pingpong(id, progress)
                })
                .collect(),
        );
        println!(
            "| {name} | {:.1} µs | {:.1} µs | {:.2} |",
            soft * 1e6,
            udp * 1e6,
            soft / udp
        );
    }
    if selected("awaited") {
        // The two alternate, run by run, so that both see the machine as it is then: its
        // noise moves both, and the ratio is taken run by run.
        let mut pairs: Vec<(f64, f64)> = Vec::new();
        for _ in 0..runs {
            id = id.wrapping_add(1) % 200;
            let by_cq = softroce_awaited_write(id, false);
            id = id.wrapping_add(1) % 200;
            pairs.push((by_cq, softroce_awaited_write(id, true)));
        }
        let by_cq = median(pairs.iter().map(|p| p.0).collect());
        let routed = median(pairs.iter().map(|p| p.1).collect());
        let ratio = median(pairs.iter().map(|p| p.1 / p.0).collect());
        println!(
            "\n8-byte RC WRITE awaited on a tokio task, one in flight, median of {runs} runs\n"
        );
        println!("| awaited by | time per WRITE | ratio |");
        println!("|---|---|---|");
        println!(
            "| the CQ's next completion | {:.1} µs | 1.00 |",
            by_cq * 1e6
        );
        println!(
            "| its own future (`CompletionRouter`) | {:.1} µs | {ratio:.2} |",
            routed * 1e6
        );
    }
}
