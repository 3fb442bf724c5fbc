//! The one macro behind every fixed-length header view, so that the length check, the
//! constructors and the `HeaderRepr` glue are written once.

/// Declares a zero-copy view `$view<T>` over a header of `$len` bytes, and implements
/// [`HeaderRepr`](crate::wire::HeaderRepr) for `$repr` through it.
///
/// `$repr` must provide `fn parse<T: AsRef<[u8]>>(view: &$view<T>) -> Result<Self>` and
/// `fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut $view<T>)`.
macro_rules! header_view {
    ($(#[$meta:meta])* $view:ident, $repr:ident, $layer:expr, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $view<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $view<T> {
            /// The header's length on the wire, in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors may then panic.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Checks that the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                let available = self.buffer.as_ref().len();
                if available < $len {
                    return Err($crate::wire::Error::Truncated {
                        layer: $layer,
                        needed: $len,
                        available,
                    });
                }
                Ok(())
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes, without whatever follows it in the buffer.
            pub fn header_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..$len]
            }

            /// The header's bytes as an array: the accessors' constant offsets into it need no
            /// bounds check of their own, and the one length check here is shared by every
            /// accessor a parse or an emit inlines (a BTH's parse was 103 instructions with a
            /// check per field). Panics on a short buffer, as `new_unchecked` warns.
            fn bytes(&self) -> &[u8; $len] {
                self.buffer
                    .as_ref()
                    .first_chunk()
                    .expect("a header view over fewer bytes than its header")
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            fn bytes_mut(&mut self) -> &mut [u8; $len] {
                self.buffer
                    .as_mut()
                    .first_chunk_mut()
                    .expect("a header view over fewer bytes than its header")
            }
        }

        impl $crate::wire::HeaderRepr for $repr {
            const LEN: usize = $len;
            const LAYER: $crate::wire::Layer = $layer;

            fn parse_bytes(bytes: &[u8]) -> $crate::wire::Result<Self> {
                Self::parse(&$view::new_checked(bytes)?)
            }

            fn emit_bytes(&self, bytes: &mut [u8]) -> $crate::wire::Result<()> {
                let mut view = $view::new_checked(bytes)?;
                self.emit(&mut view);
                Ok(())
            }
        }
    };
}
