//! SHARP's stage kinds, one file each, named `sharp_<file stem>`: claims from a
//! ConceptNet dump (`claims`), the claims × roles grid with Appendix B's turn (`turns`),
//! the labels and metrics as a summary (`metrics`).

pub mod claims;
pub mod metrics;
pub mod turns;
