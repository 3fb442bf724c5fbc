//! A `softroce` subcommand run as a child process, its output read line by line as it comes:
//! shared by the tool and daemon tests. Not every test uses every helper.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

/// Long enough for a debug build on a busy 2-core machine; a hung tool fails instead of hanging.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// A line a tool printed.
pub enum Line {
    Out(String),
    Err(String),
}

/// A running tool whose standard output and standard error threads forward line by line.
pub struct Tool {
    pub child: Child,
    lines: Receiver<Line>,
    seen: Vec<Line>,
}

/// How a tool ended, and everything it printed.
pub struct Ended {
    pub status: ExitStatus,
    pub stdout: Vec<String>,
    pub stderr: String,
}

/// Forwards `from`'s lines, each made a `Line` by `wrap`, until it ends.
fn forward(from: impl Read + Send + 'static, wrap: fn(String) -> Line, to: Sender<Line>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if to.send(wrap(line)).is_err() {
                break;
            }
        }
    });
}

impl Tool {
    pub fn start(args: &[&str]) -> Tool {
        let mut child = Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the softroce binary starts");
        let (tx, lines) = mpsc::channel();
        forward(child.stdout.take().unwrap(), Line::Out, tx.clone());
        forward(child.stderr.take().unwrap(), Line::Err, tx);
        Tool {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one (on either stream) equals `line`; false if the tool ended first.
    pub fn wait_for(&mut self, line: &str) -> bool {
        self.wait_for_match(|l| l == line).is_some()
    }

    /// Reads lines until one (on either stream) satisfies `wanted`, and returns it; `None` if
    /// the tool ended first.
    pub fn wait_for_match(&mut self, wanted: impl Fn(&str) -> bool) -> Option<String> {
        while let Ok(next) = self.lines.recv_timeout(DEADLINE) {
            let found = match &next {
                Line::Out(l) | Line::Err(l) => wanted(l).then(|| l.clone()),
            };
            self.seen.push(next);
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Sends the tool a signal by name (`TERM`, `INT`, `USR1`, `KILL`).
    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args(["-s", name, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -s {name}");
    }

    /// Waits for the tool to end (killing it after the deadline).
    pub fn end(mut self) -> Ended {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > DEADLINE {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                self.seen.extend(self.lines.iter());
                let printed: Vec<&str> = self
                    .seen
                    .iter()
                    .map(|(Line::Out(l) | Line::Err(l))| l.as_str())
                    .collect();
                panic!(
                    "a tool did not finish within {DEADLINE:?}; it printed:\n{}",
                    printed.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The forwarding threads end with the tool's output streams.
        self.seen.extend(self.lines.iter());
        let (mut stdout, mut stderr) = (Vec::new(), String::new());
        for line in std::mem::take(&mut self.seen) {
            match line {
                Line::Out(line) => stdout.push(line),
                Line::Err(line) => {
                    stderr.push_str(&line);
                    stderr.push('\n');
                }
            }
        }
        Ended {
            status,
            stdout,
            stderr,
        }
    }
}

impl Ended {
    pub fn has(&self, line: &str) -> bool {
        self.stdout.iter().any(|l| l == line)
    }

    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.stdout.iter().any(|l| l.starts_with(prefix))
    }

    /// The result rows: lines that start with the message size, as perftest's do.
    pub fn rows(&self) -> Vec<Vec<String>> {
        self.stdout
            .iter()
            .filter(|l| l.starts_with(' ') && l[1..].starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    }

    /// The GID line after the remote address line.
    pub fn remote_gid(&self) -> &str {
        let at = self
            .stdout
            .iter()
            .position(|l| l.starts_with(" remote address: LID 0000 QPN 0x"))
            .expect("a remote address line");
        &self.stdout[at + 1]
    }
}

impl Drop for Tool {
    /// A test that fails half way leaves no process behind to hold its addresses.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
