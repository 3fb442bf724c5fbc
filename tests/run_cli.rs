//! `softroce run`: an unmodified program over softroce's C library, which cargo builds beside
//! the `softroce` executable (the softroce-rdma target, in `rdma/`).

use std::process::Command;

#[test]
fn run_gives_a_program_the_library_and_its_address() {
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["run", "--addr", "127.0.3.21", "--", "ibv_devices"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{listed}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The GUID is made of the address: 127 and 0.3.21.
    assert!(
        listed.contains("softroce0") && listed.contains("02007ffffe000315"),
        "{listed}"
    );
}

#[test]
fn run_says_why_a_program_cannot_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["run", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot run /nonexistent/program"), "{said}");
}

/// `--busy-poll` reaches the program as `SOFTROCE_BUSY_POLL`, within its bound, and the library
/// refuses a value it cannot read when a device opens, saying why.
#[test]
fn run_passes_busy_polling_to_the_library_and_bad_values_are_refused() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["run", "--busy-poll", "20", "--", "env"]);
    assert!(out.status.success(), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(env.lines().any(|l| l == "SOFTROCE_BUSY_POLL=20"), "{env}");

    let out = run(&["run", "--busy-poll", "10001", "--", "env"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("microseconds, 0 (off) to 10000"), "{said}");

    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["run", "--addr", "127.0.3.22", "--", "ibv_devinfo"])
        .env("SOFTROCE_BUSY_POLL", "lots")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("SOFTROCE_BUSY_POLL=lots: expected microseconds"),
        "{said}"
    );
}

/// `--trains-per-qp` reaches the program as `SOFTROCE_TRAINS_PER_QP=1`, and the library refuses
/// a value other than 0 or 1 when a device opens, saying why.
#[test]
fn run_passes_trains_per_qp_to_the_library_and_bad_values_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["run", "--trains-per-qp", "--", "env"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(
        env.lines().any(|l| l == "SOFTROCE_TRAINS_PER_QP=1"),
        "{env}"
    );

    for (value, refused) in [("yes", true), ("1", false), ("0", false)] {
        let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args(["run", "--addr", "127.0.3.23", "--", "ibv_devinfo"])
            .env("SOFTROCE_TRAINS_PER_QP", value)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            said.contains(&format!("SOFTROCE_TRAINS_PER_QP={value}: expected 1")),
            refused,
            "{value}: {said}"
        );
        assert_eq!(out.status.success(), !refused, "{value}: {said}");
    }
}

/// A program run by `softroce run` finds `/dev/infiniband/uverbsN` (one per device) and
/// `rdma_cm` as character devices it may open, as UCX requires, while its /dev keeps the host's
/// devices (and, as root, new pseudo-terminals); nothing changes on the host; a user with no
/// privilege gets the same (a user namespace), and `--host-dev` keeps the host's /dev.
#[test]
fn run_gives_the_program_its_own_dev_infiniband() {
    let host_had_it = std::path::Path::new("/dev/infiniband").exists();
    let check = "stat -c '%n %F' /dev/infiniband/uverbs0 /dev/infiniband/uverbs1 \
                 /dev/infiniband/rdma_cm && test -r /dev/infiniband/uverbs1 \
                 && test -w /dev/infiniband/uverbs1 && echo ok > /dev/null && test -d /dev/pts \
                 && id -u";
    let run = |user: Option<&str>, extra: &[&str]| {
        let mut command = match user {
            // setpriv (util-linux) drops to another user before `softroce run` starts.
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid", uid, "--regid", uid, "--clear-groups"])
                    .arg(env!("CARGO_BIN_EXE_softroce"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_softroce")),
        };
        command
            .args(["run", "--addr", "127.0.3.24", "--addr", "127.0.3.25"])
            .args(extra)
            .args(["--", "sh", "-c", check])
            .output()
            .unwrap()
    };
    let out = run(None, &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for node in ["uverbs0", "uverbs1", "rdma_cm"] {
        assert!(
            said.contains(&format!("/dev/infiniband/{node} character special file")),
            "{said}"
        );
    }
    assert_eq!(
        std::path::Path::new("/dev/infiniband").exists(),
        host_had_it
    );

    if is_root() {
        // A new pseudo-terminal opens: as root, /dev/ptmx is a node of the view's own (a bind
        // of the host's would not find its devpts).
        let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args([
                "run",
                "--addr",
                "127.0.3.24",
                "--",
                "/usr/bin/python3",
                "-c",
            ])
            .arg("import os, pty; m, s = pty.openpty(); print(os.ttyname(s))")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.starts_with("/dev/pts/"),
            "{out:?}"
        );

        let out = run(Some("65534"), &[]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        // The program runs as the user who ran it, not as the namespace's root.
        assert!(said.trim_end().ends_with("65534"), "{said}");
    }
    if !host_had_it {
        let out = run(None, &["--host-dev"]);
        assert!(!out.status.success(), "{out:?}");
    }
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}
