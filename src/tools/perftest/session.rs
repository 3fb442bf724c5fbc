//! A perftest session once both sides are set up: the exchange's rounds of each test, and the
//! bandwidth and latency loops that post, poll and time (perftest's `run_iter_*`).

use super::super::perftest_keys::Keys;
use super::super::perftest_oob::{BwReport, Exchange};
use super::super::perftest_report::{
    bw_report, lat_duration_report, lat_report, BwSamples, Output, Row, Side, Table,
};
use super::super::{failed, peer_address, Result};
use super::context::{Clock, Context, DataCheck};
use super::{qp_options, Options, Plan, Test, Verb, POLL_BATCH};
use crate::transport::PathMtu;
use crate::verbs::QpEndpoint;
use crate::wire::QKey;

/// What a latency run measured.
pub(super) enum LatRun {
    /// When each message was posted.
    Posted(Vec<u64>),
    /// `-D`: messages counted in the sampling period.
    Counted(u64),
}

/// One side of a test after the exchange's first rounds.
pub(super) struct Session<'a, 'o> {
    pub(super) o: &'a Options,
    pub(super) plan: Plan,
    pub(super) client: bool,
    pub(super) mtu: PathMtu,
    pub(super) exchange: Exchange,
    pub(super) ctx: Context,
    pub(super) output: Output<'o>,
    /// This side's keys and the peer's, per QP.
    pub(super) mine: Vec<Keys>,
    pub(super) theirs: Vec<Keys>,
}

impl Session<'_, '_> {
    /// The key rounds before the test, the QPs connected, and the address lines. All tests
    /// have one round per QP before connecting and one per QP after it, printing the peer's
    /// address. The SEND tests have one more before printing, the others after;
    /// `ib_write_lat` and `ib_read_lat` one more at the very start.
    pub(super) fn handshake(&mut self) -> Result<()> {
        let test = self.o.test;
        if matches!(test, Test::WriteLat | Test::ReadLat) {
            self.qp_keys(0)?;
        }
        for qp in 0..self.ctx.qps.len() {
            self.qp_keys(qp)?;
        }
        self.connect()?;
        let send = test.verb() == Verb::Send;
        if send {
            self.exchange.sync(&self.mine[0])?;
        }
        for keys in &self.mine {
            self.output
                .address(Side::Local, keys, test.verb().shown())?;
        }
        for qp in 0..self.mine.len() {
            let mine = self.mine[qp];
            let (theirs, _) = self.exchange.keys(|_| mine)?;
            self.theirs[qp] = theirs;
            self.output
                .address(Side::Remote, &theirs, test.verb().shown())?;
        }
        if !send {
            self.exchange.sync(&self.mine[0])?;
        }
        Ok(())
    }

    /// A key round for QP `qp`, whose keys are made the first time. The server, which reads
    /// the client's keys first, offers no more outstanding READs than the client answers, so
    /// that the one limit `connect` sets is right for both directions.
    pub(super) fn qp_keys(&mut self, qp: usize) -> Result<()> {
        let ctx = &self.ctx;
        let made = self.mine.get(qp).copied();
        let out_reads = self.plan.out_reads;
        let (theirs, mine) = self.exchange.keys(|peer| {
            made.unwrap_or_else(|| {
                let offered = peer.map_or(out_reads, |p| out_reads.min(p.out_reads.max(1)));
                ctx.keys(qp, offered)
            })
        })?;
        if made.is_none() {
            self.mine.push(mine);
            self.theirs.push(theirs);
        } else {
            self.theirs[qp] = theirs;
        }
        Ok(())
    }

    /// `ctx_connect`: every QP to RTS towards its peer. With `-R` the QPs are connected
    /// already.
    pub(super) fn connect(&self) -> Result<()> {
        if self.exchange.is_rdma_cm() {
            return Ok(());
        }
        let peer = self.exchange.peer();
        for ((qp, mine), theirs) in self.ctx.qps.iter().zip(&self.mine).zip(&self.theirs) {
            let addr = peer_address(theirs.gid, self.ctx.gid.to_canonical(), peer)?;
            let out_reads = mine.out_reads.min(theirs.out_reads).max(1);
            let options = qp_options(self.o.test.verb(), self.mtu, out_reads);
            let remote = QpEndpoint {
                addr,
                qpn: theirs.qpn,
                psn: theirs.psn,
                mtu: self.mtu,
                qkey: QKey(0),
            };
            qp.connect(&remote, &options)
                .map_err(failed("Failed to modify QP to RTR or RTS"))?;
        }
        Ok(())
    }

