//! What a process's devices are: the addresses it binds, from its environment.
//!
//! `SOFTROCE_ADDR` names them, comma-separated: one device per address, `softroce0` first.
//! Unset, there is one device on 127.0.0.1. Two processes on one host use two addresses
//! (127.0.0.1 and 127.0.0.2, say): each device binds UDP 4791 on its address when it is
//! opened, and an address another process holds is refused then, with a line saying so.
//! `softroce run --addr ADDR -- PROGRAM` sets the variable.
//!
//! `SOFTROCE_PROGRESS` (`hybrid`, the default, `thread` or `inline`) chooses who runs each
//! device's engine, as `--progress` does for softroce's own tools.
//!
//! `SOFTROCE_CC` sets congestion control as the tools' `--cc` does: `off`, or mlx5's
//! parameter names (`rp_time_reset=55,...`); unset, it is on, as on ConnectX.
//!
//! `SOFTROCE_BUSY_POLL` sets how long, in microseconds, each engine keeps polling its socket
//! after packets moved, rather than sleep in it (`DeviceConfig::busy_poll`); 0 turns it off.
//! Unset, 50 with hybrid and inline progress when the process may run on more than one CPU,
//! none otherwise.
//!
//! `SOFTROCE_TRAINS_PER_QP=1` cuts segmentation trains per QP, for a softroce peer of several
//! engines (`BackendKind::Udp`); unset or `0`, trains mix QPs. Any other value refuses the
//! device, saying why.
//!
//! `SOFTROCE_MTU` (256 to 4096) sets the ports' active MTU. Unset, a port follows its link as
//! rxe's does: 1024 on a 1500-byte Ethernet link, 4096 on jumbo frames and on loopback. A CM
//! client names its port's MTU in its REQ, so a process whose link runs jumbo frames toward a
//! peer whose port has 1024 sets it to 1024.

use std::net::IpAddr;
use std::time::Duration;

use softroce::transport::{CongestionConfig, PathMtu};
use softroce::verbs::Progress;

/// The variable that names the process's device addresses.
pub use softroce::verbs::C_ADDR_VAR as ADDR_VAR;
use softroce::verbs::{
    C_BUSY_POLL_VAR as BUSY_POLL_VAR, C_CC_VAR as CC_VAR, C_MTU_VAR as MTU_VAR,
    C_PROGRESS_VAR as PROGRESS_VAR, C_TRAINS_PER_QP_VAR as TRAINS_PER_QP_VAR, MAX_BUSY_POLL,
};

/// The address when `SOFTROCE_ADDR` is unset.
const DEFAULT_ADDR: &str = "127.0.0.1";

/// The addresses of the process's devices, in device order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses(pub Vec<IpAddr>);

impl Addresses {
    /// Parses `SOFTROCE_ADDR`'s value: addresses separated by commas, at least one, no two the
    /// same.
    pub fn parse(value: &str) -> Result<Addresses, String> {
        let mut addresses: Vec<IpAddr> = Vec::new();
        for part in value.split(',').map(str::trim) {
            let addr: IpAddr = part
                .parse()
                .map_err(|_| format!("{ADDR_VAR}={value}: {part:?} is not an IP address"))?;
            if addr.is_unspecified() || addr.is_multicast() {
                return Err(format!(
                    "{ADDR_VAR}={value}: {addr} cannot be a device's address; name the one peers reach"
                ));
            }
            if addresses.contains(&addr) {
                return Err(format!("{ADDR_VAR}={value}: {addr} is named twice"));
            }
            addresses.push(addr);
        }
        Ok(Addresses(addresses))
    }

    /// The process's addresses, from its environment.
    pub fn from_env() -> Result<Addresses, String> {
        match std::env::var(ADDR_VAR) {
            Ok(value) => Self::parse(&value),
            Err(std::env::VarError::NotPresent) => Self::parse(DEFAULT_ADDR),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ADDR_VAR} is not UTF-8")),
        }
    }
}

/// The engines' progress, from `SOFTROCE_PROGRESS`.
pub(crate) fn progress() -> Result<Progress, String> {
    match std::env::var(PROGRESS_VAR).as_deref() {
        Err(_) | Ok("hybrid") => Ok(Progress::Hybrid),
        Ok("thread") => Ok(Progress::Thread),
        Ok("inline") => Ok(Progress::Inline),
        Ok(other) => Err(format!(
            "{PROGRESS_VAR}={other}: expected thread, hybrid or inline"
        )),
    }
}

