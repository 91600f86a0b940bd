//! Allow and deny lists of tool-name globs (policy, tenants, agents), each entry optionally with
//! a condition, compiled once: deny wins, and a list with an allow part admits only what it
//! matches. A condition that cannot be evaluated decides closed: a deny entry denies, an allow
//! entry does not allow. Each decision names the entry that made it, for refusals and
//! explanations.

use super::*;
use crate::conditions::{Condition, Evaluation, Input};
use crate::settings::raw::RawRule;

/// A glob over tool names, kept with its text so refusals can name it, and where the catalog
/// defines it (e.g. `tenants.globex.deny[0]`) so explanations can point at it; with the
/// condition of its entry, if it has one.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub text: String,
    pub location: String,
    matcher: GlobMatcher,
    /// The entry applies only when this holds (`when:`).
    pub when: Option<Arc<Condition>>,
}

impl Pattern {
    fn compile(text: &str, path: &str, when: Option<Arc<Condition>>) -> Result<Self, FieldError> {
        let glob = Glob::new(text)
            .map_err(|err| FieldError::new(path, format!("invalid glob {text:?}: {err}")))?;
        Ok(Pattern {
            text: text.to_owned(),
            location: path.to_owned(),
            matcher: glob.compile_matcher(),
            when,
        })
    }

    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.is_match(tool)
    }

    /// Whether the entry applies to this call: always without a condition.
    pub fn applies(&self, input: &Input<'_>) -> Evaluation {
        match &self.when {
            None => Evaluation::Holds(true),
            Some(condition) => input.evaluate_at(|| self.location.clone(), condition),
        }
    }
}

/// Allow and deny entries; deny wins, and a set allow list admits only what it matches.
#[derive(Debug, Clone, Default)]
pub struct AccessList {
    pub allow: Option<Vec<Pattern>>,
    pub deny: Vec<Pattern>,
    /// Where the catalog defines the list, e.g. `tenants.globex` or `policy`.
    pub location: String,
}

/// What decided an access list's answer for one tool.
#[derive(Debug, Clone)]
pub enum Verdict<'a> {
    /// Admitted: by this allow pattern, or with no allow list set (`None`).
    Allowed(Option<&'a Pattern>),
    /// This deny pattern matched (and its condition held).
    Denied(&'a Pattern),
    /// This deny pattern matched and its condition could not be evaluated: denied, closed.
    DeniedOnError(&'a Pattern, String),
    /// An allow list is set and nothing in it admitted the tool; with the first allow entry
    /// whose condition could not be evaluated, if one did not.
    NotAllowed(Option<(&'a Pattern, String)>),
}

/// A list's answer, and whether it is only provisional: a matching entry's condition reads the
/// call (`args`, `now`, `run`), which is not known yet (ListTools, stage 4). A provisional
/// answer admits; the chain decides again once the arguments are bound.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub verdict: Verdict<'a>,
    pub provisional: bool,
}

impl AccessList {
    /// Whether an entry's condition can take long to evaluate on a call
    /// ([`Condition::may_take_long`]).
    pub fn conditions_take_long(&self) -> bool {
        self.deny
            .iter()
            .chain(self.allow.iter().flatten())
            .filter_map(|pattern| pattern.when.as_deref())
            .any(Condition::may_take_long)
    }

    /// The list's answer for `tool` and the entry that gave it: deny first, then allow.
    pub fn decide(&self, tool: &str, input: &Input<'_>) -> Decision<'_> {
        let mut provisional = false;
        for pattern in self.deny.iter().filter(|p| p.matches(tool)) {
            let verdict = match pattern.applies(input) {
                Evaluation::Holds(true) => Verdict::Denied(pattern),
                Evaluation::Failed(error) => Verdict::DeniedOnError(pattern, error),
                Evaluation::Unknown => {
                    provisional = true;
                    continue;
                }
                Evaluation::Holds(false) => continue,
            };
            return Decision {
                verdict,
                provisional: false,
            };
        }
        let Some(allow) = &self.allow else {
            return Decision {
                verdict: Verdict::Allowed(None),
                provisional,
            };
        };
        let mut failed = None;
        let mut pending = None;
        for pattern in allow.iter().filter(|p| p.matches(tool)) {
            match pattern.applies(input) {
                Evaluation::Holds(true) => {
                    return Decision {
                        verdict: Verdict::Allowed(Some(pattern)),
                        provisional,
                    };
                }
                Evaluation::Failed(error) => {
                    failed.get_or_insert((pattern, error));
                }
                Evaluation::Unknown => {
                    pending.get_or_insert(pattern);
                }
                Evaluation::Holds(false) => {}
            }
        }
        match pending {
            Some(pattern) => Decision {
                verdict: Verdict::Allowed(Some(pattern)),
                provisional: true,
            },
            None => Decision {
                verdict: Verdict::NotAllowed(failed),
                provisional: false,
            },
        }
    }

    pub(super) fn build(
        allow: &Option<Vec<RawRule>>,
        deny: &[RawRule],
        path: &str,
        tool_names: &BTreeSet<&str>,
    ) -> Result<Self, FieldError> {
        let compile_all = |entries: &[RawRule], field: &str| -> Result<Vec<Pattern>, FieldError> {
            let mut patterns = Vec::new();
            for (i, entry) in entries.iter().enumerate() {
                let at = format!("{path}.{field}[{i}]");
                match entry {
                    RawRule::Glob(text) => {
                        patterns.push(compile_glob(text, &at, None, tool_names)?)
                    }
                    RawRule::Conditional(rule) => {
                        let condition = Condition::compile(&rule.when).map_err(|err| {
                            FieldError::new(
                                format!("{at}.when"),
                                format!("invalid condition {:?}: {err}", rule.when),
                            )
                        })?;
                        let condition = Arc::new(condition);
                        if rule.tools.is_empty() {
                            return Err(FieldError::new(
                                format!("{at}.tools"),
                                "a conditional entry needs at least one tool-name glob",
                            ));
                        }
                        for (j, text) in rule.tools.iter().enumerate() {
                            let glob_at = format!("{at}.tools[{j}]");
                            let mut pattern =
                                compile_glob(text, &glob_at, Some(condition.clone()), tool_names)?;
                            // Refusals and explanations name the entry, whose condition it is.
                            pattern.location = at.clone();
                            patterns.push(pattern);
                        }
                    }
                }
            }
            Ok(patterns)
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

/// A glob at `at`, which must match a tool of the catalog.
fn compile_glob(
    text: &str,
    at: &str,
    when: Option<Arc<Condition>>,
    tool_names: &BTreeSet<&str>,
) -> Result<Pattern, FieldError> {
    let pattern = Pattern::compile(text, at, when)?;
    // A pattern that matches nothing is almost always a typo that silently widens or narrows
    // access.
    if !tool_names.iter().any(|name| pattern.matches(name)) {
        return Err(FieldError::new(
            at,
            format!("pattern {text:?} matches no tool in the catalog"),
        ));
    }
    Ok(pattern)
}

/// One tenant's policy.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    pub access: AccessList,
    pub rate_limit: Option<Rate>,
}
