//! The `softroce` command line.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use softroce::decode::{decode_capture, Item};
use softroce::demo::DemoConfig;

#[derive(Parser)]
#[command(
    name = "softroce",
    version,
    about = "A userspace software RoCEv2 transport"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Move data between two devices over UDP on loopback: RDMA WRITE, then RDMA READ back,
    /// every byte checked. Needs no root.
    Demo {
        /// How many MiB to move each way.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
        /// The RDMA message size, in KiB.
        #[arg(long, default_value_t = 1024)]
        message_kib: usize,
    },
    /// Print one line per RoCEv2 packet of a pcap or pcapng file, with its ICRC checked.
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, raw IP or Linux cooked link types).
        file: PathBuf,
        /// Print one JSON object per packet instead; the counts go to standard error.
        #[arg(long)]
        json: bool,
    },
}

fn decode(file: &PathBuf, json: bool) -> ExitCode {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("softroce decode: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut write_error: Option<std::io::Error> = None;
    let result = decode_capture(&bytes, |item| {
        if write_error.is_some() {
            return;
        }
        let line = match item {
            Item::Roce(d) if json => serde_json::to_string(d).expect("plain data serialises"),
            Item::Roce(d) => d.summary(),
            Item::Malformed { frame, error } if json => {
                serde_json::json!({ "frame": frame, "malformed": error.to_string() }).to_string()
            }
            Item::Malformed { frame, error } => format!("{frame:>5} malformed RoCE: {error}"),
            Item::NotRoce => return,
        };
        write_error = writeln!(out, "{line}").err();
    });
    let outcome = match &result {
        // The counts go after the packets, or to standard error beside JSON lines.
        Ok(summary) if json => {
            eprint!("{}", summary.render());
            Ok(())
        }
        Ok(summary) => write!(out, "{}", summary.render()),
        Err(_) => Ok(()),
    };
    let write_error = write_error.or(outcome.err()).or(out.flush().err());
    match write_error {
        // A reader that stops early (`| head`) is not an error.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("softroce decode: writing the output: {e}");
            return ExitCode::FAILURE;
        }
        None => {}
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce decode: {}: {e}", file.display());
            ExitCode::FAILURE
        }
    }
}

fn demo(mib: u64, message_kib: usize) -> ExitCode {
    let config = DemoConfig {
        total: mib << 20,
        message: (message_kib << 10).clamp(1, 32 << 20),
        ..DemoConfig::default()
    };
    eprintln!(
        "softroce demo: {} MiB by RDMA WRITE {} -> {}, then back by RDMA READ, {} KiB messages, MTU 4096",
        mib, config.addresses[0], config.addresses[1], config.message >> 10
    );
    let (report, devices) = match softroce::demo::run(config) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("softroce demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rate = |t: std::time::Duration| report.bytes as f64 / t.as_secs_f64().max(1e-9) / 1e6;
    println!(
        "RDMA WRITE: {} MiB in {:.2} s = {:.0} MB/s",
        report.bytes >> 20,
        report.write_time.as_secs_f64(),
        rate(report.write_time)
    );
    println!(
        "RDMA READ:  {} MiB in {:.2} s = {:.0} MB/s",
        report.bytes >> 20,
        report.read_time.as_secs_f64(),
        rate(report.read_time)
    );
    for device in &devices {
        if let Ok((core, io)) = device.counters() {
            println!("\ncounters of {}:\n{core}io: {io:?}", device.address());
        }
    }
    if report.mismatches == 0 {
        println!("\nverified: every byte read back matches what was written");
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: {} bytes differ", report.mismatches);
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode { file, json } => decode(file, *json),
        Command::Demo { mib, message_kib } => demo(*mib, *message_kib),
    }
}
