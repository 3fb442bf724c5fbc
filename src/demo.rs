//! `softroce demo`: two devices on loopback move data by RDMA WRITE, read it back by RDMA READ,
//! and check every byte.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::memory::{Access, MemoryRegion};
use crate::transport::{Payload, SendOp, SendWr, Sge, WcStatus};
use crate::verbs::{CompletionQueue, ConnectOptions, Device, DeviceConfig, QueuePair, Result};
use crate::wire::RKey;

/// How the demo runs.
#[derive(Debug, Clone, Copy)]
pub struct DemoConfig {
    /// How many bytes to move each way (rounded up to whole windows).
    pub total: u64,
    /// The registered window the data passes through, round by round.
    pub window: usize,
    /// The size of each RDMA message.
    pub message: usize,
    /// The two devices' addresses: data goes from the first to the second and back.
    pub addresses: [IpAddr; 2],
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            total: 1 << 30,
            window: 32 << 20,
            message: 1 << 20,
            addresses: ["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()],
        }
    }
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The bytes moved each way.
    pub bytes: u64,
    /// The time the WRITEs took, from the first post to the last completion of each round.
    pub write_time: Duration,
    /// The time the READs took, likewise.
    pub read_time: Duration,
    /// Bytes read back that differ from what was written.
    pub mismatches: u64,
}

/// The byte pattern of round `round`: every round's data differs, so a stale byte is caught.
fn fill(round: u64, base: u64, out: &mut [u8]) {
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let word = (base + i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(17)
            ^ round.wrapping_mul(0xd1b5_4a32_d192_ed03);
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

/// Posts one operation per message over the window and waits for all of them.
fn transfer(
    side: &Side,
    window: usize,
    message: usize,
    op: impl Fn(usize) -> Result<(SendOp, Sge)>,
    mut progress: impl FnMut(usize),
) -> Result<()> {
    let count = window.div_ceil(message);
    for i in 0..count {
        let (op, sge) = op(i * message)?;
        side.qp
            .post_send(SendWr::new(i as u64, op, Payload::Sges(sge.into())))?;
    }
    let mut done = 0;
    while done < count {
        let wc = side
            .cq
            .wait(Duration::from_secs(30))?
            .ok_or(crate::verbs::Error::DeviceClosed)?;
        if wc.status != WcStatus::Success {
            return Err(crate::verbs::Error::Verbs(
                crate::transport::VerbsError::InvalidRequest("a demo transfer failed"),
            ));
        }
        done += 1;
        progress(message.min(window - (done - 1) * message));
    }
    Ok(())
}

/// A bar for one direction on standard error, drawn only if it is a terminal (indicatif hides
/// it otherwise), and rated as the result lines are: the bytes that direction moved over the
/// time its transfers took, not counting the filling and checking between them.
fn direction_bar(bars: &MultiProgress, label: &'static str, total: u64) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{prefix:<5} [{bar:30}] {binary_bytes:>9} / {binary_total_bytes}  {msg}",
    )
    .expect("a valid template")
    .progress_chars("#>.");
    bars.add(ProgressBar::new(total).with_style(style).with_prefix(label))
}

/// Moves the bar on by `bytes`, and rates what it has moved over `spent`.
fn advance(bar: &ProgressBar, bytes: usize, spent: Duration) {
    bar.inc(bytes as u64);
    let rate = bar.position() as f64 / spent.as_secs_f64().max(1e-9) / 1e6;
    bar.set_message(format!("{rate:.0} MB/s"));
}

/// Runs the demo and returns its figures; the caller prints the counters.
pub fn run(config: DemoConfig) -> Result<(DemoReport, [Device; 2])> {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let devices = [
        Device::open(DeviceConfig::udp(config.addresses[0]))?,
        Device::open(DeviceConfig::udp(config.addresses[1]))?,
    ];
    let mut sides = Vec::new();
    for device in &devices {
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(4096)?;
        let mr = pd.register(config.window, access)?;
        let qp = pd
            .create_qp()
            .send_cq(&cq)
            .recv_cq(&cq)
            .max_send_wr(1024)
            .build()?;
        sides.push(Side { qp, cq, mr });
    }
    let (a, b) = (&sides[0], &sides[1]);
    let options = ConnectOptions::default();
    a.qp.connect(&b.qp.endpoint(), &options)?;
    b.qp.connect(&a.qp.endpoint(), &options)?;

    let rounds = config.total.div_ceil(config.window as u64);
    let total = rounds * config.window as u64;
    let mut pattern = vec![0u8; config.window];
    let mut check = vec![0u8; config.window];
    let zeros = vec![0u8; config.window];
    let mut report = DemoReport {
        bytes: total,
        write_time: Duration::ZERO,
        read_time: Duration::ZERO,
        mismatches: 0,
    };
    // Each round: A's window gets the round's pattern and is written to B; A's window is zeroed
    // and B's is read back over it; then every byte is compared with the pattern.
    let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let write_bar = direction_bar(&bars, "WRITE", total);
    let read_bar = direction_bar(&bars, "READ", total);
    let message = |at: usize| config.message.min(config.window - at);
    for round in 0..rounds {
        fill(round, 0, &mut pattern);
        a.mr.write(0, &pattern)?;
        // One phase: the message-sized operations `op` builds, over the whole window; `spent`
        // is the time the earlier phases of its direction took.
        let phase = |op: fn(u64, RKey) -> SendOp, bar: &ProgressBar, spent: Duration| {
            let started_phase = Instant::now();
            let build = |at| -> Result<(SendOp, Sge)> {
                let remote = op(b.mr.iova() + at as u64, b.mr.rkey());
                Ok((remote, a.mr.sge(at, message(at))?))
            };
            transfer(a, config.window, config.message, build, |n| {
                advance(bar, n, spent + started_phase.elapsed());
            })?;
            Result::Ok(started_phase.elapsed())
        };
        let write = |remote_addr, rkey| SendOp::Write { remote_addr, rkey };
        report.write_time += phase(write, &write_bar, report.write_time)?;
        a.mr.write(0, &zeros)?;
        let read = |remote_addr, rkey| SendOp::Read { remote_addr, rkey };
        report.read_time += phase(read, &read_bar, report.read_time)?;
        a.mr.read(0, &mut check)?;
        report.mismatches += check.iter().zip(&pattern).filter(|(x, y)| x != y).count() as u64;
    }
    write_bar.finish();
    read_bar.finish();
    Ok((report, devices))
}
