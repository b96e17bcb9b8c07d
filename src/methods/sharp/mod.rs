//! SHARP / role-relationship fidelity (Kong et al., arXiv:2411.07965 v1,
//! `../shared/papers/relationship-fidelity.txt`; spec `../shared/specs/sharp.md`):
//! commonsense claims from ConceptNet put to a role-play agent by roles it loves and
//! hates, stance detection, SR / AR / ER / CRF. Here: ConceptNet lines, the claim filter
//! and rendering ([`conceptnet`]), counterfactual rules ([`counterfact`], lexicon in
//! `rules/sharp/`), the labels and metrics ([`metrics`]), the stance parser
//! ([`parsers`]) and its offline stand-in ([`offline`]), the roles file and Appendix B's turn
//! ([`roles`], seeds in `seeds/sharp/`), the stage kinds ([`stages`]).

use super::Method;

pub mod conceptnet;
pub mod counterfact;
pub mod metrics;
pub mod offline;
pub mod parsers;
pub mod roles;
pub mod stages;

pub static METHOD: Method = Method {
    name: "sharp",
    about: "relationship fidelity: ConceptNet claims put to a role-play agent by roles of high / low affection, stance detection, SR / AR / ER / CRF (Kong et al., 2024)",
    kinds: &[&stages::claims::KIND, &stages::turns::KIND, &stages::metrics::KIND],
    parsers: parsers::KINDS,
    shapes: offline::SHAPES,
};
