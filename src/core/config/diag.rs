//! Config diagnostics: every problem found while checking a pipeline, collected
//! (never stop at the first) and rendered as `path:line:col: stage "name": message`.

use std::fmt;

use super::node::Span;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    /// The stage (or provider, written `provider "x"`) the problem belongs to.
    pub subject: Option<String>,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.span)?;
        if self.severity == Severity::Warning {
            write!(f, "warning: ")?;
        }
        if let Some(subject) = &self.subject {
            write!(f, "{subject}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// A collection of diagnostics, kept in the order they were found.
#[derive(Debug, Default, Clone)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn error(&mut self, span: &Span, subject: Option<&str>, message: impl Into<String>) {
        self.push(Severity::Error, span, subject, message.into());
    }

    pub fn warning(&mut self, span: &Span, subject: Option<&str>, message: impl Into<String>) {
        self.push(Severity::Warning, span, subject, message.into());
    }

    fn push(&mut self, severity: Severity, span: &Span, subject: Option<&str>, message: String) {
        self.items.push(Diagnostic { severity, span: span.clone(), subject: subject.map(str::to_string), message });
    }

    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub fn has_errors(&self) -> bool {
        self.items.iter().any(|d| d.severity == Severity::Error)
    }

    pub fn n_errors(&self) -> usize {
        self.items.iter().filter(|d| d.severity == Severity::Error).count()
    }

    pub fn n_warnings(&self) -> usize {
        self.items.iter().filter(|d| d.severity == Severity::Warning).count()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// Turn every warning into an error (`--deny-warnings`).
    pub fn deny_warnings(&mut self) {
        for d in &mut self.items {
            d.severity = Severity::Error;
        }
    }

    /// Sort by file position so output reads top to bottom (stable for equal spans).
    pub fn sort(&mut self) {
        self.items.sort_by_key(|d| match &d.span.origin {
            super::node::Origin::File(_) => (0, d.span.start),
            super::node::Origin::Arg(_) => (1, 0),
            super::node::Origin::Builtin => (2, 0),
        });
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            writeln!(f, "{d}")?;
        }
        Ok(())
    }
}

/// `stage "name"` — the subject prefix used for stage diagnostics.
pub fn stage_subject(name: &str) -> String {
    format!("stage \"{name}\"")
}

/// A "did you mean" hint for `word` among `candidates`: the closest by edit distance
/// (transpositions count once), if close enough for its length.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (strsim::damerau_levenshtein(&word.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, c.to_string()))
        .map(|(_, c)| format!(" (did you mean \"{c}\"?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_finds_close_words() {
        assert_eq!(did_you_mean("profils", ["profiles", "personas"]).unwrap(), " (did you mean \"profiles\"?)");
        assert!(did_you_mean("zzz", ["profiles"]).is_none());
        assert_eq!(did_you_mean("hwo", ["how", "n"]).unwrap(), " (did you mean \"how\"?)");
    }
}
