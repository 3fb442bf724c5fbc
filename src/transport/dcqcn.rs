//! The reaction point of DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015), as ConnectX runs it per QP, with its parameters under mlx5's
//! names (`drivers/infiniband/hw/mlx5/cong.c`, the `rp_*` files of `cc_params`).
//!
//! A QP sends unpaced until its first CNP. Then it holds a current rate `Rc` and a target rate
//! `Rt`, and a pacer lets its packets go at `Rc`:
//!
//! - a CNP cuts `Rc` by `alpha / 2` (`rp_gd`), at most once per `rp_rate_reduce_monitor_period`,
//!   and raises `alpha` toward 1 (`rp_dce_tcp_g`); while no CNP comes, `alpha` decays every
//!   `rp_dce_tcp_rtt`;
//! - every `rp_time_reset` and every `rp_byte_reset` bytes sent without a CNP is an increase
//!   event, judged by the events of each kind before it since the last cut: while both are
//!   below `rp_threshold`, fast recovery (`Rt` kept); once one has reached it, additive increase
//!   (`Rt` up by `rp_ai_rate`); once both are past it, hyper increase (`Rt` up by
//!   `rp_hai_rate`); `Rc` then moves halfway to `Rt`. The ordering, the flat hyper step and
//!   which increases make the next cut reset `Rt` follow Google's Isekai model of ConnectX
//!   (`isekai/host/rdma/rdma_roce_cc_dcqcn.cc`); `rp_byte_reset` is counted in bytes, as NVIDIA's
//!   documentation says, though Isekai counts it in 64-byte units;
//! - once `Rc` is back at the QP's line rate, the pacer lets go.
//!
//! Time is the caller's (`now`), and nothing here runs on its own: the periodic updates a NIC
//! runs off timers are caught up, in order, whenever the QP sends or hears a CNP. That gives the
//! rates a timer would, and costs a QP that sends nothing nothing.
//!
//! Two differences from ConnectX. Its first CNP only gives the QP a rate limiter, at
//! `rp_rate_to_set_on_first_cnp` (the port's speed when 0), and cuts nothing; softroce's first
//! CNP also cuts, one CNP sooner, since the rate it starts from is what the QP already sends
//! (below). And its QPs send at the port's speed until paced: a software
//! sender is seldom as fast as the speed its port reports (25 Gb/s here, `rp_max_rate` 0), so
//! a cut from that rate, or from a current rate the QP never reached, would take several CNPs
//! to bite. softroce first brings `Rc` down to the rate the QP was measured sending at over the
//! last [`METER_WINDOW`] or so, then cuts. The increases still stop at the port's speed, where
//! the pacer lets go.

use std::time::Duration;

/// The reaction point's parameters: mlx5's names, and the defaults of NVIDIA's documentation
/// ("DCQCN CC Parameters", DOCA) for ConnectX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpParams {
    /// DCQCN on: a CNP slows the QP down. Off, CNPs are counted and ignored.
    pub enabled: bool,
    /// `alpha` of a QP's first cut, in 1/1024.
    pub rp_initial_alpha_value: u32,
    /// `g` of the `alpha` update, in 1/1024: on a CNP `alpha = g·alpha + (1024 − g)`, and
    /// every `rp_dce_tcp_rtt` without one `alpha = g·alpha`.
    pub rp_dce_tcp_g: u32,
    /// The period of the `alpha` decay, in microseconds.
    pub rp_dce_tcp_rtt: u32,
    /// A cut takes `Rc` to `Rc·(1 − alpha/2^rp_gd)`, `alpha` in 1/1024: 11 halves at most.
    pub rp_gd: u32,
    /// A cut leaves at least this percentage of `Rc`.
    pub rp_min_dec_fac: u32,
    /// The shortest time between two cuts, in microseconds: the CNPs between are coalesced.
    pub rp_rate_reduce_monitor_period: u32,
    /// The period of the timer's increase events, in microseconds.
    pub rp_time_reset: u32,
    /// Bytes sent between the byte counter's increase events; 0 turns the byte counter off.
    pub rp_byte_reset: u32,
    /// Increase events of a kind before the increase leaves fast recovery (DCQCN's `F`).
    pub rp_threshold: u32,
    /// The additive increase, in Mb/s.
    pub rp_ai_rate: u32,
    /// The hyper increase's step, in Mb/s.
    pub rp_hai_rate: u32,
    /// The lowest rate a cut leaves, in Mb/s.
    pub rp_min_rate: u32,
    /// The highest rate, in Mb/s; 0 is the QP's line rate (see the module documentation).
    pub rp_max_rate: u32,
    /// The rate a QP starts at on its first CNP, in Mb/s; 0 is its line rate.
    pub rp_rate_to_set_on_first_cnp: u32,
    /// Every cut sets `Rt` to `Rc` first, as in the paper. Off, only a cut after an increase
    /// does (one of the byte counter, or of the timer with `rp_clamp_tgt_rate_ati`), so that
    /// cuts back to back keep the rate to recover to (as Google's Isekai models ConnectX).
    pub rp_clamp_tgt_rate: bool,
    /// An increase of the timer, too, makes the next cut set `Rt` to `Rc` first.
    pub rp_clamp_tgt_rate_ati: bool,
}

