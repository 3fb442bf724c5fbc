//! Congestion control as ConnectX does it on RoCEv2: the notification point answers packets a
//! switch marked CE with CNPs, and the reaction point ([`super::dcqcn`]) slows the QP that
//! hears them. Kernel rxe does neither.
//!
//! The notification point (IBTA Annex A17.9.3): a packet that reaches a QP marked CE makes the
//! QP send a CNP to the QP that sent it (BTH opcode 0x81, BECN set, P_Key 0xFFFF, PSN 0, then
//! 16 reserved bytes), at most one per `np_min_time_between_cnps`. RC, UC and UD alike; a UD
//! sender is named by the DETH's source QP.
//!
//! A CNP is an attacker's until checked, as every packet is: it must pass the ICRC, name a QP
//! that exists, and come from an RC or UC QP's peer address. Nothing of a
//! UD QP's peers is known, so a UD QP takes CNPs from anyone; the worst a forged one does is
//! what a switch's mark would: the QP slows to `rp_min_rate` and recovers.
//!
//! The IP side of a CNP (its DSCP, `np_cnp_dscp`) and of every other packet (ECT(0)) is the io
//! layer's to write ([`crate::io::UdpConfig`], [`crate::io::RawConfig`]); a device passes
//! this configuration's on to it.

use std::net::IpAddr;
use std::time::Duration;

use super::dcqcn::{CnpOutcome, RateControl, RpParams};
use super::outgoing::Source;
use super::{Ctx, Qp, QpType};
use crate::wire::{BthRepr, Ecn, ExtHeaders, Opcode, PacketRepr, Psn, Qpn};

/// The notification point's parameters, under mlx5's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpParams {
    /// Answer CE marks with CNPs. Off, marks are counted and nothing is sent.
    pub enabled: bool,
    /// The shortest time between two CNPs a QP sends, in microseconds.
    pub np_min_time_between_cnps: u32,
    /// The DSCP of the CNPs sent, 0 to 63 (the io layer writes it).
    pub np_cnp_dscp: u8,
}

impl Default for NpParams {
    fn default() -> Self {
        NpParams {
            enabled: true,
            np_min_time_between_cnps: 4,
            np_cnp_dscp: 48,
        }
    }
}

/// How a device takes part in congestion control: all of it on by default, as on ConnectX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionConfig {
    /// Send every RoCE packet ECN-capable, ECT(0), so that a congested switch marks it rather
    /// than drops it (the io layer writes it). Off, packets go out not ECN-capable.
    pub ecn_capable: bool,
    /// The notification point: CE marks to CNPs.
    pub np: NpParams,
    /// The reaction point: CNPs to a lower rate (DCQCN).
    pub rp: RpParams,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            ecn_capable: true,
            np: NpParams::default(),
            rp: RpParams::default(),
        }
    }
}

impl CongestionConfig {
    /// None of it: packets not ECN-capable, marks not answered, CNPs ignored, as kernel rxe.
    pub fn off() -> Self {
        CongestionConfig {
            ecn_capable: false,
            np: NpParams {
                enabled: false,
                ..NpParams::default()
            },
            rp: RpParams {
                enabled: false,
                ..RpParams::default()
            },
        }
    }

