//! What perftest's tools print, and the arithmetic behind their result rows
//! (src/perftest_parameters.c: `ctx_print_test_info`, `print_report_bw`,
//! `print_full_bw_report`, `print_report_lat`, `print_report_lat_duration`;
//! src/perftest_communication.c: `ctx_print_pingpong_data`).
//!
//! The text is perftest's, byte for byte where softroce has the same thing to say, with C's
//! `printf` conversions spelled out: `%-7.2lf` is `{:<7.2}`, and `%#06x` is [`c_hex`], which
//! differs from Rust's `{:#06x}` for zero (C prints no `0x` then). `--json` prints one JSON
//! document instead, at the end, with the keys of perftest's `--out_json` file (which is not
//! JSON itself: its keys are not quoted).
//!
//! Times are nanoseconds from the start of a run, where perftest counts CPU cycles; the
//! arithmetic is otherwise perftest's, including its integer steps.

use std::io::{self, Write};

use serde_json::{json, Map, Value};

use super::perftest_keys::Keys;
use super::perftest_oob::BwReport;

/// `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// The messages of a bandwidth run over which perftest computes the peak are at most this many
/// (`force_dependecies` turns the peak off above it).
pub const PEAK_ITERS_MAX: u64 = 20_000;

/// The unit of the bandwidth columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwUnit {
    /// MB/sec, which perftest counts in MiB (2^20 bytes).
    MiB,
    /// Gb/sec (`--report_gbits`): 10^9 bits.
    Gbit,
}

impl BwUnit {
    fn bytes(self) -> f64 {
        match self {
            BwUnit::MiB => 1_048_576.0,
            BwUnit::Gbit => 125_000_000.0,
        }
    }
}

/// The timestamps of a bandwidth run, as perftest keeps them (`tposted`, `tcompleted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwSamples {
    /// Messages counted: all of them, or those of the sampling period with `-D`.
    pub iters: u64,
    /// When each message was posted; with `no_peak`, one entry: the start.
    pub posted: Vec<u64>,
    /// When the completion counting each message arrived (one completion counts `cq_mod`
    /// messages, so only every `cq_mod`-th entry is set); with `no_peak`, one entry: the end.
    pub completed: Vec<u64>,
    /// Messages per signalled completion: perftest's CQ moderation (`-Q`).
    pub cq_mod: u64,
    /// No peak is computed, as with perftest's `-N`: only the start and end are kept.
    pub no_peak: bool,
}

/// `print_report_bw`: the average over the run, and the peak, the best rate of any stretch of
/// messages from one posted to one whose completion was seen.
pub fn bw_report(size: u64, unit: BwUnit, s: &BwSamples) -> BwReport {
    let n = s.iters as usize;
    let per = |from: usize, to: usize| s.completed[to].checked_sub(s.posted[from]);
    // Entries never set are 0 in perftest's arrays, and its unsigned subtraction makes them
    // huge: they never win. `checked_sub` skips them here.
    let mut best = per(0, 0).unwrap_or(u64::MAX);
    if !s.no_peak {
        let cq_mod = s.cq_mod.max(1) as usize;
        for i in 0..n {
            let first = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            let last_alone = (n % cq_mod != 0).then_some(n - 1);
            for j in (first..n).step_by(cq_mod).chain(last_alone) {
                if let Some(t) = per(i, j) {
                    best = best.min(t / (j - i + 1) as u64);
                }
            }
        }
    }
    let end = if s.no_peak { 0 } else { n.saturating_sub(1) };
    let seconds = per(0, end).unwrap_or(0).max(1) as f64 / 1e9;
    let messages = s.iters as f64;
    let bw_peak = if s.no_peak || best == u64::MAX {
        0.0
    } else {
        size as f64 * 1e9 / (best.max(1) as f64 * unit.bytes())
    };
    BwReport {
        size,
        iters: s.iters,
        bw_peak,
        bw_avg: size as f64 * messages / (seconds * unit.bytes()),
        msg_rate: messages / seconds / 1e6,
    }
}

/// One row of a latency table (`print_report_lat`), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatReport {
    /// `#bytes`: the message size.
    pub size: u64,
    /// `#iterations`: round trips, or READs or atomics, timed.
    pub iters: u64,
    /// `t_min[usec]`: the shortest gap.
    pub t_min: f64,
    /// `t_max[usec]`: the longest gap kept, the two longest dropped.
    pub t_max: f64,
    /// `t_typical[usec]`: the median gap.
    pub t_typical: f64,
    /// `t_avg[usec]`: the mean gap.
    pub t_avg: f64,
    /// `t_stdev[usec]`: the standard deviation of the gaps.
    pub t_stdev: f64,
    /// `99% percentile[usec]`.
    pub p99: f64,
    /// `99.9% percentile[usec]`.
    pub p999: f64,
}

