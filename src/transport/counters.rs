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

        /// Sums the counters of a device's engines.
        impl std::ops::AddAssign<&Counters> for Counters {
            fn add_assign(&mut self, other: &Counters) {
                $(self.$name += other.$name;)*
            }
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
    /// Packets queued for the wire, ACKs and retransmissions included.
    sent_packets,
    /// ACKs that replaced an unsent ACK of the same QP instead of being sent too.
    coalesced_acks,
    /// Datagrams handed in by the io layer, before any check.
    received_packets,
    /// Request packets sent again for a PSN already sent once (RC).
    retransmitted_packets,
    /// Expiries of the RC retry timer with requests outstanding (rxe_comp.c's retransmit timer).
    retry_timeouts,
    /// Probes of an idle RC QP's peer that it had heard nothing from for its keepalive
    /// interval (`transport::keepalive`).
    keepalive_probes,
    /// RC QPs failed because their peer answered none of their keepalive probes.
    keepalive_failures,
    /// NAKs the responder sent, RNR NAKs included.
    naks_sent,
    /// NAKs the requester received, RNR NAKs not included.
    naks_received,
    /// RC requests with a PSN past the expected one, or PSN gaps that cost a UC message.
    sequence_errors,
    /// RNR NAKs the responder sent for want of a receive request (IBTA 9.7.5.2.8).
    rnr_naks_sent,
    /// RNR NAKs the requester received, each a wait before resending.
    rnr_waits,
    /// RC requests with a PSN before the expected one: duplicates, answered again if they can be.
    duplicate_requests,
    /// Peers' requests carried out on this host's memory that complete nothing here: RDMA
    /// WRITEs without immediate data (at their last packet), READs and atomics, duplicates not
    /// counted. An application learns of these only from its memory, if at all.
    remote_accesses,
    /// Duplicate READs and atomics that no responder resource answers: outside the ring, or
    /// asking for more than the original was granted. Dropped.
    unmatched_duplicates,
    /// Duplicate READs dropped because their QP already had `max_dest_rd_atomic` replays
    /// queued: a peer repeating parts of READs faster than they are answered.
    dropped_read_replays,
    /// READ response packets withheld as they were built: their rkey no longer granted the
    /// memory (deregistered, or the window invalidated, since the READ was accepted). Each is
    /// answered by NAK remote access error instead, and its QP fails.
    revoked_read_responses,
    /// Packets dropped unread because their ICRC does not match.
    icrc_errors,
    /// Remote accesses the memory check refused: key, PD, bounds, rights or alignment.
    rkey_violations,
    /// Accesses to a region over a program's memory that the program took away (unmapped, or
    /// protected) after registering it: a peer's WRITE, READ or atomic answered with NAK
    /// remote access error, a local transfer failed, or a send's payload sent as zeros from
    /// the first byte that could not be read (`MemoryError::Unmapped`).
    unmapped_accesses,
    /// Responses for PSNs never sent.
    ghost_acks,
    /// Responses for PSNs already acknowledged (duplicates, late arrivals).
    stale_responses,
    /// Packets that do not parse, or lack a header their opcode needs.
    dropped_malformed,
    /// Packets for a destination QP that does not exist.
    dropped_unknown_qp,
    /// RC and UC packets from an address other than the QP's peer (rxe_recv.c `check_addr`).
    dropped_wrong_source,
    /// Packets for a QP whose state does not take them (IBTA 10.3.1), e.g. requests before RTR.
    dropped_wrong_state,
    /// Packets whose P_Key does not match the QP's (IBTA 10.9.3).
    dropped_bad_pkey,
    /// UD packets whose DETH Q_Key is not the QP's (rxe: the port's qkey_viol_cntr).
    qkey_violations,
    /// Packets of another transport than the QP's, or responses that do not fit the request.
    dropped_unexpected,
    /// UC and UD messages the responder dropped without a word, having no NAK: a PSN gap, no
    /// receive request, or a failed length, rkey or access check.
    dropped_messages,
    /// Completions lost because their CQ had overrun (and so is in error).
    dropped_completions,
    /// Connected QPs failed because the io layer could not reach their peer at all.
    unreachable_peers,
    /// Packets that reached a QP marked CE by a switch on the way (mlx5's name).
    np_ecn_marked_roce_packets,
    /// CNPs sent in answer to CE marks (mlx5's name).
    np_cnp_sent,
    /// CNPs that cut a QP's rate or joined a cut (mlx5's name).
    rp_cnp_handled,
    /// CNPs for a QP whose DCQCN is off: counted and ignored (mlx5's name).
    rp_cnp_ignored,
}

impl Counters {
    /// Counts `error` in [`unmapped_accesses`](Self::unmapped_accesses) if it is memory a
    /// program took away.
    pub(crate) fn note_unmapped(&mut self, error: &crate::memory::MemoryError) {
        if matches!(error, crate::memory::MemoryError::Unmapped { .. }) {
            self.unmapped_accesses += 1;
        }
    }
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
        // One line per field: the Debug form lists each once, as `name: value`.
        let fields = format!("{c:?}").matches(": ").count();
        assert_eq!(text.lines().count(), fields);
    }
}
