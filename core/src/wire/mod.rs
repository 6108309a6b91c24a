//! Conversions between domain types and the wire (prost) types.
//!
//! Encoding (agent side) is infallible. Decoding (collector side) is where untrusted input
//! enters: [`decode_batch`] and [`decode_hello`] validate everything against [`Limits`]
//! and say precisely what was wrong, so a bad batch is refused with a reason and nothing
//! else is affected.
//!
//! Layout: `encode` (domain → wire), `limits` (the bounds and the checks decoding
//! makes), `decode` (wire → domain, validated).

mod decode;
mod encode;
mod limits;
#[cfg(test)]
mod tests;

pub use decode::{HelloInfo, decode_batch, decode_hello};
pub use limits::{Invalid, Limits};
