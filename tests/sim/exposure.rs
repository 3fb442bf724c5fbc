//! The transport fuzz driver's oracle of node 1's memory (`fuzz.rs`): memory no key grants must
//! neither change nor leave node 1.
//!
//! - Two guarded regions: one with no remote rights, one for remote READ only. Nothing from the
//!   network may change them.
//! - Revocable regions, for remote READ, WRITE and atomics, which node 1 deregisters or
//!   releases (its last handle gone) when the input says. Once the call returns their memory
//!   is filled with [`POISON`].
//! - One region per memory window, with no remote rights of its own: reachable only through its
//!   window, while that window is bound over it or a bind over it is on its way. Otherwise it
//!   holds [`POISON`]. Whether a bind or invalidation took effect is learnt from node 1's
//!   completions, in their order (a peer's SEND with Invalidate included).
//!
//! Poisoned memory must stay poisoned (no WRITE or atomic lands there), and no READ response
//! node 1 builds may carry eight bytes of poison that the memory it may read from does not hold
//! at that moment: a peer may plant poison-like bytes where it can write (atomics write any
//! eight bytes), so such bytes are a leak only if no readable memory has them.

use std::cell::RefCell;
use std::rc::Rc;

use super::{is_read_response, Sim};
use softroce::memory::{Access, MemoryRegion, PdId};
use softroce::transport::{WcOpcode, WcStatus, WorkCompletion};
use softroce::wire::{LKey, RKey, RocePacket};

/// What memory no key grants holds: eight distinct bytes, repeated.
pub const POISON: [u8; 8] = [0xde, 0xad, 0xbe, 0xef, 0xfe, 0xed, 0xfa, 0xce];

/// The length of every region the oracle watches.
pub const WATCHED_LEN: usize = 8192;
pub const PRIVATE_IOVA: u64 = 0x4000_0000;
pub const READ_ONLY_IOVA: u64 = 0x5000_0000;
/// Revocable region `n` is at `REVOCABLE_IOVA + n * STRIDE`, window `i`'s at
/// `WINDOWED_IOVA + i * STRIDE`.
pub const REVOCABLE_IOVA: u64 = 0x6000_0000;
pub const WINDOWED_IOVA: u64 = 0x7000_0000;
pub const STRIDE: u64 = 0x1_0000;
/// Revocable regions registered in one run, at most.
const MAX_REVOCABLE: usize = 4;

