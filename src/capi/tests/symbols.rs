//! The symbols softroce's library exports, at rdma-core's versions: every symbol that Debian's
//! RDMA programs (and the vendor libraries perftest links) import from libibverbs.so.1 or
//! librdmacm.so.1 must be there at the version they ask for, or the program does not load; and
//! a loader that asks for a symbol at its version with `dlvsym`, as NCCL does, finds it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A dynamic symbol of a library, as readelf lists it.
struct DynSym {
    /// The section index: `UND` for an import.
    ndx: String,
    name: String,
    version: String,
    /// `name@@version`: what a program linked against the library now binds.
    default: bool,
}

/// Every versioned dynamic symbol of `file`, from readelf.
fn dyn_syms(file: &Path) -> Vec<DynSym> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(file)
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success(), "readelf {}", file.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (ndx, name) = (fields.get(6)?, fields.get(7)?);
            let (name, version) = name.split_once('@')?;
            let default = version.starts_with('@');
            let version = version.trim_start_matches('@').split(' ').next()?;
            Some(DynSym {
                ndx: ndx.to_string(),
                name: name.to_string(),
                version: version.to_string(),
                default,
            })
        })
        .collect()
}

/// `(version, name)` of each dynamic symbol of `file` that `keep` takes (given its section
/// index and version).
fn symbols(file: &Path, keep: impl Fn(&str, &str) -> bool) -> BTreeSet<(String, String)> {
    dyn_syms(file)
        .into_iter()
        .filter(|s| keep(&s.ndx, &s.version))
        .map(|s| (s.version, s.name))
        .collect()
}

/// The symbols `file` defines at their default version, of rdma-core's version nodes.
fn defaults(file: &Path) -> BTreeSet<(String, String)> {
    let rdma = |v: &str| v.starts_with("IBVERBS_") || v.starts_with("RDMACM_");
    dyn_syms(file)
        .into_iter()
        .filter(|s| s.ndx != "UND" && s.default && rdma(&s.version))
        .map(|s| (s.version, s.name))
        .collect()
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{program} is not installed (apt-get install ibverbs-utils rdmacm-utils perftest)"
            )
        })
}

/// The libraries `program` loads, from ldd: the vendor libraries perftest links come too.
fn linked(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            line.split("=> ")
                .nth(1)?
                .split(' ')
                .next()
                .map(PathBuf::from)
        })
        .filter(|lib| {
            let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with("libibverbs") && !name.starts_with("librdmacm")
        })
        .collect()
}

const PROGRAMS: [&str; 17] = [
    "ibv_devices",
    "ibv_devinfo",
    "ibv_rc_pingpong",
    "ibv_uc_pingpong",
    "ibv_ud_pingpong",
    "ibv_srq_pingpong",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_atomic_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
    "rping",
    "ucmatose",
    "udaddy",
    "rdma_server",
];

