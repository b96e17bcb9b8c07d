//! SHARP's stage kinds, one file each, named `sharp_<file stem>`: claims from a
//! ConceptNet dump (`claims`).

pub mod claims;