/// The contents of a watched region that a key grants: `(i * 31) ^ seed`, in which no eight
/// bytes are a rotation of [`POISON`] (`tests/transport_fuzz.rs` checks every seed used).
pub fn clean_pattern(seed: u8) -> Vec<u8> {
    (0..WATCHED_LEN)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The seeds of every clean pattern the oracle writes.
pub fn clean_seeds() -> impl Iterator<Item = u8> {
    [1, 2]
        .into_iter()
        .chain(0x20..0x20 + MAX_REVOCABLE as u8)
        .chain(0x40..0x48)
}

fn poisoned() -> Vec<u8> {
    (0..WATCHED_LEN).map(|i| POISON[i % 8]).collect()
}

/// The first eight bytes of `bytes` that are a rotation of [`POISON`], if any: what a READ
/// response of eight or more poisoned bytes contains, wherever in the region it starts.
pub fn poison_in(bytes: &[u8]) -> Option<&[u8]> {
    bytes.windows(8).find(|w| {
        POISON
            .iter()
            .position(|&p| p == w[0])
            .is_some_and(|j| (0..8).all(|k| w[k] == POISON[(j + k) % 8]))
    })
}

/// What the oracle shares with the simulator's `observe` hook.
#[derive(Default)]
struct Readable {
    /// Node 1's regions that some key may grant for remote READ right now.
    regions: Vec<MemoryRegion>,
    /// READ responses that carried poison no readable region holds.
    leaks: Vec<String>,
}

/// A region registered for the oracle, and whether it is poisoned now.
struct Watched {
    region: MemoryRegion,
    seed: u8,
    poisoned: bool,
}

/// A memory window of node 1, and what the oracle knows of its binding.
pub struct Window {
    /// Its current rkey (the last bind posted chose it).
    pub rkey: RKey,
    /// The region only it may reach.
    own: Watched,
    /// Its last bind that completed was over `own`, and nothing invalidated it since.
    bound_over_own: bool,
    /// Binds over `own` posted and not yet completed.
    pending_own: u32,
}

impl Window {
    fn granted(&self) -> bool {
        self.bound_over_own || self.pending_own > 0
    }
}

/// A work request of node 1 whose completion changes what a window grants.
enum Pending {
    Bind { window: usize, own: bool },
    Invalidate { window: usize },
}

/// Node 1's watched memory.
pub struct Oracle {
    pd: PdId,
    private: MemoryRegion,
    read_only: MemoryRegion,
    revocable: Vec<Watched>,
    pub windows: Vec<Window>,
    pending: Vec<(u64, Pending)>,
    readable: Rc<RefCell<Readable>>,
}

fn register(sim: &mut Sim, pd: PdId, iova: u64, access: Access, seed: u8) -> MemoryRegion {
    let region = sim.nodes[1].reg_mr(pd, iova, WATCHED_LEN, access).unwrap();
    region.write(0, &clean_pattern(seed)).unwrap();
    region
}

impl Oracle {
    /// Registers the guarded regions and a first revocable one in `pd` on node 1, and watches
    /// what node 1 sends. `open` is node 1's region that node 0 may write and read.
    pub fn new(sim: &mut Sim, pd: PdId, open: &MemoryRegion) -> Oracle {
        let readable = Rc::new(RefCell::new(Readable::default()));
        let watch = readable.clone();
        sim.observe = Some(Box::new(move |from, bytes| {
            let Ok(packet) = RocePacket::new_checked(bytes) else {
                return;
            };
            if from != 1 || !is_read_response(packet.bth().opcode()) {
                return;
            }
            let Some(poison) = poison_in(packet.payload()) else {
                return;
            };
            let mut readable = watch.borrow_mut();
            let planted = readable
                .regions
                .iter()
                .any(|r| r.to_vec().windows(8).any(|w| w == poison));
            if !planted {
                let psn = packet.bth().psn();
                readable
                    .leaks
                    .push(format!("READ response {psn:?} carried poison"));
            }
        }));
        let read_only = register(sim, pd, READ_ONLY_IOVA, Access::REMOTE_READ, 2);
        readable.borrow_mut().regions = vec![open.clone(), read_only.clone()];
        let mut oracle = Oracle {
            pd,
            private: register(sim, pd, PRIVATE_IOVA, Access::LOCAL_WRITE, 1),
            read_only,
            revocable: Vec::new(),
            windows: Vec::new(),
            pending: Vec::new(),
            readable,
        };
        oracle.register_revocable(sim);
        oracle
    }

    /// The lkeys of the guarded regions, which no window may be bound over.
    pub fn guarded_lkeys(&self) -> [LKey; 2] {
        [self.private.lkey(), self.read_only.lkey()]
    }

    /// The rkeys of the regions the oracle registered, for node 0 to try.
    pub fn rkeys(&self) -> Vec<RKey> {
        let revocable = self.revocable.iter().map(|w| w.region.rkey());
        [self.private.rkey(), self.read_only.rkey()]
            .into_iter()
            .chain(revocable)
            .collect()
    }

    fn register_revocable(&mut self, sim: &mut Sim) -> Option<RKey> {
        let n = self.revocable.len();
        if n == MAX_REVOCABLE {
            return None;
        }
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let seed = 0x20 + n as u8;
        let iova = REVOCABLE_IOVA + n as u64 * STRIDE;
        let region = register(sim, self.pd, iova, access, seed);
        self.readable.borrow_mut().regions.push(region.clone());
        let rkey = region.rkey();
        self.revocable.push(Watched {
            region,
            seed,
            poisoned: false,
        });
        Some(rkey)
    }

    /// Deregisters the newest revocable region (through `dereg_mr`, or as the verbs do when
    /// its last handle goes, if `released`) and poisons it; or, if it is gone already,
    /// registers another and returns its rkey.
    pub fn revoke_or_register(&mut self, sim: &mut Sim, released: bool) -> Option<RKey> {
        let Some(newest) = self.revocable.last_mut().filter(|w| !w.poisoned) else {
            return self.register_revocable(sim);
        };
        let (lkey, rkey) = (newest.region.lkey(), newest.region.rkey());
        if released {
            sim.nodes[1].release_mr(lkey, rkey);
        } else {
            sim.nodes[1]
                .dereg_mr(lkey)
                .expect("a revocable region has no windows");
        }
        let region = newest.region.clone();
        self.readable
            .borrow_mut()
            .regions
            .retain(|r| r.rkey() != region.rkey());
        newest.poisoned = true;
        region.write(0, &poisoned()).unwrap();
        None
    }

    /// A new window of node 1, with the region only it may reach.
    pub fn add_window(&mut self, sim: &mut Sim, rkey: RKey) {
        let i = self.windows.len();
        let seed = 0x40 + i as u8;
        let iova = WINDOWED_IOVA + i as u64 * STRIDE;
        let access = Access::LOCAL_WRITE | Access::MW_BIND;
        let region = sim.nodes[1]
            .reg_mr(self.pd, iova, WATCHED_LEN, access)
            .unwrap();
        region.write(0, &poisoned()).unwrap();
        self.windows.push(Window {
            rkey,
            own: Watched {
                region,
                seed,
                poisoned: true,
            },
            bound_over_own: false,
            pending_own: 0,
        });
    }

    /// The region window `i` alone may be bound over.
    pub fn own_region(&self, i: usize) -> &MemoryRegion {
        &self.windows[i].own.region
    }

    /// Node 1 is about to post a bind of window `i` as work request `wr_id`, over its own
    /// region if `own`: that region is granted from now on, so it holds its clean pattern again.
    pub fn binding(&mut self, wr_id: u64, i: usize, own: bool) {
        if own {
            let window = &mut self.windows[i];
            window.pending_own += 1;
            if window.own.poisoned {
                window.own.poisoned = false;
                let region = window.own.region.clone();
                region.write(0, &clean_pattern(window.own.seed)).unwrap();
                self.readable.borrow_mut().regions.push(region);
            }
        }
        let bind = Pending::Bind { window: i, own };
        self.pending.push((wr_id, bind));
    }

    /// Node 1 posted an invalidation of window `i` as work request `wr_id`.
    pub fn invalidating(&mut self, wr_id: u64, i: usize) {
        self.pending
            .push((wr_id, Pending::Invalidate { window: i }));
    }

    /// A post of `wr_id` failed: it will not complete.
    pub fn not_posted(&mut self, wr_id: u64) {
        if let Some(at) = self.pending.iter().position(|(id, _)| *id == wr_id) {
            if let (_, Pending::Bind { window, own: true }) = self.pending.remove(at) {
                self.windows[window].pending_own -= 1;
            }
        }
    }

    /// One of node 1's completions, in the order node 1 completed them.
    pub fn completed(&mut self, wc: &WorkCompletion) {
        if let Some(rkey) = wc.invalidated_rkey {
            // A window keeps the upper 24 bits of its rkey for life.
            if let Some(window) = self
                .windows
                .iter_mut()
                .find(|w| w.rkey.0 >> 8 == rkey.0 >> 8)
            {
                window.bound_over_own = false;
            }
        }
        if !matches!(wc.opcode, WcOpcode::BindMw | WcOpcode::LocalInv) {
            return;
        }
        let Some(at) = self.pending.iter().position(|(id, _)| *id == wc.wr_id) else {
            return;
        };
        let success = wc.status == WcStatus::Success;
        match self.pending.remove(at).1 {
            Pending::Bind { window, own } => {
                let window = &mut self.windows[window];
                if own {
                    window.pending_own -= 1;
                }
                if success {
                    window.bound_over_own = own;
                }
            }
            Pending::Invalidate { window } if success => {
                self.windows[window].bound_over_own = false;
            }
            Pending::Invalidate { .. } => {}
        }
    }

    /// Poisons each window's region that its window no longer grants.
    pub fn settle(&mut self) {
        for window in &mut self.windows {
            if window.granted() || window.own.poisoned {
                continue;
            }
            window.own.poisoned = true;
            let region = window.own.region.clone();
            self.readable
                .borrow_mut()
                .regions
                .retain(|r| r.rkey() != region.rkey());
            region.write(0, &poisoned()).unwrap();
        }
    }

    /// Panics if the network changed memory no key grants, or a READ response carried it.
    pub fn check(&self) {
        assert_eq!(
            self.private.to_vec(),
            clean_pattern(1),
            "a region with no remote rights"
        );
        assert_eq!(
            self.read_only.to_vec(),
            clean_pattern(2),
            "a read-only region"
        );
        let taken_back = self
            .revocable
            .iter()
            .chain(self.windows.iter().map(|w| &w.own))
            .filter(|w| w.poisoned);
        for watched in taken_back {
            assert!(
                watched.region.to_vec() == poisoned(),
                "memory no key grants changed: {:?}",
                watched.region
            );
        }
        let leaks = &self.readable.borrow().leaks;
        assert!(
            leaks.is_empty(),
            "memory no key grants left node 1: {leaks:?}"
        );
    }
}
