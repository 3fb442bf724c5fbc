//! Connection management in the simulator: a CM agent on each node, carrying its MADs on the
//! node's QP1 over the simulated wire, with its losses, duplicates and delays.

use std::time::Duration;

use super::{Faults, Sim};
use softroce::cm::agent::Agent;
use softroce::cm::{CmConfig, CmEvent, ConnId};
use softroce::memory::{Access, MemoryRegion};
use softroce::transport::CqId;
use softroce::wire::cm::CmMessage;
use softroce::wire::{Qpn, RocePacket};

/// Where each agent's receive buffers go: far from the regions tests register.
const AGENT_IOVA: u64 = 0x7f00_0000_0000;

/// Timers short enough to simulate many of: a 16.8 ms response timeout, five retries.
pub fn config() -> CmConfig {
    CmConfig {
        response_timeout: 12,
        packet_life_time: 0,
        max_retries: 5,
        ..CmConfig::default()
    }
}

/// A simulator whose nodes have CM agents, and the events each agent reported.
pub struct CmSim {
    pub sim: Sim,
    pub agents: Vec<Agent>,
    pub events: Vec<Vec<CmEvent>>,
}

impl CmSim {
    pub fn new(nodes: usize, seed: u64, faults: Faults, config: CmConfig) -> CmSim {
        let mut sim = Sim::new(nodes, seed, faults);
        let agents = (0..nodes)
            .map(|n| {
                let ep = &mut sim.nodes[n];
                Agent::new(ep, Duration::ZERO, seed + n as u64, config, AGENT_IOVA).unwrap()
            })
            .collect();
        CmSim {
            sim,
            agents,
            events: vec![Vec::new(); nodes],
        }
    }

    /// Lets every agent do what is due now, and keeps what it reports.
    pub fn pump(&mut self) {
        let now = self.sim.now;
        for (n, agent) in self.agents.iter_mut().enumerate() {
            agent.pump(now, &mut self.sim.nodes[n]);
            while let Some(event) = agent.poll_event() {
                self.events[n].push(event);
            }
        }
    }

    /// One step of the network, stopping at the agents' deadlines too.
    pub fn step(&mut self) -> bool {
        self.pump();
        let deadline = self.agents.iter().filter_map(Agent::next_deadline).min();
        let progressed = self.sim.step_with(deadline);
        self.pump();
        progressed
    }

    /// Steps until `done` holds, or panics after `limit` of virtual time.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut CmSim) -> bool) {
        while !done(self) {
            assert!(
                self.sim.now < limit,
                "simulation did not finish by {limit:?}"
            );
            assert!(
                self.step() || done(self),
                "simulation went idle before finishing"
            );
        }
    }

    /// Steps until nothing is in flight and no timer, the agents' included, is armed.
    pub fn run_idle(&mut self, limit: Duration) {
        while self.step() {
            assert!(
                self.sim.now < limit,
                "simulation did not settle by {limit:?}"
            );
        }
    }

    /// Whether node `n` has reported `event`.
    pub fn saw(&self, n: usize, event: &CmEvent) -> bool {
        self.events[n].contains(event)
    }

    /// How often node `n` reported an event for `conn` that `is` picks.
    pub fn count(&self, n: usize, is: impl Fn(&CmEvent) -> bool) -> usize {
        self.events[n].iter().filter(|e| is(e)).count()
    }

    /// The connection of node `n`'s first connection request, with the request.
    pub fn first_request(&self, n: usize) -> Option<(ConnId, softroce::cm::ConnectRequest)> {
        self.events[n].iter().find_map(|e| match e {
            CmEvent::ConnectRequest { conn, request, .. } => Some((*conn, (**request).clone())),
            _ => None,
        })
    }
}

/// A node's RC QP in RESET, with a CQ and a registered region.
#[derive(Debug, Clone)]
pub struct Peer {
    pub qpn: Qpn,
    pub cq: CqId,
    pub mr: MemoryRegion,
}

pub fn rc_peer(sim: &mut Sim, node: usize) -> Peer {
    let ep = &mut sim.nodes[node];
    let pd = ep.alloc_pd();
    let cq = ep.create_cq(1 << 12);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = ep
        .reg_mr(pd, super::rc::IOVA, super::rc::MR_LEN, access)
        .unwrap();
    let qpn = super::rc::qp_on(sim, node, pd, cq);
    Peer { qpn, cq, mr }
}

/// The name of the CM message a sealed packet carries to QP1, if it carries one.
pub fn mad_name(bytes: &[u8]) -> Option<&'static str> {
    let packet = RocePacket::new_checked(bytes).ok()?;
    if packet.bth().dest_qp() != Qpn::GSI {
        return None;
    }
    let payload = packet.payload();
    CmMessage::parse(payload).ok().map(|(_, m)| m.name())
}
