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

/// What the driver reads before its actions: MTU 1024, the simulator's `seed`, the shortest
/// ACK timeout, 7 retries and RNR retries, READ depths of 16, and 0 for the random rkey.
fn header(seed: u8) -> Script {
    Script::default()
        .u32(1)
        .u8(seed)
        .u32(0)
        .u32(7)
        .u32(7)
        .u32(15)
        .u32(15)
        .u32(0)
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
    let script = header(0)
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

/// The seed's top bit puts node 1's QP on an SRQ of 16 requests: of 20 zero-length receives
/// posted, the last 4 are refused there, so the last 4 of 20 SENDs find none and are answered
/// with an RNR NAK; on the QP's own deep queue none is. Without the SRQ in the driver, the
/// fuzzer would never reach a responder that takes its requests from one.
#[test]
fn a_seed_of_128_or_more_puts_node_1_on_a_shallow_srq() {
    let script = |seed: u8| {
        let mut script = header(seed);
        for _ in 0..20 {
            // post_recv, no SGE
            script = script.u32(2).u32(0);
        }
        for _ in 0..20 {
            // post_send: the first rkey, at node 1's region, a SEND of no SGE, signalled
            script = script
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0)
                .u8(0)
                .u32(0);
            script = script.u8(1).u8(0).u8(0);
        }
        for _ in 0..8 {
            script = script.u32(3).u32(63); // 64 steps
        }
        script
    };
    let own_queue = sim::fuzz::run(&script(0).0);
    assert_eq!(own_queue.rnr_naks_sent, 0, "{own_queue}");
    let shared = sim::fuzz::run(&script(128).0);
    assert!(shared.rnr_naks_sent > 0, "{shared}");
}
