//! Running Debian's unmodified RDMA programs over softroce's libibverbs.so.1 and
//! librdmacm.so.1: a directory holding the library under both names, programs started with it
//! on `LD_LIBRARY_PATH` and an address of their own, and a bound on how long each may take.

#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// A directory of this test process's own in the temporary directory, made once, afresh: named
/// by process ID and start time, and created with `create_dir`, never reused, so that a
/// directory another run left under the same process ID (another user's, once the PIDs have
/// wrapped: seen in CI as EEXIST and EACCES) is never taken for it.
pub fn own_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::temp_dir();
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for attempt in 0..100 {
            let dir = base.join(format!(
                "softroce-capi-{}-{started}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => return dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot make {}: {e}", dir.display()),
            }
        }
        panic!("no fresh directory in {}", base.display())
    })
}

/// A directory with `libibverbs.so.1` and `librdmacm.so.1`, both softroce's library: the one
/// cargo built, or `SOFTROCE_RDMA_LIB` (.ci/run runs these tests as nobody, on a copy). Made
/// once per test process.
pub fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let library = std::env::var_os("SOFTROCE_RDMA_LIB").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma")),
            PathBuf::from,
        );
        let dir = own_dir().join("lib");
        std::fs::create_dir(&dir).unwrap();
        for name in ["libibverbs.so.1", "librdmacm.so.1"] {
            std::os::unix::fs::symlink(&library, dir.join(name)).unwrap();
        }
        dir
    })
    .clone()
}

/// `program args...`, over softroce, with its device on `addr`. Panics, saying what to
/// install, if the program is not there.
pub fn program(addr: &str, program: &str, args: &[&str]) -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()));
    assert!(
        found,
        "{program} is not installed: apt-get install ibverbs-utils rdmacm-utils perftest"
    );
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTROCE_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for `child` at most `limit`; kills it past that and panics, with what it printed.
pub fn finish(name: &str, child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    let mut child = child;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{name} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Panics unless `output` is a success, with what the program printed.
pub fn succeeded(name: &str, output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Waits until something listens on TCP `port` (from /proc/net/tcp and tcp6, so that no
/// connection is spent on finding out), at most `limit`.
pub fn wait_listening(port: u16, limit: Duration) {
    let start = Instant::now();
    let wanted = format!(":{port:04X} ");
    while start.elapsed() < limit {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
            std::fs::read_to_string(table).is_ok_and(|text| {
                text.lines().skip(1).any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 3
                        && format!("{} ", fields[1]).contains(&wanted)
                        && fields[3] == "0A"
                })
            })
        });
        if listening {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listened on TCP port {port} within {limit:?}");
}

/// Runs a server and a client of the same kind: the server on `addrs.0`, listening on TCP
/// `port` (its `args` say so), the client on `addrs.1`; both must succeed within `limit`.
/// Returns both outputs.
pub fn pair(
    name: &str,
    addrs: (&str, &str),
    server_args: &[&str],
    client_args: &[&str],
    port: u16,
    limit: Duration,
) -> (String, String) {
    let server = program(addrs.0, name, server_args).spawn().unwrap();
    wait_listening(port, limit);
    let client = program(addrs.1, name, client_args).spawn().unwrap();
    let client = finish(&format!("{name} (client)"), client, limit);
    let server = finish(&format!("{name} (server)"), server, limit);
    (
        succeeded(&format!("{name} (server)"), &server),
        succeeded(&format!("{name} (client)"), &client),
    )
}

/// Runs `server` and then `client` until the client succeeds and its output shows it was
/// served (`served`): it fails while the server is not listening yet (a refused TCP
/// connection, or REJ 8 from RDMA-CM; rping exits 0 even then). Each try is bounded by
/// `limit`; both must succeed. Returns both outputs.
pub fn until_served(
    name: &str,
    mut server: Command,
    mut client: impl FnMut() -> Command,
    served: impl Fn(&str) -> bool,
    limit: Duration,
) -> (String, String) {
    let mut server = server.spawn().unwrap();
    let start = Instant::now();
    // The try before the last, reported with it: a client that the server served but that
    // failed before its output was flushed reads as not served, and only the next try, which
    // finds no server, makes the loop give up.
    let mut before: Option<Output> = None;
    let client = loop {
        let attempt = finish(
            &format!("{name} (client)"),
            client().spawn().unwrap(),
            limit,
        );
        let was_served = served(&String::from_utf8_lossy(&attempt.stdout));
        if attempt.status.success() && was_served {
            break attempt;
        }
        // A client the server served, that failed all the same, is the failure to report: the
        // server is done, and the next try would only say that nothing listens any more.
        let server_done = was_served || server.try_wait().unwrap().is_some();
        if server_done || start.elapsed() > limit {
            let _ = server.kill();
            let server = server.wait_with_output().unwrap();
            let before = before.map_or("none".into(), |before| {
                format!(
                    "{}\nits stdout:\n{}\nits stderr:\n{}",
                    before.status,
                    String::from_utf8_lossy(&before.stdout),
                    String::from_utf8_lossy(&before.stderr)
                )
            });
            panic!(
                "{name}: the client failed ({})\nclient stdout:\n{}\nclient stderr:\n{}\n\
                 server stdout:\n{}\nserver stderr:\n{}\nthe client's try before: {before}",
                attempt.status,
                String::from_utf8_lossy(&attempt.stdout),
                String::from_utf8_lossy(&attempt.stderr),
                String::from_utf8_lossy(&server.stdout),
                String::from_utf8_lossy(&server.stderr)
            );
        }
        before = Some(attempt);
        std::thread::sleep(Duration::from_millis(200));
    };
    let server = finish(&format!("{name} (server)"), server, limit);
    (
        succeeded(&format!("{name} (server)"), &server),
        succeeded(&format!("{name} (client)"), &client),
    )
}

/// Whether perftest's output has its result line: the message size and the iterations, then
/// the figures.
pub fn has_result_line(out: &str) -> bool {
    out.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let numeric = |f: Option<&str>| f.is_some_and(|f| f.parse::<u64>().is_ok());
        numeric(fields.next()) && numeric(fields.next()) && fields.next().is_some()
    })
}

