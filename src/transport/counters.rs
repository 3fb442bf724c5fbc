//! [`Counters`]: like rxe's hw_counters, what happened on the wire, including every packet
//! dropped and why. A peer's misbehaviour that costs it a packet or a message shows up here.

use std::fmt;

/// Declares the counters once: the struct's fields, their documentation and the rows
/// `Display` prints, in the same order.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// What a transport endpoint has done and dropped since it started.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl fmt::Display for Counters {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                $(writeln!(f, "{:<24}{}", stringify!($name), self.$name)?;)*
                Ok(())
            }
        }
    };
}

counters! {
    sent_packets,
    /// ACKs that replaced an unsent ACK of the same QP instead of being sent too.
    coalesced_acks,
    received_packets,
    retransmitted_packets,
    retry_timeouts,
    naks_sent,
    naks_received,
    sequence_errors,
    rnr_naks_sent,
    rnr_waits,
    duplicate_requests,
    /// Duplicate READs and atomics that no responder resource answers: outside the ring, or
    /// asking for more than the original was granted. Dropped.
    unmatched_duplicates,
    icrc_errors,
    rkey_violations,
    /// Responses for PSNs never sent.
    ghost_acks,
    /// Responses for PSNs already acknowledged (duplicates, late arrivals).
    stale_responses,
    dropped_malformed,
    dropped_unknown_qp,
    dropped_wrong_source,
    dropped_wrong_state,
    /// Packets whose P_Key does not match the QP's (IBTA 10.9.3).
    dropped_bad_pkey,
    /// UD packets whose DETH Q_Key is not the QP's (rxe: the port's qkey_viol_cntr).
    qkey_violations,
    dropped_unexpected,
    /// UC and UD messages the responder dropped without a word, having no NAK: a PSN gap, no
    /// receive request, or a failed length, rkey or access check.
    dropped_messages,
    /// Completions lost because their CQ had overrun (and so is in error).
    dropped_completions,
    /// Connected QPs failed because the io layer could not reach their peer at all.
    unreachable_peers,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_prints_on_a_line_of_its_own() {
        let c = Counters {
            unmatched_duplicates: 7,
            ..Default::default()
        };
        let text = c.to_string();
        assert!(text.contains("unmatched_duplicates    7\n"), "{text}");
        assert_eq!(text.lines().count(), 26);
    }
}