impl Default for RpParams {
    fn default() -> Self {
        RpParams {
            enabled: true,
            rp_initial_alpha_value: 1023,
            rp_dce_tcp_g: 1019,
            rp_dce_tcp_rtt: 1,
            rp_gd: 11,
            rp_min_dec_fac: 50,
            rp_rate_reduce_monitor_period: 4,
            rp_time_reset: 300,
            rp_byte_reset: 32767,
            rp_threshold: 1,
            rp_ai_rate: 5,
            rp_hai_rate: 50,
            rp_min_rate: 1,
            rp_max_rate: 0,
            rp_rate_to_set_on_first_cnp: 0,
            rp_clamp_tgt_rate: false,
            rp_clamp_tgt_rate_ati: true,
        }
    }
}

/// How far back a QP's send rate is measured, for where a cut starts from.
pub const METER_WINDOW: Duration = Duration::from_micros(500);

/// How much a paced QP may send ahead of its rate, so that an engine that wakes late sends
/// the packets it owes at once rather than losing them from its rate: 16 KiB.
const PACER_BURST_BYTES: f64 = 16384.0;

/// The line rate where `rp_max_rate` sets none, in bytes per second: the port's speed as
/// softroce reports it to `ibv_query_port` (EDR, 1X: 25 Gb/s).
const PORT_SPEED: f64 = 25e9 / 8.0;

/// Increase events caught up at most at once. A QP silent for long enough to owe more is back
/// at its line rate long before (from its lowest rate, hyper increase gets there in hundreds).
const MAX_CATCH_UP: u64 = 1 << 16;

const fn mbps(rate: u32) -> f64 {
    rate as f64 * 1e6 / 8.0
}

fn micros(us: u32) -> Duration {
    Duration::from_micros(u64::from(us))
}

/// What a QP sent lately: bytes in the current window and the one before it.
#[derive(Debug, Clone, Copy, Default)]
struct Meter {
    start: Duration,
    bytes: u64,
    previous: u64,
}

impl Meter {
    fn add(&mut self, now: Duration, bytes: u64) {
        self.roll(now);
        self.bytes += bytes;
    }

    fn roll(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= METER_WINDOW {
            self.previous = if elapsed >= 2 * METER_WINDOW {
                0
            } else {
                self.bytes
            };
            self.bytes = 0;
            self.start = now;
        }
    }

    /// Bytes per second over the last window and what there is of this one.
    fn rate(&mut self, now: Duration) -> f64 {
        self.roll(now);
        let span = now.saturating_sub(self.start) + METER_WINDOW;
        (self.previous + self.bytes) as f64 / span.as_secs_f64()
    }
}

/// The rate state of a QP that heard a CNP.
#[derive(Debug, Clone, Copy)]
struct Limited {
    /// The current rate `Rc`, bytes per second.
    current: f64,
    /// The target rate `Rt`.
    target: f64,
    /// Where the increases stop and the pacer lets go.
    line: f64,
    /// `alpha`, in 1/1024.
    alpha: f64,
    /// The last cut.
    cut_at: Duration,
    /// The `alpha` decay is caught up to here.
    alpha_at: Duration,
    /// The increase timer is caught up to here.
    timer_at: Duration,
    /// Bytes sent since the byte counter's last event.
    bytes: u64,
    /// Increase events since the last cut, of the timer and of the byte counter (`T`, `BC`).
    timer_events: u64,
    byte_events: u64,
    /// The rate rose since the last cut in a way that makes the next cut set `Rt` to `Rc`:
    /// by the byte counter, or by the timer with `rp_clamp_tgt_rate_ati`.
    raised: bool,
    /// The pacer's bucket: bytes the QP may send now, at most [`PACER_BURST_BYTES`], and
    /// below zero while a packet that went is still being paid for at `current`.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    filled_at: Duration,
}

