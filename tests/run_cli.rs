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
