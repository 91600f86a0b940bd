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

/// A check a match must also pass, so that numbers that only look like one are left alone.
#[derive(Debug, Clone, Copy)]
enum Check {
    None,
    /// Payment cards: the Luhn checksum (an order number of 16 digits is not a card).
    Luhn,
    /// IBANs: the ISO 13616 mod-97 check.
    Iban,
    /// Userinfo in a URL: not a port followed by a path (`host:8080/users/` before an `@`).
    UrlPassword,
}

/// A built-in detector.
struct Builtin {
    name: &'static str,
    /// A secret (on by default) or personal data (opt-in).
    secret: bool,
    pattern: &'static str,
    /// Whether every match starts with one of a few case-sensitive literals, so the detector
    /// can be searched for through the guard's gate (see the module's documentation).
    gated: bool,
    check: Check,
}

/// The built-in detectors. Each pattern stays inside one JSON string (no quotes), so redacting
/// a JSON output leaves it JSON.
const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "aws_access_key",
        secret: true,
        pattern: r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?-u:\b)",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "github_token",
        secret: true,
        pattern: r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})(?-u:\b)",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "gitlab_token",
        secret: true,
        pattern: r"(?-u:\b)glpat-[A-Za-z0-9_-]{20,}",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "slack_token",
        secret: true,
        pattern: r"(?-u:\b)xox[abposr]-[A-Za-z0-9-]{10,}",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "private_key",
        secret: true,
        // The whole block when its end is there. Otherwise (a cut output, a file's first bytes)
        // the header and everything after it that a key's body can be: base64 runs and the
        // armour's header lines, apart by whitespace or JSON's escaped line breaks. The body is
        // the secret; a word of prose right after a cut key may go with it.
        pattern: r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----(?:[A-Za-z0-9+/=\s\\:,.-]*?-----END [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----|(?:(?:\s|\\[nrt])*(?:(?:Proc-Type|DEK-Info|Version|Comment):[^\r\n\\\x22]*|[A-Za-z0-9+/=]+))*)",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "jwt",
        secret: true,
        pattern: r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        gated: true,
        check: Check::None,
    },
    Builtin {
        name: "authorization_header",
        secret: true,
        // The credential of an `Authorization: Bearer …` / `Basic …` value, however quoted.
        pattern: r"(?i)(?-u:\b)(?:bearer|basic)\s+[A-Za-z0-9._~+/-]{16,}=*",
        gated: false,
        check: Check::None,
    },
    Builtin {
        name: "connection_string_password",
        secret: true,
        // scheme://user:password@host — only the userinfo is redacted, the rest stays readable.
        // The user may be empty (`redis://:password@host`), the password may hold `/` (base64
        // passwords are written unescaped), and the slashes may be JSON-escaped
        // (`postgres:\/\/app:password@db`). A host, port and path before an `@` in the path
        // (`https://host:8080/users/@bob`) is not one: see [`Check::UrlPassword`].
        pattern: r"(?-u:\b)[a-zA-Z][a-zA-Z0-9+.-]{1,30}:(?://|\\/\\/)(?P<secret>[^\s:/@?#'`\x22\\]*:[^\s@'`\x22]+)@",
        gated: false,
        check: Check::UrlPassword,
    },
    Builtin {
        name: "email",
        secret: false,
        pattern: r"(?-u:\b)[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}(?-u:\b)",
        gated: false,
        check: Check::None,
    },
    Builtin {
        name: "payment_card",
        secret: false,
        pattern: r"(?-u:\b)[0-9](?:[ -]?[0-9]){12,18}(?-u:\b)",
        gated: false,
        check: Check::Luhn,
    },
    Builtin {
        name: "iban",
        secret: false,
        pattern: r"(?-u:\b)[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}(?-u:\b)",
        gated: false,
        check: Check::Iban,
    },
    Builtin {
        name: "phone",
        secret: false,
        // International form: + country code, then 7 to 14 more digits in groups.
        pattern: r"\+[0-9]{1,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}(?-u:\b)",
        gated: false,
        check: Check::None,
    },
];