/// What a CNP did to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CnpOutcome {
    /// It cut the rate.
    Cut,
    /// It came within `rp_rate_reduce_monitor_period` of the last cut, which it joins: only
    /// `alpha` rose.
    Coalesced,
    /// DCQCN is off.
    Ignored,
}

/// One QP's reaction point and pacer.
#[derive(Debug, Clone, Default)]
pub struct RateControl {
    meter: Meter,
    limited: Option<Limited>,
}

impl RateControl {
    /// The current rate in bytes per second, or `None` while the QP is unpaced.
    pub fn rate(&self) -> Option<f64> {
        self.limited.map(|l| l.current)
    }

    /// Whether the pacer lets a packet go at `now`. Catches up the periodic updates first.
    pub fn may_send(&mut self, params: &RpParams, now: Duration) -> bool {
        self.catch_up(params, now);
        // Within a byte of paid: the release time below is rounded to nanoseconds, and a
        // bucket filled to it must let the packet go, or the QP would wake at once, forever.
        self.limited.is_none_or(|l| l.tokens > -1.0)
    }

    /// When the pacer lets the next packet go at the current rate, while it holds one back.
    pub fn release_at(&self) -> Option<Duration> {
        self.limited.map(|l| {
            let owed = (-l.tokens).max(0.0);
            // Rounded up to the next nanosecond.
            l.filled_at + Duration::from_nanos((owed / l.current * 1e9).ceil() as u64)
        })
    }

    /// When a QP held back by the pacer should look again: at its release, or sooner if
    /// the timer raises the rate first.
    pub fn wake_at(&self, params: &RpParams) -> Option<Duration> {
        let next_increase = self
            .limited
            .map(|l| l.timer_at + micros(params.rp_time_reset.max(1)));
        match (self.release_at(), next_increase) {
            (Some(release), Some(increase)) => Some(release.min(increase)),
            (release, _) => release,
        }
    }

    /// A packet of `bytes` left at `now`.
    pub fn sent(&mut self, params: &RpParams, now: Duration, bytes: usize) {
        let bytes = bytes as u64;
        self.meter.add(now, bytes);
        let Some(l) = &mut self.limited else {
            return;
        };
        l.refill(now);
        l.tokens -= bytes as f64;
        if params.rp_byte_reset > 0 {
            l.bytes += bytes;
            while l.bytes >= u64::from(params.rp_byte_reset) {
                l.bytes -= u64::from(params.rp_byte_reset);
                l.raised = true;
                l.increase(params);
                l.byte_events += 1;
            }
        }
        self.let_go_at_line();
    }

    /// A CNP for this QP arrived at `now`.
    pub fn on_cnp(&mut self, params: &RpParams, now: Duration) -> CnpOutcome {
        if !params.enabled {
            return CnpOutcome::Ignored;
        }
        self.catch_up(params, now);
        let line = if params.rp_max_rate > 0 {
            mbps(params.rp_max_rate)
        } else {
            PORT_SPEED
        };
        let floor = mbps(params.rp_min_rate.max(1)).min(line);
        // What the QP really sent lately: a cut from a rate it never reached would not bite.
        let measured = self.meter.rate(now).clamp(floor, line);
        let l = match &mut self.limited {
            Some(l) => l,
            None => {
                let start = if params.rp_rate_to_set_on_first_cnp > 0 {
                    mbps(params.rp_rate_to_set_on_first_cnp)
                } else {
                    line
                };
                let start = start.clamp(floor, line).min(measured);
                self.limited.insert(Limited {
                    current: start,
                    target: start,
                    line,
                    alpha: f64::from(params.rp_initial_alpha_value.min(1024)),
                    // So that the first CNP cuts.
                    cut_at: now.saturating_sub(micros(params.rp_rate_reduce_monitor_period)),
                    alpha_at: now,
                    timer_at: now,
                    bytes: 0,
                    timer_events: 0,
                    byte_events: 0,
                    raised: false,
                    tokens: 0.0,
                    filled_at: now,
                })
            }
        };
        let g = f64::from(params.rp_dce_tcp_g.min(1024));
        let coalesced = now < l.cut_at + micros(params.rp_rate_reduce_monitor_period);
        if !coalesced {
            l.current = l.current.min(measured);
            if params.rp_clamp_tgt_rate || l.raised {
                l.target = l.current;
            }
            // alpha is in 1/1024 and `rp_gd` divides it by 2^gd: 11 takes 1024 to a half.
            let cut = (l.alpha / f64::from(1u32 << params.rp_gd.min(30))).min(1.0);
            let kept = (1.0 - cut).max(f64::from(params.rp_min_dec_fac.min(100)) / 100.0);
            l.current = (l.current * kept).max(floor);
            l.target = l.target.max(l.current);
            l.cut_at = now;
            l.timer_at = now;
            l.bytes = 0;
            l.timer_events = 0;
            l.byte_events = 0;
            l.raised = false;
        }
        l.alpha = g * l.alpha / 1024.0 + (1024.0 - g);
        l.alpha_at = now;
        if coalesced {
            CnpOutcome::Coalesced
        } else {
            CnpOutcome::Cut
        }
    }

