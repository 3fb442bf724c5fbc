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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode { file, json } => decode(file, *json),
    }
}