#[test]
fn every_symbol_the_programs_import_is_exported_at_its_version() {
    let library = PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma"));
    let exported = symbols(&library, |ndx, _| ndx != "UND");
    let rdma = |v: &str| v.starts_with("IBVERBS_") || v.starts_with("RDMACM_");
    let mut missing = BTreeSet::new();
    for program in PROGRAMS.iter().chain(&["rdma_client"]) {
        let path = which(program);
        let mut files = vec![path.clone()];
        files.extend(linked(&path));
        for file in files {
            for wanted in symbols(&file, |ndx, v| ndx == "UND" && rdma(v)) {
                if !exported.contains(&wanted) {
                    missing.insert(format!(
                        "{} {} (for {})",
                        wanted.0,
                        wanted.1,
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not exported:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
    // And no ibv_ or rdma_ symbol is exported without its node (dlvsym would not find it).
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(&library)
        .output()
        .unwrap();
    let unversioned: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (ndx, name) = (*fields.get(6)?, *fields.get(7)?);
            let ours = ["ibv_", "_ibv_", "rdma_"]
                .iter()
                .any(|p| name.starts_with(p));
            (ndx != "UND" && ours && !name.contains('@')).then(|| name.to_string())
        })
        .collect();
    assert!(unversioned.is_empty(), "{unversioned:?}");
}

#[test]
fn dlvsym_finds_symbols_at_their_versions() {
    let program = common::compile_c(
        "dlvsym",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	const char *wanted[][2] = {
		{"ibv_get_device_list", "IBVERBS_1.1"}, {"ibv_reg_mr_iova2", "IBVERBS_1.8"},
		{"_ibv_query_gid_ex", "IBVERBS_1.11"}, {"ibv_create_comp_channel", "IBVERBS_1.0"},
		{"rdma_create_id", "RDMACM_1.0"}, {"rdma_establish", "RDMACM_1.2"},
	};
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	for (unsigned i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
		if (!dlvsym(h, wanted[i][0], wanted[i][1])) {
			printf("missing %s@%s\n", wanted[i][0], wanted[i][1]);
			return 1;
		}
	if (dlvsym(h, "ibv_get_device_list", "IBVERBS_9.9")) { printf("a version that is not\n"); return 1; }
	printf("ok\n");
	return 0;
}
"#,
        &["-ldl"],
    );
    let lib = common::lib_dir().join("libibverbs.so.1");
    let out = Command::new(&program).arg(&lib).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}

/// Where the dynamic loader finds `soname` (`ldconfig -p`): Debian's own library.
fn system_library(soname: &str) -> PathBuf {
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.trim_start().starts_with(&format!("{soname} ")))
        .find_map(|line| line.split("=> ").nth(1).map(|p| PathBuf::from(p.trim())))
        .unwrap_or_else(|| panic!("{soname} is not installed (apt-get install {soname})"))
}

/// Every symbol Debian's libibverbs.so.1 and librdmacm.so.1 define, at its version, softroce's
/// library defines (libibverbs 1.0's verbs at IBVERBS_1.0 beside today's at IBVERBS_1.1
/// included); and every version node theirs have, its has. (A symbol rdma-core adds joins the
/// failures until it is built.)
#[test]
fn rdma_cores_symbols_and_versions_are_all_defined() {
    let ours = symbols(
        &PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma")),
        |ndx, _| ndx != "UND",
    );
    let mut rdma_core = BTreeSet::new();
    for soname in ["libibverbs.so.1", "librdmacm.so.1"] {
        rdma_core.extend(symbols(&system_library(soname), |ndx, v| {
            ndx != "UND" && (v.starts_with("IBVERBS_") || v.starts_with("RDMACM_"))
        }));
    }
    let missing: Vec<_> = rdma_core
        .iter()
        .filter(|wanted| !ours.contains(wanted))
        .map(|(version, name)| format!("{name}@{version}"))
        .collect();
    assert!(missing.is_empty(), "not defined: {missing:?}");
    // And each at the same version by default: a program linked against softroce's library
    // binds what it would bind against rdma-core's (ibv_open_device@@IBVERBS_1.1, never 1.0).
    let ours_defaults = defaults(&PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma")));
    let mut rdma_core_defaults = BTreeSet::new();
    for soname in ["libibverbs.so.1", "librdmacm.so.1"] {
        rdma_core_defaults.extend(defaults(&system_library(soname)));
    }
    let differ: Vec<_> = rdma_core_defaults
        .symmetric_difference(&ours_defaults)
        .map(|(version, name)| format!("{name}@@{version}"))
        .collect();
    assert!(differ.is_empty(), "default versions differ: {differ:?}");
    let versions = |set: &BTreeSet<(String, String)>| -> BTreeSet<String> {
        set.iter().map(|(v, _)| v.clone()).collect()
    };
    let ours_versions = versions(&ours);
    let absent: Vec<_> = versions(&rdma_core)
        .into_iter()
        .filter(|v| !ours_versions.contains(v))
        .collect();
    assert!(absent.is_empty(), "version nodes not defined: {absent:?}");
}

/// The libraries of the middleware on top of verbs bind every verbs and RDMA-CM symbol they
/// name when they load, so one missing kills every program on them: libfabric (all of its
/// programs, whatever provider), pyverbs (`import pyverbs`), Open MPI's verbs components. Each
/// finds every one in softroce's library, at its version.
#[test]
fn the_middlewares_libraries_find_every_symbol_they_import() {
    let exported = symbols(
        &PathBuf::from(env!("CARGO_BIN_EXE_softroce-rdma")),
        |ndx, _| ndx != "UND",
    );
    let rdma = |v: &str| v.starts_with("IBVERBS_") || v.starts_with("RDMACM_");
    let pyverbs = Path::new("/usr/lib/python3/dist-packages/pyverbs");
    let mut libraries = vec![
        system_library("libfabric.so.1"),
        system_library("libmca_common_verbs.so.40"),
    ];
    let modules = std::fs::read_dir(pyverbs).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (apt-get install python3-pyverbs)",
            pyverbs.display()
        )
    });
    libraries.extend(
        modules
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "so")),
    );
    assert!(libraries.len() > 10, "pyverbs's modules: {libraries:?}");
    let mut missing = BTreeSet::new();
    for library in &libraries {
        for wanted in symbols(library, |ndx, v| ndx == "UND" && rdma(v)) {
            if !exported.contains(&wanted) {
                missing.insert(format!("{}@{} ({})", wanted.1, wanted.0, library.display()));
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
