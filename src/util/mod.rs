//! Small helpers that any layer may use: duration parsing, hashing, invalid settings,
//! the slot of a rebuilt actor, outside text made fit for a message, the W3C trace
//! context of the current span. Leaves: they import nothing else from the crate.

pub mod duration;
pub mod hash;
pub mod invalid;
#[cfg(test)]
pub(crate) mod scratch;
pub mod slot;
pub mod text;
pub mod trace_context;