    /// `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`: the client runs and reports to the server,
    /// which prints the client's report.
    pub(super) fn remote_report_bw(&mut self) -> Result<()> {
        let unit = self.plan.unit;
        self.output.header(Table::Bw(unit))?;
        let me = self.mine[0];
        if !self.client {
            self.exchange.sync(&me)?;
            let report = self.exchange.reports(&BwReport::default())?;
            self.output.row(&Row::Bw(report, unit))?;
            self.exchange.close(&me)?;
            self.output.line()?;
            // The client's last completion came before its report: every byte has landed.
            return self.check_data();
        }
        let mut last = BwReport::default();
        for size in self.plan.sizes.clone() {
            let samples = self.bw_client(size)?;
            last = bw_report(size, unit, &samples);
            self.output.row(&Row::Bw(last, unit))?;
        }
        self.output.line()?;
        self.check_data()?;
        self.exchange.sync(&me)?;
        self.exchange.reports(&last)?;
        self.exchange.close(&me)
    }

    /// `--check-data`, on the side the data landed on: checks it and says how much landed.
    pub(super) fn check_data(&mut self) -> Result<()> {
        if !self.o.check_data {
            return Ok(());
        }
        let check = DataCheck::of(self.o.test.verb());
        if check.receiver_is_client() != self.client {
            return Ok(());
        }
        let first = self.plan.sizes.iter().min().copied().unwrap_or(0);
        let ctx = &self.ctx;
        let landed = check.verify(&ctx.mr, ctx.qps.len(), ctx.slice, first.min(ctx.slice))?;
        Ok(self.output.notice(&format!(
            "data check: {landed} bytes landed where they were sent from, each as sent"
        ))?)
    }

    /// `ib_send_bw`: both sides report what they measured; the server posts its receives before
    /// the round that starts each size, and measures from its first receive to its last.
    pub(super) fn send_bw(&mut self) -> Result<()> {
        let unit = self.plan.unit;
        self.output.header(Table::Bw(unit))?;
        let me = self.mine[0];
        for size in self.plan.sizes.clone() {
            if !self.client {
                for qp in 0..self.ctx.qps.len() {
                    for k in 0..self.plan.rx_depth {
                        self.ctx.post_recv(qp, self.ctx.cycled(size, k), size)?;
                    }
                }
            }
            self.exchange.sync(&me)?;
            let samples = if self.client {
                self.bw_client(size)?
            } else {
                self.bw_server(size)?
            };
            self.output
                .row(&Row::Bw(bw_report(size, unit, &samples), unit))?;
            // Only `-a` has a round after each size too.
            if self.o.all_sizes {
                self.exchange.sync(&me)?;
            }
        }
        self.output.line()?;
        self.check_data()?;
        self.exchange.close(&me)
    }

    /// `ib_write_lat`: both sides time the round trips. There is no closing round.
    pub(super) fn write_lat(&mut self) -> Result<()> {
        self.output.header(self.lat_table())?;
        for size in self.plan.sizes.clone() {
            let run = self.write_lat_run(size)?;
            self.lat_row(size, run)?;
        }
        self.ctx.answer_late_resends()?;
        Ok(self.output.line()?)
    }

    /// `ib_read_lat`: the client times its READs; the server only waits for it to finish.
    pub(super) fn read_lat(&mut self) -> Result<()> {
        let me = self.mine[0];
        if !self.client {
            self.exchange.close(&me)?;
            return Ok(self.output.line()?);
        }
        self.output.header(self.lat_table())?;
        for size in self.plan.sizes.clone() {
            let run = self.read_lat_run(size)?;
            self.lat_row(size, run)?;
        }
        self.output.line()?;
        self.exchange.close(&me)
    }

    /// `ib_send_lat`: both sides time the round trips; each size's receives are posted before
    /// its round.
    pub(super) fn send_lat(&mut self) -> Result<()> {
        self.output.header(self.lat_table())?;
        let me = self.mine[0];
        for size in self.plan.sizes.clone() {
            for _ in 0..self.plan.rx_depth {
                self.ctx.post_recv(0, 0, size)?;
            }
            self.exchange.sync(&me)?;
            let run = self.send_lat_run(size)?;
            self.lat_row(size, run)?;
        }
        self.output.line()?;
        self.exchange.close(&me)
    }

    pub(super) fn lat_table(&self) -> Table {
        match self.plan.timing {
            Some(_) => Table::LatDuration,
            None => Table::Lat,
        }
    }

    pub(super) fn lat_row(&mut self, size: u64, run: LatRun) -> Result<()> {
        let rtt = self.o.test.rtt_factor();
        let row = match (run, self.plan.timing) {
            (LatRun::Counted(iters), Some(timing)) => {
                let (from, to) = timing.sample_ns();
                Row::LatDuration(lat_duration_report(size, iters, to - from, rtt))
            }
            (LatRun::Posted(posted), _) => Row::Lat(lat_report(size, &posted, rtt)),
            (LatRun::Counted(_), None) => unreachable!("messages are counted only with -D"),
        };
        Ok(self.output.row(&row)?)
    }