/// softroce's own command line, beside the C library: cargo builds both into one directory,
/// or `SOFTROCE_BIN` names it (.ci/run's copy for nobody, with the library in `rdma/` beside
/// it, as `softroce run` finds it).
pub fn softroce_bin() -> PathBuf {
    let bin = std::env::var_os("SOFTROCE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma")).with_file_name("softroce"),
        PathBuf::from,
    );
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace (cargo build)",
        bin.display()
    );
    bin
}

/// `mpirun` of `ranks` ranks of `program` over UCX's RC (`--mca pml ucx`, `UCX_TLS=rc,self`: no
/// shared memory between the ranks), each rank through `softroce run --addr ADDRESS`, where
/// `address` is a shell expression of the rank (`OMPI_COMM_WORLD_RANK`) giving its address.
pub fn mpirun_over_softroce(ranks: usize, address: &str, program: &Path) -> Command {
    // Named by its address expression: tests with others may run at once.
    let named: String = address
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let wrapper = own_dir().join(format!("mpi_rank_over_softroce_{named}"));
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} run --addr {address} -- \"$@\"\n",
            softroce_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut mpirun = Command::new("mpirun");
    mpirun
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &ranks.to_string(),
        ])
        .args(["--mca", "pml", "ucx", "-x", "UCX_TLS=rc,self"])
        .arg(&wrapper)
        .arg(program);
    mpirun
}

/// softroce's own tool `args`, with its device on `addr`.
pub fn softroce(addr: &str, args: &[&str]) -> Command {
    let mut command = Command::new(softroce_bin());
    command
        .args(args)
        .args(["--bind", addr])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `softroce run --addr A [--addr B ...] -- program args...`: the program over softroce as a
/// user runs it, a device on each of `addrs`, with its own `/dev/infiniband`. Panics, saying
/// what to install, if the program (a name to find on `PATH`, or a path) is not there.
pub fn softroce_run(addrs: &[&str], program: &str, args: &[&str]) -> Command {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
    };
    assert!(
        found,
        "{program} is not installed: apt-get install ucx-utils openmpi-bin libopenmpi-dev \
         libfabric-bin qperf python3-pyverbs"
    );
    let mut command = Command::new(softroce_bin());
    command.arg("run");
    for addr in addrs {
        command.args(["--addr", addr]);
    }
    command
        .args(["--", program])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `source` with C helpers before it for a program whose thread is to block in a call while
/// another acts on what it waits for: the blocking thread calls `announce_tid()` just before
/// that call, and the other `wait_blocked()`, which returns 1 once the first sleeps in the
/// kernel (state S in its `/proc` stat: it sleeps nowhere else in between), 0 after 10 s.
pub fn with_blocked_waiter(source: &str) -> String {
    const HELPERS: &str = r#"#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
static volatile pid_t blocked_tid;
static void announce_tid(void) { blocked_tid = (pid_t) syscall(SYS_gettid); }
static int wait_blocked(void) {
    for (int i = 0; i < 10000; i++, usleep(1000)) {
        char path[64], stat[512];
        if (!blocked_tid) continue;
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int) blocked_tid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[n] = 0;
        char *end = strrchr(stat, ')');
        if (end && end[1] == ' ' && end[2] == 'S') return 1;
    }
    return 0;
}
"#;
    format!("{HELPERS}{source}")
}

/// How long a C program of the tests may take.
pub const C_LIMIT: Duration = Duration::from_secs(60);

/// Runs the C program `name`, built from `source` after `c/common.h` with `libs`, on `addrs`
/// with `args`, within [`C_LIMIT`], and asserts it succeeded and printed each of `lines`.
pub fn run_c_expecting(
    name: &str,
    source: &str,
    libs: &[&str],
    addrs: &str,
    args: &[&str],
    lines: &[&str],
) {
    let path = compile_c_with_common(name, source, libs);
    let child = program(addrs, path.to_str().unwrap(), args)
        .spawn()
        .unwrap();
    let output = finish(name, child, C_LIMIT);
    let out = succeeded(name, &output);
    for line in lines {
        assert!(out.contains(line), "{name}: no {line:?} in:\n{out}");
    }
}

/// Compiles the C program `source` after `c/common.h` (CHECK, `next_wc`, and two connected RC
/// QPs of one process), as [`compile_c`] does.
pub fn compile_c_with_common(name: &str, source: &str, libs: &[&str]) -> PathBuf {
    let whole = format!("{}\n{source}", include_str!("../c/common.h"));
    compile_c(name, &whole, libs)
}

/// Compiles the C program `source` with `cc`, linked with `libs` (`-ldl`, `-lrdmacm`, ...),
/// into a directory of this test process's; panics with the compiler's message if it fails.
/// Returns the executable.
pub fn compile_c(name: &str, source: &str, libs: &[&str]) -> PathBuf {
    compile_c_by("cc", name, source, libs)
}

/// [`compile_c`] with `compiler` (`mpicc`, ...).
pub fn compile_c_by(compiler: &str, name: &str, source: &str, libs: &[&str]) -> PathBuf {
    let dir = own_dir();
    let (file, program) = (dir.join(format!("{name}.c")), dir.join(name));
    std::fs::write(&file, source).unwrap();
    let built = Command::new(compiler)
        .arg(&file)
        .arg("-o")
        .arg(&program)
        .args(libs)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{name}.c: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    program
}
