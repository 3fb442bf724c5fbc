//! Completion channels of 1.0 programs. `ibv_create_comp_channel` and
//! `ibv_destroy_comp_channel` have one version since 1.0, but 1.0's channel was its descriptor
//! alone (`{ int fd; }`), where today's begins with the context: a 1.0 program that reads
//! `channel->fd` (to poll it) would read a pointer's low half from today's. A channel made on
//! a 1.0 context is a 1.0 channel over today's, and the calls that take a channel map it back.

use std::sync::{Mutex, MutexGuard};

use super::abi::ibv_comp_channel_1_0;
use crate::abi::ibv_comp_channel;

/// The 1.0 channels, by address, each with today's channel it stands for.
static MADE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn made() -> MutexGuard<'static, Vec<(usize, usize)>> {
    MADE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The 1.0 channel over `today`, a channel just made on a 1.0 context: what the program gets.
///
/// # Safety
///
/// `today` is a live channel of this library's, which the program does not have yet.
pub(crate) unsafe fn channel_1_0(today: *mut ibv_comp_channel) -> *mut ibv_comp_channel {
    // SAFETY: per the contract.
    let fd = unsafe { (*today).fd };
    let legacy = Box::into_raw(Box::new(ibv_comp_channel_1_0 { fd }));
    made().push((legacy as usize, today as usize));
    legacy.cast()
}

/// Today's channel that `channel` stands for if it is a 1.0 channel; else `channel` itself.
pub(crate) fn today_channel(channel: *mut ibv_comp_channel) -> *mut ibv_comp_channel {
    let made = made();
    let found = made.iter().find(|&&(legacy, _)| legacy == channel as usize);
    found.map_or(channel, |&(_, today)| today as *mut ibv_comp_channel)
}

/// Frees `channel` if it is a 1.0 channel, whose channel of today has just been destroyed.
pub(crate) fn forget_channel(channel: *mut ibv_comp_channel) {
    let mut made = made();
    if let Some(at) = made
        .iter()
        .position(|&(legacy, _)| legacy == channel as usize)
    {
        made.swap_remove(at);
        // SAFETY: a 1.0 channel is a leaked box of `channel_1_0`'s, freed once, here.
        drop(unsafe { Box::from_raw(channel.cast::<ibv_comp_channel_1_0>()) });
    }
}
