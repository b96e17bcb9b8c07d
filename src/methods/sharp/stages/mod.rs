//! SHARP's stage kinds, one file each, named `sharp_<file stem>`: claims from a ConceptNet
//! dump (`claims`), their human check (`verify`), roles from a relationship table and
//! dialogue logs (`roles`), the claims × roles grid with Appendix B's turn (`turns`),
//! self-consistency over stance samples (`vote`), the metrics and the paper's tables as
//! summaries (`metrics`, `transfer`), the card of a run (`card`).

pub mod card;
pub mod claims;
pub mod metrics;
pub mod roles;
pub mod transfer;
pub mod turns;
pub mod verify;
pub mod vote;
