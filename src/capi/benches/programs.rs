//! What the C library costs a program: perftest's `ib_write_bw` and `ib_send_lat`, as Debian
//! ships them, through softroce's `libibverbs.so.1`, against softroce's own `write-bw` and
//! `send-lat` (the same engine, called from Rust) on the same loopback, sizes and iteration
//! counts, alternated run by run. Prints a markdown table of medians over `SOFTROCE_BENCH_RUNS`
//! runs (default 3), each figure as the client reports it (with the range of the runs), and the ratios issue 22 asks for:
//! bandwidth at least 0.9x, latency (perftest's typical, the median) at most 1.1x.
//!
//! Needs perftest installed and softroce's command line built beside the library:
//! `cargo build --release && cargo bench -p softroce-rdma --bench programs`.
//! `SOFTROCE_BENCH_ONLY=write` (or `send`) keeps the rows whose test contains it.
//!
//! Timings here vary by 15% from run to run, more than the library's cost at small sizes. With
//! `SOFTROCE_BENCH_INSTRUCTIONS=1` (valgrind installed) the bandwidth rows are counted instead:
//! each side counted by callgrind in turn (all its threads), without the peak bandwidth's
//! calculation (`-N`), a message's share taken as the difference between a run of a tenth of
//! the row's iterations and one of a fiftieth, so that the set-up falls out; the ratio, both
//! sides' sum, in the timings' sense (the tool's cost over perftest's: a rate). What the CPUs
//! do, not what the scheduler makes of it.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{finish, program, softroce, succeeded, wait_listening};

const LIMIT: Duration = Duration::from_secs(120);
const SERVER: &str = "127.0.5.1";
const CLIENT: &str = "127.0.5.2";

/// One row: perftest's program, softroce's tool, the message size and the iterations (enough
/// for a second or two a run here), the column of the client's result line that is the figure,
/// and whether more is better.
struct Row {
    program: &'static str,
    tool: &'static str,
    size: usize,
    iters: usize,
    column: usize,
    higher_is_better: bool,
}

const fn bw(size: usize, iters: usize) -> Row {
    // " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]": the average
    Row {
        program: "ib_write_bw",
        tool: "write-bw",
        size,
        iters,
        column: 3,
        higher_is_better: true,
    }
}

const fn lat(size: usize, iters: usize) -> Row {
    // " #bytes #iterations t_min t_max t_typical t_avg ...": the typical (median) half round trip
    Row {
        program: "ib_send_lat",
        tool: "send-lat",
        size,
        iters,
        column: 4,
        higher_is_better: false,
    }
}

// The bandwidth rows run about a second each here: at a tenth of that (100,000 messages of
// 64 B), the start of a run weighs in, and two runs of one program differed by up to 1.6x.
const ROWS: [Row; 6] = [
    bw(64, 1_000_000),
    bw(4096, 300_000),
    bw(65536, 30_000),
    bw(1 << 20, 2_000),
    lat(8, 20_000),
    lat(4096, 10_000),
];

fn runs() -> usize {
    std::env::var("SOFTROCE_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

/// The figure in `column` of the result line for `size` in perftest's (or softroce's, which
/// prints the same) output.
fn figure(out: &str, size: usize, column: usize) -> Option<f64> {
    out.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > column && fields[0] == size.to_string())
            .then(|| fields[column].parse().ok())
            .flatten()
    })
}

/// Runs a server and then its client, the server listening on TCP `port`; returns what each
/// printed (the server's output, the client's), once both succeeded.
fn run(name: &str, mut server: Command, mut client: Command, port: u16) -> (Output, Output) {
    let server = server.spawn().unwrap();
    wait_listening(port, LIMIT);
    let client = finish(&format!("{name} (client)"), client.spawn().unwrap(), LIMIT);
    let server = finish(&format!("{name} (server)"), server, LIMIT);
    succeeded(&format!("{name} (server)"), &server);
    succeeded(&format!("{name} (client)"), &client);
    (server, client)
}

/// Runs a server and then its client; returns the client's figure.
fn measure(name: &str, server: Command, client: Command, port: u16, row: &Row) -> f64 {
    let (_, client) = run(name, server, client, port);
    let out = String::from_utf8_lossy(&client.stdout);
    figure(&out, row.size, row.column)
        .unwrap_or_else(|| panic!("{name}: no result line for {} bytes:\n{out}", row.size))
}

/// The options both programs take, perftest's syntax, for `iters` iterations.
fn args(row: &Row, iters: usize, port: u16) -> Vec<String> {
    let (size, iters, port) = (row.size.to_string(), iters.to_string(), port.to_string());
    ["-F", "-s", &size, "-n", &iters, "-p", &port]
        .map(String::from)
        .to_vec()
}

/// The server and the client of `row` for `iters` iterations on TCP `port`: softroce's tool,
/// or perftest's program on the library (`theirs`).
fn pair(row: &Row, theirs: bool, iters: usize, port: u16) -> (Command, Command) {
    let a = args(row, iters, port);
    let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
    if theirs {
        a.extend(["-x", "0"]);
    }
    let client_args: Vec<&str> = a.iter().copied().chain([SERVER]).collect();
    if theirs {
        (
            program(SERVER, row.program, &a),
            program(CLIENT, row.program, &client_args),
        )
    } else {
        (
            softroce(SERVER, &[&[row.tool], a.as_slice()].concat()),
            softroce(CLIENT, &[&[row.tool], client_args.as_slice()].concat()),
        )
    }
}