    /// `run_iter_bw`: keeps up to `tx_depth` messages in flight on every QP. Message `k` of a
    /// QP asks for a completion when `k % cq_mod == cq_mod - 1`, and so does the last; each
    /// completion counts `cq_mod` messages.
    pub(super) fn bw_client(&self, size: u64) -> Result<BwSamples> {
        let (plan, ctx) = (&self.plan, &self.ctx);
        let qps = ctx.qps.len();
        let timed = plan.timing.is_some();
        let total = plan.iters * qps as u64;
        let stamps = if plan.no_peak { 1 } else { total as usize };
        let mut posted = vec![0; stamps];
        let mut completed = vec![0; stamps];
        let (mut scnt, mut ccnt) = (vec![0u64; qps], vec![0u64; qps]);
        let (mut totscnt, mut totccnt, mut counted) = (0u64, 0u64, 0u64);
        let mut wcs = Vec::with_capacity(POLL_BATCH);
        let clock = Clock::start(plan.timing);
        while totscnt < total || totccnt < total || (timed && !clock.over()) {
            for qp in 0..qps {
                while (scnt[qp] < plan.iters || timed)
                    && scnt[qp].saturating_sub(ccnt[qp]) < plan.tx_depth
                    && !clock.over()
                {
                    let k = scnt[qp];
                    let signaled =
                        k % plan.cq_mod == plan.cq_mod - 1 || (!timed && k == plan.iters - 1);
                    if !plan.no_peak {
                        posted[totscnt as usize] = clock.ns();
                    }
                    ctx.post_send(qp, ctx.cycled(size, k), size, &self.theirs[qp], signaled)?;
                    scnt[qp] += 1;
                    totscnt += 1;
                }
            }
            if totccnt < total || (timed && totccnt < totscnt) {
                ctx.poll(&ctx.send_cq, &mut wcs, POLL_BATCH)?;
                for wc in &wcs {
                    ccnt[wc.wr_id as usize] += plan.cq_mod;
                    totccnt += plan.cq_mod;
                    if !plan.no_peak {
                        completed[(totccnt.min(total) - 1) as usize] = clock.ns();
                    }
                    if clock.sampling() {
                        counted += plan.cq_mod;
                    }
                }
            }
        }
        Ok(self.bw_samples(counted, posted, completed, &clock))
    }

    /// `run_iter_bw_server`: counts receives, posting each one again while more are to come,
    /// from the first receive to the last (or through the timed run that the first starts).
    pub(super) fn bw_server(&self, size: u64) -> Result<BwSamples> {
        let (plan, ctx) = (&self.plan, &self.ctx);
        let qps = ctx.qps.len();
        let timed = plan.timing.is_some();
        let total = plan.iters * qps as u64;
        let mut reposted = vec![plan.rx_depth; qps];
        let (mut received, mut counted) = (0u64, 0u64);
        let mut wcs = Vec::with_capacity(POLL_BATCH);
        // The clock starts with the first receive, as perftest's does.
        let mut clock: Option<Clock> = None;
        while received < total || (timed && !clock.as_ref().is_some_and(Clock::over)) {
            if ctx.poll(&ctx.recv_cq, &mut wcs, POLL_BATCH)? > 0 && clock.is_none() {
                clock = Some(Clock::start(plan.timing));
            }
            let Some(clock) = &clock else { continue };
            for wc in &wcs {
                let qp = wc.wr_id as usize;
                received += 1;
                if clock.sampling() {
                    counted += 1;
                }
                if timed || reposted[qp] < plan.iters {
                    ctx.post_recv(qp, ctx.cycled(size, reposted[qp]), size)?;
                    reposted[qp] += 1;
                }
            }
        }
        let clock = clock.expect("a run ends after its first receive");
        Ok(self.bw_samples(counted, vec![0], vec![clock.ns()], &clock))
    }

    /// The samples of a bandwidth run: as recorded, or, with `-D`, the messages counted in the
    /// sampling period.
    pub(super) fn bw_samples(
        &self,
        counted: u64,
        mut posted: Vec<u64>,
        mut completed: Vec<u64>,
        clock: &Clock,
    ) -> BwSamples {
        let iters = match self.plan.timing {
            Some(timing) => {
                let (from, to) = timing.sample_ns();
                (posted[0], completed[0]) = (from, to);
                counted
            }
            None => {
                if self.plan.no_peak {
                    completed[0] = clock.ns().max(completed[0]);
                }
                self.plan.iters * self.ctx.qps.len() as u64
            }
        };
        BwSamples {
            iters,
            posted,
            completed,
            cq_mod: self.plan.cq_mod,
            no_peak: self.plan.no_peak,
        }
    }

