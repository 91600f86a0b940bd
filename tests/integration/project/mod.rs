//! The project holds together: module floors, documentation links.

pub(crate) mod architecture;
pub(crate) mod docs;