/// perftest drops this many of the largest gaps before its statistics (`LAT_MEASURE_TAIL`).
const LAT_MEASURE_TAIL: usize = 2;

/// `print_report_lat`: statistics of the gaps between consecutive posts, each halved when it
/// is a round trip of two messages (`rtt_factor` 2) and taken whole for a READ or atomic.
pub fn lat_report(size: u64, posted: &[u64], rtt_factor: u32) -> LatReport {
    let mut delta: Vec<u64> = posted.windows(2).map(|w| w[1] - w[0]).collect();
    delta.sort_unstable();
    // At least 5 iterations (`-n` refuses fewer): 4 gaps, 2 of them counted.
    let count = delta.len() - LAT_MEASURE_TAIL;
    let usec = |ns: u64| ns as f64 / 1e3 / f64::from(rtt_factor);
    // `get_median`, in whole units before the division, as perftest's cycles are.
    let median = if (count - 1) % 2 == 1 {
        (delta[count / 2] + delta[count / 2 - 1]) / 2
    } else {
        delta[count / 2]
    };
    let average = delta[..count].iter().map(|&d| usec(d)).sum::<f64>() / count as f64;
    // perftest squares each deviation as an `int`, truncated toward zero.
    let variance = delta[..count]
        .iter()
        .map(|&d| ((average - usec(d)).trunc()).powi(2).trunc())
        .sum::<f64>()
        / count as f64;
    let at = |fraction: f64| usec(delta[(count as f64 * fraction).ceil() as usize]);
    LatReport {
        size,
        iters: posted.len() as u64,
        t_min: usec(delta[0]),
        t_max: usec(delta[count]),
        t_typical: usec(median),
        t_avg: average,
        t_stdev: variance.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    }
}

/// One row of a latency table with `-D` (`print_report_lat_duration`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatDurationReport {
    /// `#bytes`: the message size.
    pub size: u64,
    /// `#iterations`: messages counted in the sampling period.
    pub iters: u64,
    /// Microseconds per message.
    pub t_avg: f64,
    /// Messages per second.
    pub tps: f64,
}

/// `print_report_lat_duration`: `iters` messages in `sample_ns`.
pub fn lat_duration_report(
    size: u64,
    iters: u64,
    sample_ns: u64,
    rtt_factor: u32,
) -> LatDurationReport {
    let usec = sample_ns as f64 / 1e3;
    LatDurationReport {
        size,
        iters,
        t_avg: usec / f64::from(rtt_factor) / iters.max(1) as f64,
        tps: iters as f64 / (usec / 1e6).max(1e-9),
    }
}

/// A result row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// A bandwidth row, in this unit.
    Bw(BwReport, BwUnit),
    /// A latency row.
    Lat(LatReport),
    /// A latency row with `-D`.
    LatDuration(LatDurationReport),
}

/// Which table a test prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The bandwidth table, in this unit.
    Bw(BwUnit),
    /// The latency table.
    Lat,
    /// The latency table with `-D`.
    LatDuration,
}

/// What `ctx_print_test_info` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestInfo {
    /// "RDMA_Write BW Test", "Atomic FETCH_AND_ADD BW Test", "Send Latency Test", ...
    pub title: String,
    /// The `Device` line: the device's IP address, where perftest names the HCA.
    pub device: String,
    /// `Number of qps` (`-q`).
    pub qps: usize,
    /// Printed on the side that sends (the client).
    pub tx_depth: Option<u64>,
    /// Printed on the side that receives SENDs (the server of the SEND tests).
    pub rx_depth: Option<u64>,
    /// Printed in the bandwidth tests.
    pub cq_mod: Option<u64>,
    /// `Mtu`: the path MTU in bytes.
    pub mtu: usize,
    /// `GID index` (`-x`).
    pub gid_index: u32,
    /// READ and atomic tests print their outstanding reads; the others their inline size.
    pub out_reads: Option<u16>,
    /// `-R`: the QPs and the exchange on RDMA-CM, and the server's lines about it.
    pub rdma_cm: bool,
    /// Whether this side is the server.
    pub server: bool,
}

