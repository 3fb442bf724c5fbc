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