/// Congestion control from `SOFTROCE_CC`; the defaults when unset.
pub(crate) fn congestion() -> Result<CongestionConfig, String> {
    match std::env::var(CC_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(CongestionConfig::default()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{CC_VAR} is not UTF-8")),
        Ok(value) => value
            .parse()
            .map_err(|why| format!("{CC_VAR}={value}: {why}")),
    }
}

/// The ports' active MTU from `SOFTROCE_MTU`; `None` when unset (the link's).
pub(crate) fn port_mtu() -> Result<Option<PathMtu>, String> {
    match std::env::var(MTU_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{MTU_VAR} is not UTF-8")),
        Ok(value) => parse_mtu(&value).map(Some),
    }
}

/// The engines' busy polling from `SOFTROCE_BUSY_POLL`; `None` when unset (softroce's
/// choice).
pub(crate) fn busy_poll() -> Result<Option<Duration>, String> {
    match std::env::var(BUSY_POLL_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{BUSY_POLL_VAR} is not UTF-8")),
        Ok(value) => parse_busy_poll(&value).map(Some),
    }
}

/// Whether trains are cut per QP, from `SOFTROCE_TRAINS_PER_QP`: `1` or `0` (the default).
pub(crate) fn trains_per_qp() -> Result<bool, String> {
    match std::env::var(TRAINS_PER_QP_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(false),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{TRAINS_PER_QP_VAR} is not UTF-8")),
        Ok(value) => parse_trains_per_qp(&value),
    }
}

fn parse_trains_per_qp(value: &str) -> Result<bool, String> {
    match value.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!(
            "{TRAINS_PER_QP_VAR}={value}: expected 1 (trains cut per QP) or 0"
        )),
    }
}

fn parse_busy_poll(value: &str) -> Result<Duration, String> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_micros)
        .filter(|busy_poll| *busy_poll <= MAX_BUSY_POLL)
        .ok_or_else(|| {
            format!(
                "{BUSY_POLL_VAR}={value}: expected microseconds, 0 (off) to {}",
                MAX_BUSY_POLL.as_micros()
            )
        })
}

fn parse_mtu(value: &str) -> Result<PathMtu, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .and_then(|bytes| PathMtu::try_from(bytes).ok())
        .ok_or_else(|| format!("{MTU_VAR}={value}: expected 256, 512, 1024, 2048 or 4096"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_say_why() {
        let two = Addresses::parse("127.0.0.1, ::1").unwrap();
        assert_eq!(
            two.0,
            [
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        for (bad, says) in [
            ("localhost", "is not an IP address"),
            ("0.0.0.0", "cannot be a device's address"),
            ("10.0.0.1,10.0.0.1", "named twice"),
            ("", "is not an IP address"),
        ] {
            let error = Addresses::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn busy_poll_is_microseconds_up_to_the_bound() {
        assert_eq!(parse_busy_poll("0"), Ok(Duration::ZERO));
        assert_eq!(parse_busy_poll(" 50 "), Ok(Duration::from_micros(50)));
        assert_eq!(parse_busy_poll("10000"), Ok(MAX_BUSY_POLL));
        for bad in ["10001", "-1", "50us", "", "0.5"] {
            let error = parse_busy_poll(bad).unwrap_err();
            assert!(error.contains("expected microseconds"), "{bad}: {error}");
        }
    }

    #[test]
    fn trains_per_qp_is_0_or_1() {
        assert_eq!(parse_trains_per_qp("0"), Ok(false));
        assert_eq!(parse_trains_per_qp(" 1 "), Ok(true));
        for bad in ["", "2", "true", "yes"] {
            let error = parse_trains_per_qp(bad).unwrap_err();
            assert!(
                error.contains("expected 1 (trains cut per QP) or 0"),
                "{error}"
            );
        }
    }

    #[test]
    fn mtu_is_an_ib_mtu_in_bytes() {
        assert_eq!(parse_mtu("1024"), Ok(PathMtu::Mtu1024));
        assert_eq!(parse_mtu(" 4096 "), Ok(PathMtu::Mtu4096));
        for bad in ["1500", "0", "mtu", "-1", "", "3"] {
            let error = parse_mtu(bad).unwrap_err();
            assert!(
                error.contains("expected 256, 512, 1024, 2048 or 4096"),
                "{bad}: {error}"
            );
        }
    }
}