    /// Runs the `alpha` decay and the timer's increase events that fell due by `now`.
    fn catch_up(&mut self, params: &RpParams, now: Duration) {
        let Some(l) = &mut self.limited else {
            return;
        };
        let rtt = micros(params.rp_dce_tcp_rtt.max(1));
        let periods = now.saturating_sub(l.alpha_at).as_nanos() / rtt.as_nanos();
        if periods > 0 {
            let g = f64::from(params.rp_dce_tcp_g.min(1024)) / 1024.0;
            l.alpha *= g.powi(i32::try_from(periods).unwrap_or(i32::MAX));
            l.alpha_at += rtt * u32::try_from(periods).unwrap_or(u32::MAX);
        }
        let reset = micros(params.rp_time_reset.max(1));
        let due = (now.saturating_sub(l.timer_at).as_nanos() / reset.as_nanos()) as u64;
        for _ in 0..due.min(MAX_CATCH_UP) {
            l.timer_at += reset;
            // What the bucket gained before the event, at the rate before it.
            l.refill(l.timer_at);
            l.raised |= params.rp_clamp_tgt_rate_ati;
            l.increase(params);
            l.timer_events += 1;
            if l.current >= l.line {
                break;
            }
        }
        if due > 0 {
            // Whatever was not caught up is owed no more: the rate is at its line.
            l.timer_at = l.timer_at.max(now.saturating_sub(reset));
        }
        l.refill(now);
        self.let_go_at_line();
    }

    /// Back at the line rate with nothing to recover: unpaced again, as ConnectX frees the
    /// QP's rate limiter.
    fn let_go_at_line(&mut self) {
        if self
            .limited
            .is_some_and(|l| l.current >= l.line && l.target >= l.line)
        {
            self.limited = None;
        }
    }
}

impl Limited {
    /// Fills the bucket at the current rate up to `now`.
    fn refill(&mut self, now: Duration) {
        if now > self.filled_at {
            let gained = self.current * (now - self.filled_at).as_secs_f64();
            self.tokens = (self.tokens + gained).min(PACER_BURST_BYTES);
            self.filled_at = now;
        }
    }