    /// Sets one parameter by its mlx5 name (`rp_time_reset`, `np_min_time_between_cnps`, ...),
    /// or one of `ecn`, `np` and `dcqcn` (also `rp`) to `on` or `off`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let number = || -> Result<u32, String> {
            value
                .parse::<u32>()
                .map_err(|_| format!("{name}={value}: expected a whole number"))
        };
        let switch = || -> Result<bool, String> {
            match value {
                "on" | "1" | "true" => Ok(true),
                "off" | "0" | "false" => Ok(false),
                _ => Err(format!("{name}={value}: expected on or off")),
            }
        };
        let rp = &mut self.rp;
        match name {
            "ecn" => self.ecn_capable = switch()?,
            "np" => self.np.enabled = switch()?,
            "dcqcn" | "rp" => rp.enabled = switch()?,
            "np_min_time_between_cnps" => self.np.np_min_time_between_cnps = number()?,
            "np_cnp_dscp" => {
                self.np.np_cnp_dscp = u8::try_from(number()?)
                    .ok()
                    .filter(|&dscp| dscp <= 63)
                    .ok_or(format!("{name}={value}: a DSCP is 0 to 63"))?;
            }
            "rp_clamp_tgt_rate" => rp.rp_clamp_tgt_rate = switch()?,
            "rp_clamp_tgt_rate_ati" => rp.rp_clamp_tgt_rate_ati = switch()?,
            "rp_initial_alpha_value" => rp.rp_initial_alpha_value = at_most(name, number()?, 1023)?,
            "rp_dce_tcp_g" => rp.rp_dce_tcp_g = at_most(name, number()?, 1023)?,
            "rp_dce_tcp_rtt" => rp.rp_dce_tcp_rtt = number()?,
            "rp_gd" => rp.rp_gd = at_most(name, number()?, 15)?,
            "rp_min_dec_fac" => rp.rp_min_dec_fac = at_most(name, number()?, 100)?,
            "rp_rate_reduce_monitor_period" => rp.rp_rate_reduce_monitor_period = number()?,
            "rp_time_reset" => rp.rp_time_reset = number()?,
            "rp_byte_reset" => rp.rp_byte_reset = number()?,
            "rp_threshold" => rp.rp_threshold = number()?,
            "rp_ai_rate" => rp.rp_ai_rate = number()?,
            "rp_hai_rate" => rp.rp_hai_rate = number()?,
            "rp_min_rate" => rp.rp_min_rate = number()?,
            "rp_max_rate" => rp.rp_max_rate = number()?,
            "rp_rate_to_set_on_first_cnp" => rp.rp_rate_to_set_on_first_cnp = number()?,
            _ => {
                return Err(format!(
                    "{name}: no such congestion setting (ecn, np, dcqcn, or mlx5's np_* and \
                     rp_* parameter names)"
                ))
            }
        }
        Ok(())
    }

    /// The ECN codepoint the io layer sends RoCE packets with.
    pub fn ecn(&self) -> Ecn {
        if self.ecn_capable {
            Ecn::Ect0
        } else {
            Ecn::NotEct
        }
    }
}

fn at_most(name: &str, value: u32, most: u32) -> Result<u32, String> {
    if value <= most {
        Ok(value)
    } else {
        Err(format!("{name}={value}: at most {most}"))
    }
}

/// Parses a comma-separated list: `off` (all of it off, as [`CongestionConfig::off`]), `on`
/// (the defaults), and `name=value` settings ([`CongestionConfig::set`]), applied in order on
/// the defaults: `off,np=on` answers marks with CNPs and does nothing else.
impl std::str::FromStr for CongestionConfig {
    type Err = String;

    fn from_str(list: &str) -> Result<Self, String> {
        let mut config = CongestionConfig::default();
        for item in list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            match item.split_once('=') {
                None if item == "off" => config = CongestionConfig::off(),
                None if item == "on" => config = CongestionConfig::default(),
                None => return Err(format!("{item}: expected on, off or name=value")),
                Some((name, value)) => config.set(name.trim(), value.trim())?,
            }
        }
        Ok(config)
    }
}

/// What congestion control did for one QP, and its rate now ([`super::Endpoint::congestion`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CongestionStatus {
    /// Packets that reached the QP marked CE.
    pub ce_marked: u64,
    /// CNPs the QP sent.
    pub cnps_sent: u64,
    /// CNPs for the QP that cut its rate or joined a cut.
    pub cnps_handled: u64,
    /// CNPs for the QP that DCQCN, being off, ignored.
    pub cnps_ignored: u64,
    /// The rate the pacer holds the QP to, in bits per second; `None` while unpaced.
    pub rate_bps: Option<f64>,
}

/// `rate 1234 Mb/s` (or `unpaced`), then the counts.
impl std::fmt::Display for CongestionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rate_bps {
            Some(bps) => write!(f, "rate {:.0} Mb/s", bps / 1e6)?,
            None => f.write_str("unpaced")?,
        }
        write!(
            f,
            ", {} marked CE, {} CNPs sent, {} CNPs handled, {} ignored",
            self.ce_marked, self.cnps_sent, self.cnps_handled, self.cnps_ignored
        )
    }
}

/// A QP's notification point and reaction point.
#[derive(Debug, Clone, Default)]
pub(crate) struct QpCongestion {
    /// When it last sent a CNP.
    last_cnp: Option<Duration>,
    pub rate: RateControl,
    /// The pacer held a packet back on the last pump: when to look again
    /// ([`RateControl::wake_at`]).
    held_until: Option<Duration>,
    status: CongestionStatus,
}

impl QpCongestion {
    /// A packet marked CE reached the QP at `now`: whether to answer it with a CNP.
    pub fn marked(&mut self, params: &NpParams, now: Duration) -> bool {
        self.status.ce_marked += 1;
        let interval = Duration::from_micros(u64::from(params.np_min_time_between_cnps));
        let due = self.last_cnp.is_none_or(|last| now >= last + interval);
        if params.enabled && due {
            self.last_cnp = Some(now);
            self.status.cnps_sent += 1;
            true
        } else {
            false
        }
    }

