//! The transport fuzz driver (`tests/sim/fuzz.rs`, which the `transport` fuzz target runs under
//! libFuzzer) on random inputs: every `cargo test` runs some of what a fuzz campaign runs, so
//! the driver and the invariants it checks cannot rot between campaigns.

mod sim;

use proptest::prelude::*;
use sim::fuzz::Script;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn hostile_sequences_never_panic_or_reach_guarded_memory(
        data in proptest::collection::vec(any::<u8>(), 0..4096)
    ) {
        sim::fuzz::run(&data);
    }
}

/// The oracle tells poison from what a key grants by content: no clean pattern it writes may
/// hold eight bytes of poison, or a READ of it would look like a leak.
#[test]
fn no_clean_pattern_holds_poison() {
    for seed in sim::exposure::clean_seeds() {
        let clean = sim::exposure::clean_pattern(seed);
        assert_eq!(sim::exposure::poison_in(&clean), None, "seed {seed:#x}");
    }
    let poison = sim::exposure::POISON.repeat(3);
    assert!(sim::exposure::poison_in(&poison[3..15]).is_some());
}

/// A script the driver runs as a fuzz input: node 0 READs 8000 bytes (8 responses at MTU 1024)
/// of node 1's revocable region; node 1 has sent 2 responses and built the rest of its batch
/// when it deregisters the region, and the simulator then runs. On bb27b60 the other 6 left with
/// what the oracle had written over the region, and `run` panicked ("memory no key grants left
/// node 1"); now they are withheld as they are built.
#[test]
fn the_driver_catches_a_read_that_outlives_its_region() {
    let header = Script::default()
        .u32(1) // MTU 1024
        .u8(0) // the simulator's seed
        .u32(0) // timeout
        .u32(7) // retry_cnt
        .u32(7) // rnr_retry
        .u32(15)
        .u32(15) // READ depths
        .u32(0); // the random rkey
    let script = header
        // post_send: an rkey from the list, the sixth (the revocable region's), at its start.
        .u32(0)
        .u32(0)
        .u32(5)
        .u32(3)
        .u32(0)
        .u32(0)
        // a READ into one SGE of 8000 bytes at the start of node 0's region, signalled
        .u32(5)
        .u32(1)
        .u32(8000)
        .u32(0)
        .u8(1)
        .u8(0)
        .u8(0)
        // the request to node 1, then two of its responses to node 0
        .u32(4)
        .u32(0)
        .u32(1)
        .u32(4)
        .u32(1)
        .u32(2)
        // node 1 deregisters the region; then ten steps
        .u32(9)
        .u8(0)
        .u32(3)
        .u32(10);
    let counters = sim::fuzz::run(&script.0);
    assert_eq!(counters.revoked_read_responses, 1, "{counters}");
}
