//! The built-in detectors: their patterns, and the checks a match must also pass (Luhn, mod 97, a URL's userinfo).

/// A check a match must also pass, so that numbers that only look like one are left alone.
#[derive(Debug, Clone, Copy)]
pub(super) enum Check {
    None,
    /// Payment cards: the Luhn checksum (an order number of 16 digits is not a card).
    Luhn,
    /// IBANs: the ISO 13616 mod-97 check.
    Iban,
    /// Userinfo in a URL: not a port followed by a path (`host:8080/users/` before an `@`).
    UrlPassword,
}

/// A built-in detector.
pub(super) struct Builtin {
    pub(super) name: &'static str,
    /// A secret (on by default) or personal data (opt-in).
    pub(super) secret: bool,
    pub(super) pattern: &'static str,
    /// Whether every match starts with one of a few case-sensitive literals, so the detector
    /// can be searched for through the guard's gate (see the module's documentation).
    pub(super) gated: bool,
    pub(super) check: Check,
}

/// The built-in detectors. Each pattern stays inside one JSON string (no quotes), so redacting
/// a JSON output leaves it JSON.
pub(super) const BUILTINS: &[Builtin] = &[
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

pub(super) fn passes(check: Check, found: &str) -> bool {
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
