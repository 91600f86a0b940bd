//! Property tests (proptest, 256 cases each): canonical argument hashing, and allow/deny glob
//! semantics through catalogs loaded from generated YAML, checked against small reference
//! implementations written here.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Map, Value};
use toolgate::{
    boundary::access,
    canonical::sha256_hex,
    catalog::{AccessList, Verdict},
    conditions::{Input, ToolFacts},
    config::Config,
    identity::{AuthMethod, Caller},
    settings::Env,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // Failures are reported with their shrunk input; no regression files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// --- canonical hashing ---------------------------------------------------------------------------

/// Integers up to 2^53 in magnitude: within it every integer has exactly one f64, so `1`, `1.0`
/// and `1e0` are the same number. (Beyond it the canonical form keeps the float spelling.)
const EXACT: i64 = 1 << 53;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-EXACT + 1..EXACT).prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        prop_oneof![-1e6f64..1e6, any::<f64>()]
            .prop_filter("finite and not whole", |f| f.is_finite()
                && f.fract() != 0.0)
            .prop_map(Value::from),
        "[a-c\u{e9}\u{4e2d}\"\\\\/ \n\u{1}]{0,5}".prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-d]{1,2}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Random choices for a renderer, read in a cycle.
struct Tape<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Tape<'_> {
    fn pick(&mut self, n: usize) -> usize {
        let byte = self.bytes[self.at % self.bytes.len()];
        self.at += 1;
        usize::from(byte) % n
    }
}

/// Writes `value` as JSON text with another key order, whitespace, number and string spelling.
fn respell(value: &Value, tape: &mut Tape, out: &mut String) {
    let space = |tape: &mut Tape, out: &mut String| {
        out.push_str(["", " ", "\n", "\t", "\r\n  "][tape.pick(5)]);
    };
    space(tape, out);
    match value {
        Value::Null | Value::Bool(_) => out.push_str(&value.to_string()),
        Value::Number(n) => out.push_str(&respell_number(n, tape)),
        Value::String(s) => respell_string(s, tape, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respell(item, tape, out);
            }
            space(tape, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            // Fisher-Yates driven by the tape.
            for i in (1..entries.len()).rev() {
                entries.swap(i, tape.pick(i + 1));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                space(tape, out);
                respell_string(key, tape, out);
                space(tape, out);
                out.push(':');
                respell(item, tape, out);
            }
            space(tape, out);
            out.push('}');
        }
    }
    space(tape, out);
}

fn respell_number(n: &serde_json::Number, tape: &mut Tape) -> String {
    if let Some(i) = n.as_i64() {
        let sign = if i == 0 && tape.pick(2) == 0 { "-" } else { "" };
        return match tape.pick(6) {
            0 => format!("{sign}{i}"),
            1 => format!("{sign}{i}.0"),
            2 => format!("{sign}{i}e0"),
            3 => format!("{sign}{i}.000E+0"),
            4 if i != 0 => format!("{i}0e-1"),
            4 => format!("{sign}0.0e-1"),
            _ => format!("{sign}{}", i as f64),
        };
    }
    let f = n.as_f64().expect("finite");
    match tape.pick(4) {
        0 => format!("{f}"),
        1 => format!("{f:e}"),
        2 => format!("{f:E}"),
        _ => format!("{f:.17e}"),
    }
}

