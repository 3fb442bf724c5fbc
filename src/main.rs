//! The `softroce` command line.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use softroce::decode::{decode_capture, Item};

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
    let mut write_failed = None;
    let result = decode_capture(&bytes, |item| {
        let line = match item {
            Item::Roce(d) if json => serde_json::to_string(d).expect("plain data serialises"),
            Item::Roce(d) => d.summary(),
            Item::Malformed { frame, error } if json => {
                serde_json::json!({ "frame": frame, "malformed": error.to_string() }).to_string()
            }
            Item::Malformed { frame, error } => format!("{frame:>5} malformed RoCE: {error}"),
            Item::NotRoce => return,
        };
        if let Err(e) = writeln!(out, "{line}") {
            write_failed.get_or_insert(e);
        }
    });
    let flushed = out.flush();
    if let Some(e) = write_failed.or(flushed.err()) {
        eprintln!("softroce decode: writing the output: {e}");
        return ExitCode::FAILURE;
    }
    match result {
        Ok(summary) => {
            let counts = summary.render();
            if json {
                eprint!("{counts}");
            } else {
                print!("{counts}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("softroce decode: {}: {e}", file.display());
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode { file, json } => decode(file, *json),
    }
}