/// Which of a QP's keys its address line shows beside the LID, QPN and PSN: perftest shows the
/// outstanding reads in the READ tests, and the R_Key and VA in the READ and WRITE tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// `OUT`: the outstanding reads.
    pub out_reads: bool,
    /// `RKey` and `VAddr`: the buffer the peer reads or writes.
    pub buffer: bool,
}

/// perftest's "rdma_cm QPs" and "Data ex. method" values.
fn exchange_method(rdma_cm: bool) -> (&'static str, &'static str) {
    if rdma_cm {
        ("ON", "rdma_cm")
    } else {
        ("OFF", "Ethernet")
    }
}

/// Which side an address line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This side's QP: `local address`.
    Local,
    /// The peer's QP: `remote address`.
    Remote,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Local => "local",
            Side::Remote => "remote",
        }
    }
}

/// C's `%#0{width}x`: `0x` and zero padding to `width` characters in all, but no `0x` for 0.
pub fn c_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{value:0width$x}")
    } else {
        format!("{value:#0width$x}")
    }
}

/// The JSON document `--json` prints.
#[derive(Debug, Default)]
struct Document {
    test_info: Map<String, Value>,
    local: Vec<Value>,
    remote: Vec<Value>,
    results: Vec<Value>,
}

/// Where a tool's output goes: perftest's text, or, with `--json`, one JSON document at the end.
pub struct Output<'a> {
    out: &'a mut dyn Write,
    json: Option<Document>,
}

impl std::fmt::Debug for Output<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("json", &self.json)
            .finish_non_exhaustive()
    }
}

impl<'a> Output<'a> {
    /// Writes perftest's text to `out`, or with `json` one JSON document at the end.
    pub fn new(out: &'a mut dyn Write, json: bool) -> Self {
        Output {
            out,
            json: json.then(Document::default),
        }
    }

    /// The server's banner, once it listens. A client waits for it before it connects.
    pub fn waiting(&mut self) -> io::Result<()> {
        self.notice(
            "\n************************************\n\
             * Waiting for client to connect... *\n\
             ************************************",
        )
    }

    /// Lines perftest prints outside its tables, at once: on standard error with `--json`,
    /// which keeps standard output for the document.
    pub fn notice(&mut self, text: &str) -> io::Result<()> {
        if self.json.is_some() {
            eprintln!("{text}");
            return Ok(());
        }
        writeln!(self.out, "{text}")?;
        self.out.flush()
    }

    /// The test's banner (`ctx_print_test_info`), or the JSON document's `test_info`.
    pub fn info(&mut self, info: &TestInfo) -> io::Result<()> {
        if let Some(doc) = &mut self.json {
            let map = &mut doc.test_info;
            let mut put = |key: &str, value: Value| map.insert(key.into(), value);
            put("test", info.title.replace(' ', "_").into());
            put("Dual_port", "OFF".into());
            put("Device", info.device.clone().into());
            put("Number_of_qps", info.qps.into());
            put("Transport_type", "IB".into());
            put("Connection_type", "RC".into());
            put("Using_SRQ", "OFF".into());
            put("PCIe_relax_order", "Unsupported".into());
            put("ibv_wr_API", "OFF".into());
            if let Some(depth) = info.tx_depth {
                put("TX_depth", depth.into());
            }
            if let Some(depth) = info.rx_depth {
                put("RX_depth", depth.into());
            }
            if let Some(cq_mod) = info.cq_mod {
                put("CQ_Moderation", cq_mod.into());
            }
            put("Mtu", info.mtu.into());
            put("Link_type", "Ethernet".into());
            put("GID_index", info.gid_index.into());
            match info.out_reads {
                Some(reads) => put("Outstand_reads", reads.into()),
                None => put("Max_inline_data", 0.into()),
            };
            let (qps, method) = exchange_method(info.rdma_cm);
            put("rdma_cm_QPs", qps.into());
            put("Data_ex_method", method.into());
            return Ok(());
        }
        let w = &mut self.out;
        writeln!(w, "{RESULT_LINE}")?;
        writeln!(w, "                    {}", info.title)?;
        writeln!(
            w,
            " Dual-port       : OFF\t\tDevice         : {}",
            info.device
        )?;
        writeln!(w, " Number of qps   : {}\t\tTransport type : IB", info.qps)?;
        writeln!(w, " Connection type : RC\t\tUsing SRQ      : OFF")?;
        writeln!(w, " PCIe relax order: Unsupported")?;
        writeln!(w, " ibv_wr* API     : OFF")?;
        if let Some(depth) = info.tx_depth {
            writeln!(w, " TX depth        : {depth}")?;
        }
        if let Some(depth) = info.rx_depth {
            writeln!(w, " RX depth        : {depth}")?;
        }
        if let Some(cq_mod) = info.cq_mod {
            writeln!(w, " CQ Moderation   : {cq_mod}")?;
        }
        writeln!(w, " Mtu             : {}[B]", info.mtu)?;
        writeln!(w, " Link type       : Ethernet")?;
        writeln!(w, " GID index       : {}", info.gid_index)?;
        match info.out_reads {
            Some(reads) => writeln!(w, " Outstand reads  : {reads}")?,
            None => writeln!(w, " Max inline data : 0[B]")?,
        }
        let (qps, method) = exchange_method(info.rdma_cm);
        writeln!(w, " rdma_cm QPs\t : {qps}")?;
        writeln!(w, " Data ex. method : {method}")?;
        if info.rdma_cm && info.server {
            // perftest prints these after the fact: the client has connected by now.
            writeln!(w, "{RESULT_LINE}")?;
            writeln!(w, " Waiting for client rdma_cm QP to connect")?;
            writeln!(
                w,
                " Please run the same command with the IB/RoCE interface IP"
            )?;
        }
        writeln!(w, "{RESULT_LINE}")
    }

