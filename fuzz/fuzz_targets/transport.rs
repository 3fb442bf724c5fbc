//! The transport core under a hostile peer: two endpoints on the simulator, driven by the
//! input through verbs, network steps, forged and mutated packets, state changes and memory
//! windows (`tests/sim/fuzz.rs`, shared with the property test that runs it in `cargo test`).
//! Panics only if the core panics or lets the network change memory no key grants.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

fuzz_target!(|data: &[u8]| {
    sim::fuzz::run(data);
});
