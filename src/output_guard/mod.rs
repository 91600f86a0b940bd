//! The output guard: what a tool's output may not carry back to the model unnoticed. Named
//! detectors find secrets (cloud keys, source-host and chat tokens, private keys, JWTs,
//! credentials in `Authorization` values and in connection strings) and, when the catalog opts
//! in, personal data (e-mail addresses, payment cards that pass the Luhn check, IBANs that pass
//! their mod-97 check, phone numbers); a catalog adds its own as regexes. Each detector either
//! redacts what it finds (`[REDACTED:<detector>]`) or blocks the whole output.
//!
//! Each detector scans the output once with its own compiled regex. The built-in secret
//! detectors all have a literal (`AKIA`, `ghp_`, `eyJ`, `-----BEGIN`, `://`, …) the regex
//! engine looks for first, at memory speed, so an output with nothing to find costs ~20 µs per
//! 64 KiB for all eight; one `RegexSet` over the same patterns measured 127 µs, since a set
//! cannot use the patterns' literals. Outputs are bounded by the tool's `max_output_bytes`, and
//! the engine's time is linear in the text, so screening is too.
//!
//! The detectors whose every match starts with one of a few case-sensitive literals are also
//! joined into one gate: a regex that matches wherever any of them does. Most outputs have none
//! of those secrets, and one search of the gate instead of one per detector spares what each
//! search costs whatever the text's length (~480 instructions; 256-byte outputs are common).
//! Only when the gate matches do its detectors search one by one, to count and redact.
//!
//! What a screen reports names detectors and counts, never what they matched: it is what the
//! audit log, the metrics and the refusal carry.

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use regex::{Regex, RegexBuilder};

use crate::settings::raw::{RawGuardAction, RawOutputGuard};

mod detectors;
#[cfg(test)]
mod tests;

pub use detectors::builtin_names;
use detectors::{BUILTINS, Check, passes};

/// What a detector does with what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Replaced with `[REDACTED:<detector>]`; the rest of the output is returned.
    Redact,
    /// The output is withheld: the call ends `output_blocked`.
    Block,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Redact => "redact",
            Action::Block => "block",
        }
    }
}

/// Most bytes of a custom pattern's compiled program: a pattern cannot make the guard large.
const MAX_PATTERN_PROGRAM_BYTES: usize = 1 << 20;

/// Why an `output_guard` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("unknown detector {name:?} at {path}; the built-in detectors are {known}")]
    UnknownDetector {
        name: String,
        path: String,
        known: String,
    },
    #[error(
        "invalid detector name {name:?} at {path}: lower-case letters, digits and '_', at most 64"
    )]
    BadName { name: String, path: String },
    #[error("custom detector {name:?} at {path} has the name of a built-in detector")]
    NameTaken { name: String, path: String },
    #[error("invalid pattern at {path}: {error}")]
    Pattern { path: String, error: String },
}

/// A detector in force.
#[derive(Debug)]
struct Detector {
    name: Arc<str>,
    regex: Regex,
    action: Action,
    check: Check,
    /// Whether the pattern names a group `secret`: then only that part of a match is what
    /// the detector finds (and redacts), the rest of the match is context.
    secret_group: bool,
    /// Whether the guard's gate searches for it first.
    gated: bool,
}

/// The group a pattern may name to say which part of its match is the secret.
const SECRET_GROUP: &str = "secret";

/// The compiled detectors of one tool (shared by the tools with the same settings).
#[derive(Debug)]
pub struct Guard {
    detectors: Vec<Detector>,
    /// Matches wherever one of the gated detectors does; `None` when fewer than two are in
    /// force (a gate would only add a search).
    gate: Option<Regex>,
}

/// What a detector found in one output.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub detector: Arc<str>,
    pub matches: usize,
    pub action: Action,
}

/// A screened output.
#[derive(Debug)]
pub struct Screened<'t> {
    /// The output with what redacting detectors found replaced (unchanged when none did).
    pub text: Cow<'t, str>,
    /// Every detector that found something, in the guard's order.
    pub findings: Vec<Finding>,
    /// Whether a blocking detector found something: the output must not be returned.
    pub blocked: bool,
}

