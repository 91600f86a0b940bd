//! Allow and deny lists of tool-name globs (policy, tenants, agents), compiled once: deny wins,
//! and a list with an allow part admits only what it matches. Each decision names the rule that
//! made it, for refusals and explanations.

use super::*;

/// A glob over tool names, kept with its text so refusals can name it, and where the catalog
/// defines it (e.g. `tenants.globex.deny[0]`) so explanations can point at it.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub text: String,
    pub location: String,
    matcher: GlobMatcher,
}

impl Pattern {
    fn compile(text: &str, path: &str) -> Result<Self, FieldError> {
        let glob = Glob::new(text)
            .map_err(|err| FieldError::new(path, format!("invalid glob {text:?}: {err}")))?;
        Ok(Pattern {
            text: text.to_owned(),
            location: path.to_owned(),
            matcher: glob.compile_matcher(),
        })
    }

    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.is_match(tool)
    }
}

/// Allow and deny globs; deny wins, and a set allow list admits only what it matches.
#[derive(Debug, Clone, Default)]
pub struct AccessList {
    pub allow: Option<Vec<Pattern>>,
    pub deny: Vec<Pattern>,
    /// Where the catalog defines the list, e.g. `tenants.globex` or `policy`.
    pub location: String,
}

/// What decided an access list's answer for one tool.
#[derive(Debug, Clone, Copy)]
pub enum Verdict<'a> {
    /// Admitted: by this allow pattern, or with no allow list set (`None`).
    Allowed(Option<&'a Pattern>),
    /// This deny pattern matched.
    Denied(&'a Pattern),
    /// An allow list is set and nothing in it matched.
    NotAllowed,
}

/// Why an access list refused a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessDenial {
    /// A deny pattern matched.
    Denied(String),
    /// An allow list is set and nothing in it matched.
    NotAllowed,
}

impl AccessList {
    pub fn check(&self, tool: &str) -> Result<(), AccessDenial> {
        match self.decide(tool) {
            Verdict::Allowed(_) => Ok(()),
            Verdict::Denied(hit) => Err(AccessDenial::Denied(hit.text.clone())),
            Verdict::NotAllowed => Err(AccessDenial::NotAllowed),
        }
    }

    /// The list's answer for `tool` and the pattern that gave it: deny first, then allow.
    pub fn decide(&self, tool: &str) -> Verdict<'_> {
        if let Some(hit) = self.deny.iter().find(|p| p.matches(tool)) {
            return Verdict::Denied(hit);
        }
        match &self.allow {
            Some(allow) => match allow.iter().find(|p| p.matches(tool)) {
                Some(hit) => Verdict::Allowed(Some(hit)),
                None => Verdict::NotAllowed,
            },
            None => Verdict::Allowed(None),
        }
    }

    pub(super) fn build(
        allow: &Option<Vec<String>>,
        deny: &[String],
        path: &str,
        tool_names: &BTreeSet<&str>,
    ) -> Result<Self, FieldError> {
        let compile_all = |texts: &[String], field: &str| {
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    let at = format!("{path}.{field}[{i}]");
                    let pattern = Pattern::compile(text, &at)?;
                    // A pattern that matches nothing is almost always a typo that silently
                    // widens or narrows access.
                    if !tool_names.iter().any(|name| pattern.matches(name)) {
                        return Err(FieldError::new(
                            at,
                            format!("pattern {text:?} matches no tool in the catalog"),
                        ));
                    }
                    Ok(pattern)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(AccessList {
            allow: allow
                .as_ref()
                .map(|a| compile_all(a, "allow"))
                .transpose()?,
            deny: compile_all(deny, "deny")?,
            location: path.to_owned(),
        })
    }
}

/// One tenant's policy.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    pub access: AccessList,
    pub rate_limit: Option<Rate>,
}