    /// `run_iter_lat_write`: each side writes its count into the last byte of the peer's
    /// receive slice, and waits for the peer's count in its own. The server writes first.
    pub(super) fn write_lat_run(&self, size: u64) -> Result<LatRun> {
        let (plan, ctx) = (&self.plan, &self.ctx);
        let timed = plan.timing.is_some();
        let (iters, peer) = (plan.iters, &self.theirs[0]);
        let post_byte = (ctx.send_offset(0) + size - 1) as usize;
        let poll_byte = (ctx.recv_offset(0) + size - 1) as usize;
        let mut posted = Vec::with_capacity(iters as usize);
        let (mut scnt, mut ccnt, mut rcnt, mut counted) = (0u64, 0u64, 0u64, 0u64);
        let clock = Clock::start(plan.timing);
        while scnt < iters || ccnt < iters || rcnt < iters || (timed && !clock.over()) {
            // The server writes first: it waits only once it has written.
            let turn_to_wait = self.client || scnt > 0;
            if (rcnt < iters || timed) && turn_to_wait {
                rcnt += 1;
                let mut byte = [0];
                loop {
                    ctx.mr
                        .read(poll_byte, &mut byte)
                        .map_err(failed("Couldn't read the buffer"))?;
                    if byte[0] == rcnt as u8 || clock.over() {
                        ctx.watch.heard();
                        break;
                    }
                    ctx.watch.nothing()?;
                }
            }
            if scnt < iters || timed {
                if !timed {
                    posted.push(clock.ns());
                }
                scnt += 1;
                ctx.mr
                    .write(post_byte, &[scnt as u8])
                    .map_err(failed("Couldn't write the buffer"))?;
                ctx.post_send(0, 0, size, peer, true)?;
            }
            if clock.over() {
                break;
            }
            if (ccnt < iters || timed) && ctx.wait_one(&ctx.send_cq, || clock.over())? {
                ccnt += 1;
                if clock.sampling() {
                    counted += 1;
                }
            }
        }
        Ok(self.lat_run(posted, counted))
    }

    /// `run_iter_lat`: one READ (or atomic) at a time.
    pub(super) fn read_lat_run(&self, size: u64) -> Result<LatRun> {
        let (plan, ctx) = (&self.plan, &self.ctx);
        let timed = plan.timing.is_some();
        let mut posted = Vec::with_capacity(plan.iters as usize);
        let mut counted = 0;
        let clock = Clock::start(plan.timing);
        while (posted.len() as u64) < plan.iters || (timed && !clock.over()) {
            if !timed {
                posted.push(clock.ns());
            }
            ctx.post_send(0, 0, size, &self.theirs[0], true)?;
            if ctx.wait_one(&ctx.send_cq, || false)? && clock.sampling() {
                counted += 1;
            }
        }
        Ok(self.lat_run(posted, counted))
    }

    /// `run_iter_lat_send`: each side waits for a message and answers it; the client sends
    /// first. Receives are posted again while more messages are to come than are posted.
    pub(super) fn send_lat_run(&self, size: u64) -> Result<LatRun> {
        let (plan, ctx) = (&self.plan, &self.ctx);
        let timed = plan.timing.is_some();
        let (iters, peer) = (plan.iters, &self.theirs[0]);
        let mut posted = Vec::with_capacity(iters as usize);
        let (mut scnt, mut rcnt, mut counted) = (0u64, 0u64, 0u64);
        let clock = Clock::start(plan.timing);
        while scnt < iters || rcnt < iters || (timed && !clock.over()) {
            // The client sends first: it waits only once it has sent.
            let turn_to_wait = !self.client || scnt > 0;
            if (rcnt < iters || timed) && turn_to_wait {
                if !ctx.wait_one(&ctx.recv_cq, || clock.over())? {
                    break;
                }
                rcnt += 1;
                if clock.sampling() {
                    counted += 1;
                }
                if timed || rcnt + plan.rx_depth <= iters {
                    ctx.post_recv(0, 0, size)?;
                }
            }
            if scnt < iters || (timed && !clock.over()) {
                if !timed {
                    posted.push(clock.ns());
                }
                scnt += 1;
                // Every send is signalled: a latency test's CQ moderation is its TX depth, 1.
                ctx.post_send(0, 0, size, peer, true)?;
                ctx.wait_one(&ctx.send_cq, || false)?;
            }
        }
        Ok(self.lat_run(posted, counted))
    }

    pub(super) fn lat_run(&self, posted: Vec<u64>, counted: u64) -> LatRun {
        match self.plan.timing {
            Some(_) => LatRun::Counted(counted),
            None => LatRun::Posted(posted),
        }
    }
}
