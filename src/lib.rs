//! Sluice: a clustered, in-memory rate limiter.
//!
//! The design is in `DESIGN.md` (shared with the team); each module here is
//! one part of it.

pub mod algorithm;