impl Guard {
    /// The detectors in force for a tool: the catalog's section, then the tool's over it (its
    /// `secrets` and each detector it names replace the catalog's; its custom detectors are
    /// added, replacing the catalog's of the same name). Without either, every secret detector
    /// redacts.
    pub fn compile(
        catalog: Option<(&RawOutputGuard, &str)>,
        tool: Option<(&RawOutputGuard, &str)>,
    ) -> Result<Guard, GuardError> {
        let mut secrets = RawGuardAction::Redact;
        let mut actions: BTreeMap<&str, RawGuardAction> = BTreeMap::new();
        let mut custom: BTreeMap<&str, (&str, RawGuardAction, String)> = BTreeMap::new();
        for (section, path) in catalog.into_iter().chain(tool) {
            if let Some(action) = section.secrets {
                secrets = action;
                // A tool's `secrets` replaces the catalog's per-secret settings too.
                actions.retain(|name, _| !is_secret(name));
            }
            for (name, action) in &section.detectors {
                if !BUILTINS.iter().any(|b| b.name == name) {
                    return Err(GuardError::UnknownDetector {
                        name: name.clone(),
                        path: format!("{path}.detectors"),
                        known: BUILTINS
                            .iter()
                            .map(|b| b.name)
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
                actions.insert(name, *action);
            }
            for (index, detector) in section.custom.iter().enumerate() {
                let at = format!("{path}.custom[{index}]");
                let valid = !detector.name.is_empty()
                    && detector.name.len() <= 64
                    && detector
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !valid {
                    return Err(GuardError::BadName {
                        name: detector.name.clone(),
                        path: format!("{at}.name"),
                    });
                }
                if BUILTINS.iter().any(|b| b.name == detector.name) {
                    return Err(GuardError::NameTaken {
                        name: detector.name.clone(),
                        path: format!("{at}.name"),
                    });
                }
                custom.insert(
                    &detector.name,
                    (&detector.pattern, detector.action, format!("{at}.pattern")),
                );
            }
        }
        let mut detectors = Vec::new();
        // The patterns of the gated detectors in force, joined into the gate below.
        let mut gated = Vec::new();
        for builtin in BUILTINS {
            let action = match actions.get(builtin.name) {
                Some(action) => *action,
                None if builtin.secret => secrets,
                None => RawGuardAction::Off,
            };
            if let Some(action) = active(action) {
                detectors.push(Detector::new(
                    builtin.name,
                    regex(builtin.pattern, builtin.name)?,
                    action,
                    builtin.check,
                    builtin.gated,
                ));
                if builtin.gated {
                    gated.push(format!("(?:{})", builtin.pattern));
                }
            }
        }
        for (name, (pattern, action, path)) in custom {
            // One that can match the empty text would redact between every two characters.
            let hir = regex_syntax::parse(pattern).map_err(|error| GuardError::Pattern {
                path: path.clone(),
                error: error.to_string(),
            })?;
            if hir.properties().minimum_len() == Some(0) {
                return Err(GuardError::Pattern {
                    path,
                    error:
                        "it matches the empty text; a detector must match at least one character"
                            .to_owned(),
                });
            }
            if let Some(action) = active(action) {
                detectors.push(Detector::new(
                    name,
                    regex(pattern, &path)?,
                    action,
                    Check::None,
                    false,
                ));
            }
        }
        let gate = match gated.len() {
            0 | 1 => None,
            _ => Some(regex(
                &gated.join("|"),
                "the gate of the built-in secret detectors",
            )?),
        };
        if gate.is_none() {
            // Without a gate each detector searches on its own.
            detectors.iter_mut().for_each(|d| d.gated = false);
        }
        Ok(Guard { detectors, gate })
    }

    /// Whether no detector is in force (the output is returned as it is).
    pub fn is_off(&self) -> bool {
        self.detectors.is_empty()
    }

    /// The names and actions of the detectors in force, in order.
    pub fn detectors(&self) -> impl Iterator<Item = (&str, Action)> {
        self.detectors.iter().map(|d| (&*d.name, d.action))
    }

    /// Screens `text`: each detector in force looks for its matches, once.
    pub fn screen<'t>(&self, text: &'t str) -> Screened<'t> {
        let mut findings = Vec::new();
        let mut redactions: Vec<(usize, usize, usize)> = Vec::new();
        let mut blocked = false;
        if self.detectors.is_empty() {
            return Screened {
                text: Cow::Borrowed(text),
                findings,
                blocked,
            };
        }
        // The gated detectors cannot find anything where their gate does not match.
        let gate_closed = self.gate.as_ref().is_some_and(|gate| !gate.is_match(text));
        for (index, detector) in self.detectors.iter().enumerate() {
            if gate_closed && detector.gated {
                continue;
            }
            let mut matches = 0;
            detector.each_match(text, |found| {
                if found.is_empty() || !passes(detector.check, found.as_str()) {
                    return;
                }
                matches += 1;
                if detector.action == Action::Redact {
                    redactions.push((found.start(), found.end(), index));
                }
            });
            if matches > 0 {
                blocked |= detector.action == Action::Block;
                findings.push(Finding {
                    detector: detector.name.clone(),
                    matches,
                    action: detector.action,
                });
            }
        }
        if blocked || redactions.is_empty() {
            return Screened {
                text: Cow::Borrowed(text),
                findings,
                blocked,
            };
        }
        // Overlapping matches (a JWT inside a bearer credential) are redacted once, as the
        // earlier one; its end is the furthest of those it covers.
        redactions.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        let mut pending: Option<(usize, usize, usize)> = None;
        for (start, end, index) in redactions {
            match &mut pending {
                Some((_, pending_end, _)) if start < *pending_end => {
                    *pending_end = (*pending_end).max(end);
                }
                _ => {
                    if let Some(done) = pending.take() {
                        at = self.replace(text, at, done, &mut out);
                    }
                    pending = Some((start, end, index));
                }
            }
        }
        if let Some(done) = pending {
            at = self.replace(text, at, done, &mut out);
        }
        out.push_str(&text[at..]);
        Screened {
            text: Cow::Owned(out),
            findings,
            blocked,
        }
    }

    fn replace(
        &self,
        text: &str,
        at: usize,
        (start, end, index): (usize, usize, usize),
        out: &mut String,
    ) -> usize {
        out.push_str(&text[at..start]);
        out.push_str("[REDACTED:");
        out.push_str(&self.detectors[index].name);
        out.push(']');
        end
    }
}

impl Detector {
    fn new(name: &str, regex: Regex, action: Action, check: Check, gated: bool) -> Self {
        let secret_group = regex.capture_names().any(|n| n == Some(SECRET_GROUP));
        Detector {
            name: name.into(),
            regex,
            action,
            check,
            secret_group,
            gated,
        }
    }

    /// Calls `found` with each thing the detector finds: the match, or its `secret` group.
    fn each_match<'t>(&self, text: &'t str, mut found: impl FnMut(regex::Match<'t>)) {
        if !self.secret_group {
            self.regex.find_iter(text).for_each(found);
            return;
        }
        for captures in self.regex.captures_iter(text) {
            if let Some(secret) = captures.name(SECRET_GROUP) {
                found(secret);
            }
        }
    }
}

fn is_secret(name: &str) -> bool {
    BUILTINS.iter().any(|b| b.name == name && b.secret)
}

fn active(action: RawGuardAction) -> Option<Action> {
    match action {
        RawGuardAction::Redact => Some(Action::Redact),
        RawGuardAction::Block => Some(Action::Block),
        RawGuardAction::Off => None,
    }
}

fn regex(pattern: &str, path: &str) -> Result<Regex, GuardError> {
    RegexBuilder::new(pattern)
        .size_limit(MAX_PATTERN_PROGRAM_BYTES)
        .build()
        .map_err(|error| GuardError::Pattern {
            path: path.to_owned(),
            error: error.to_string(),
        })
}