fn respell_string(s: &str, tape: &mut Tape, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if tape.pick(2) == 0 => out.push_str("\\/"),
            '\n' if tape.pick(2) == 0 => out.push_str("\\n"),
            c if (c as u32) < 0x20 || tape.pick(3) == 0 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Paths to every leaf (scalar or empty container), as indexes into arrays and keys into objects.
fn leaves(value: &Value, at: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match value {
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                at.push(Value::from(i));
                leaves(item, at, out);
                at.pop();
            }
        }
        Value::Object(map) if !map.is_empty() => {
            for (key, item) in map {
                at.push(Value::from(key.as_str()));
                leaves(item, at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

fn leaf_mut<'a>(value: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match step {
        Value::String(key) => &mut v[key.as_str()],
        index => &mut v[index.as_u64().unwrap() as usize],
    })
}

/// A value that differs from `leaf` in meaning, not only in spelling.
fn changed(leaf: &Value, how: usize) -> Value {
    match (leaf, how % 2) {
        (Value::Null, _) => Value::from(false),
        (Value::Bool(b), 0) => Value::from(!b),
        (Value::Number(n), 0) => match n.as_i64() {
            Some(i) => Value::from(i + 1),
            None => Value::from(n.as_f64().unwrap() * 0.5),
        },
        // Same characters, another type: `1` and `"1"` are different arguments.
        (Value::Number(_) | Value::Bool(_), _) => Value::from(leaf.to_string()),
        (Value::String(s), 0) => Value::from(format!("{s}x")),
        (Value::String(s), _) => Value::from(s.chars().rev().chain(['"']).collect::<String>()),
        (Value::Array(_), _) => Value::Array(vec![Value::Null]),
        (Value::Object(_), _) => Value::Object(Map::from_iter([("k".to_owned(), Value::Null)])),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn respelling_a_value_never_changes_its_hash(
        value in json_value(),
        tape in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let mut text = String::new();
        respell(&value, &mut Tape { bytes: &tape, at: 0 }, &mut text);
        let parsed: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("respelled text is not JSON ({e}): {text}")))?;
        prop_assert_eq!(sha256_hex(&parsed), sha256_hex(&value), "{}", text);
    }

    #[test]
    fn changing_any_leaf_changes_the_hash(
        value in json_value(),
        pick in any::<prop::sample::Index>(),
        how in 0usize..2,
    ) {
        let mut paths = Vec::new();
        leaves(&value, &mut Vec::new(), &mut paths);
        let path = pick.get(&paths);
        let mut other = value.clone();
        let leaf = leaf_mut(&mut other, path);
        *leaf = changed(leaf, how);
        prop_assert_ne!(sha256_hex(&other), sha256_hex(&value), "{} vs {}", value, other);
    }
}

#[test]
fn number_spellings_of_one_value_hash_the_same() {
    let hash = |text: &str| sha256_hex(&serde_json::from_str(text).unwrap());
    for (a, b) in [
        ("1", "1.0"),
        ("1", "1e0"),
        ("1", "10e-1"),
        ("0", "-0"),
        ("0", "-0.0"),
        ("0", "0e5"),
        ("-7", "-7.000"),
        ("1.5", "15e-1"),
        ("1.5", "1.50"),
        ("9007199254740991", "9007199254740991.0"),
    ] {
        assert_eq!(hash(a), hash(b), "{a} vs {b}");
    }
    for (a, b) in [("1", "1.5"), ("1", "\"1\""), ("0", "false"), ("0", "null")] {
        assert_ne!(hash(a), hash(b), "{a} vs {b}");
    }
}

// --- allow/deny globs ---------------------------------------------------------------------------

/// The glob semantics the catalog promises for tool names: `*` any run of characters (also
/// none), `?` exactly one, everything else itself.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // matches[j]: pattern[..i] matches name[..j]
    let mut matches = vec![false; n.len() + 1];
    matches[0] = true;
    for &pc in &p {
        let mut next = vec![false; n.len() + 1];
        for j in 0..=n.len() {
            next[j] = match pc {
                '*' => matches[j] || (j > 0 && next[j - 1]),
                '?' => j > 0 && matches[j - 1],
                c => j > 0 && matches[j - 1] && n[j - 1] == c,
            };
        }
        matches = next;
    }
    matches[n.len()]
}

/// Reference for one allow/deny list: deny wins (naming its first matching rule), then a set allow
/// list admits only what it matches.
/// Why a list refuses a tool, in the reference's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AccessDenial {
    Denied(String),
    NotAllowed,
}

