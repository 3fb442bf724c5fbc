//! RED's marking (RFC 2309, with ECN as RFC 3168 has it): shared by the simulator's bottleneck
//! and `examples/ecn_switch.rs`, the bench's switch.

/// RED's thresholds: never a mark at `kmin` bytes queued or below, a chance rising linearly
/// to `pmax` at `kmax`, a certain mark above.
#[derive(Debug, Clone, Copy)]
pub struct Red {
    pub kmin: usize,
    pub kmax: usize,
    pub pmax: f64,
}

impl Red {
    /// The chance that a packet finding `queued` bytes with it in the queue is marked.
    pub fn chance(&self, queued: usize) -> f64 {
        if queued <= self.kmin {
            0.0
        } else if queued >= self.kmax {
            1.0
        } else {
            self.pmax * (queued - self.kmin) as f64 / (self.kmax - self.kmin) as f64
        }
    }
}