    /// One increase event (of the timer, or of the byte counter), judged by the events before
    /// it since the last cut, as Isekai's model of ConnectX counts them: the first after a cut
    /// is fast recovery.
    fn increase(&mut self, params: &RpParams) {
        let threshold = u64::from(params.rp_threshold);
        let (most, least) = (
            self.timer_events.max(self.byte_events),
            self.timer_events.min(self.byte_events),
        );
        if most < threshold {
            // Fast recovery: back toward the rate before the cut.
        } else if least > threshold {
            // A step of `rp_hai_rate` (the paper's, and ns-3's, grows with each event).
            self.target += mbps(params.rp_hai_rate);
        } else {
            self.target += mbps(params.rp_ai_rate);
        }
        self.target = self.target.min(self.line);
        self.current = ((self.current + self.target) / 2.0).min(self.line);
        // Halving the distance never quite gets there: within a byte a second is there.
        if self.line - self.current < 1.0 {
            self.current = self.line;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// A QP that sent 500 kB over the meter's window before `at`: 8 Gb/s.
    fn sending(params: &RpParams, at: Duration) -> RateControl {
        let mut rc = RateControl::default();
        let start = at - METER_WINDOW;
        for i in 0..125u32 {
            rc.sent(params, start + METER_WINDOW * i / 125, 4000);
        }
        rc
    }

    /// Within a nanosecond: the pacer's times come from floating-point rates.
    fn close(at: Option<Duration>, expected: Duration) {
        let at = at.expect("the pacer holds a packet back");
        assert!(
            at.abs_diff(expected) <= Duration::from_nanos(1),
            "{at:?}, not {expected:?}"
        );
    }

    fn gbps(rc: &RateControl) -> f64 {
        rc.rate().map_or(f64::INFINITY, |bytes| bytes * 8.0 / 1e9)
    }

    #[test]
    fn unpaced_until_the_first_cnp_which_halves_the_measured_rate() {
        let p = RpParams::default();
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        assert_eq!(rc.rate(), None);
        assert!(rc.may_send(&p, now));
        assert_eq!(rc.on_cnp(&p, now), CnpOutcome::Cut);
        // alpha 1023/1024 over 2^11: a cut of almost exactly a half, from 8 Gb/s.
        let rate = gbps(&rc);
        assert!((3.9..4.1).contains(&rate), "{rate} Gb/s");
    }

    #[test]
    fn cnps_within_the_monitor_period_join_the_cut() {
        let p = RpParams::default();
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        let after_one = gbps(&rc);
        assert_eq!(rc.on_cnp(&p, now + US), CnpOutcome::Coalesced);
        assert_eq!(rc.on_cnp(&p, now + 3 * US), CnpOutcome::Coalesced);
        assert_eq!(gbps(&rc), after_one);
        assert_eq!(rc.on_cnp(&p, now + 4 * US), CnpOutcome::Cut);
        assert!(gbps(&rc) < after_one * 0.6, "{} of {after_one}", gbps(&rc));
    }

    #[test]
    fn a_cut_never_goes_below_the_minimum_rate_nor_past_the_decrease_factor() {
        let p = RpParams {
            rp_min_dec_fac: 80,
            rp_min_rate: 1000,
            ..RpParams::default()
        };
        let mut now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        // At most 20% off a cut.
        assert!((6.35..6.45).contains(&gbps(&rc)), "{}", gbps(&rc));
        for _ in 0..100 {
            now += 5 * US;
            rc.on_cnp(&p, now);
        }
        assert!((gbps(&rc) - 1.0).abs() < 1e-9, "{}", gbps(&rc));
    }

    #[test]
    fn alpha_decays_without_cnps_so_a_late_cut_is_smaller() {
        let p = RpParams::default();
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        let before = gbps(&rc);
        // 200 µs later alpha is 1023·(1019/1024)^200 ≈ 376: a cut of about 18%, and the
        // timer has not yet raised the rate (300 µs).
        rc.on_cnp(&p, now + 200 * US);
        let kept = gbps(&rc) / before;
        assert!((0.80..0.84).contains(&kept), "kept {kept}");
    }

    #[test]
    fn recovery_adds_to_the_target_and_lets_go_at_the_port_speed() {
        let p = RpParams {
            rp_byte_reset: 0,
            ..RpParams::default()
        };
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        let cut = rc.limited.unwrap();
        // Rt is the 8 Gb/s the QP was sending at. The first timer event (none before it:
        // fast recovery) takes Rc halfway there; the second (one before it, the threshold:
        // additive) adds rp_ai_rate to Rt first.
        assert!((cut.target * 8.0 / 1e9 - 8.0).abs() < 0.01);
        let t = micros(p.rp_time_reset);
        assert!(rc.may_send(&p, now + t));
        let one = rc.limited.unwrap();
        assert_eq!(one.target, cut.target);
        assert!((one.current - (cut.current + cut.target) / 2.0).abs() < 1.0);
        rc.may_send(&p, now + 2 * t);
        let two = rc.limited.unwrap();
        assert!((two.target - (one.target + mbps(p.rp_ai_rate))).abs() < 1.0);
        assert!((two.current - (one.current + two.target) / 2.0).abs() < 1.0);
        // With the byte counter off the timer alone never reaches hyper increase: additive
        // steps of 5 Mb/s every 300 µs take Rt from 8 Gb/s to the port's 25 (3400 of
        // them), and the pacer then lets go.
        let mut at = now + 2 * t;
        let mut steps = 0;
        while rc.rate().is_some() {
            at += t;
            rc.may_send(&p, at);
            steps += 1;
            assert!(steps < 4000, "still at {} Gb/s", gbps(&rc));
        }
        assert!(steps > 3000, "{steps}");
        assert!(rc.may_send(&p, at));
    }

    #[test]
    fn a_cut_starts_from_what_the_qp_sent_and_after_a_timer_increase_resets_the_target() {
        let p = RpParams::default();
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        let t = micros(p.rp_time_reset);
        rc.may_send(&p, now + t);
        let one = rc.limited.unwrap();
        // The QP sent nothing since: over the meter's window and what followed it, 500 kB in
        // 800 µs, 5 Gb/s, below the 6 Gb/s Rc had recovered to. The cut starts there, and
        // after the timer's increase sets Rt to it (rp_clamp_tgt_rate_ati).
        assert!(one.current * 8.0 / 1e9 > 5.9);
        assert_eq!(rc.on_cnp(&p, now + t), CnpOutcome::Cut);
        let recut = rc.limited.unwrap();
        assert!(
            (recut.target * 8.0 / 1e9 - 5.0).abs() < 0.01,
            "{}",
            recut.target
        );
        assert!(recut.current < recut.target);
    }

    #[test]
    fn the_byte_counter_with_the_timer_reaches_hyper_increase() {
        let p = RpParams {
            // Rt = Rc at the cut, so that the increases show below the line.
            rp_clamp_tgt_rate: true,
            ..RpParams::default()
        };
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        // A second cut: Rt is then the first cut's rate, below the line.
        let now = now + 5 * US;
        rc.on_cnp(&p, now);
        let t = micros(p.rp_time_reset);
        // Two timer events, then byte counter events: the third of those finds two of each
        // kind before it, both past the threshold of 1: one hyper step of 50 Mb/s, where the
        // second (one byte event before it) was additive.
        rc.may_send(&p, now + 2 * t);
        rc.sent(&p, now + 2 * t, p.rp_byte_reset as usize);
        let before = rc.limited.unwrap().target;
        rc.sent(&p, now + 2 * t, p.rp_byte_reset as usize);
        let additive = rc.limited.unwrap().target;
        assert!(
            (additive - before - mbps(p.rp_ai_rate)).abs() < 1.0,
            "{before} {additive}"
        );
        rc.sent(&p, now + 2 * t, p.rp_byte_reset as usize);
        let after = rc.limited.unwrap().target;
        assert!(
            (after - additive - mbps(p.rp_hai_rate)).abs() < 1.0,
            "{additive} {after}"
        );
    }

    #[test]
    fn the_pacer_spaces_packets_at_the_current_rate() {
        let p = RpParams {
            rp_rate_to_set_on_first_cnp: 2000, // 2 Gb/s, then halved: 1 Gb/s
            rp_initial_alpha_value: 1024,
            // No increase during the test.
            rp_time_reset: 10_000,
            rp_byte_reset: 0,
            ..RpParams::default()
        };
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        rc.on_cnp(&p, now);
        assert!((gbps(&rc) - 1.0).abs() < 0.01);
        // At 1 Gb/s, 4000 bytes take 32 µs.
        assert!(rc.may_send(&p, now));
        rc.sent(&p, now, 4000);
        assert!(!rc.may_send(&p, now));
        close(rc.release_at(), now + 32 * US);
        // An engine that wakes 100 µs later sends what it owes at once: packets until the
        // pacer is past the wake-up (32, 64, 96, then 128 µs), within the 16 KiB of credit.
        assert_eq!(send_all(&mut rc, &p, now + 100 * US), 3);
        close(rc.release_at(), now + 128 * US);
        // Idle for long, it gets at most 16 KiB ahead (131 µs at 1 Gb/s): four packets
        // within it, and a fifth that starts before the credit is spent.
        assert_eq!(send_all(&mut rc, &p, now + 500 * US), 5);
    }

    /// Sends packets of 4000 bytes at `at` while the pacer lets them go; how many went.
    fn send_all(rc: &mut RateControl, p: &RpParams, at: Duration) -> usize {
        let mut sent = 0;
        while rc.may_send(p, at) {
            rc.sent(p, at, 4000);
            sent += 1;
        }
        sent
    }

    #[test]
    fn off_ignores_cnps() {
        let p = RpParams {
            enabled: false,
            ..RpParams::default()
        };
        let now = Duration::from_millis(10);
        let mut rc = sending(&p, now);
        assert_eq!(rc.on_cnp(&p, now), CnpOutcome::Ignored);
        assert_eq!(rc.rate(), None);
    }
}
