//! The transport fuzz driver (`tests/sim/fuzz.rs`, which the `transport` fuzz target runs under
//! libFuzzer) on random inputs: every `cargo test` runs some of what a fuzz campaign runs, so
//! the driver and the invariants it checks cannot rot between campaigns.

mod sim;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn hostile_sequences_never_panic_or_reach_guarded_memory(
        data in proptest::collection::vec(any::<u8>(), 0..4096)
    ) {
        sim::fuzz::run(&data);
    }
}
