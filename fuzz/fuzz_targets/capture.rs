//! Capture files, as `softroce decode` reads them: a corrupt file is an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = softroce::decode::decode_capture(data, |_| {});
});