    /// A CNP for the QP arrived at `now`.
    pub fn on_cnp(&mut self, params: &RpParams, now: Duration) -> CnpOutcome {
        let outcome = self.rate.on_cnp(params, now);
        match outcome {
            CnpOutcome::Ignored => self.status.cnps_ignored += 1,
            CnpOutcome::Cut | CnpOutcome::Coalesced => self.status.cnps_handled += 1,
        }
        outcome
    }

    /// The pacer held the QP's next packet back.
    pub fn hold(&mut self, params: &RpParams) {
        self.held_until = self.rate.wake_at(params);
    }

    /// The QP's pump runs: nothing is held back until it says so.
    pub fn unhold(&mut self) {
        self.held_until = None;
    }

    /// When the QP's pump is due again for the pacer: while it holds a packet back.
    pub fn deadline(&self) -> Option<Duration> {
        self.held_until
    }

    pub fn status(&self) -> CongestionStatus {
        CongestionStatus {
            rate_bps: self.rate.rate().map(|bytes| bytes * 8.0),
            ..self.status
        }
    }
}

impl Qp {
    /// `repr`, from `src`, reached the QP marked CE: counted, and answered by a CNP to the QP
    /// that sent it unless the QP sent one within `np_min_time_between_cnps`. The CM's MADs on
    /// QP1 are not answered: nothing paces them.
    pub(crate) fn congestion_marked(&mut self, src: IpAddr, repr: &PacketRepr, ctx: &mut Ctx<'_>) {
        ctx.counters.np_ecn_marked_roce_packets += 1;
        if self.qpn == Qpn::GSI || !self.cc.marked(&ctx.congestion.np, ctx.now) {
            return;
        }
        let sender = match self.qp_type {
            QpType::Ud => match repr.ext.deth {
                Some(deth) => deth.src_qp,
                None => return,
            },
            QpType::Rc | QpType::Uc => self.settings.dest_qpn,
        };
        // P_Key 0xFFFF and PSN 0, as the Annex's CNP has them.
        let mut bth = BthRepr::new(Opcode::Cnp, sender, Psn::new(0));
        bth.becn = true;
        ctx.counters.np_cnp_sent += 1;
        ctx.send(src, bth, ExtHeaders::default(), 0, Source::Empty);
    }

    /// A CNP for the QP, from `src`. It must come from an RC or UC QP's peer (a UD QP's peers
    /// are not known); one that does not is counted and dropped. Its P_Key is not checked: the
    /// Annex's CNP carries 0xFFFF whatever the QP's partition.
    pub(crate) fn on_cnp(&mut self, src: IpAddr, ctx: &mut Ctx<'_>) {
        if self.qp_type != QpType::Ud && self.peer() != Some(src) {
            ctx.counters.dropped_wrong_source += 1;
            return;
        }
        match self.cc.on_cnp(&ctx.congestion.rp, ctx.now) {
            CnpOutcome::Ignored => ctx.counters.rp_cnp_ignored += 1,
            CnpOutcome::Cut | CnpOutcome::Coalesced => ctx.counters.rp_cnp_handled += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_by_mlx5_name_in_order() {
        let config: CongestionConfig = "off, np=on, np_min_time_between_cnps=50".parse().unwrap();
        assert!(!config.ecn_capable && config.np.enabled && !config.rp.enabled);
        assert_eq!(config.np.np_min_time_between_cnps, 50);
        let config: CongestionConfig = "rp_time_reset=55,rp_ai_rate=40,rp_clamp_tgt_rate=on"
            .parse()
            .unwrap();
        assert_eq!(config.rp.rp_time_reset, 55);
        assert_eq!(config.rp.rp_ai_rate, 40);
        assert!(config.rp.rp_clamp_tgt_rate && config.rp.enabled && config.ecn_capable);
        assert_eq!(
            "".parse::<CongestionConfig>(),
            Ok(CongestionConfig::default())
        );
        for (bad, says) in [
            ("rp_time_resett=1", "no such congestion setting"),
            ("np_cnp_dscp=64", "0 to 63"),
            ("rp_gd=40", "at most 15"),
            ("dcqcn=maybe", "expected on or off"),
            ("rp_ai_rate=-1", "whole number"),
            ("slow", "expected on, off or name=value"),
        ] {
            let error = bad.parse::<CongestionConfig>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