/// `command`, run under callgrind, which counts every instruction its threads execute.
fn under_callgrind(command: &Command) -> Command {
    let mut counted = Command::new("valgrind");
    counted
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(command.get_program())
        .args(command.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => counted.env(key, value),
            None => counted.env_remove(key),
        };
    }
    counted
}

/// The instructions valgrind's report on standard error counted ("I   refs:   1,234,567").
fn counted(stderr: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(stderr).lines().find_map(|line| {
        let (_, refs) = line.split_once("I   refs:")?;
        refs.trim().replace(',', "").parse().ok()
    })
}

/// The instructions a message (an iteration) of `row` costs each side, the client's and the
/// server's: softroce's tool, or perftest's program on the library (`theirs`).
fn instructions(row: &Row, theirs: bool, port: &mut u16) -> [f64; 2] {
    let (short, long) = (row.iters / 50, row.iters / 10);
    let name = if theirs { row.program } else { row.tool };
    [false, true].map(|server_side| {
        let [fewer, more] = [short, long].map(|iters| {
            *port += 1;
            let (mut server, mut client) = pair(row, theirs, iters, *port);
            // No peak bandwidth: both programs compute it from every message's timestamps, in
            // time that grows as the iterations' square (within 20000 of them), which a
            // difference of two runs would not take out.
            server.arg("-N");
            client.arg("-N");
            let (server, client) = if server_side {
                (under_callgrind(&server), client)
            } else {
                (server, under_callgrind(&client))
            };
            let (server, client) = run(name, server, client, *port);
            let report = if server_side { server } else { client };
            counted(&report.stderr).unwrap_or_else(|| {
                panic!(
                    "{name}: no count from valgrind (apt-get install valgrind):\n{}",
                    String::from_utf8_lossy(&report.stderr)
                )
            })
        });
        more.saturating_sub(fewer) as f64 / (long - short) as f64
    })
}

/// The instructions table: each bandwidth row's cost a message, each side, and the ratio of
/// the sums.
fn instructions_table(rows: &[&Row]) {
    println!("| test | bytes | softroce's tool: client + server | perftest on libibverbs.so.1: client + server | ratio | target |");
    println!("|---|---|---|---|---|---|");
    let mut port = 19_700u16;
    for row in rows {
        let ours = instructions(row, false, &mut port);
        let theirs = instructions(row, true, &mut port);
        let (sum_ours, sum_theirs) = (ours[0] + ours[1], theirs[0] + theirs[1]);
        let (ratio, target) = if row.higher_is_better {
            (sum_ours / sum_theirs, "≥ 0.9")
        } else {
            (sum_theirs / sum_ours, "≤ 1.1")
        };
        println!(
            "| {} | {} | {:.0} + {:.0} | {:.0} + {:.0} | {ratio:.2} | {target} |",
            row.program, row.size, ours[0], ours[1], theirs[0], theirs[1]
        );
    }
}

/// The median of `v`, with its range as text.
fn median(mut v: Vec<f64>) -> (f64, String) {
    v.sort_by(f64::total_cmp);
    let range = format!("{:.2} – {:.2}", v[0], v[v.len() - 1]);
    (v[v.len() / 2], range)
}

fn main() {
    // `cargo bench` passes --bench; a plain `cargo test --benches` passes nothing and runs
    // nothing, so that this bench costs the test suite no time.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let only = std::env::var("SOFTROCE_BENCH_ONLY").unwrap_or_default();
    let rows: Vec<&Row> = ROWS
        .iter()
        .filter(|r| r.program.contains(only.as_str()))
        .collect();
    if std::env::var_os("SOFTROCE_BENCH_INSTRUCTIONS").is_some_and(|v| v != "0") {
        // The bandwidth rows only: a latency test's sides spin on their CQs between messages,
        // as many instructions as the peer is slow (and under callgrind one side is slow).
        let bandwidth: Vec<&Row> = rows.into_iter().filter(|r| r.higher_is_better).collect();
        return instructions_table(&bandwidth);
    }
    let mut port = 19_500u16;
    println!("| test | bytes | softroce's tool | perftest on libibverbs.so.1 | ratio | target |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..runs() {
            port += 1;
            let (server, client) = pair(row, false, row.iters, port);
            ours.push(measure(row.tool, server, client, port, row));
            port += 1;
            let (server, client) = pair(row, true, row.iters, port);
            theirs.push(measure(row.program, server, client, port, row));
        }
        let ((ours, our_range), (theirs, their_range)) = (median(ours), median(theirs));
        let (unit, target) = if row.higher_is_better {
            ("MB/s", "≥ 0.9")
        } else {
            ("µs", "≤ 1.1")
        };
        println!(
            "| {} | {} | {ours:.2} {unit} ({our_range}) | {theirs:.2} {unit} ({their_range}) | {:.2} | {target} |",
            row.program,
            row.size,
            theirs / ours
        );
    }
}
