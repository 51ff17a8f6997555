//! Sluice's decision core, shared by the server and the client: the
//! algorithms as pure arithmetic over an injected time in integer
//! nanoseconds (`algorithm`), and tiered mode's allotments and ledgers
//! (`tiered`), with no I/O and no dependencies, so an app
//! that decides a key in process (issue 23's allotments) runs the same code
//! the owner does without building any of the server.

pub mod algorithm;
pub mod tiered;
