//! The scale programs reach: a million regions and windows in a device's key tables, and a
//! hundred thousand through the verbs. Registrations ran out of keys at 31 regions, 63 or 125
//! (issue 50): each key was drawn free in both key tables at once, and the two tables' slots
//! filled between them. In a test binary of their own, so that their work does not load the
//! CPU under the library's timing tests.

use softroce::memory::{Access, MemoryTable, MwType};
use softroce::prelude::*;
use softroce::wire::Qpn;

const QP: Qpn = Qpn::new(0x20);

/// A million regions registered, all deregistered, and a million again, then a million windows
/// allocated and deallocated, each key reaching what it names.
#[test]
fn a_million_regions_and_windows_register_and_go() {
    const N: usize = 1_000_000;
    let mut t = MemoryTable::new(11);
    let pd = t.alloc_pd();
    for round in 0..2 {
        let regions: Vec<MemoryRegion> = (0..N)
            .map(|i| {
                let made = t.register(pd, i as u64 * 8, 8, Access::REMOTE_WRITE);
                made.unwrap_or_else(|e| panic!("round {round}, region {i}: {e}"))
            })
            .collect();
        assert_eq!(t.regions(), N);
        for (i, region) in regions.iter().enumerate().step_by(997) {
            let at = i as u64 * 8;
            let span = t.check_remote(region.rkey(), (pd, QP), at, 8, Access::REMOTE_WRITE);
            assert!(span.is_ok(), "round {round}, region {i}");
            assert!(t
                .check_local(region.lkey(), pd, at, 8, Access::NONE)
                .is_ok());
        }
        for region in &regions {
            t.deregister(region.lkey()).unwrap();
        }
        assert_eq!(t.regions(), 0);
    }
    let windows: Vec<_> = (0..N)
        .map(|i| {
            let made = t.alloc_mw(pd, MwType::Type1);
            made.unwrap_or_else(|e| panic!("window {i}: {e}"))
        })
        .collect();
    assert_eq!(t.window_count(), N);
    for rkey in windows {
        t.dealloc_mw(rkey).unwrap();
    }
    assert_eq!(t.window_count(), 0);
}

/// Through the verbs: 100,000 regions registered, deregistered and registered again, each
/// reached through its handle, and 100,000 windows.
#[test]
fn a_hundred_thousand_regions_and_windows_through_the_verbs() {
    const N: usize = 100_000;
    let device = Device::open(DeviceConfig::udp("127.0.0.50".parse().unwrap())).unwrap();
    let pd = device.alloc_pd().unwrap();
    let before = device.resources().unwrap().regions;
    for round in 0..2 {
        let regions: Vec<MemoryRegion> = (0..N)
            .map(|i| {
                let made = pd.register(8, Access::LOCAL_WRITE);
                made.unwrap_or_else(|e| panic!("round {round}, region {i}: {e}"))
            })
            .collect();
        assert_eq!(device.resources().unwrap().regions, before + N);
        for region in regions.iter().step_by(997) {
            region.write(0, b"reached").unwrap();
        }
        for region in &regions {
            pd.deregister(region).unwrap();
        }
        drop(regions);
        assert_eq!(device.resources().unwrap().regions, before);
    }
    let windows: Vec<_> = (0..N)
        .map(|i| {
            let made = pd.alloc_mw(MwType::Type2);
            made.unwrap_or_else(|e| panic!("window {i}: {e}"))
        })
        .collect();
    drop(windows);
}