    /// One QP's address lines, with the keys the test shows.
    pub fn address(&mut self, side: Side, keys: &Keys, shown: Shown) -> io::Result<()> {
        let Shown {
            out_reads: reads,
            buffer: rdma,
        } = shown;
        if let Some(doc) = &mut self.json {
            let mut entry = json!({
                "LID": keys.lid,
                "QPN": keys.qpn.value(),
                "PSN": keys.psn.value(),
                "GID": keys.gid.to_string(),
            });
            if reads {
                entry["OUT"] = keys.out_reads.into();
            }
            if rdma {
                entry["RKey"] = keys.rkey.0.into();
                entry["VAddr"] = keys.vaddr.into();
            }
            match side {
                Side::Local => doc.local.push(entry),
                Side::Remote => doc.remote.push(entry),
            }
            return Ok(());
        }
        let mut line = format!(
            " {} address: LID {} QPN {} PSN {}",
            side.name(),
            c_hex(keys.lid.into(), 4),
            c_hex(keys.qpn.value().into(), 6),
            c_hex(keys.psn.value().into(), 6)
        );
        if reads {
            line.push_str(&format!(" OUT {}", c_hex(keys.out_reads.into(), 4)));
        }
        if rdma {
            line.push_str(&format!(
                " RKey {} VAddr {}",
                c_hex(keys.rkey.0.into(), 8),
                c_hex(keys.vaddr, 16)
            ));
        }
        let gid: Vec<String> = keys
            .gid
            .octets()
            .iter()
            .map(|b| format!("{b:02}"))
            .collect();
        writeln!(self.out, "{line}\n GID: {}", gid.join(":"))
    }

    /// The table's head: a line and the column names.
    pub fn header(&mut self, table: Table) -> io::Result<()> {
        if self.json.is_some() {
            return Ok(());
        }
        let columns = match table {
            Table::Bw(BwUnit::MiB) => {
                " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
            }
            Table::Bw(BwUnit::Gbit) => {
                " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            }
            Table::Lat => {
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                 t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
            }
            Table::LatDuration => " #bytes        #iterations       t_avg[usec]    tps average",
        };
        writeln!(self.out, "{RESULT_LINE}\n{columns}")
    }

    /// One result row, or an entry of the JSON document's `results`.
    pub fn row(&mut self, row: &Row) -> io::Result<()> {
        if let Some(doc) = &mut self.json {
            doc.results.push(match *row {
                Row::Bw(r, _) => json!({
                    "MsgSize": r.size,
                    "n_iterations": r.iters,
                    "BW_peak": r.bw_peak,
                    "BW_average": r.bw_avg,
                    "MsgRate": r.msg_rate,
                }),
                Row::Lat(r) => json!({
                    "MsgSize": r.size,
                    "n_iterations": r.iters,
                    "t_min": r.t_min,
                    "t_max": r.t_max,
                    "t_typical": r.t_typical,
                    "t_avg": r.t_avg,
                    "t_stdev": r.t_stdev,
                    "percentile_99": r.p99,
                    "percentile_99.9": r.p999,
                }),
                Row::LatDuration(r) => json!({
                    "MsgSize": r.size,
                    "n_iterations": r.iters,
                    "t_avg": r.t_avg,
                    "tps_average": r.tps,
                }),
            });
            return Ok(());
        }
        let text = match *row {
            // Below 0.1 Gb/sec perftest prints six decimals (REPORT_FMT_EXT).
            Row::Bw(r, BwUnit::Gbit) if r.bw_avg < 0.1 => format!(
                " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
                r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
            ),
            Row::Bw(r, _) => format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
            ),
            Row::Lat(r) => format!(
                " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t\
                 {:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                r.size, r.iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999
            ),
            Row::LatDuration(r) => format!(
                " {:<7}       {}            {:<7.2}        {:<7.2}",
                r.size, r.iters, r.t_avg, r.tps
            ),
        };
        writeln!(self.out, "{text}")
    }

