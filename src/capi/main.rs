//! softroce's `libibverbs.so.1` and `librdmacm.so.1`: this "binary" is linked as a shared
//! object (see `build.rs`), and every symbol it exports comes from the `softroce_capi` library.
#![no_main]

use softroce_capi as _;
