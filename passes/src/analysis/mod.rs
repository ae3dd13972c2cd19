//! Analyses: facts about a function that passes, backends and the driver share, kept apart from
//! the rewrites that use them.

pub mod cost;
pub mod memory;
pub mod timeline;
