//! The RDMA-CM ports a group's members hold, and the program that steers requests to them.
//!
//! A port is an entry of the record's ports table: its key (port space and number) and its
//! holder (the place and generation of the member). A port whose holder is gone (its place's
//! byte lock free, or taken by a later member) is free, so a killed process's ports are free
//! at once. Every change rewrites the group's program from the table, with the group lock held.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::registry::{Registry, MAX_PORTS};
use super::{steering, GroupMember};

/// An RDMA-CM port a member holds on the address; given back when dropped.
#[derive(Debug)]
pub struct PortBinding {
    member: Arc<GroupMember>,
    key: u32,
    port: u16,
}

impl PortBinding {
    /// The port held.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortBinding {
    fn drop(&mut self) {
        let member = &self.member;
        // The group lock first, then `held`, as `bind_port` takes them.
        let group = member.registry.lock_group();
        let mut held = member.held_lock();
        let Some((index, count)) = held.get_mut(&self.key) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        let index = *index;
        held.remove(&self.key);
        drop(held);
        if group.is_ok() {
            let _ = member.free_port(index);
        }
    }
}

/// Whether the member the ports table names by `holder` is alive; `me` is the caller's place
/// and holder (its own byte lock does not show in its own open of the record).
fn alive(registry: &Registry, me: (u8, u32), holder: u32) -> bool {
    let place = (holder & 0xff) as u8;
    let alive = (place, holder) == me || registry.held_by_another(place).unwrap_or(false);
    alive && registry.generation(place).ok() == Some(holder >> 8)
}

/// Gives the group (through `own`, any of its sockets) the program for the ports its living
/// members hold, and `default`, a living member's place, for requests no port names. Called
/// with the group lock held.
pub(super) fn steer(
    registry: &Registry,
    me: (u8, u32),
    own: &OwnedFd,
    default: u8,
) -> io::Result<()> {
    let services: Vec<(u32, u8)> = registry
        .ports()?
        .into_iter()
        .filter(|&(_, key, holder)| key != 0 && alive(registry, me, holder))
        .map(|(_, key, holder)| (key, (holder & 0xff) as u8))
        .collect();
    steering::attach(own, &services, default)
}

impl GroupMember {
    pub(super) fn held_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u32, (usize, usize)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn me(&self) -> (u8, u32) {
        (self.place, self.holder())
    }

    fn steer(&self) -> io::Result<()> {
        steer(&self.registry, self.me(), &self.own_socket()?, self.place)
    }

    /// Frees entry `index` if it is still this member's, and steers without it.
    fn free_port(&self, index: usize) -> io::Result<()> {
        let ports = self.registry.ports()?;
        if ports.get(index).map(|&(_, _, h)| h) == Some(self.holder()) {
            self.registry.set_port(index, 0, 0)?;
        }
        self.steer()
    }

    /// Holds RDMA-CM port `port` (not 0) of port space `space` (its number, as in the service
    /// ID) on the address for this member: REQs and SIDR_REQs for it come here.
    /// `EADDRINUSE` if a living member holds it.
    pub fn bind_port(self: &Arc<Self>, space: u16, port: u16) -> io::Result<PortBinding> {
        let _group = self.registry.lock_group()?;
        let key = (u32::from(space) << 16) | u32::from(port);
        let mut held = self.held_lock();
        if let Some((_, count)) = held.get_mut(&key) {
            *count += 1;
            return Ok(PortBinding {
                member: self.clone(),
                key,
                port,
            });
        }
        let entries = self.registry.ports()?;
        let me = self.me();
        let taken =
            |(_, k, holder): &(usize, u32, u32)| *k == key && alive(&self.registry, me, *holder);
        if port == 0 || entries.iter().any(taken) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "RDMA-CM port {port} of {} is bound by another process",
                    self.address
                ),
            ));
        }
        let free = entries
            .iter()
            .find(|&&(_, k, holder)| k == 0 || !alive(&self.registry, me, holder))
            .map(|&(index, _, _)| index)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "{MAX_PORTS} RDMA-CM ports are bound on {} already",
                        self.address
                    ),
                )
            })?;
        self.registry.set_port(free, key, self.holder())?;
        if let Err(error) = self.steer() {
            // Nothing steers to it: the port is not held.
            let _ = self.free_port(free);
            return Err(error);
        }
        held.insert(key, (free, 1));
        Ok(PortBinding {
            member: self.clone(),
            key,
            port,
        })
    }
}
