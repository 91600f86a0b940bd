//! The output guard's unit tests: each detector with its near misses, redaction and blocking, the cut.

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
    let screened =
        guard.screen("cards 4111111111111111 and 5500 0000 0000 0004, key AKIAIOSFODNN7EXAMPLE");
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
        error("{ custom: [{ name: t, pattern: 'a{1000}{1000}' }] }").contains("invalid pattern")
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