/// A list's answer for `name`, for a caller, in the reference's terms (no conditions here).
fn list_decides(list: &AccessList, caller: &Caller, name: &str) -> Result<(), AccessDenial> {
    match list.decide(name, &listing(caller, name)).verdict {
        Verdict::Allowed(_) => Ok(()),
        Verdict::Denied(hit) => Err(AccessDenial::Denied(hit.text.clone())),
        Verdict::NotAllowed(None) => Err(AccessDenial::NotAllowed),
        other => panic!("a condition's verdict without conditions: {other:?}"),
    }
}

fn listing<'a>(caller: &'a Caller, name: &'a str) -> Input<'a> {
    Input::listing(
        caller,
        ToolFacts {
            name,
            version: "1.0.0",
            risk_level: "READ_ONLY",
        },
    )
}

fn reference_list(
    allow: &Option<Vec<String>>,
    deny: &[String],
    name: &str,
) -> Result<(), AccessDenial> {
    if let Some(hit) = deny.iter().find(|p| glob_matches(p, name)) {
        return Err(AccessDenial::Denied(hit.clone()));
    }
    match allow {
        Some(allow) if !allow.iter().any(|p| glob_matches(p, name)) => {
            Err(AccessDenial::NotAllowed)
        }
        _ => Ok(()),
    }
}

/// A pattern made from a tool name, so that most patterns match something.
fn pattern_from(name: &str, edits: &[(usize, u8)]) -> String {
    let mut chars: Vec<char> = name.chars().collect();
    for &(at, edit) in edits {
        let at = at % (chars.len() + 1);
        match edit % 5 {
            0 if at < chars.len() => chars[at] = '?',
            1 if at < chars.len() => {
                let end = (at + usize::from(edit / 5) % 3 + 1).min(chars.len());
                chars.splice(at..end, ['*']);
            }
            2 => chars.insert(at, '*'),
            // A letter that may not be in the name: the pattern then often matches nothing.
            3 if at < chars.len() => chars[at] = char::from(b'a' + edit % 26),
            _ => {}
        }
    }
    chars.into_iter().collect()
}

#[derive(Debug, Clone)]
struct Lists {
    tools: Vec<String>,
    policy_deny: Vec<String>,
    tenant_allow: Option<Vec<String>>,
    tenant_deny: Vec<String>,
    agent_allow: Option<Vec<String>>,
    probes: Vec<String>,
}

fn patterns(tools: Vec<String>, max: usize) -> impl Strategy<Value = Vec<String>> {
    let derived = (
        any::<prop::sample::Index>(),
        prop::collection::vec((0usize..8, any::<u8>()), 0..4),
    )
        .prop_map(move |(i, edits)| pattern_from(i.get::<String>(&tools), &edits));
    prop::collection::vec(prop_oneof![4 => derived, 1 => "[a-c_*?]{1,4}"], 0..max)
}

fn lists() -> impl Strategy<Value = Lists> {
    prop::collection::btree_set("[a-d_]{1,5}", 1..7).prop_flat_map(|tools| {
        let tools: Vec<String> = tools.into_iter().collect();
        (
            Just(tools.clone()),
            patterns(tools.clone(), 2),
            prop::option::of(patterns(tools.clone(), 3)),
            patterns(tools.clone(), 3),
            prop::option::of(patterns(tools, 2)),
            prop::collection::vec("[a-d_]{0,6}", 0..6),
        )
            .prop_map(
                |(tools, policy_deny, tenant_allow, tenant_deny, agent_allow, probes)| Lists {
                    tools,
                    policy_deny,
                    tenant_allow,
                    tenant_deny,
                    agent_allow,
                    probes,
                },
            )
    })
}