/// The names of the built-in detectors: the secrets, then personal data.
pub fn builtin_names() -> impl Iterator<Item = (&'static str, bool)> {
    BUILTINS.iter().map(|b| (b.name, b.secret))
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

fn passes(check: Check, found: &str) -> bool {
    match check {
        Check::None => true,
        Check::Luhn => luhn(found),
        Check::Iban => iban(found),
        Check::UrlPassword => url_password(found),
    }
}

/// Whether `user:password`, found before an `@` in a URL, is userinfo and not a host, a port and
/// the start of a path (`db.internal:5432/users/` of `https://db.internal:5432/users/@bob`): a
/// password with a `/` (escaped or not) whose part before it is all digits is read as a port.
fn url_password(found: &str) -> bool {
    let Some((_, password)) = found.split_once(':') else {
        return false;
    };
    let before_slash = password.split(['/', '\\']).next().unwrap_or(password);
    let has_slash = before_slash.len() < password.len();
    !(has_slash && !before_slash.is_empty() && before_slash.bytes().all(|b| b.is_ascii_digit()))
}

/// The Luhn checksum over the digits of `text` (separators skipped).
fn luhn(text: &str) -> bool {
    let mut sum = 0;
    let mut digits = 0;
    for (position, digit) in text.bytes().rev().filter(u8::is_ascii_digit).enumerate() {
        let mut value = u32::from(digit - b'0');
        if position % 2 == 1 {
            value *= 2;
            if value > 9 {
                value -= 9;
            }
        }
        sum += value;
        digits += 1;
    }
    (13..=19).contains(&digits) && sum % 10 == 0
}

/// The IBAN check: the first four characters moved to the end, letters as 10-35, mod 97 is 1.
fn iban(text: &str) -> bool {
    let compact: Vec<u8> = text.bytes().filter(|b| *b != b' ').collect();
    if !(15..=34).contains(&compact.len()) {
        return false;
    }
    let (head, tail) = compact.split_at(4);
    let mut remainder: u32 = 0;
    for &byte in tail.iter().chain(head) {
        let value = match byte {
            b'0'..=b'9' => u32::from(byte - b'0'),
            b'A'..=b'Z' => u32::from(byte - b'A') + 10,
            _ => return false,
        };
        remainder = if value >= 10 {
            (remainder * 100 + value) % 97
        } else {
            (remainder * 10 + value) % 97
        };
    }
    remainder == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(section: &str) -> Guard {
        let raw: RawOutputGuard = serde_yaml_ng::from_str(section).unwrap();
        Guard::compile(Some((&raw, "output_guard")), None).unwrap()
    }

    fn all_on() -> Guard {
        guard("{ detectors: { email: redact, payment_card: redact, iban: redact, phone: redact } }")
    }

    /// Each detector on a true sample and on near misses that must stay.
    #[test]
    fn each_detector_finds_its_kind_and_leaves_near_misses() {
        let guard = all_on();
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "aws_access_key",
                "key AKIAIOSFODNN7EXAMPLE here",
                &[
                    "AKIAIOSFODNN7EXAMPL",
                    "AKIAiosfodnn7example",
                    "XAKIAIOSFODNN7EXAMPLE1",
                ],
            ),
            (
                "github_token",
                "ghp_0123456789abcdefghijABCDEFGHIJ012345",
                &["ghp_short", "ghx_0123456789abcdefghijABCDEFGHIJ012345"],
            ),
            (
                "gitlab_token",
                "token glpat-abcdefghij0123456789",
                &["glpat-short"],
            ),
            (
                "slack_token",
                "xoxb-1234567890-abcdefghij",
                &["xoxz-1234567890-abcdefghij", "xoxb-short"],
            ),
            (
                "private_key",
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
                &["-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"],
            ),
            (
                "jwt",
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIzNDU",
                &["eyJhbGciOiJIUzI1NiJ9", "eyJ.eyJ.sig"],
            ),
            (
                "authorization_header",
                "\"Authorization\": \"Bearer abcdefghijklmnop0123\"",
                &["bearer of bad news", "Basic idea"],
            ),
            (
                "connection_string_password",
                "postgres://app:s3cr3t@db.internal:5432/orders",
                &[
                    "https://db.internal:5432/orders",
                    "mailto:bob@acme.com",
                    "https://social.example:8443/users/@alice",
                    "https://medium.com/@alice",
                    "git@github.com:org/repo.git",
                    "https://db.internal:5432/orders?owner=bob@acme.com",
                    "see https://h:80/a and b@c.d",
                ],
            ),
            (
                "email",
                "write to bob@acme.com today",
                &["bob@acme", "@acme.com"],
            ),
            (
                "payment_card",
                "card 4111 1111 1111 1111 on file",
                // 16 digits that fail Luhn: an order number.
                &["order 4111111111111112", "tel 12345"],
            ),
            (
                "iban",
                "IBAN DE89 3704 0044 0532 0130 00",
                &["DE89 3704 0044 0532 0130 01", "AB12"],
            ),
            (
                "phone",
                "call +44 20 7946 0958",
                &["call 2079460958", "+44"],
            ),
        ];
        for (detector, sample, misses) in cases {
            let screened = guard.screen(sample);
            assert!(
                screened.text.contains(&format!("[REDACTED:{detector}]")),
                "{detector}: {}",
                screened.text
            );
            assert!(
                screened.findings.iter().any(|f| &*f.detector == *detector),
                "{detector}"
            );
            for miss in *misses {
                let screened = guard.screen(miss);
                assert!(
                    !screened.findings.iter().any(|f| &*f.detector == *detector),
                    "{detector} found something in the near miss {miss:?}: {}",
                    screened.text
                );
            }
        }
    }

    /// Passwords in URLs as they are written in the wild, each redacted whole, the rest of the
    /// URL left readable (issue 52, item 5: these three went through).
    #[test]
    fn a_password_in_a_url_is_found_however_it_is_written() {
        // The default guard: secrets only (with e-mail addresses on, `x@db.internal` is one).
        let guard = guard("{}");
        for (text, redacted) in [
            (
                "redis://:hunter2hunter2@cache:6379/0",
                "redis://[REDACTED:connection_string_password]@cache:6379/0",
            ),
            (
                "postgres://app:a+b/c9/xyz==@db/orders",
                "postgres://[REDACTED:connection_string_password]@db/orders",
            ),
            (
                r#"{"dsn":"postgres:\/\/app:s3cr3t\/x@db.internal\/orders"}"#,
                r#"{"dsn":"postgres:\/\/[REDACTED:connection_string_password]@db.internal\/orders"}"#,
            ),
            (
                "amqp://guest:gu:est@mq then https://db.internal:5432/x",
                "amqp://[REDACTED:connection_string_password]@mq then https://db.internal:5432/x",
            ),
        ] {
            assert_eq!(guard.screen(text).text, redacted, "{text}");
        }
    }

    /// A private key's body is the secret: a key cut before its end (a cut error text, a file's
    /// first bytes) loses its body with its header, in plain text and in JSON (issue 52, item 5:
    /// only the header was redacted).
    #[test]
    fn a_cut_private_key_loses_its_body_too() {
        let guard = all_on();
        let body = [
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
            "VJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNb",
        ];
        let cut = format!("-----BEGIN PRIVATE KEY-----\n{}\n{}", body[0], body[1]);
        let encrypted = format!(
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,8E1C\n\n{}\n{}",
            body[0], body[1]
        );
        let json = serde_json::json!({ "stderr": cut }).to_string();
        for text in [cut.clone(), encrypted, json, format!("{cut} ")] {
            let screened = guard.screen(&text);
            for part in body {
                assert!(!screened.text.contains(part), "{}", screened.text);
            }
            assert!(
                screened.text.contains("[REDACTED:private_key]"),
                "{}",
                screened.text
            );
        }
        let json = serde_json::json!({ "stderr": cut, "code": 1 }).to_string();
        let screened: serde_json::Value = serde_json::from_str(&guard.screen(&json).text).unwrap();
        assert_eq!(screened["code"], 1, "the JSON stays JSON");
        // Near misses stay.
        for text in [
            "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOC\n-----END PUBLIC KEY-----",
            "the file starts with BEGIN PRIVATE KEY and a body",
            "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE",
        ] {
            assert_eq!(guard.screen(text).text, text);
        }
    }

    /// The gate spares searches, never findings: the gated detectors find what they find
    /// alone, together, and beside the detectors that search on their own.
    #[test]
    fn the_gate_changes_what_is_searched_not_what_is_found() {
        let default = Guard::compile(None, None).unwrap();
        let gated: Vec<&str> = default
            .detectors
            .iter()
            .filter(|d| d.gated)
            .map(|d| &*d.name)
            .collect();
        assert_eq!(
            gated,
            [
                "aws_access_key",
                "github_token",
                "gitlab_token",
                "slack_token",
                "private_key",
                "jwt"
            ]
        );
        let gate = default.gate.as_ref().expect("the default guard has a gate");
        assert!(!gate.is_match(r#"{"text": "nothing to find", "bearer": "ok"}"#));

        // Two gated secrets and two that search alone, in one output.
        let screened = default.screen(
            "AKIAIOSFODNN7EXAMPLE, xoxb-1234567890-abcdefghij, Bearer abcdefghijklmnop0123, \
             postgres://app:s3cr3t@db, AKIAIOSFODNN7EXAMPLF",
        );
        let found: Vec<(&str, usize)> = screened
            .findings
            .iter()
            .map(|f| (&*f.detector, f.matches))
            .collect();
        assert_eq!(
            found,
            [
                ("aws_access_key", 2),
                ("slack_token", 1),
                ("authorization_header", 1),
                ("connection_string_password", 1)
            ]
        );
        // The gate closed, the others still search.
        let screened = default.screen("Bearer abcdefghijklmnop0123 and mysql://u:pw@h");
        assert_eq!(screened.findings.len(), 2, "{:?}", screened.findings);

        // One gated detector in force: no gate, and it searches alone.
        let one = guard("{ secrets: off, detectors: { jwt: block } }");
        assert!(one.gate.is_none());
        let screened = one.screen("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIzNDU");
        assert!(screened.blocked);
    }

    #[test]
    fn secrets_are_redacted_by_default_and_personal_data_is_opt_in() {
        let default = Guard::compile(None, None).unwrap();
        let screened = default.screen(r#"{"key": "AKIAIOSFODNN7EXAMPLE", "mail": "bob@acme.com"}"#);
        assert_eq!(
            screened.text,
            r#"{"key": "[REDACTED:aws_access_key]", "mail": "bob@acme.com"}"#
        );
        assert_eq!(
            screened.findings,
            vec![Finding {
                detector: "aws_access_key".into(),
                matches: 1,
                action: Action::Redact
            }]
        );
        assert!(!screened.blocked);
        // Nothing found: the text is the output itself, not a copy.
        assert!(matches!(
            default.screen("nothing here").text,
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_blocking_detector_withholds_the_output_and_counts_without_values() {
        let guard = guard("{ detectors: { payment_card: block } }");
        let screened = guard
            .screen("cards 4111111111111111 and 5500 0000 0000 0004, key AKIAIOSFODNN7EXAMPLE");
        assert!(screened.blocked);
        assert_eq!(
            screened
                .findings
                .iter()
                .map(|f| (&*f.detector, f.matches, f.action))
                .collect::<Vec<_>>(),
            vec![
                ("aws_access_key", 1, Action::Redact),
                ("payment_card", 2, Action::Block)
            ]
        );
    }

    #[test]
    fn a_tool_section_overrides_the_catalogs() {
        let catalog: RawOutputGuard =
            serde_yaml_ng::from_str("{ detectors: { email: redact, jwt: block } }").unwrap();
        let tool: RawOutputGuard = serde_yaml_ng::from_str(
            "{ secrets: off, custom: [{ name: ticket, pattern: 'TKT-[0-9]{6}', action: block }] }",
        )
        .unwrap();
        let guard = Guard::compile(
            Some((&catalog, "output_guard")),
            Some((&tool, "tools[0].output_guard")),
        )
        .unwrap();
        assert_eq!(
            guard.detectors().collect::<Vec<_>>(),
            vec![("email", Action::Redact), ("ticket", Action::Block)]
        );
        let off: RawOutputGuard = serde_yaml_ng::from_str("{ secrets: off }").unwrap();
        assert!(
            Guard::compile(Some((&off, "output_guard")), None)
                .unwrap()
                .is_off()
        );
    }

    #[test]
    fn load_errors_name_where() {
        let error = |yaml: &str| {
            let raw: RawOutputGuard = serde_yaml_ng::from_str(yaml).unwrap();
            Guard::compile(None, Some((&raw, "tools[2].output_guard")))
                .unwrap_err()
                .to_string()
        };
        assert!(
            error("{ detectors: { emails: redact } }")
                .contains("unknown detector \"emails\" at tools[2].output_guard.detectors")
        );
        assert!(
            error("{ custom: [{ name: Bad-Name, pattern: x }] }")
                .contains("tools[2].output_guard.custom[0].name")
        );
        assert!(error("{ custom: [{ name: jwt, pattern: x }] }").contains("built-in"));
        assert!(
            error("{ custom: [{ name: t, pattern: '(' }] }")
                .contains("invalid pattern at tools[2].output_guard.custom[0].pattern")
        );
        assert!(
            error("{ custom: [{ name: t, pattern: 'a{1000}{1000}' }] }")
                .contains("invalid pattern")
        );
        // A pattern that matches the empty text would redact between every two characters.
        for empty in ["x*", "\\b", "(a|)"] {
            let message = error(&format!(
                "{{ custom: [{{ name: t, pattern: '{empty}' }}] }}"
            ));
            assert!(
                message.contains("matches the empty text"),
                "{empty}: {message}"
            );
        }
    }

    #[test]
    fn a_named_secret_group_is_all_that_is_redacted() {
        let default = Guard::compile(None, None).unwrap();
        assert_eq!(
            default
                .screen("db postgres://app:s3cr3t@db.internal/orders")
                .text,
            "db postgres://[REDACTED:connection_string_password]@db.internal/orders"
        );
        let custom = guard(r"{ custom: [{ name: pin, pattern: 'PIN: (?P<secret>[0-9]{4})' }] }");
        assert_eq!(
            custom.screen("card PIN: 1234 ok").text,
            "card PIN: [REDACTED:pin] ok"
        );
    }

    #[test]
    fn overlapping_matches_are_redacted_once() {
        let guard = Guard::compile(None, None).unwrap();
        let screened = guard.screen(
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIzNDU end",
        );
        assert_eq!(
            screened.text,
            "Authorization: [REDACTED:authorization_header] end"
        );
        assert_eq!(screened.findings.len(), 2);
    }
}