    /// The closing line of the table.
    pub fn line(&mut self) -> io::Result<()> {
        if self.json.is_some() {
            return Ok(());
        }
        writeln!(self.out, "{RESULT_LINE}")
    }

    /// Prints the JSON document, if that is the output.
    pub fn finish(self) -> io::Result<()> {
        if let Some(doc) = self.json {
            let document = json!({
                "test_info": doc.test_info,
                "local": doc.local,
                "remote": doc.remote,
                "results": doc.results,
            });
            writeln!(self.out, "{document}")?;
        }
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_hex_is_printfs() {
        assert_eq!(c_hex(0x15, 6), "0x0015");
        assert_eq!(c_hex(0x6c0406, 6), "0x6c0406");
        assert_eq!(c_hex(0x663, 8), "0x000663");
        assert_eq!(c_hex(0x7fe0_f46c_9000, 16), "0x007fe0f46c9000");
        assert_eq!(c_hex(0, 4), "0000");
        assert_eq!(c_hex(0, 16), "0000000000000000");
    }

    #[test]
    fn bw_rows_are_perftests() {
        // The row ib_write_bw printed in the lab for wirecheck's report.
        let report = BwReport {
            size: 4096,
            iters: 5,
            bw_peak: 4.34,
            bw_avg: 4.34,
            msg_rate: 0.001112,
        };
        let mut text = Vec::new();
        Output::new(&mut text, false)
            .row(&Row::Bw(report, BwUnit::MiB))
            .unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            " 4096       5                4.34               4.34   \t\t   0.001112\n"
        );
    }

    #[test]
    fn bandwidth_average_and_peak() {
        // Four 1 MiB messages, one completion per message, posted at 0, 5, 6 and 7 ms and
        // completed at 6, 7, 8 and 9 ms: 4 MiB in 9 ms on average, but the last three came
        // out in 4 ms from the second one's post, 4/3 ms per message (in whole nanoseconds).
        let ms = 1_000_000;
        let samples = BwSamples {
            iters: 4,
            posted: vec![0, 5 * ms, 6 * ms, 7 * ms],
            completed: vec![6 * ms, 7 * ms, 8 * ms, 9 * ms],
            cq_mod: 1,
            no_peak: false,
        };
        let report = bw_report(1 << 20, BwUnit::MiB, &samples);
        assert!((report.bw_avg - 4000.0 / 9.0).abs() < 1e-9, "{report:?}");
        assert!(
            (report.bw_peak - 1e9 / 1_333_333.0).abs() < 1e-9,
            "{report:?}"
        );
        assert!(
            (report.msg_rate - 4.0 / 9.0 / 1000.0).abs() < 1e-12,
            "{report:?}"
        );
        let no_peak = BwSamples {
            iters: 4,
            posted: vec![0],
            completed: vec![5 * ms],
            cq_mod: 1,
            no_peak: true,
        };
        let report = bw_report(1 << 20, BwUnit::Gbit, &no_peak);
        assert_eq!(report.bw_peak, 0.0);
        assert!((report.bw_avg - 6.7108864).abs() < 1e-9, "{report:?}");
    }

    #[test]
    fn latency_statistics() {
        // Gaps of 10, 20, 30, 40, 50, 60 µs: the two largest are dropped, the rest halved.
        let posted = [0, 10, 30, 60, 100, 150, 210].map(|us: u64| us * 1000);
        let report = lat_report(2, &posted, 2);
        assert_eq!(report.iters, 7);
        assert_eq!(report.t_min, 5.0);
        assert_eq!(report.t_max, 25.0);
        assert_eq!(report.t_typical, 12.5);
        assert_eq!(report.t_avg, 12.5);
        assert_eq!(report.p99, 25.0);
        // Deviations 7.5, 2.5, 2.5, 7.5 truncate to 7, 2, 2, 7.
        assert!((report.t_stdev - (106.0f64 / 4.0).sqrt()).abs() < 1e-12);
    }
}