fn yaml_list(patterns: &[String]) -> String {
    let quoted: Vec<String> = patterns.iter().map(|p| format!("\"{p}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

fn catalog_yaml(lists: &Lists) -> String {
    let mut yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\npolicy: {{ deny: {} }}\ntenants:\n  t:\n    deny: {}\n",
        yaml_list(&lists.policy_deny),
        yaml_list(&lists.tenant_deny)
    );
    if let Some(allow) = &lists.tenant_allow {
        yaml += &format!("    allow: {}\n", yaml_list(allow));
    }
    yaml += "agents:\n  bot:\n";
    match &lists.agent_allow {
        Some(allow) => yaml += &format!("    allow: {}\n", yaml_list(allow)),
        None => yaml += "    deny: []\n",
    }
    yaml += "tools:\n";
    for tool in &lists.tools {
        yaml += &format!(
            "  - {{ name: {tool}, description: d, risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}\n"
        );
    }
    yaml
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn allow_and_deny_globs_match_the_reference(lists in lists()) {
        let yaml = catalog_yaml(&lists);
        let loaded = Config::from_yaml(&yaml, "globs.yaml", std::path::Path::new("."), &Env::default());
        // Every pattern must match some tool of the catalog, or the catalog is refused naming it.
        let mut first_unmatched = None;
        let mut lists_in_order = vec![("policy.deny", Some(&lists.policy_deny))];
        lists_in_order.push(("tenants.t.allow", lists.tenant_allow.as_ref()));
        lists_in_order.push(("tenants.t.deny", Some(&lists.tenant_deny)));
        lists_in_order.push(("agents.bot.allow", lists.agent_allow.as_ref()));
        for (path, patterns) in lists_in_order {
            for (i, p) in patterns.into_iter().flatten().enumerate() {
                if first_unmatched.is_none() && !lists.tools.iter().any(|t| glob_matches(p, t)) {
                    first_unmatched = Some(format!("{path}[{i}]"));
                }
            }
        }
        let config = match (loaded, first_unmatched) {
            (Ok(config), None) => config,
            (Err(err), Some(path)) => {
                prop_assert_eq!(&err.path, &path, "{}", err);
                prop_assert!(err.message.contains("matches no tool in the catalog"), "{}", err);
                return Ok(());
            }
            (Ok(_), Some(path)) => {
                return Err(TestCaseError::fail(format!("{path} matches no tool, yet the catalog loaded:\n{yaml}")));
            }
            (Err(err), None) => {
                return Err(TestCaseError::fail(format!("refused: {err}\n{yaml}")));
            }
        };
        let catalog = &config.catalog;
        let caller = |agent: &str| Caller {
            tenant: "t".into(),
            subject: "s".into(),
            agent: agent.into(),
            scopes: BTreeSet::new(),
            method: AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        };
        let tenant = &catalog.tenants["t"].access;
        for name in lists.tools.iter().chain(&lists.probes) {
            let tenant_expected = reference_list(&lists.tenant_allow, &lists.tenant_deny, name);
            prop_assert_eq!(list_decides(tenant, &caller("bot"), name), tenant_expected.clone(), "tenant list, {}", name);
            prop_assert_eq!(
                list_decides(&catalog.policy, &caller("bot"), name),
                reference_list(&None, &lists.policy_deny, name),
                "global policy, {}", name
            );
            let global = reference_list(&None, &lists.policy_deny, name);
            let agent = reference_list(&lists.agent_allow, &[], name);
            // The whole stage: global, then tenant, then agent. Agents are configured without a
            // "*" entry, so an unknown agent, another spelling of a known one, or none gets nothing.
            let expected = global.is_ok() && tenant_expected.is_ok();
            for unknown in ["other", "Bot", "bot ", ""] {
                prop_assert!(access::check(catalog, &listing(&caller(unknown), name)).is_err(), "{:?} {}", unknown, name);
            }
            prop_assert_eq!(
                access::check(catalog, &listing(&caller("bot"), name)).is_ok(),
                expected && agent.is_ok(),
                "agent bot, {}", name
            );
        }
    }
}
