//! wirecheck: live checks of softroce's wire codec against kernel rxe, run by the interop lab.
//!
//! Each subcommand is a minimal scripted RoCEv2 peer for one check (not a transport): it does the
//! guest tool's out-of-band exchange over TCP, then builds every packet with softroce's codec,
//! sends it through a UDP socket or a raw IP socket (`--path`), decodes and logs every packet
//! rxe sends back, and prints one verdict line. It exits 0 only if its check held.

use std::process::ExitCode;

/// Returns early with an error built like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(format!($($arg)*).into())
    };
}

mod args;
mod checks;
mod link;
mod oob;
mod rc;

/// Errors carry their own explanation; the verdict line prints it.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().is_some_and(|a| a == "-h" || a == "--help") {
        println!("{}", args::USAGE);
        return ExitCode::SUCCESS;
    }
    let args = match args::Args::parse(argv.into_iter()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("wirecheck: {e}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let name = format!("{} (path {})", args.check.name(), args.path);
    match checks::run(&args) {
        Ok(summary) => {
            println!("PASS {name}: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAIL {name}: {e}");
            ExitCode::FAILURE
        }
    }
}
